#!/usr/bin/env python3
"""CPU cost of one simulator process serving N concurrent streams.

Starts `switchyard sim` (reference profile, given time scale), drives N closed-loop streaming
clients with benchmark-shaped prompts (a shared prefix of P tokens plus unique words) for a
fixed window, and reports the simulator's CPU use (utime + stime from /proc) per wall second.

    python e2e/sim_cpu_cost.py --bin target/release/switchyard --streams 32 --time-scale 0.1
"""

import argparse
import json
import os
import random
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]


def cpu_seconds(pid):
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--streams", type=int, default=32)
    ap.add_argument("--time-scale", type=float, default=0.1)
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--prefix-words", type=int, default=12000)
    ap.add_argument("--output-tokens", type=int, default=300)
    ap.add_argument("--port", type=int, default=18950)
    args = ap.parse_args()

    ready = Path(tempfile.mkdtemp()) / "ready.json"
    proc = subprocess.Popen([args.bin, "sim", "--profile", "l40s-27b-fp8", "--time-scale", str(args.time_scale),
                             "--port", str(args.port), "--ready-file", str(ready), "--tokenizer", str(REPO / "tokenizer/files"),
                             "--enable-prompt-tokens-details",
                             "--kv-events-config", json.dumps({"enable_kv_cache_events": True, "endpoint": "tcp://*:0"})],
                            stdout=subprocess.DEVNULL)
    try:
        while not ready.exists():
            time.sleep(0.05)
        url = json.loads(ready.read_text())["workers"][0]["url"]
        rng = random.Random(1)
        words = "model cache request token worker cluster policy route queue prompt latency region".split()
        prefixes = [" ".join(rng.choice(words) for _ in range(args.prefix_words)) for _ in range(4)]
        stop = time.time() + args.seconds
        counts = {"requests": 0, "tokens": 0, "errors": 0}
        lock = threading.Lock()

        def client(i):
            with httpx.Client(timeout=120) as c:
                n = 0
                while time.time() < stop:
                    n += 1
                    body = {"model": "sim-model", "max_tokens": args.output_tokens, "stream": True,
                            "messages": [{"role": "system", "content": prefixes[(i + n) % 4]},
                                         {"role": "user", "content": f"question {i} {n} " + " ".join(rng.choice(words) for _ in range(150))}]}
                    try:
                        with c.stream("POST", url + "/v1/chat/completions", json=body) as r:
                            toks = sum(1 for line in r.iter_lines() if line.startswith("data: {"))
                        with lock:
                            counts["requests"] += 1
                            counts["tokens"] += toks
                    except Exception:
                        with lock:
                            counts["errors"] += 1

        threads = [threading.Thread(target=client, args=(i,)) for i in range(args.streams)]
        for t in threads:
            t.start()
        time.sleep(min(5, args.seconds / 4))  # warm-up: prefixes cached, batch full
        c0, w0 = cpu_seconds(proc.pid), time.time()
        time.sleep(max(1, stop - time.time() - 1))
        c1, w1 = cpu_seconds(proc.pid), time.time()
        for t in threads:
            t.join()
        result = {"streams": args.streams, "time_scale": args.time_scale, "window_s": round(w1 - w0, 1),
                  "sim_cpu_cores": round((c1 - c0) / (w1 - w0), 3), **counts}
        print(json.dumps(result))
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)


if __name__ == "__main__":
    main()
