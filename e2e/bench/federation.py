"""The federation benchmark (`e2e/bench/run --federation`): two clusters ("east", "west") of
simulated workers, each behind its own spoke, federated by a hub over mutual TLS; GuideLLM
sends the shared-prefix workload to the hub. The hub's cluster choice is what differs between
the routers: `hub-cache-aware` (the prefix index), `hub-least-loaded` (load alone) and
`hub-random`; inside each cluster the spoke routes as always.

The prefix working set is sized between one cluster's KV capacity and both clusters'
together (48 prefixes of 16,000 tokens = 768k tokens against 3 × 176k per cluster): a hub
that spreads every prefix over both clusters makes each cluster hold all of them and evict,
one that keeps each prefix in one cluster fits.

Besides GuideLLM's figures, each point records what the hub added (its routing time per
request from `switchyard_hub_route_seconds`, and its upstream TTFT against the spokes' own
TTFT) and the bytes the spokes sent the hub against the engines' KV-event bytes, both over
the measured window."""

import json
import os
import re
import subprocess
import time

import httpx

from configs import front_yaml, worker_set_yaml

ROUTERS = ["hub-cache-aware", "hub-least-loaded", "hub-random"]
CLUSTERS = (("east", "eu-west"), ("west", "us-east"))
# Federation defaults where they differ from the routing benchmark's.
PREFIX_COUNT = 48


def wait_ready_file(path, proc, log, timeout=60):
    deadline = time.time() + timeout
    while not path.exists():
        if proc.poll() is not None or time.time() > deadline:
            raise RuntimeError(f"{log} : did not start: " + log.read_text())
        time.sleep(0.1)
    return json.loads(path.read_text())


class Federation:
    """A hub, two spokes and their fleets for one router; `procs` in start order."""

    def __init__(self, router, opts, outdir, time_scale, start, start_fleet, free_port):
        choice = router.removeprefix("hub-")
        self.procs = []
        certs = outdir / "certs"
        done = subprocess.run([opts.bin, "certs", "--out", str(certs), *[a for c, _ in CLUSTERS for a in ("--cluster", c)]],
                              capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            raise RuntimeError("switchyard certs failed: " + done.stderr)
        self.workers, sets = [], {}
        for cluster, region in CLUSTERS:
            cdir = outdir / cluster
            cdir.mkdir(exist_ok=True)
            proc, workers = start_fleet(opts, cdir, time_scale)
            self.procs.append(proc)
            self.workers += workers
            sets[cluster] = worker_set_yaml(opts, workers, time_scale, f"{cluster}-set", cluster, region)
        (outdir / "hub.yaml").write_text("---\n".join(sets.values()) + front_yaml([f"{c}-set" for c in sets]))
        ready = outdir / "hub-ready.json"
        ready.unlink(missing_ok=True)
        self.api_port = free_port()
        hub = start([opts.bin, "hub", "--config", str(outdir / "hub.yaml"), "--listen", "127.0.0.1:0",
                     "--api-listen", f"127.0.0.1:{self.api_port}", "--admin-listen", "127.0.0.1:0",
                     "--tls-dir", str(certs / "hub"), "--ready-file", str(ready), "--cluster-choice", choice],
                    outdir / "hub.log")
        self.procs.append(hub)
        self.hub_pid = hub.pid
        info = wait_ready_file(ready, hub, outdir / "hub.log")
        self.url, self.hub_admin = info["url"], info["admin"]
        self.spoke_admins = []
        for cluster, _ in CLUSTERS:
            cfg = outdir / f"spoke-{cluster}"
            cfg.mkdir(exist_ok=True)
            (cfg / "fleet.yaml").write_text(sets[cluster] + front_yaml([f"{cluster}-set"]))
            admin = free_port()
            self.spoke_admins.append(f"http://127.0.0.1:{admin}")
            self.procs.append(start([opts.bin, "spoke", "--config", str(cfg), "--listen", "127.0.0.1:0",
                                     "--admin-listen", f"127.0.0.1:{admin}", "--hub", info["federation"],
                                     "--cluster", cluster, "--tls-dir", str(certs / "clusters" / cluster)],
                                    outdir / f"spoke-{cluster}.log"))
        deadline = time.time() + 60
        while True:
            try:
                live = httpx.get(self.hub_admin + "/status", timeout=5).json().get("liveClusters", [])
                if sorted(live) == sorted(c for c, _ in CLUSTERS):
                    break
            except httpx.HTTPError:
                pass
            if time.time() > deadline:
                raise RuntimeError("the federation did not come up: see the hub and spoke logs in " + str(outdir))
            time.sleep(0.2)

    def sample(self):
        """Counters over the hub and the spokes now (see `window`)."""
        hub = parse_metrics(httpx.get(self.hub_admin + "/metrics", timeout=10).text)
        spokes = [httpx.get(a + "/status", timeout=10).json() for a in self.spoke_admins]
        spoke_metrics = [parse_metrics(httpx.get(a + "/metrics", timeout=10).text) for a in self.spoke_admins]

        def buckets(metrics, name):
            out = {}
            for m in metrics:
                for (n, le), v in m.items():
                    if n == name + "_bucket":
                        out[le] = out.get(le, 0.0) + v
            return out
        # utime + stime of the hub process, in clock ticks (fields 14 and 15 of /proc/pid/stat).
        stat = open(f"/proc/{self.hub_pid}/stat").read().rsplit(")", 1)[1].split()
        return {
            "t": time.time(),
            "hub_cpu_s": (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK"),
            "route_buckets": buckets([hub], "switchyard_hub_route_seconds"),
            "spoke_tokenize_buckets": buckets(spoke_metrics, "switchyard_spoke_tokenize_seconds"),
            "spoke_decision_buckets": buckets(spoke_metrics, "switchyard_spoke_decision_seconds"),
            "upstream_ttft": (sum_of(hub, "switchyard_hub_upstream_ttft_seconds_sum"),
                              sum_of(hub, "switchyard_hub_upstream_ttft_seconds_count")),
            "hub_bytes": sum((s.get("hub") or {}).get("bytes", 0) for s in spokes),
            "kv_event_bytes": sum(w["kvEvents"]["bytes"] for s in spokes for w in s["workers"]),
        }


def parse_metrics(text):
    """{(name, le or labels): value} of a Prometheus text page, summed over other labels."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$', line)
        if not m:
            continue
        le = re.search(r'le="([^"]+)"', m.group(2) or "")
        key = (m.group(1), le.group(1) if le else "")
        out[key] = out.get(key, 0.0) + float(m.group(3))
    return out


def sum_of(metrics, name):
    return sum(v for (n, _), v in metrics.items() if n == name)


def quantile_bucket(before, after, q):
    """The smallest bucket bound (ms) holding a fraction `q` of the observations between two
    samples of one histogram's buckets, and the count."""
    buckets = sorted(((float("inf") if le == "+Inf" else float(le)), after[le] - before.get(le, 0.0)) for le in after)
    total = buckets[-1][1] if buckets else 0.0
    bound = next((le for le, n in buckets if total and n >= q * total), None)
    return (None if bound is None else bound * 1000), total


def window(before, after, time_scale):
    """What the hub added and what the spokes sent it between two samples. Routing times are
    wall time (the hub's own code does not run slower at a time scale), given as the smallest
    histogram bucket bound holding 50 / 90 / 99 % of the window's requests; beside them, as a
    control for what the machine does to any short piece of work, the same for the spokes'
    tokenization and decisions in the same window, and the hub's CPU time per request."""
    route = {q: quantile_bucket(before["route_buckets"], after["route_buckets"], q) for q in (0.5, 0.9, 0.99)}
    total = route[0.5][1]
    seconds = max(1e-9, after["t"] - before["t"])
    hub_bytes = after["hub_bytes"] - before["hub_bytes"]
    kv_bytes = after["kv_event_bytes"] - before["kv_event_bytes"]
    cpu = after["hub_cpu_s"] - before["hub_cpu_s"]
    return {
        "routed_requests": total,
        "route_ms_p50_bucket": route[0.5][0],
        "route_ms_p90_bucket": route[0.9][0],
        "route_ms_p99_bucket": route[0.99][0],
        "route_ms_buckets": {le: after["route_buckets"][le] - before["route_buckets"].get(le, 0.0)
                             for le in after["route_buckets"]},
        "spoke_tokenize_ms_p99_bucket": quantile_bucket(before["spoke_tokenize_buckets"],
                                                        after["spoke_tokenize_buckets"], 0.99)[0],
        "spoke_decision_ms_p99_bucket": quantile_bucket(before["spoke_decision_buckets"],
                                                        after["spoke_decision_buckets"], 0.99)[0],
        "hub_cpu_ms_per_request": cpu * 1000 / total if total else None,
        "spoke_to_hub_bytes_per_s": hub_bytes / seconds,
        "kv_event_bytes_per_s": kv_bytes / seconds,
        "bytes_ratio": hub_bytes / kv_bytes if kv_bytes else None,
    }


def write_report(out, meta, runs):
    """report.md of a federation run: the three cluster choices side by side, the goals."""
    by = {r["router"]: r for r in runs}
    lines = ["# Federation benchmark", "", f"`{meta['command']}` · {meta['wall_s']} s wall · "
             f"2 clusters × {meta['workers']} workers · shared-prefix, {meta['workload_options']['prefix_count']} prefixes × "
             f"{meta['workload_options']['prefix_tokens']} tokens · c = {meta['concurrency'][0]} · time scale "
             f"{meta['settings']['shared-prefix']['time_scale']}", "",
             "| cluster choice | requests | TTFT p50 (95 % CI) | TTFT p95 | goodput/min (95 % CI) | cache hit rate | hub routing p50 / p90 / p99 | spokes' tokenize / decision p99 | hub CPU per request | spoke→hub B/s | KV events B/s | ratio |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]

    def ci(r, key):
        c = (r.get("ci95") or {}).get(key)
        return f" ({c[0]:.0f}–{c[1]:.0f})" if c else ""

    for name in ROUTERS:
        r = by.get(name)
        if not r:
            continue
        f = r["federation"]
        cpu = "n/a" if f["hub_cpu_ms_per_request"] is None else f"{f['hub_cpu_ms_per_request']:.2f} ms"
        ratio = "n/a" if not f["bytes_ratio"] else f"1/{1 / f['bytes_ratio']:.0f}"
        lines.append(
            f"| {name} | {r['requests']} | {r['ttft_ms_p50']:.0f} ms{ci(r, 'ttft_ms_p50')} | {r['ttft_ms_p95']:.0f} ms | "
            f"{r['goodput_per_min']:.1f}{ci(r, 'goodput_per_min')} | {r['cache_hit_rate'] or 0:.3f} | "
            f"≤ {f['route_ms_p50_bucket']} / ≤ {f['route_ms_p90_bucket']} / ≤ {f['route_ms_p99_bucket']} ms | "
            f"≤ {f['spoke_tokenize_ms_p99_bucket']} / ≤ {f['spoke_decision_ms_p99_bucket']} ms | {cpu} | "
            f"{f['spoke_to_hub_bytes_per_s']:.0f} | {f['kv_event_bytes_per_s']:.0f} | {ratio} |")
    goals = []
    ca, ll = by.get("hub-cache-aware"), by.get("hub-least-loaded")
    if ca and ll:
        ratio = ll["ttft_ms_p50"] / max(ca["ttft_ms_p50"], 1e-9)
        good = ca["goodput_per_min"] / max(ll["goodput_per_min"], 1e-9)
        goals.append(f"| median TTFT ≥ 3× lower than least-loaded | {ratio:.1f}× | {'met' if ratio >= 3 else 'not met'} |")
        goals.append(f"| goodput ≥ 2× least-loaded | {good:.2f}× | {'met' if good >= 2 else 'not met'} |")
        p99 = ca["federation"]["route_ms_p99_bucket"]
        goals.append(f"| hub routing p99 ≤ 2 ms (bucket bound) | ≤ {p99} ms | {'met' if p99 is not None and p99 <= 2 else 'not met'} |")
        ratio_b = ca["federation"]["bytes_ratio"]
        shown = "n/a" if not ratio_b else f"1/{1 / ratio_b:.0f}"
        goals.append(f"| spoke → hub bytes ≤ 1/10 of KV-event bytes | {shown} | "
                     f"{'met' if ratio_b is not None and ratio_b <= 0.1 else 'not met'} |")
    if goals:
        lines += ["", "| goal | measured | |", "|---|---|---|", *goals]
    lines += ["", "TTFTs and goodput at time scale 1 (measured ÷ time scale), like the routing benchmark. "
              "Hub routing time is wall time per request from arrival until the request is sent to a spoke "
              "(tokenization, prefix lookup, planning), as the smallest histogram bucket bound holding 50 / 90 / "
              "99 % of the window's requests. Beside it, the same bound for the spokes' own tokenization and "
              "decision in the same window (the same kind of work on the same machine), and the hub process's "
              "CPU time (user + system) over the window per routed request.", ""]
    (out / "report.md").write_text("\n".join(lines))
