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
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROUTERS = ["random", "round-robin", "sglang-cache-aware", "vllm-router-cache-aware", "switchyard", "oracle"]
WORKLOADS = ["control", "shared-prefix", "multi-turn"]
SLO_MS = {"control": 8000, "shared-prefix": 8000, "multi-turn": 4000}
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


def start_fleet(opts, outdir):
    ready = outdir / "fleet-ready.json"
    ready.unlink(missing_ok=True)
    # Port 0 everywhere: the kernel picks free ports and the ready file reports them.
    kv = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": "tcp://*:0", "replay_endpoint": "tcp://*:0"}
    proc = start([opts.bin, "sim", "--workers", str(opts.workers), "--port", "0", "--profile", opts.profile,
                  "--time-scale", str(opts.time_scale), "--seed", str(opts.seed), "--enable-prompt-tokens-details",
                  "--tokenizer", str(opts.tokenizer), "--kv-events-config", json.dumps(kv), "--ready-file", str(ready)],
                 outdir / "fleet.log")
    deadline = time.time() + 60
    while not ready.exists():
        if proc.poll() is not None or time.time() > deadline:
            raise RuntimeError("fleet did not start: " + (outdir / "fleet.log").read_text())
        time.sleep(0.1)
    return proc, json.loads(ready.read_text())["workers"]


def spoke_yaml(opts, workers):
    eps = "\n".join(
        f"    - {{name: w{w['index']}, host: 127.0.0.1, httpPort: {w['url'].rsplit(':', 1)[1]}, "
        f"kvEventsPort: {w['kvEvents'].rsplit(':', 1)[1]}, kvReplayPort: {w['kvReplay'].rsplit(':', 1)[1]}}}" for w in workers)
    rate = int(1000 / opts.profile_prefill_ms / opts.time_scale)
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


def start_router(name, opts, workers, outdir):
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
        (cfg / "fleet.yaml").write_text(spoke_yaml(opts, workers))
        args = [opts.bin, "spoke", "--config", str(cfg), "--listen", f"127.0.0.1:{port}"]
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
    hits = queries = 0.0
    for w in workers:
        for line in httpx.get(w["url"] + "/metrics", timeout=5).text.splitlines():
            if line.startswith("vllm:prefix_cache_hits_total"):
                hits += float(line.rsplit(" ", 1)[1])
            elif line.startswith("vllm:prefix_cache_queries_total"):
                queries += float(line.rsplit(" ", 1)[1])
    return hits, queries


def run_guidellm(url, workload, concurrency, opts, outpath):
    venv = Path(os.environ["BENCH_VENV"]) / "bin"
    args = [str(venv / "guidellm"), "run",
            "--backend", f"kind=openai_http,target={url},model=sim-model,request_format=/v1/chat/completions",
            "--profile", f"kind=concurrent,streams={concurrency}",
            "--constraint", f"kind=max_duration,seconds={opts.duration}",
            "--tokenizer", f"kind=hf_auto,model={opts.tokenizer}",
            "--data", json.dumps(data_spec(workload, opts)),
            "--output", f"kind=json,path={outpath}", "--disable-progress"]
    with open(outpath.with_suffix(".log"), "w") as logf:
        subprocess.run(args, stdout=logf, stderr=subprocess.STDOUT, check=True, timeout=opts.duration * 6 + 300)
    return json.loads(outpath.read_text())


def metric(m, name, stat="median"):
    node = m.get(name, {}).get("successful", {})
    if stat in ("p95", "p99"):
        return node.get("percentiles", {}).get(stat)
    return node.get(stat)


def summarise(raw, workload, opts, hit_rate):
    b = raw["benchmarks"][0]
    m = b["metrics"]
    scale = opts.time_scale
    reqs = b.get("requests", {}).get("successful", [])
    duration_s = max(1e-9, (b.get("duration") or opts.duration)) / scale
    ttfts = []
    for r in reqs:
        t = r.get("time_to_first_token_ms") or (r.get("info", {}) or {}).get("time_to_first_token_ms")
        if t is None and r.get("first_token_time") and r.get("request_start_time"):
            t = (r["first_token_time"] - r["request_start_time"]) * 1000
        if t is not None:
            ttfts.append(t / scale)
    completed = len(reqs) if reqs else (metric(m, "request_totals", "count") or 0)
    good = sum(1 for t in ttfts if t <= SLO_MS[workload])
    return {
        "ttft_ms_p50": (metric(m, "time_to_first_token_ms") or 0) / scale,
        "ttft_ms_p95": (metric(m, "time_to_first_token_ms", "p95") or 0) / scale,
        "itl_ms_p50": (metric(m, "inter_token_latency_ms") or 0) / scale,
        "e2e_s_p50": (metric(m, "request_latency") or 0) / scale,
        "requests": completed,
        "requests_per_min": completed / duration_s * 60,
        "goodput_per_min": good / duration_s * 60 if ttfts else 0.0,
        "cache_hit_rate": hit_rate,
        "measured": {"ttft_ms_p50": metric(m, "time_to_first_token_ms"), "duration_s": b.get("duration")},
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repo", required=True)
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true")
    mode.add_argument("--full", action="store_true")
    ap.add_argument("--out", default="results/bench")
    ap.add_argument("--routers", default=",".join(ROUTERS))
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--concurrency")
    ap.add_argument("--duration", type=float)
    ap.add_argument("--time-scale", type=float, default=0.1)
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
    conc = opts.concurrency or ("8" if opts.quick or not opts.full else "4,8,16,24,32")
    opts.concurrency = [int(c) for c in conc.split(",")]
    opts.concurrency_max = max(opts.concurrency)
    opts.duration = opts.duration or (30.0 if not opts.full else 120.0)
    routers = opts.routers.split(",")
    workloads = opts.workloads.split(",")
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGINT, stop_all)
    signal.signal(signal.SIGTERM, stop_all)
    command = "e2e/bench/run " + " ".join(sys.argv[3:])
    runs = []
    started = time.time()
    try:
        for router in routers:
            for workload in workloads:
                rdir = out / "runs" / router / workload
                rdir.mkdir(parents=True, exist_ok=True)
                fleet, workers = start_fleet(opts, rdir)
                rproc = None
                try:
                    rproc, url = start_router(router, opts, workers, rdir)
                    for c in opts.concurrency:
                        log(f"{router} · {workload} · c={c}")
                        h0, q0 = sim_counters(workers)
                        raw = run_guidellm(url, workload, c, opts, rdir / f"guidellm-c{c}.json")
                        h1, q1 = sim_counters(workers)
                        hit = (h1 - h0) / (q1 - q0) if q1 > q0 else 0.0
                        runs.append({"router": router, "workload": workload, "concurrency": c, **summarise(raw, workload, opts, hit)})
                        (out / "results.json").write_text(json.dumps({"runs": runs}, indent=2))
                finally:
                    if rproc:
                        stop(rproc)
                    stop(fleet)
    finally:
        stop_all()
    meta = {"command": command, "time_scale": opts.time_scale, "profile": opts.profile, "workers": opts.workers,
            "duration_s": opts.duration, "concurrency": opts.concurrency, "wall_s": round(time.time() - started),
            "machine": {"cores": os.cpu_count(), "uname": " ".join(os.uname())}, "seed": opts.seed}
    (out / "results.json").write_text(json.dumps({"meta": meta, "runs": runs}, indent=2))
    from report import write_report
    write_report(out, meta, runs)
    log(f"wrote {out}/results.json, {out}/report.md and plots in {meta['wall_s']} s")


if __name__ == "__main__":
    main()
