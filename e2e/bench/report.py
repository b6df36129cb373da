"""Turns benchmark runs into report.md (tables with ratios vs random and vs the best peer)
and PNG plots (TTFT p50/p95 and goodput vs concurrency, one figure per workload)."""

from pathlib import Path

PEERS = ["sglang-cache-aware", "vllm-router-cache-aware"]


def fmt(v, unit=""):
    if v is None:
        return "-"
    if unit == "ms":
        return f"{v / 1000:.2f} s" if v >= 1000 else f"{v:.0f} ms"
    return f"{v:.2f}" if isinstance(v, float) else str(v)


def with_ci(r, key, unit=""):
    """A figure and its 95 % bootstrap interval, e.g. `237 ms [221–250 ms]`."""
    ci = (r.get("ci95") or {}).get(key)
    if ci is None or r.get(key) is None:
        return fmt(r.get(key), unit)
    if unit:
        return f"{fmt(r[key], unit)} [{fmt(ci[0], unit)}–{fmt(ci[1], unit)}]"
    return f"{r[key]:.1f} [{ci[0]:.1f}–{ci[1]:.1f}]"


def ratio(a, b):
    if not a or not b:
        return "-"
    return f"{b / a:.2f}×" if b / a < 1 else f"{b / a:.1f}×"


def behind(run):
    b = run.get("fleet_behind_schedule")
    return "-" if b is None else f"{100 * b:.1f} %"


def find(runs, router, workload, c):
    return next((r for r in runs if r["router"] == router and r["workload"] == workload and r["concurrency"] == c), None)


def goal_ratios(runs, subject):
    """The benchmark issue's acceptance goals for `subject` (Switchyard; the oracle shows what
    any router reached in the same run), at every concurrency point that has the routers they
    compare: (c, goal, ratio, needed ratio)."""
    rows = []
    for c in sorted({r["concurrency"] for r in runs}):
        sy = {w: find(runs, subject, w, c) for w in ("control", "shared-prefix", "multi-turn")}
        rnd = {w: find(runs, "random", w, c) for w in ("control", "shared-prefix", "multi-turn")}
        s, r = sy["shared-prefix"], rnd["shared-prefix"]
        if s and r and s["ttft_ms_p50"]:
            rows.append((c, "shared-prefix TTFT p50 ≥ 30× lower than random", r["ttft_ms_p50"] / s["ttft_ms_p50"], 30))
        if s and r and r["goodput_per_min"] >= 0:
            g = s["goodput_per_min"] / r["goodput_per_min"] if r["goodput_per_min"] else float("inf")
            rows.append((c, "shared-prefix goodput ≥ 10× random", g, 10))
        for peer in PEERS:
            p = find(runs, peer, "shared-prefix", c)
            if s and p and s["ttft_ms_p50"]:
                rows.append((c, f"shared-prefix TTFT p50 lower than {peer}", p["ttft_ms_p50"] / s["ttft_ms_p50"], 1.0))
        o = find(runs, "oracle", "shared-prefix", c)
        if subject != "oracle" and s and o and s["ttft_ms_p50"]:
            rows.append((c, "shared-prefix TTFT p50 within 1.2× of the oracle", o["ttft_ms_p50"] / s["ttft_ms_p50"], 1 / 1.2))
        s, r = sy["multi-turn"], rnd["multi-turn"]
        if s and r:
            g = s["goodput_per_min"] / r["goodput_per_min"] if r["goodput_per_min"] else float("inf")
            rows.append((c, "multi-turn goodput ≥ 5× random", g, 5))
        s, r = sy["control"], rnd["control"]
        if s and r and s["ttft_ms_p50"] and s["ttft_ms_p95"]:
            rows.append((c, "control TTFT p50 no worse than random", r["ttft_ms_p50"] / s["ttft_ms_p50"], 1.0))
            rows.append((c, "control TTFT p95 ≥ 2× lower than random", r["ttft_ms_p95"] / s["ttft_ms_p95"], 2.0))
    return rows


def goals(runs):
    rows = goal_ratios(runs, "switchyard")
    if not rows:
        return []
    oracle = {(c, goal): value for c, goal, value, _ in goal_ratios(runs, "oracle")}

    def shown(value):
        return "-" if value is None else "∞" if value == float("inf") else f"{value:.2f}×"

    out = ["## Goals", "",
           "Ratio = the other router's figure / Switchyard's (higher is better for Switchyard). The last column is "
           "the same ratio for the oracle, where the run has it: what the best greedy router reached on the same fleet.",
           "", "| c | goal | ratio | holds | oracle's ratio |", "|---|---|---|---|---|"]
    for c, goal, value, need in rows:
        out.append(f"| {c} | {goal} | {shown(value)} | {'yes' if value >= need else '**no**'} | {shown(oracle.get((c, goal)))} |")
    return out + [""]


def write_report(out, meta, runs):
    out = Path(out)
    v = meta.get("versions", {})
    m = meta["machine"]
    lines = ["# Routing benchmark", "",
             f"Command: `{meta['command']}`  ",
             f"Profile `{meta['profile']}`, {meta['workers']} workers, seed {meta['seed']}, wall time {meta['wall_s']} s. "
             "Per workload (wall seconds at the time scale; figures converted to scale 1):  ",
             *[f"- {w}: time scale {s['time_scale']}, {s['warmup']:.0f} s warm-up (streams started over {s['rampup']:.0f} s), "
               f"{s['duration']:.0f} s measured = {s['warmup'] / s['time_scale']:.0f} s + {s['duration'] / s['time_scale']:.0f} s "
               "simulated" for w, s in meta["settings"].items()],
             "",
             f"Machine: {m['cores']} cores ({m.get('cpu', '?')}), {m.get('memory_gib', '?')} GiB, `{m['uname']}`.  ",
             f"Versions: switchyard {v.get('switchyard', '?')} ({v.get('switchyard_commit', '?')}), "
             f"GuideLLM {v.get('guidellm')}, sglang-router {v.get('sglang-router')}, vllm-router {v.get('vllm-router')}.", ""]
    lines += goals(runs)
    workloads = sorted({r["workload"] for r in runs}, key=["control", "shared-prefix", "multi-turn"].index)
    for w in workloads:
        lines += [f"## {w}", "", "| router | c | requests | TTFT p50 | TTFT p95 | ITL p50 | E2E p50 | req/min | goodput/min | cache hit | fleet behind | TTFT p50 vs random | vs best peer |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in [r for r in runs if r["workload"] == w]:
            same = [x for x in runs if x["workload"] == w and x["concurrency"] == r["concurrency"]]
            rnd = next((x for x in same if x["router"] == "random"), None)
            peers = [x["ttft_ms_p50"] for x in same if x["router"] in PEERS and x["ttft_ms_p50"]]
            best_peer = min(peers) if peers else None
            lines.append(
                f"| {r['router']} | {r['concurrency']} | {r.get('requests', '-')} | {with_ci(r, 'ttft_ms_p50', 'ms')} | {with_ci(r, 'ttft_ms_p95', 'ms')} | "
                f"{fmt(r['itl_ms_p50'], 'ms')} | {r['e2e_s_p50']:.1f} s | {r['requests_per_min']:.1f} | {with_ci(r, 'goodput_per_min')} | "
                f"{100 * r['cache_hit_rate']:.0f} % | {behind(r)} | {ratio(r['ttft_ms_p50'], rnd['ttft_ms_p50'] if rnd else None)} | "
                f"{ratio(r['ttft_ms_p50'], best_peer)} |")
        lines.append("")
    lines += ["Requests: completed inside the measurement window (the sample behind every figure of the row). "
              "Brackets: 95 % percentile-bootstrap intervals (1,000 resamples of the row's requests, window fixed). "
              "Fleet behind: how far the simulated workers fell behind their timing model in that window (wall "
              "time lost / window, averaged over workers); near 0 % the figures are those of the model. "
              "Ratios: how many times lower this router's median TTFT is than random's / the best peer's at the same "
              "concurrency.", ""]
    (out / "report.md").write_text("\n".join(lines))
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    for w in workloads:
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        routers = sorted({r["router"] for r in runs})
        for i, router in enumerate(routers):
            pts = sorted(((r["concurrency"], r) for r in runs if r["workload"] == w and r["router"] == router),
                         key=lambda p: p[0])
            if not pts:
                continue
            xs = [c for c, _ in pts]
            # One colour per router: p50 solid with dots, p95 dashed with crosses.
            color = f"C{i}"
            axes[0].plot(xs, [r["ttft_ms_p50"] / 1000 for _, r in pts], marker="o", color=color, label=f"{router} p50")
            axes[0].plot(xs, [r["ttft_ms_p95"] / 1000 for _, r in pts], marker="x", linestyle="--", color=color,
                         alpha=0.6, label=f"{router} p95")
            axes[1].plot(xs, [r["goodput_per_min"] for _, r in pts], marker="o", color=color, label=router)
        axes[0].set(title=f"{w}: TTFT (s, scale 1)", xlabel="concurrency", yscale="log")
        axes[1].set(title=f"{w}: goodput (req/min within SLO)", xlabel="concurrency")
        axes[0].legend(fontsize=6)
        axes[1].legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / f"{w}.png", dpi=110)
        plt.close(fig)
