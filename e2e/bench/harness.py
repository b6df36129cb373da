"""Runs the routing benchmark of ../../shared/BENCHMARK.md and writes results.json,
report.md and PNG plots.

Each router gets a fresh fleet (same profile, seed and time scale); each workload runs its
load points (concurrency levels, or Poisson arrival rates) in turn on it. Load comes from
GuideLLM with the simulator's own tokenizer directory, so token counts agree. Figures are
reported at time scale 1 (measured durations divided by the time scale). Every process
started here is stopped by its PID, also on failure or Ctrl-C.
"""

import argparse
import hashlib
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

import configs
import federation

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
# --federation: shared-prefix at the quick mode's settings, the hub's three cluster choices.
FEDERATION = {"concurrency": "32", "workloads": {**QUICK["workloads"]},
              "routers": {w: federation.ROUTERS for w in WORKLOADS}}
PROCS = []
# --api: the OpenAI endpoint GuideLLM drives (its openai_http backend's `request_format`); the
# routers forward it, so every router and the simulated workers serve the same API.
API_PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
# With Poisson arrivals GuideLLM caps the requests in flight at this (its profile's
# `max_concurrency`); arrivals beyond it wait in GuideLLM and show as dispatch delay.
MAX_OUTSTANDING = 256
# A "delay" above this many seconds is an epoch timestamp, not a delay (see summarise).
ABSOLUTE_TIME_S = 1e8


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


def slow_worker(workers, factor):
    """Slows the first worker: every engine step takes `factor` × its modelled time (the
    simulator's `slowdown` fault knob). Reads every worker's knobs back and fails the run
    unless the first is at `factor` and the others at 1."""
    first = workers[0]["url"]
    r = httpx.post(first + "/sim/faults", json={"slowdown": factor}, timeout=5)
    if r.status_code != 200:
        raise RuntimeError(f"POST {first}/sim/faults answered {r.status_code}: {r.text}")
    for i, w in enumerate(workers):
        got = httpx.get(w["url"] + "/sim/faults", timeout=5).json().get("slowdown")
        want = factor if i == 0 else 1.0
        if got is None or abs(got - want) > 1e-9 * max(1.0, want):
            raise RuntimeError(f"worker {w['index']} reports slowdown {got}, expected {want}")
    log(f"worker {workers[0]['index']} slowed down {factor}× (GET /sim/faults confirms)")


def spoke_yaml(opts, workers, time_scale):
    return configs.worker_set_yaml(opts, workers, time_scale, "bench", "bench") + configs.front_yaml(["bench"], "bench")


def start_router(name, opts, workers, outdir, time_scale):
    port = free_port()
    urls = [w["url"] for w in workers]
    venv = Path(os.environ["BENCH_VENV"]) / "bin"
    if name in ("random", "round-robin", "least-outstanding", "oracle"):
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
        admin = free_port()
        metrics_url = f"http://127.0.0.1:{admin}/metrics"
        args = [opts.bin, "spoke", "--config", str(cfg), "--listen", f"127.0.0.1:{port}", "--admin-listen",
                f"127.0.0.1:{admin}"]
        health = "/readyz"
    else:
        raise ValueError(name)
    proc = start(args, outdir / f"router-{name}.log")
    wait_http(f"http://127.0.0.1:{port}{health}")
    return proc, f"http://127.0.0.1:{port}", metrics_url if name == "switchyard" else None


def tokenize_totals(metrics_url):
    """(seconds, prompts) the spoke has spent tokenizing before its decisions, from its admin
    `/metrics`; None for a router that does not report it."""
    if not metrics_url:
        return None
    total = [0.0, 0.0]
    for line in httpx.get(metrics_url, timeout=10).text.splitlines():
        for i, suffix in enumerate(("_sum", "_count")):
            if line.startswith("switchyard_spoke_tokenize_seconds" + suffix):
                total[i] += float(line.rsplit(" ", 1)[1])
    return total


def tokenize_ms_mean(before, after):
    """Mean wall milliseconds of tokenization per prompt between two `tokenize_totals`."""
    if not before or not after or after[1] <= before[1]:
        return None
    return (after[0] - before[0]) / (after[1] - before[1]) * 1000


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


# The fleet counters the benchmark samples, in the order `sim_counters` returns them.
SIM_COUNTERS = ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total", "sim:behind_schedule_seconds_total",
                "vllm:num_preemptions_total", "vllm:time_to_first_token_seconds_sum",
                "vllm:time_to_first_token_seconds_count", "vllm:request_queue_time_seconds_sum",
                "vllm:request_queue_time_seconds_count")


def sim_counters(workers):
    """The SIM_COUNTERS summed over the fleet: prefix-cache hit and queried tokens, seconds
    behind schedule, preemptions, and the engines' TTFT and queue-time sums and counts. The
    engines' own TTFT runs from the request reaching the engine loop to its first token, wall
    time."""
    totals = dict.fromkeys(SIM_COUNTERS, 0.0)
    for w in workers:
        for line in httpx.get(w["url"] + "/metrics", timeout=5).text.splitlines():
            name = line.split("{", 1)[0].split(" ", 1)[0]
            if name in totals:
                totals[name] += float(line.rsplit(" ", 1)[1])
    return tuple(totals[n] for n in SIM_COUNTERS)


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

    def preemptions(self, start, end):
        """Requests the engines preempted (KV cache exhausted, work recomputed) in the window."""
        d = self._deltas(start, end)
        return round(d[4]) if d else 0

    def engine_means_ms(self, start, end, time_scale):
        """Mean TTFT and queue time the engines measured for the requests that got their first
        token (TTFT) or finished (queue time) in the window, at scale 1: beside the client's
        TTFT, what the path to the engine adds."""
        d = self._deltas(start, end)
        if not d:
            return None, None
        mean = lambda total, n: total / n * 1000 / time_scale if n > 0 else None
        return mean(d[5], d[6]), mean(d[7], d[8])


class GuideLLM:
    """One long-lived `guidellm_driver.py` process running every load test of the benchmark.

    GuideLLM's worker processes come from a fork server and are capped at a few: on two cores
    its default (spawned interpreters, up to ten) costs ~12 s of CPU per run, which would
    compete with the fleet under test. Poisson arrivals get one worker process: in GuideLLM
    0.8.1 every worker process draws the inter-arrival gaps from its own copy of one seeded
    generator, so with four of them each gap occurs four times in a row and the arrivals are
    not a Poisson process."""

    def __init__(self, logfile, worker_processes=4):
        self.worker_processes = worker_processes
        self.logfile = open(logfile, "a")
        self.proc = None
        self.lines = queue.Queue()

    def _ensure(self):
        if self.proc and self.proc.poll() is None:
            return
        venv = Path(os.environ["BENCH_VENV"]) / "bin"
        env = dict(os.environ, GUIDELLM__MP_CONTEXT_TYPE="forkserver", GUIDELLM__MAX_WORKER_PROCESSES=str(self.worker_processes))
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


def point_label(arrival, value):
    """How a load point is named in logs, file names' stems and reports: `c=32`, `rate=2.0/s`."""
    return f"c={value}" if arrival == "concurrent" else f"rate={value:g}/s"


def profile_arg(opts, point, settings):
    """GuideLLM's `--profile` for one load point. The warm-up is excluded from every figure:
    steady state is what a fleet lives in, and the same load runs through the router under test
    during it. Concurrent: `point` streams, started over the ramp-up instead of in one burst.
    Poisson: `point` requests per wall second, exponential gaps (GuideLLM's Poisson strategy
    has no ramp-up), at most `max_outstanding` in flight."""
    if opts.arrival == "concurrent":
        return f"kind=concurrent,streams={point},warmup={settings['warmup']},rampup_duration={settings['rampup']}"
    return f"kind=poisson,rate={point},max_concurrency={opts.max_outstanding},warmup={settings['warmup']}"


def run_guidellm(guidellm, url, workload, point, settings, opts, outpath, fed=None):
    """GuideLLM's run of one point. With a federation `fed`, its counters are sampled when the
    warm-up ends and when the run does (`fed.samples`)."""
    warmup, duration = settings["warmup"], settings["duration"]
    args = ["run",
            "--backend", f"kind=openai_http,target={url},model=sim-model,request_format={API_PATHS[opts.api]}",
            "--profile", profile_arg(opts, point, settings),
            "--constraint", f"kind=max_duration,seconds={warmup + duration}",
            "--tokenizer", f"kind=hf_auto,model={opts.tokenizer}",
            "--data", json.dumps(data_spec(workload, opts)),
            "--output", f"kind=json,path={outpath}", "--disable-progress"]
    if fed is None:
        guidellm.run(args, timeout=(warmup + duration) * 4 + 120)
        return json.loads(outpath.read_text())
    # GuideLLM's warm-up begins once its streams start (a few seconds after launch).
    samples = {}

    def sample_after_warmup():
        time.sleep(warmup + 3)
        samples["before"] = fed.sample()
    sampler = threading.Thread(target=sample_after_warmup, daemon=True)
    sampler.start()
    guidellm.run(args, timeout=(warmup + duration) * 4 + 120)
    sampler.join()
    fed.samples = (samples["before"], fed.sample())
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


def window_requests(bench, by_arrival=False):
    """Successful requests that completed inside the measurement window (after the warm-up);
    with `by_arrival` (open-loop arrivals), those sent inside it instead.

    Every figure comes from these per-request records, so the definitions are ours and stated
    in the README rather than whatever a GuideLLM version aggregates. Open-loop cells select by
    arrival because a backlog left by the warm-up (GuideLLM sends the arrivals it scheduled
    while it was still starting up in one burst) would otherwise finish inside the window and
    be counted against whichever router was draining it."""
    start, end = bench["start_time"], bench["end_time"]
    key = "request_start_time" if by_arrival else "request_end_time"
    return [r for r in bench["requests"]["successful"] if start <= (r.get(key) or 0) <= end + 1e-6]


STARTUP_BURST_S = 2.0


def startup_burst(bench):
    """Requests GuideLLM sent within the first STARTUP_BURST_S seconds of the cell (warm-up
    included): the arrivals it scheduled while starting up and sent at once."""
    starts = [r["request_start_time"] for k in ("successful", "incomplete", "errored")
              for r in (bench["requests"].get(k) or []) if r.get("request_start_time")]
    return sum(1 for t in starts if t <= min(starts) + STARTUP_BURST_S) if starts else 0


def summarise(raw, workload, time_scale, hit_rate, open_loop=False):
    b = raw["benchmarks"][0]
    scale = time_scale
    reqs = window_requests(b, by_arrival=open_loop)
    window_s = max(1e-9, b["end_time"] - b["start_time"]) / scale
    ttft = [r["time_to_first_token_ms"] / scale for r in reqs if r.get("time_to_first_token_ms") is not None]
    itl = [r["inter_token_latency_ms"] / scale for r in reqs if r.get("inter_token_latency_ms") is not None]
    e2e = [r["request_latency"] / scale for r in reqs if r.get("request_latency") is not None]
    good = sum(1 for t in ttft if t <= SLO_MS[workload])
    incomplete = len(b["requests"].get("incomplete") or [])
    # Open-loop arrivals: how late GuideLLM sent requests against their scheduled arrival (the
    # cap on requests in flight, or a client that cannot keep up), without a multi-turn
    # request's wait for its previous turn. Concurrent streams send as soon as they can, so
    # there it means nothing and is not recorded.
    delay = [(r["turn_scheduling_delay"] if r.get("turn_scheduling_delay") is not None else r.get("request_dispatch_delay"))
             for r in reqs] if open_loop else []
    # GuideLLM 0.8.1 reports some requests' delay as the absolute dispatch time (its target time
    # was unset: seen for requests held back while the cap on requests in flight bound); such a
    # value is no delay.
    unscheduled = sum(1 for d in delay if d is not None and d > ABSOLUTE_TIME_S)
    delay = [d * 1000 / scale for d in delay if d is not None and d <= ABSOLUTE_TIME_S]
    return {
        "ttft_ms_p50": percentile(ttft, 0.5) or 0.0,
        "ttft_ms_p95": percentile(ttft, 0.95) or 0.0,
        "ttft_ms_mean": sum(ttft) / len(ttft) if ttft else 0.0,
        "itl_ms_p50": percentile(itl, 0.5) or 0.0,
        "e2e_s_p50": percentile(e2e, 0.5) or 0.0,
        "requests": len(reqs),
        "requests_per_min": len(reqs) / window_s * 60,
        "goodput_per_min": good / window_s * 60,
        "ci95": bootstrap_ci(ttft, window_s, SLO_MS[workload]),
        "cache_hit_rate": hit_rate,
        "slo_ms": SLO_MS[workload],
        "incomplete_at_end": incomplete,
        "dispatch_delay_ms_p50": percentile(delay, 0.5),
        "dispatch_unscheduled": unscheduled if open_loop else None,
        "startup_burst": startup_burst(b) if open_loop else None,
        "dispatch_delay_ms_p95": percentile(delay, 0.95),
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


def run_plan(opts, settings, routers_for, workloads):
    """What decides a run's figures: a run may only be resumed under the same plan."""
    digest = hashlib.sha256()
    with open(opts.bin, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return {"settings": {w: settings[w] for w in workloads}, "routers": routers_for, "points": opts.points,
            "arrival": opts.arrival, "max_outstanding": opts.max_outstanding, "api": opts.api,
            "slow_worker": opts.slow_worker, "ttft_predictor": opts.ttft_predictor, "dispatch_pacing": opts.dispatch_pacing, "workers": opts.workers, "profile": opts.profile, "seed": opts.seed,
            "workload_options": {k: getattr(opts, k) for k in ("prefix_count", "prefix_tokens", "unique_tokens",
                                                                "first_turn_tokens", "turn_tokens", "turns",
                                                                "output_tokens")},
            # The binary itself, not the commit: a commit that changes only documents between
            # the sessions of a long run does not change what is measured.
            "switchyard_sha256": digest.hexdigest(),
            "versions": {k: v for k, v in versions(opts).items() if k != "switchyard_commit"}}


def resume(out, plan):
    """The finished cells of the run in `out` and the wall time it took, or exit with the reason
    it cannot be continued. A cell (one router on one workload, every load point on one fleet)
    counts only when all its points finished: a half-finished cell runs again from a fresh
    fleet, as it would have run."""
    try:
        before = json.loads((out / "plan.json").read_text())
        results = json.loads((out / "results.json").read_text())
    except (OSError, ValueError) as e:
        sys.exit(f"--resume: no run to continue in {out} ({e})")
    changed = sorted(k for k in plan if before.get(k) != plan[k])
    if changed:
        sys.exit(f"--resume: the run in {out} was made with different {', '.join(changed)}; "
                 "start a new run in another --out")
    if "meta" in results:
        sys.exit(f"--resume: the run in {out} is complete")
    points = {(r["router"], r["workload"], r["point"]) for r in results["runs"]}
    labels = [point_label(plan["arrival"], p) for p in plan["points"]]
    complete = {(r, w) for (r, w, _) in points if all((r, w, label) in points for label in labels)}
    runs = [r for r in results["runs"] if (r["router"], r["workload"]) in complete]
    log(f"resuming {out}: {len(complete)} finished cells kept, {len(results['runs']) - len(runs)} points of unfinished cells dropped")
    return runs, results.get("wall_s", 0)


# The workload shapes `switchyard calibrate` knows (sim/src/calibrate.rs): the harness's defaults.
REFERENCE_PROFILE = "l40s-27b-fp8"
REFERENCE_SHAPES = {"prefix_count": 24, "prefix_tokens": 16000, "unique_tokens": 256, "first_turn_tokens": 8000,
                    "turn_tokens": 400, "turns": 8}


def virtual_time(opts, workloads, settings):
    """Switchyard's and the oracle's figures for the same fleet and load in virtual time:
    `switchyard calibrate` runs the spoke's own decision function (and the oracle's rule) over
    the simulator's engine model with no wall clock in the loop, so the difference to the live
    row is what the live path loses (HTTP, tokenisation, scrape lag, a shared machine). Poisson
    rates are given to the calibrator at time scale 1 (a workload's wall rate times its time
    scale). Returns (rows, why none)."""
    if opts.slow_worker is not None:
        return [], "the calibrator's engines all run at the profile's speed"
    if any(getattr(opts, k) != v for k, v in REFERENCE_SHAPES.items()) or opts.profile != REFERENCE_PROFILE:
        return [], "the calibrator knows the reference workload shapes only, sized for the reference profile"
    poisson = opts.arrival == "poisson"
    # Multi-turn turns wait for their previous answer: the calibrator runs it closed-loop only.
    modelled = [w for w in workloads if not (poisson and w == "multi-turn")]
    if not modelled:
        return [], "multi-turn under Poisson arrivals has no virtual-time counterpart"
    rows = []
    for workload in modelled:
        scale = settings[workload]["time_scale"]
        load = (["--rate", ",".join(f"{r * scale:g}" for r in opts.points)] if poisson
                else ["--concurrency", ",".join(str(c) for c in opts.points)])
        cmd = [opts.bin, "calibrate", "--profile", opts.profile, "--engines", str(opts.workers),
               "--workload", workload, "--routing", "switchyard,oracle", *load, "--requests", "1000", "--warmup", "200",
               "--output-tokens", str(opts.output_tokens), "--seed", str(opts.seed), "--ttft-predictor", opts.ttft_predictor,
               "--dispatch-pacing", opts.dispatch_pacing, "--format", "json"]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            raise RuntimeError(f"switchyard calibrate failed: {done.stderr.strip()}")
        for r in json.loads(done.stdout)["runs"]:
            res, arrival = r["result"], r["spec"]["arrival"]
            # The live row's load point: its concurrency, or its wall rate.
            point = ("poisson", round(arrival["ratePerS"] / scale, 9)) if poisson else ("concurrent", arrival["concurrency"])
            rows.append({"workload": r["spec"]["workload"], "arrival": point[0], "point": point[1], "router": r["routing"],
                         "requests": r["spec"]["requests"], **{k: res[k] for k in (
                             "ttft_ms_p50", "ttft_ms_p95", "requests_per_min", "goodput_per_min", "preemptions_per_request")}})
    return rows, None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repo", required=True)
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true")
    mode.add_argument("--full", action="store_true")
    mode.add_argument("--federation", action="store_true",
                      help="two clusters behind a hub: the hub's cluster choices on shared-prefix (federation.py)")
    ap.add_argument("--out", default="results/bench")
    ap.add_argument("--resume", action="store_true",
                    help="continue the run in --out: keep its finished router × workload cells, run the rest")
    ap.add_argument("--routers", help="comma-separated; default: the mode's routers per workload")
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--concurrency", help="comma-separated list (concurrent arrivals)")
    ap.add_argument("--arrival", choices=["concurrent", "poisson"], default="concurrent",
                    help="concurrent: --concurrency closed-loop streams; poisson: open-loop arrivals at --rate")
    ap.add_argument("--rate", help="comma-separated requests per wall second (poisson arrivals)")
    ap.add_argument("--max-outstanding", type=int,
                    help=f"poisson: most requests in flight, later arrivals wait in GuideLLM (default {MAX_OUTSTANDING})")
    ap.add_argument("--api", choices=sorted(API_PATHS), default="chat",
                    help="OpenAI API driven through every router: chat = /v1/chat/completions, completions = /v1/completions")
    ap.add_argument("--ttft-predictor", choices=["Queue", "EngineReplica"], default="Queue",
                    help="the spoke worker set's ttftPredictor (live and in the virtual-time figures)")
    ap.add_argument("--dispatch-pacing", choices=["Paced", "Immediate"], default="Paced",
                    help="the spoke worker set's dispatchPacing (live and in the virtual-time figures)")
    ap.add_argument("--slow-worker", type=float, metavar="FACTOR",
                    help="slow the first worker: every engine step takes FACTOR x its modelled time")
    # Each of these overrides the mode's setting for every workload.
    ap.add_argument("--duration", type=float, help="measured seconds per point (wall time)")
    ap.add_argument("--time-scale", type=float, help="multiplier on every simulated duration")
    ap.add_argument("--warmup", type=float, help="seconds of load before measuring (wall time)")
    ap.add_argument("--rampup", type=float, help="seconds over which the streams start (wall time)")
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--profile", default="l40s-27b-fp8")
    ap.add_argument("--prefix-count", type=int, help="default 24 (--federation: 48)")
    ap.add_argument("--prefix-tokens", type=int, default=16000)
    ap.add_argument("--unique-tokens", type=int, default=256)
    ap.add_argument("--first-turn-tokens", type=int, default=8000)
    ap.add_argument("--turn-tokens", type=int, default=400)
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--output-tokens", type=int, default=300)
    ap.add_argument("--seed", type=int, default=1)
    opts = ap.parse_args()
    if opts.prefix_count is None:
        opts.prefix_count = federation.PREFIX_COUNT if opts.federation else 24
    opts.bin = os.environ["SWITCHYARD_BIN"]
    opts.tokenizer = Path(opts.repo) / "tokenizer" / "files"
    # What an operator configures for the engines it deploys: their prefill rate (ms per token
    # at time scale 1) and the vLLM arguments --max-num-seqs and --max-num-batched-tokens. The
    # KV capacity the spoke reads from the engines' own vllm:cache_config_info.
    opts.profile_prefill_ms, opts.max_num_seqs, opts.max_num_batched_tokens = {
        "l40s-27b-fp8": (0.42, 64, 8192), "tiny": (0.01, 32, 2048)}.get(opts.profile, (0.42, 64, 8192))
    # Quick: the sweep's top point only, where routing decides the most (see README.md);
    # full: the whole sweep with longer windows. Explicit options override either.
    mode = FULL if opts.full else FEDERATION if opts.federation else QUICK
    if opts.federation:
        opts.workloads = "shared-prefix"
    if opts.arrival == "poisson":
        if not opts.rate:
            ap.error("--arrival poisson needs --rate")
        if opts.concurrency:
            ap.error("--concurrency applies to concurrent arrivals only (Poisson: --rate)")
        if opts.rampup is not None:
            ap.error("--rampup applies to concurrent arrivals only (GuideLLM's Poisson profile has no ramp-up)")
        opts.points = [float(r) for r in opts.rate.split(",")]
        if min(opts.points) <= 0:
            ap.error("--rate must be positive")
        opts.max_outstanding = MAX_OUTSTANDING if opts.max_outstanding is None else opts.max_outstanding
        if opts.max_outstanding <= 0:
            ap.error("--max-outstanding must be positive")
    else:
        for flag, given in (("--rate", opts.rate), ("--max-outstanding", opts.max_outstanding)):
            if given is not None:
                ap.error(f"{flag} applies to --arrival poisson only")
        opts.points = [int(c) for c in (opts.concurrency or mode["concurrency"]).split(",")]
    if opts.slow_worker is not None and not opts.slow_worker > 0:
        ap.error("--slow-worker needs a positive factor")
    opts.concurrency = opts.points if opts.arrival == "concurrent" else None
    overrides = {k: getattr(opts, k) for k in ("time_scale", "warmup", "rampup", "duration") if getattr(opts, k) is not None}
    settings = {w: {**mode["workloads"][w], **overrides} for w in WORKLOADS}
    if opts.arrival == "poisson":
        for s in settings.values():
            s["rampup"] = None
    workloads = opts.workloads.split(",")
    chosen = opts.routers.split(",") if opts.routers else None
    routers_for = {w: chosen or mode["routers"][w] for w in workloads}
    known = ROUTERS + federation.ROUTERS
    routers = [r for r in known if any(r in routers_for[w] for w in workloads)] + \
        [r for r in (chosen or []) if r not in known]
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGINT, stop_all)
    signal.signal(signal.SIGTERM, stop_all)
    command = "e2e/bench/run " + " ".join(a for a in sys.argv[3:] if a != "--resume")
    plan = run_plan(opts, settings, routers_for, workloads)
    runs, wall_before = resume(out, plan) if opts.resume else ([], 0)
    (out / "plan.json").write_text(json.dumps({**plan, "wall_s_before": wall_before, "command": command}, indent=2))
    done = {(r["router"], r["workload"]) for r in runs}
    started = time.time()
    guidellm = GuideLLM(out / "guidellm.log", worker_processes=1 if opts.arrival == "poisson" else 4)
    try:
        for router in routers:
            for workload in [w for w in workloads if router in routers_for[w]]:
                if (router, workload) in done:
                    log(f"{router} · {workload}: kept from the run being resumed")
                    continue
                rdir = out / "runs" / router / workload
                rdir.mkdir(parents=True, exist_ok=True)
                scale = settings[workload]["time_scale"]
                fed = None
                if router in federation.ROUTERS:
                    fed = federation.Federation(router, opts, rdir, scale, start, start_fleet, free_port)
                    fleet, workers, rproc, url, router_metrics = None, fed.workers, None, fed.url, None
                else:
                    fleet, workers = start_fleet(opts, rdir, scale)
                    rproc = None
                try:
                    if opts.slow_worker is not None:
                        slow_worker(workers, opts.slow_worker)
                    if fed is None:
                        rproc, url, router_metrics = start_router(router, opts, workers, rdir, scale)
                    for point in opts.points:
                        label = point_label(opts.arrival, point)
                        log(f"{router} · {workload} · {label}")
                        stem = f"c{point}" if opts.arrival == "concurrent" else f"rate{point:g}"
                        tokenized_before = tokenize_totals(router_metrics)
                        with CounterSampler(workers) as counters:
                            raw = run_guidellm(guidellm, url, workload, point, settings[workload], opts,
                                               rdir / f"guidellm-{stem}.json", fed)
                        tokenized = tokenize_ms_mean(tokenized_before, tokenize_totals(router_metrics))
                        bench = raw["benchmarks"][0]
                        window = (bench["start_time"], bench["end_time"])
                        run = summarise(raw, workload, scale, counters.hit_rate(*window), opts.arrival == "poisson")
                        run["fleet_behind_schedule"] = counters.behind_schedule(*window)
                        run["preemptions"] = counters.preemptions(*window)
                        run["engine_ttft_ms_mean"], run["engine_queue_ms_mean"] = counters.engine_means_ms(*window, scale)
                        # Wall time, not divided by the time scale: what the router's own code took.
                        run["router_tokenize_ms_wall_mean"] = tokenized
                        if fed is not None:
                            run["federation"] = federation.window(*fed.samples, scale)
                        key = {"concurrency": point} if opts.arrival == "concurrent" else {"rate": point}
                        runs.append({"router": router, "workload": workload, "arrival": opts.arrival, **key,
                                     "point": label, **run})
                        (out / "results.json").write_text(json.dumps({"runs": runs, "wall_s": wall_before + round(time.time() - started)}, indent=2))
                finally:
                    if rproc:
                        stop(rproc)
                    if fleet:
                        stop(fleet)
                    for p in reversed(fed.procs if fed else []):
                        stop(p)
    finally:
        stop_all()
    meta = {"command": command, "profile": opts.profile, "workers": opts.workers,
            "settings": {w: settings[w] for w in workloads}, "routers": routers_for, "min_requests": MIN_REQUESTS,
            "arrival": opts.arrival, "concurrency": opts.concurrency,
            "rate": opts.points if opts.arrival == "poisson" else None,
            "max_outstanding": opts.max_outstanding if opts.arrival == "poisson" else None,
            "api": opts.api, "api_path": API_PATHS[opts.api],
            "slow_worker": None if opts.slow_worker is None else {"worker": 0, "factor": opts.slow_worker},
            "ttft_predictor": opts.ttft_predictor,
            "dispatch_pacing": opts.dispatch_pacing,
            "workload_options": {k: getattr(opts, k) for k in ("prefix_count", "prefix_tokens", "unique_tokens", "first_turn_tokens",
                                                    "turn_tokens", "turns", "output_tokens")},
            "wall_s": wall_before + round(time.time() - started), "resumed": opts.resume,
            "machine": machine(), "versions": versions(opts), "seed": opts.seed, "slo_ms": SLO_MS,
            "workloads": {w: data_spec(w, opts) for w in workloads}}
    log("virtual-time figures (switchyard calibrate)")
    meta["virtual"], meta["virtual_skipped"] = virtual_time(opts, workloads, settings)
    (out / "results.json").write_text(json.dumps({"meta": meta, "runs": runs}, indent=2))
    if opts.federation:
        federation.write_report(out, meta, runs)
    else:
        from report import write_report
        write_report(out, meta, runs)
    log(f"wrote {out}/results.json, {out}/report.md and plots in {meta['wall_s']} s")


if __name__ == "__main__":
    main()
