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


WORKLOADS = ("control", "shared-prefix", "multi-turn")
# The acceptance goals of the routing-quality issue: where an interval decides, a router is
# "behind" only when its whole 95 % interval lies on the wrong side of the other's.
GOODPUT_OF_ORACLE = 0.95
CONTROL_P95_OF_PEER = 0.8
SHARED_PREFIX_VS_RANDOM = 30


def interval(r, key):
    ci = (r.get("ci95") or {}).get(key)
    return ci if ci else [r[key], r[key]]


def acceptance(runs, subject):
    """The goals for `subject` at every concurrency point that has the routers they compare:
    (c, goal, subject's figure, the figure it is compared with, holds)."""
    rows = []
    for c in sorted({r["concurrency"] for r in runs}):
        for w in WORKLOADS:
            s = find(runs, subject, w, c)
            if not s:
                continue
            peers = [p for p in (find(runs, peer, w, c) for peer in PEERS) if p]
            for key, what in (("ttft_ms_p50", "median TTFT"), ("ttft_ms_p95", "p95 TTFT")):
                if peers:
                    best = min(peers, key=lambda p: p[key])
                    holds = interval(s, key)[0] <= interval(best, key)[1]
                    rows.append((c, f"{w}: {what} no worse than the best peer's", with_ci(s, key, "ms"),
                                 f"{best['router']} {with_ci(best, key, 'ms')}", holds))
            if peers:
                best = max(peers, key=lambda p: p["goodput_per_min"])
                holds = interval(s, "goodput_per_min")[1] >= interval(best, "goodput_per_min")[0]
                rows.append((c, f"{w}: goodput ≥ the best peer's", with_ci(s, "goodput_per_min"),
                             f"{best['router']} {with_ci(best, 'goodput_per_min')}", holds))
            o = find(runs, "oracle", w, c)
            if o and subject != "oracle":
                need = GOODPUT_OF_ORACLE * interval(o, "goodput_per_min")[0]
                rows.append((c, f"{w}: goodput ≥ {GOODPUT_OF_ORACLE}× the oracle's", with_ci(s, "goodput_per_min"),
                             f"oracle {with_ci(o, 'goodput_per_min')}",
                             interval(s, "goodput_per_min")[1] >= need))
            if w == "control" and peers:
                p50 = min(p["ttft_ms_p50"] for p in peers)
                rows.append((c, "control: median TTFT ≤ the best peer's point estimate", fmt(s["ttft_ms_p50"], "ms"),
                             fmt(p50, "ms"), s["ttft_ms_p50"] <= p50))
                p95 = min(p["ttft_ms_p95"] for p in peers)
                rows.append((c, f"control: p95 TTFT ≤ {CONTROL_P95_OF_PEER}× the best peer's point estimate",
                             fmt(s["ttft_ms_p95"], "ms"), f"{CONTROL_P95_OF_PEER} × {fmt(p95, 'ms')}",
                             s["ttft_ms_p95"] <= CONTROL_P95_OF_PEER * p95))
            r = find(runs, "random", w, c)
            if w == "shared-prefix" and r and s["ttft_ms_p50"]:
                ratio_ = r["ttft_ms_p50"] / s["ttft_ms_p50"]
                rows.append((c, f"shared-prefix: median TTFT ≥ {SHARED_PREFIX_VS_RANDOM}× lower than random's",
                             f"{fmt(s['ttft_ms_p50'], 'ms')} ({ratio_:.1f}× lower)", f"random {fmt(r['ttft_ms_p50'], 'ms')}",
                             ratio_ >= SHARED_PREFIX_VS_RANDOM))
    return rows


def goals(runs):
    rows = acceptance(runs, "switchyard")
    if not rows:
        return []
    oracle = {(c, goal): holds for c, goal, _, _, holds in acceptance(runs, "oracle")}
    yes = lambda h: "yes" if h else "**no**"  # noqa: E731
    out = ["## Goals", "",
           "Brackets: 95 % intervals. A goal judged by intervals fails only where Switchyard's whole interval lies "
           "on the wrong side of the other router's; point-estimate goals compare the figures themselves. The last "
           "column applies the same goal to the oracle, where the run has it.",
           "", "| c | goal | Switchyard | compared with | holds | holds for the oracle |", "|---|---|---|---|---|---|"]
    for c, goal, mine, other, holds in rows:
        o = oracle.get((c, goal))
        out.append(f"| {c} | {goal} | {mine} | {other} | {yes(holds)} | {'-' if o is None else yes(o)} |")
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
    need = meta.get("min_requests")
    short = [f"{r['router']} · {r['workload']} · c={r['concurrency']} ({r['requests']})" for r in runs
             if need and r.get("requests", 0) < need]
    if need:
        lines += [f"Cells with fewer than {need} requests in their window: {', '.join(short) if short else 'none'}.", ""]
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
