"""Runs the routing benchmark of ../../shared/BENCHMARK.md and writes results.json,
report.md and PNG plots.

Each router gets a fresh fleet (same profile, seed and time scale); each workload runs its
concurrency levels in turn on it. Load comes from GuideLLM with the simulator's own tokenizer
directory, so token counts agree. Figures are reported at time scale 1 (measured durations
divided by the time scale). Every process started here is stopped by its PID, also on
failure or Ctrl-C.
"""

import argparse
import json
import os
import queue
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

ROUTERS = ["random", "round-robin", "sglang-cache-aware", "vllm-router-cache-aware", "switchyard", "oracle"]
WORKLOADS = ["control", "shared-prefix", "multi-turn"]
SLO_MS = {"control": 8000, "shared-prefix": 8000, "multi-turn": 4000}
# Settings of the two modes per workload, in wall seconds at the workload's time scale.
# Every wall millisecond of overhead (HTTP, JSON, tokenisation, the Python client, a busy
# core) counts 1/scale ms at scale 1, so each workload runs at the smallest scale whose
# figures that overhead does not distort:
# - shared-prefix at 0.25: its cached TTFTs are ~170 ms, so overhead matters most here;
#   104 s of simulated warm-up place the 24 prefixes;
# - multi-turn at 0.2: 110 s warm-up (80 s left its conversations' first turns in the
#   window); its goal is goodput, which a few tens of ms do not move;
# - control at 0.1: its requests take ~95 s at c = 32 and the first waves' synchronised
#   prefills decide any shorter window's p95, so it measures after 180 s of warm-up; its
#   figures are tens of seconds, where 10× overhead does not show.
# The quick mode's windows give every router × workload cell at least MIN_REQUESTS
# completed requests (the slowest cells in earlier runs: control ~3.5 requests per wall
# second, random's shared-prefix ~2.0, multi-turn ~6.0), and it runs only the routers its
# goals compare: the peers, Switchyard and the oracle everywhere, random on shared-prefix
# (the 30× goal). Round-robin, and random elsewhere, are in the full mode.
MIN_REQUESTS = 150
_GOAL_ROUTERS = ["sglang-cache-aware", "vllm-router-cache-aware", "switchyard", "oracle"]
QUICK = {"concurrency": "32", "workloads": {
    "control": {"time_scale": 0.1, "warmup": 18.0, "rampup": 4.0, "duration": 56.0},
    "shared-prefix": {"time_scale": 0.25, "warmup": 26.0, "rampup": 10.0, "duration": 80.0},
    "multi-turn": {"time_scale": 0.2, "warmup": 22.0, "rampup": 8.0, "duration": 28.0}},
    "routers": {"control": _GOAL_ROUTERS, "shared-prefix": ["random", *_GOAL_ROUTERS], "multi-turn": _GOAL_ROUTERS}}
_FULL_CACHED = {"time_scale": 0.2, "warmup": 40.0, "rampup": 10.0, "duration": 60.0}
FULL = {"concurrency": "4,8,16,24,32", "workloads": {
    "control": {"time_scale": 0.2, "warmup": 40.0, "rampup": 10.0, "duration": 120.0},
    "shared-prefix": {"time_scale": 0.25, "warmup": 50.0, "rampup": 12.5, "duration": 75.0},
    "multi-turn": _FULL_CACHED},
    "routers": {w: ROUTERS for w in WORKLOADS}}
PROCS = []


def log(msg):
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(args, logfile):
    proc = subprocess.Popen(args, stdout=open(logfile, "w"), stderr=subprocess.STDOUT, start_new_session=True)
    PROCS.append(proc)
    return proc


def stop(proc):
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=15)
        except (subprocess.TimeoutExpired, ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    if proc in PROCS:
        PROCS.remove(proc)


def stop_all(*_):
    for p in list(PROCS):
        stop(p)
    if _:
        sys.exit(130)


def wait_http(url, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url} did not come up")


def start_fleet(opts, outdir, time_scale):
    ready = outdir / "fleet-ready.json"
    ready.unlink(missing_ok=True)
    # Port 0 everywhere: the kernel picks free ports and the ready file reports them.
    kv = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": "tcp://*:0", "replay_endpoint": "tcp://*:0"}
    proc = start([opts.bin, "sim", "--workers", str(opts.workers), "--port", "0", "--profile", opts.profile,
                  "--time-scale", str(time_scale), "--seed", str(opts.seed), "--enable-prompt-tokens-details",
                  "--tokenizer", str(opts.tokenizer), "--kv-events-config", json.dumps(kv), "--ready-file", str(ready)],
                 outdir / "fleet.log")
    deadline = time.time() + 60
    while not ready.exists():
        if proc.poll() is not None or time.time() > deadline:
            raise RuntimeError("fleet did not start: " + (outdir / "fleet.log").read_text())
        time.sleep(0.1)
    return proc, json.loads(ready.read_text())["workers"]


def spoke_yaml(opts, workers, time_scale):
    eps = "\n".join(
        f"    - {{name: w{w['index']}, host: 127.0.0.1, httpPort: {w['url'].rsplit(':', 1)[1]}, "
        f"kvEventsPort: {w['kvEvents'].rsplit(':', 1)[1]}, kvReplayPort: {w['kvReplay'].rsplit(':', 1)[1]}}}" for w in workers)
    rate = int(1000 / opts.profile_prefill_ms / time_scale)
    return f"""apiVersion: switchyard.dev/v1alpha1
kind: InferenceWorkerSet
metadata: {{name: bench}}
spec:
  model: sim-model
  cluster: bench
  endpoints:
    static:
{eps}
  kvBlockSize: 16
  capacity: {{prefillTokensPerSecond: {rate}}}
  tokenizer: {{source: Files, path: {opts.tokenizer}}}
---
apiVersion: switchyard.dev/v1alpha1
kind: InferencePool
metadata: {{name: bench}}
spec:
  members: [{{workerSet: bench}}]
---
apiVersion: switchyard.dev/v1alpha1
kind: GatewayBackend
metadata: {{name: bench}}
spec:
  models: [{{name: sim-model, pool: bench}}]
"""


def start_router(name, opts, workers, outdir, time_scale):
    port = free_port()
    urls = [w["url"] for w in workers]
    venv = Path(os.environ["BENCH_VENV"]) / "bin"
    if name in ("random", "round-robin", "oracle"):
        args = [opts.bin, "lb", "--policy", name, "--listen", f"127.0.0.1:{port}", "--seed", str(opts.seed)]
        for u in urls:
            args += ["--worker", u]
        health = "/health"
    elif name == "sglang-cache-aware":
        args = [str(venv / "smg"), "launch", "--host", "127.0.0.1", "--port", str(port), "--prometheus-host", "127.0.0.1",
                "--prometheus-port", str(free_port()), "--policy", "cache_aware", "--worker-urls", *urls]
        health = "/v1/models"
    elif name == "vllm-router-cache-aware":
        args = [str(venv / "vllm-router"), "--host", "127.0.0.1", "--port", str(port), "--prometheus-host", "127.0.0.1",
                "--prometheus-port", str(free_port()), "--policy", "cache_aware", "--worker-urls", *urls]
        health = "/health"
    elif name == "switchyard":
        cfg = outdir / "spoke-config"
        cfg.mkdir(exist_ok=True)
        (cfg / "fleet.yaml").write_text(spoke_yaml(opts, workers, time_scale))
        args = [opts.bin, "spoke", "--config", str(cfg), "--listen", f"127.0.0.1:{port}", "--admin-listen", "127.0.0.1:0"]
        health = "/readyz"
    else:
        raise ValueError(name)
    proc = start(args, outdir / f"router-{name}.log")
    wait_http(f"http://127.0.0.1:{port}{health}")
    return proc, f"http://127.0.0.1:{port}"


def data_spec(workload, opts):
    if workload == "control":
        return {"kind": "synthetic_text", "prompt_tokens": opts.prefix_tokens + opts.unique_tokens, "output_tokens": opts.output_tokens}
    if workload == "shared-prefix":
        return {"kind": "synthetic_text", "prompt_tokens": opts.unique_tokens, "output_tokens": opts.output_tokens,
                "prefix_tokens": opts.prefix_tokens, "prefix_count": opts.prefix_count}
    # Multi-turn: each conversation starts with a unique first turn, every later turn adds
    # `turn_tokens` new tokens to the full history (GuideLLM keeps the history).
    return {"kind": "synthetic_text", "turns": opts.turns, "first_prompt_tokens": opts.first_turn_tokens,
            "prompt_tokens": opts.turn_tokens, "output_tokens": opts.output_tokens}


def sim_counters(workers):
    """(prefix-cache hit tokens, queried tokens, seconds behind schedule), summed over the fleet."""
    hits = queries = behind = 0.0
    for w in workers:
        for line in httpx.get(w["url"] + "/metrics", timeout=5).text.splitlines():
            if line.startswith("vllm:prefix_cache_hits_total"):
                hits += float(line.rsplit(" ", 1)[1])
            elif line.startswith("vllm:prefix_cache_queries_total"):
                queries += float(line.rsplit(" ", 1)[1])
            elif line.startswith("sim:behind_schedule_seconds_total"):
                behind += float(line.rsplit(" ", 1)[1])
    return hits, queries, behind


class CounterSampler:
    """Samples the fleet's counters once a second, so rates can be taken over exactly
    GuideLLM's measurement window (the warm-up excluded)."""

    def __init__(self, workers):
        self.workers = workers
        self.samples = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self):
        while True:
            try:
                self.samples.append((time.time(), *sim_counters(self.workers)))
            except httpx.HTTPError:
                pass
            if self.done.wait(1.0):
                return

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *_):
        self.done.set()
        self.thread.join()

    def _deltas(self, start, end):
        if not self.samples:
            return None
        first = min(self.samples, key=lambda s: abs(s[0] - start))
        last = min(self.samples, key=lambda s: abs(s[0] - end))
        return [b - a for a, b in zip(first, last)]

    def hit_rate(self, start, end):
        d = self._deltas(start, end)
        return d[1] / d[2] if d and d[2] > 0 else 0.0

    def behind_schedule(self, start, end):
        """Share of the window's wall time by which the average worker fell behind its timing
        model: 0 means the fleet kept to the model; figures are then exact at scale 1."""
        d = self._deltas(start, end)
        return d[3] / (d[0] * len(self.workers)) if d and d[0] > 0 else 0.0


class GuideLLM:
    """One long-lived `guidellm_driver.py` process running every load test of the benchmark.

    GuideLLM's worker processes come from a fork server and are capped at a few: on two cores
    its default (spawned interpreters, up to ten) costs ~12 s of CPU per run, which would
    compete with the fleet under test."""

    def __init__(self, logfile):
        self.logfile = open(logfile, "a")
        self.proc = None
        self.lines = queue.Queue()

    def _ensure(self):
        if self.proc and self.proc.poll() is None:
            return
        venv = Path(os.environ["BENCH_VENV"]) / "bin"
        env = dict(os.environ, GUIDELLM__MP_CONTEXT_TYPE="forkserver", GUIDELLM__MAX_WORKER_PROCESSES="4")
        env.pop("GUIDELLM__DISABLE_PROGRESS", None)
        self.proc = subprocess.Popen([str(venv / "python"), str(Path(__file__).with_name("guidellm_driver.py"))],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.logfile, text=True,
                                     env=env, start_new_session=True)
        PROCS.append(self.proc)
        self.lines = queue.Queue()
        out, lines, log = self.proc.stdout, self.lines, self.logfile

        def pump():
            for line in out:
                if line.startswith("done "):
                    lines.put(line)
                else:
                    log.write(line)
                    log.flush()
            lines.put(None)

        threading.Thread(target=pump, daemon=True).start()

    def run(self, args, timeout):
        self._ensure()
        self.logfile.write(f"\n==== guidellm {' '.join(args)}\n")
        self.logfile.flush()
        self.proc.stdin.write(json.dumps(args) + "\n")
        self.proc.stdin.flush()
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            stop(self.proc)
            raise RuntimeError(f"GuideLLM did not finish within {timeout:.0f} s")
        if line is None or line.split()[1] != "0":
            stop(self.proc)
            raise RuntimeError(f"GuideLLM failed ({(line or 'exited').strip()}); see {self.logfile.name}")


def run_guidellm(guidellm, url, workload, concurrency, settings, opts, outpath):
    warmup, duration = settings["warmup"], settings["duration"]
    args = ["run",
            "--backend", f"kind=openai_http,target={url},model=sim-model,request_format=/v1/chat/completions",
            # The warm-up is excluded from every figure: steady state is what a fleet lives in,
            # and the same load runs through the router under test during it. The ramp-up
            # starts the streams over a few seconds instead of in one burst.
            "--profile", f"kind=concurrent,streams={concurrency},warmup={warmup},rampup_duration={settings['rampup']}",
            "--constraint", f"kind=max_duration,seconds={warmup + duration}",
            "--tokenizer", f"kind=hf_auto,model={opts.tokenizer}",
            "--data", json.dumps(data_spec(workload, opts)),
            "--output", f"kind=json,path={outpath}", "--disable-progress"]
    guidellm.run(args, timeout=(warmup + duration) * 4 + 120)
    return json.loads(outpath.read_text())


def percentile(values, q):
    """Linear-interpolated percentile (numpy's default), None for no values."""
    if not values:
        return None
    v = sorted(values)
    k = (len(v) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


# Bootstrap resamples behind every 95 % interval (fixed seed: the same data gives the same interval).
BOOTSTRAP_RESAMPLES = 1000


def poisson1(rng):
    """A Poisson(1) draw (Knuth's method: few uniforms at this rate)."""
    limit, k, p = 0.36787944117144233, 0, rng.random()
    while p > limit:
        k += 1
        p *= rng.random()
    return k


def bootstrap_ci(ttft, window_s, slo_ms, resamples=BOOTSTRAP_RESAMPLES, seed=0):
    """95 % bootstrap intervals of the median and p95 TTFT and of goodput.

    Median and p95: requests resampled with replacement (percentile bootstrap). Goodput is a
    count per window, so it is resampled the Poisson way (each request weighted by a
    Poisson(1) draw): resampling a fixed number of requests would give it no spread at all
    whenever every request meets the SLO, although another run of the same window completes
    a different number of them. Each interval is the 2.5th–97.5th percentile of the statistic
    over the resamples. None without requests."""
    if not ttft:
        return None
    rng = random.Random(seed)
    good_requests = sum(1 for t in ttft if t <= slo_ms)
    p50, p95, good = [], [], []
    for _ in range(resamples):
        sample = rng.choices(ttft, k=len(ttft))
        p50.append(percentile(sample, 0.5))
        p95.append(percentile(sample, 0.95))
        good.append(sum(poisson1(rng) for _ in range(good_requests)) / window_s * 60)
    interval = lambda xs: [percentile(xs, 0.025), percentile(xs, 0.975)]  # noqa: E731
    return {"ttft_ms_p50": interval(p50), "ttft_ms_p95": interval(p95), "goodput_per_min": interval(good)}


def window_requests(bench):
    """Successful requests that completed inside the measurement window (after the warm-up).

    Every figure comes from these per-request records, so the definitions are ours and stated
    in the README rather than whatever a GuideLLM version aggregates."""
    start, end = bench["start_time"], bench["end_time"]
    return [r for r in bench["requests"]["successful"] if start <= (r.get("request_end_time") or 0) <= end + 1e-6]


def summarise(raw, workload, time_scale, hit_rate):
    b = raw["benchmarks"][0]
    scale = time_scale
    reqs = window_requests(b)
    window_s = max(1e-9, b["end_time"] - b["start_time"]) / scale
    ttft = [r["time_to_first_token_ms"] / scale for r in reqs if r.get("time_to_first_token_ms") is not None]
    itl = [r["inter_token_latency_ms"] / scale for r in reqs if r.get("inter_token_latency_ms") is not None]
    e2e = [r["request_latency"] / scale for r in reqs if r.get("request_latency") is not None]
    good = sum(1 for t in ttft if t <= SLO_MS[workload])
    incomplete = len(b["requests"].get("incomplete") or [])
    return {
        "ttft_ms_p50": percentile(ttft, 0.5) or 0.0,
        "ttft_ms_p95": percentile(ttft, 0.95) or 0.0,
        "itl_ms_p50": percentile(itl, 0.5) or 0.0,
        "e2e_s_p50": percentile(e2e, 0.5) or 0.0,
        "requests": len(reqs),
        "requests_per_min": len(reqs) / window_s * 60,
        "goodput_per_min": good / window_s * 60,
        "ci95": bootstrap_ci(ttft, window_s, SLO_MS[workload]),
        "cache_hit_rate": hit_rate,
        "slo_ms": SLO_MS[workload],
        "incomplete_at_end": incomplete,
        "time_scale": scale,
        "measured": {"window_s": b["end_time"] - b["start_time"], "warmup_s": b.get("warmup_duration"),
                     "ttft_ms_p50": (percentile(ttft, 0.5) or 0.0) * scale},
    }


def machine():
    cpu = "unknown"
    try:
        cpu = next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return {"cores": os.cpu_count(), "cpu": cpu, "memory_gib": round(mem_gib, 1), "uname": " ".join(os.uname())}


def versions(opts):
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for pkg in ("guidellm", "sglang-router", "vllm-router"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = None
    try:
        out["switchyard"] = subprocess.run([opts.bin, "--version"], capture_output=True, text=True,
                                           timeout=10).stdout.strip().removeprefix("switchyard ")
        out["switchyard_commit"] = subprocess.run(["git", "-C", opts.repo, "describe", "--always", "--dirty"], capture_output=True,
                                                  text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repo", required=True)
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true")
    mode.add_argument("--full", action="store_true")
    ap.add_argument("--out", default="results/bench")
    ap.add_argument("--routers", help="comma-separated; default: the mode's routers per workload")
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--concurrency", help="comma-separated list")
    # Each of these overrides the mode's setting for every workload.
    ap.add_argument("--duration", type=float, help="measured seconds per point (wall time)")
    ap.add_argument("--time-scale", type=float, help="multiplier on every simulated duration")
    ap.add_argument("--warmup", type=float, help="seconds of load before measuring (wall time)")
    ap.add_argument("--rampup", type=float, help="seconds over which the streams start (wall time)")
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--profile", default="l40s-27b-fp8")
    ap.add_argument("--prefix-count", type=int, default=24)
    ap.add_argument("--prefix-tokens", type=int, default=16000)
    ap.add_argument("--unique-tokens", type=int, default=256)
    ap.add_argument("--first-turn-tokens", type=int, default=8000)
    ap.add_argument("--turn-tokens", type=int, default=400)
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--output-tokens", type=int, default=300)
    ap.add_argument("--seed", type=int, default=1)
    opts = ap.parse_args()
    opts.bin = os.environ["SWITCHYARD_BIN"]
    opts.tokenizer = Path(opts.repo) / "tokenizer" / "files"
    opts.profile_prefill_ms = {"l40s-27b-fp8": 0.42, "tiny": 0.01}.get(opts.profile, 0.42)
    # Quick: the sweep's top point only, where routing decides the most (see README.md);
    # full: the whole sweep with longer windows. Explicit options override either.
    mode = FULL if opts.full else QUICK
    opts.concurrency = [int(c) for c in (opts.concurrency or mode["concurrency"]).split(",")]
    overrides = {k: getattr(opts, k) for k in ("time_scale", "warmup", "rampup", "duration") if getattr(opts, k) is not None}
    settings = {w: {**mode["workloads"][w], **overrides} for w in WORKLOADS}
    workloads = opts.workloads.split(",")
    chosen = opts.routers.split(",") if opts.routers else None
    routers_for = {w: chosen or mode["routers"][w] for w in workloads}
    routers = [r for r in ROUTERS if any(r in routers_for[w] for w in workloads)] + \
        [r for r in (chosen or []) if r not in ROUTERS]
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGINT, stop_all)
    signal.signal(signal.SIGTERM, stop_all)
    command = "e2e/bench/run " + " ".join(sys.argv[3:])
    runs = []
    started = time.time()
    guidellm = GuideLLM(out / "guidellm.log")
    try:
        for router in routers:
            for workload in [w for w in workloads if router in routers_for[w]]:
                rdir = out / "runs" / router / workload
                rdir.mkdir(parents=True, exist_ok=True)
                scale = settings[workload]["time_scale"]
                fleet, workers = start_fleet(opts, rdir, scale)
                rproc = None
                try:
                    rproc, url = start_router(router, opts, workers, rdir, scale)
                    for c in opts.concurrency:
                        log(f"{router} · {workload} · c={c}")
                        with CounterSampler(workers) as counters:
                            raw = run_guidellm(guidellm, url, workload, c, settings[workload], opts,
                                               rdir / f"guidellm-c{c}.json")
                        bench = raw["benchmarks"][0]
                        window = (bench["start_time"], bench["end_time"])
                        run = summarise(raw, workload, scale, counters.hit_rate(*window))
                        run["fleet_behind_schedule"] = counters.behind_schedule(*window)
                        runs.append({"router": router, "workload": workload, "concurrency": c, **run})
                        (out / "results.json").write_text(json.dumps({"runs": runs}, indent=2))
                finally:
                    if rproc:
                        stop(rproc)
                    stop(fleet)
    finally:
        stop_all()
    meta = {"command": command, "profile": opts.profile, "workers": opts.workers,
            "settings": {w: settings[w] for w in workloads}, "routers": routers_for, "min_requests": MIN_REQUESTS,
            "concurrency": opts.concurrency, "wall_s": round(time.time() - started),
            "machine": machine(), "versions": versions(opts), "seed": opts.seed, "slo_ms": SLO_MS,
            "workloads": {w: data_spec(w, opts) for w in workloads}}
    (out / "results.json").write_text(json.dumps({"meta": meta, "runs": runs}, indent=2))
    from report import write_report
    write_report(out, meta, runs)
    log(f"wrote {out}/results.json, {out}/report.md and plots in {meta['wall_s']} s")


if __name__ == "__main__":
    main()
