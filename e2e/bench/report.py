"""Turns benchmark runs into report.md (tables with ratios vs random and vs the best peer)
and PNG plots (TTFT p50/p95 and goodput vs concurrency or arrival rate, one figure per workload).

A run's load point is its concurrency (closed-loop streams) or, with Poisson arrivals, its rate
in requests per wall second; runs without an `arrival` field (results before it existed) are
concurrent."""

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


def preempted(run):
    """Engine preemptions in the window per completed request (older runs did not count them)."""
    p, n = run.get("preemptions"), run.get("requests")
    return "-" if p is None or not n else f"{p / n:.2f}"


def point(r):
    """The load point of a run, comparable and sortable: ("concurrent", 32) or ("poisson", 2.0)."""
    if r.get("arrival", "concurrent") == "concurrent":
        return ("concurrent", r["concurrency"])
    return ("poisson", r["rate"])


def value(pt):
    """A point as a table cell: `32` (streams) or `2/s` (requests per wall second)."""
    kind, v = pt
    return str(v) if kind == "concurrent" else f"{v:g}/s"


def label(pt):
    """A point in prose: `c=32` or `rate=2/s`."""
    kind, v = pt
    return f"c={v}" if kind == "concurrent" else f"rate={v:g}/s"


def point_header(runs):
    kinds = {point(r)[0] for r in runs}
    return "c" if kinds == {"concurrent"} else "rate" if kinds == {"poisson"} else "c / rate"


def find(runs, router, workload, pt):
    return next((r for r in runs if r["router"] == router and r["workload"] == workload and point(r) == pt), None)


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
    """The goals for `subject` at every load point that has the routers they compare:
    (point, goal, subject's figure, the figure it is compared with, holds)."""
    rows = []
    for c in sorted({point(r) for r in runs}):
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
           "", f"| {point_header(runs)} | goal | Switchyard | compared with | holds | holds for the oracle |",
           "|---|---|---|---|---|---|"]
    for c, goal, mine, other, holds in rows:
        o = oracle.get((c, goal))
        out.append(f"| {value(c)} | {goal} | {mine} | {other} | {yes(holds)} | {'-' if o is None else yes(o)} |")
    return out + [""]


def workload_shape(w, spec):
    """One workload's requests in words, from its GuideLLM data spec."""
    if w == "shared-prefix":
        return (f"one of {spec['prefix_count']} prefixes of {spec['prefix_tokens']:,} tokens + "
                f"{spec['prompt_tokens']:,} unique tokens")
    if w == "multi-turn":
        return (f"{spec['first_prompt_tokens']:,}-token first turn, +{spec['prompt_tokens']:,} tokens per turn, "
                f"{spec['turns']} turns")
    return f"{spec['prompt_tokens']:,} unique tokens"


def load_lines(meta):
    """The load and fleet options of the run (results from before they existed: the reference ones)."""
    api = meta.get("api_path", "/v1/chat/completions")
    specs = meta.get("workloads", {})
    out_tokens = sorted({s["output_tokens"] for s in specs.values() if "output_tokens" in s})
    if meta.get("arrival", "concurrent") == "poisson":
        rates = ", ".join(f"{r:g}/s" for r in meta["rate"])
        load = (f"Poisson arrivals at {rates} (requests per wall second), at most {meta['max_outstanding']} in flight "
                "(later arrivals wait in GuideLLM: the dispatch delay)")
    else:
        c = meta.get("concurrency") or []
        load = f"{', '.join(str(x) for x in c)} concurrent stream{'' if c == [1] else 's'} (closed loop)"
    tokens = f"; {', '.join(map(str, out_tokens))} output tokens" if out_tokens else ""
    slow = meta.get("slow_worker")
    fleet = f"{meta['workers']} workers of `{meta['profile']}`, seed {meta['seed']}"
    if slow:
        fleet += f", worker {slow['worker']} slowed {slow['factor']:g}× (every step takes {slow['factor']:g}× its modelled time)"
    fleet += (f"; Switchyard predicts TTFT with `{meta.get('ttft_predictor', 'Queue')}`"
              f" and dispatches `{meta.get('dispatch_pacing', 'Immediate')}`")
    return [f"Load: {load}, through `{api}`{tokens}.  ",
            f"Fleet: {fleet}. Wall time {meta['wall_s']} s. "
            "Per workload (wall seconds at the time scale; figures converted to scale 1):  "]


def live_vs_virtual(meta, runs):
    """Per workload and load point, Switchyard's live figures beside its own decision function's
    in virtual time (and the oracle's, live and virtual): how much the live path loses."""
    virtual = meta.get("virtual") or []
    if not virtual:
        why = meta.get("virtual_skipped")
        return [f"Virtual-time figures: not computed ({why}).", ""] if why else []

    def vpoint(v):
        # Rows written before open-loop virtual runs carry only a concurrency.
        return (v.get("arrival", "concurrent"), v.get("point", v.get("concurrency")))

    kinds = {vpoint(v)[0] for v in virtual}
    header = "c" if kinds == {"concurrent"} else "rate"
    lines = ["## Live against virtual time", "",
             f"| workload | {header} | Switchyard TTFT p50 live / virtual | p95 live / virtual | goodput/min live / virtual | "
             "oracle TTFT p50 live / virtual | oracle p95 live / virtual |",
             "|---|---|---|---|---|---|---|"]
    for v in [v for v in virtual if v["router"] == "switchyard"]:
        pt = vpoint(v)
        live = find(runs, "switchyard", v["workload"], pt)
        ov = next((o for o in virtual if o["router"] == "oracle" and o["workload"] == v["workload"]
                   and vpoint(o) == pt), None)
        olive = find(runs, "oracle", v["workload"], pt)

        def pair(run, virt, key, unit="ms"):
            show = (lambda x: fmt(x, unit)) if unit else (lambda x: f"{x:.1f}")
            return f"{show(run[key]) if run else '-'} / {show(virt[key]) if virt else '-'}"

        label = pt[1] if pt[0] == "concurrent" else f"{pt[1]:g}/s"
        lines.append(f"| {v['workload']} | {label} | {pair(live, v, 'ttft_ms_p50')} | {pair(live, v, 'ttft_ms_p95')} | "
                     f"{pair(live, v, 'goodput_per_min', '')} | {pair(olive, ov, 'ttft_ms_p50')} | {pair(olive, ov, 'ttft_ms_p95')} |")
    load = ("Poisson rate (at time scale 1)" if header == "rate" else "concurrency")
    lines += ["", f"Virtual: `switchyard calibrate` over the same profile, engine count, {load}, output length and "
              "seed, 1,000 measured requests after 200, the spoke's own decision function and TTFT calibration (or the "
              "oracle's rule) over the simulator's engine model with no wall clock in the loop: no HTTP, tokenisation, "
              "scrape lag or shared cores. Live minus virtual is what the live path loses.", ""]
    return lines


def write_report(out, meta, runs):
    out = Path(out)
    v = meta.get("versions", {})
    m = meta["machine"]
    specs = meta.get("workloads", {})

    def settings_line(w, s):
        start = "" if s.get("rampup") is None else f" (streams started over {s['rampup']:.0f} s)"
        line = (f"- {w}: time scale {s['time_scale']}, {s['warmup']:.0f} s warm-up{start}, {s['duration']:.0f} s measured = "
                f"{s['warmup'] / s['time_scale']:.0f} s + {s['duration'] / s['time_scale']:.0f} s simulated")
        if meta.get("arrival") == "poisson":
            line += "; rate at scale 1: " + ", ".join(f"{r * s['time_scale']:g}/s" for r in meta["rate"])
        if w in specs:
            line += f"; {workload_shape(w, specs[w])}"
        return line

    lines = ["# Routing benchmark", "",
             f"Command: `{meta['command']}`  ",
             *load_lines(meta),
             *[settings_line(w, s) for w, s in meta["settings"].items()],
             "",
             f"Machine: {m['cores']} cores ({m.get('cpu', '?')}), {m.get('memory_gib', '?')} GiB, `{m['uname']}`.  ",
             f"Versions: switchyard {v.get('switchyard', '?')} ({v.get('switchyard_commit', '?')}), "
             f"GuideLLM {v.get('guidellm')}, sglang-router {v.get('sglang-router')}, vllm-router {v.get('vllm-router')}.", ""]
    lines += goals(runs)
    need = meta.get("min_requests")
    short = [f"{r['router']} · {r['workload']} · {label(point(r))} ({r['requests']})" for r in runs
             if need and r.get("requests", 0) < need]
    if need:
        lines += [f"Cells with fewer than {need} requests in their window: {', '.join(short) if short else 'none'}.", ""]
    workloads = sorted({r["workload"] for r in runs}, key=["control", "shared-prefix", "multi-turn"].index)
    for w in workloads:
        rows = [r for r in runs if r["workload"] == w]
        # Open-loop arrivals: how late requests left GuideLLM against their schedule, and what
        # was still in flight when the window closed, show a fleet that did not keep up.
        open_loop = any(point(r)[0] == "poisson" for r in rows)
        extra = " dispatch delay p95 | in flight at end | start-up burst |" if open_loop else ""
        lines += [f"## {w}", "", f"| router | {point_header(rows)} | requests | TTFT p50 | TTFT p95 | ITL p50 | E2E p50 | req/min | goodput/min | cache hit | fleet behind | preempted/req |{extra} TTFT p50 vs random | vs best peer |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|" + ("---|---|---|" if open_loop else "")]
        for r in rows:
            same = [x for x in runs if x["workload"] == w and point(x) == point(r)]
            rnd = next((x for x in same if x["router"] == "random"), None)
            peers = [x["ttft_ms_p50"] for x in same if x["router"] in PEERS and x["ttft_ms_p50"]]
            best_peer = min(peers) if peers else None
            extra = (f" {fmt(r.get('dispatch_delay_ms_p95'), 'ms')} | {r.get('incomplete_at_end', '-')} | "
                     f"{r.get('startup_burst', '-')} |") if open_loop else ""
            lines.append(
                f"| {r['router']} | {value(point(r))} | {r.get('requests', '-')} | {with_ci(r, 'ttft_ms_p50', 'ms')} | {with_ci(r, 'ttft_ms_p95', 'ms')} | "
                f"{fmt(r['itl_ms_p50'], 'ms')} | {r['e2e_s_p50']:.1f} s | {r['requests_per_min']:.1f} | {with_ci(r, 'goodput_per_min')} | "
                f"{100 * r['cache_hit_rate']:.0f} % | {behind(r)} | {preempted(r)} |{extra} {ratio(r['ttft_ms_p50'], rnd['ttft_ms_p50'] if rnd else None)} | "
                f"{ratio(r['ttft_ms_p50'], best_peer)} |")
        lines.append("")
    lines += ["Requests: completed inside the measurement window (the sample behind every figure of the row). "
              "Brackets: 95 % percentile-bootstrap intervals (1,000 resamples of the row's requests, window fixed). "
              "Fleet behind: how far the simulated workers fell behind their timing model in that window (wall "
              "time lost / window, averaged over workers); near 0 % the figures are those of the model. "
              "Preempted/req: engine preemptions in the window (the KV cache ran out and a running request's work "
              "was dropped, to be recomputed) per completed request. "
              "Ratios: how many times lower this router's median TTFT is than random's / the best peer's at the same "
              "concurrency or rate."
              + (" Rate: requests per wall second. Dispatch delay: how long after its scheduled arrival GuideLLM sent a "
                 "request (scale 1; a multi-turn request's wait for its previous turn excluded), non-zero once the cap "
                 "on requests in flight binds. In flight at end: requests still unanswered when the window closed. "
                 "Poisson rows count the requests sent inside the window (not those completed in it). Start-up burst: "
                 "requests GuideLLM sent in the cell's first 2 s, the arrivals it scheduled while still starting up; "
                 "compare routers only where it is similar."
                 if any(point(r)[0] == "poisson" for r in runs) else ""), ""]
    lines += live_vs_virtual(meta, runs)
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
            pts = sorted(((point(r)[1], r) for r in runs if r["workload"] == w and r["router"] == router),
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
        kinds = {point(r)[0] for r in runs if r["workload"] == w}
        xlabel = "concurrency" if kinds == {"concurrent"} else "arrival rate (req/s, wall)" if kinds == {"poisson"} else \
            "concurrency / arrival rate"
        axes[0].set(title=f"{w}: TTFT (s, scale 1)", xlabel=xlabel, yscale="log")
        axes[1].set(title=f"{w}: goodput (req/min within SLO)", xlabel=xlabel)
        axes[0].legend(fontsize=6)
        axes[1].legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / f"{w}.png", dpi=110)
        plt.close(fig)
