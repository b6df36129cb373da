"""Event gaps, engine restarts, tokenization drift and dead workers, through real processes."""

import json
import os
import random
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest

from conftest import REPO, TOKENIZER_DIR, spoke_config, switchyard_bin

WORDS = "model cache request token worker cluster policy route queue prompt latency region tenant batch stream event".split()


def prompt(rng, n=120):
    return " ".join(rng.choice(WORDS) for _ in range(n))


def send(spoke, text, max_tokens=2):
    r = httpx.post(spoke.url + "/v1/completions", json={"model": "sim-model", "prompt": text, "max_tokens": max_tokens}, timeout=60)
    assert r.status_code == 200, r.text
    return r


def worker_status(spoke, name):
    return next(w for w in spoke.status()["workers"] if w["worker"] == name)


def wait_for(pred, timeout=5.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return False


def indexed(decision, worker):
    return sum(e["cachedTokens"] for e in decision["indexedCachedTokens"] if e["worker"] == worker)


def test_event_gap_is_replayed_and_restart_resynchronised(start_sim, start_spoke):
    sim = start_sim(workers=3)
    spoke = start_spoke(spoke_config([sim]))
    rng = random.Random(1)
    for _ in range(12):
        send(spoke, prompt(rng))
    assert wait_for(lambda: all(w["kvEvents"]["batches"] > 0 for w in spoke.status()["workers"]))

    # Gap: worker 0's publisher skips two batches on the wire (they stay replayable).
    sim.faults(worker=0, dropEventBatches=2)
    on_w0 = []
    while len(on_w0) < 4:
        text = prompt(rng)
        if send(spoke, text).headers["x-switchyard-target"] == "local/w0":
            on_w0.append(text)
    assert wait_for(lambda: worker_status(spoke, "w0")["kvEvents"]["replays"] >= 1), worker_status(spoke, "w0")
    st = worker_status(spoke, "w0")["kvEvents"]
    assert st["gaps"] >= 1 and st["resyncs"] == 0, st
    # Every prompt sent during the gap is in the index (not just in the pending overlay).
    for text in on_w0:
        r = send(spoke, text)
        d = spoke.decision(r.headers["request-id"])
        full = len(httpx.post(sim.url + "/tokenize", json={"prompt": text}).json()["tokens"]) // 16 * 16
        assert indexed(d, "w0") == full, (indexed(d, "w0"), full)
        assert r.headers["x-switchyard-target"] == "local/w0"

    # Restart: worker 1's engine loses its cache and its stream starts again at 0.
    on_w1 = None
    while on_w1 is None:
        text = prompt(rng)
        if send(spoke, text).headers["x-switchyard-target"] == "local/w1":
            on_w1 = text
    assert wait_for(lambda: indexed(spoke.decision(send(spoke, on_w1).headers["request-id"]), "w1") > 0)
    sim.faults(worker=1, restartEventStream=True)
    assert wait_for(lambda: worker_status(spoke, "w1")["kvEvents"]["restarts"] >= 1), worker_status(spoke, "w1")
    d = spoke.decision(send(spoke, on_w1).headers["request-id"])
    assert all(e["worker"] != "w1" for e in d["cachedTokens"]), d["cachedTokens"]
    assert indexed(d, "w1") == 0


DRIFTED_TEMPLATE = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + ':\\n' + message['content'] + '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"


def test_tokenization_drift_falls_back_and_recovers(start_sim, start_spoke, tmp_path):
    sim = start_sim(workers=3)
    template = tmp_path / "drifted.jinja"
    template.write_text(DRIFTED_TEMPLATE)
    spoke = start_spoke(spoke_config([sim], chat_template=template))
    rng = random.Random(2)
    shared = prompt(rng, 200)

    def chat():
        body = {"model": "standard-model", "max_tokens": 2, "messages": [{"role": "system", "content": shared}, {"role": "user", "content": prompt(rng, 10)}]}
        r = httpx.post(spoke.url + "/v1/chat/completions", json=body, timeout=60)
        assert r.status_code == 200, r.text
        return r

    modes = []
    for i in range(50):
        chat()
        modes.append(spoke.status()["workerSets"]["local"]["mode"])
    assert modes[-1] in ("DEGRADED", "FALLBACK"), modes
    assert modes.index(modes[-1]) < 50
    # Meanwhile routing is load-aware: the cache signal is not trusted.
    d = spoke.decision(chat().headers["request-id"])
    assert d["fidelityModes"]["local"] == "FALLBACK"
    assert d["cachedTokens"] == []

    # Fix the configuration; the spoke reloads it and returns to EXACT by itself.
    spoke.write_config(spoke_config([sim]))
    assert wait_for(lambda: spoke.status()["generation"] >= 2, timeout=10)
    for i in range(10):
        chat()
        if spoke.status()["workerSets"]["local"]["mode"] == "EXACT":
            break
    assert spoke.status()["workerSets"]["local"]["mode"] == "EXACT"


def read_stream(url, body, out):
    """Reads an SSE stream; records ('done'|'error'|'exception', worker, chunks)."""
    try:
        with httpx.stream("POST", url, json=body, timeout=30) as r:
            worker = r.headers.get("x-switchyard-target")
            chunks = 0
            for line in r.iter_lines():
                if line.startswith("data: [DONE]"):
                    out.append(("done", worker, chunks))
                    return
                if line.startswith("data: "):
                    payload = json.loads(line[6:])
                    if "error" in payload:
                        out.append(("error", worker, chunks))
                        return
                    chunks += 1
            out.append(("truncated", worker, chunks))
    except Exception as e:  # noqa: BLE001 - any transport failure is a test failure below
        out.append(("exception", repr(e), 0))


def test_killed_worker_is_avoided_and_streams_end_with_an_error(start_sim, start_spoke):
    # Three single-worker processes so that one can be killed; slow steps keep streams open.
    sims = [start_sim("--time-scale", "20", kv_events=True) for _ in range(3)]
    spoke = start_spoke(spoke_config(sims))
    rng = random.Random(3)
    results = []
    threads = []
    for i in range(9):
        body = {"model": "sim-model", "prompt": prompt(rng, 30), "max_tokens": 60, "stream": True}
        t = threading.Thread(target=read_stream, args=(spoke.url + "/v1/completions", body, results))
        t.start()
        threads.append(t)
        time.sleep(0.02)
    time.sleep(0.8)
    victim = sims[0]
    victim.proc.send_signal(signal.SIGKILL)
    victim.proc.wait()
    killed_at = time.time()
    for t in threads:
        t.join(timeout=30)
        assert not t.is_alive(), "a stream hung"
    on_victim = [r for r in results if r[1] == "local/w0"]
    assert on_victim, results
    assert all(r[0] == "error" for r in on_victim), results
    assert all(r[0] == "done" for r in results if r[1] != "local/w0"), results

    late = []
    while time.time() < killed_at + 4:
        sent_at = time.time()
        r = httpx.post(spoke.url + "/v1/completions", json={"model": "sim-model", "prompt": prompt(rng, 30), "max_tokens": 1}, timeout=30)
        late.append((sent_at - killed_at, r.status_code, r.headers.get("x-switchyard-target")))
    assert all(code == 200 for _, code, _ in late), late
    assert not [x for x in late if x[0] >= 2.0 and x[2] == "local/w0"], late


def test_switchyard_up_serves_and_stops_cleanly(tmp_path):
    port = 18000 + random.Random(os.getpid()).randint(0, 999)
    log = tmp_path / "up.log"
    proc = subprocess.Popen([switchyard_bin(), "up", "--port", str(port)], cwd=REPO, stdout=open(log, "w"), stderr=subprocess.STDOUT)
    try:
        assert wait_for(lambda: "Front door" in log.read_text(), timeout=30), log.read_text()
        assert f"http://127.0.0.1:{port}" in log.read_text()
        assert wait_for(lambda: httpx.get(f"http://127.0.0.1:{port}/readyz").status_code == 200, timeout=10)
        r = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions",
                       json={"model": "standard-model", "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 16}, timeout=30)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 16
        # The front door is the hub: it names the cluster and worker set it chose, and the
        # spoke's worker.
        cluster, worker_set = r.headers["x-switchyard-target"].split("/")
        assert cluster in ("east", "west") and worker_set == cluster, r.headers
        assert r.headers["x-switchyard-worker"].startswith("worker-"), r.headers
        assert "cluster east (region us-east)" in log.read_text() and "cluster west (region us-west)" in log.read_text()
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
    # Nothing left listening.
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2)


def test_switchyard_up_refuses_a_taken_port_before_starting_engines(tmp_path):
    # The front door's port is claimed before any engine starts: a taken one fails at once with
    # the address, instead of after a real engine's minute-long start (whose own ephemeral
    # ports could otherwise land on a port chosen in advance). The engine here could not even
    # start: its executable does not exist, so only the port can be the error.
    import socket
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        started = time.time()
        out = subprocess.run([switchyard_bin(), "up", "--engine", "vllm", "--vllm", str(tmp_path / "no-vllm"),
                              "--vllm-model", str(tmp_path / "no-model"), "--port", str(port)],
                             cwd=REPO, capture_output=True, text=True, timeout=60)
    text = out.stdout + out.stderr
    assert out.returncode != 0, text
    assert f"cannot listen on 127.0.0.1:{port}" in text, text
    assert "Starting" not in text and "no-vllm" not in text, text
    assert time.time() - started < 20, text


def test_client_disconnect_cancels_the_engine_request(start_sim, start_spoke):
    sim = start_sim("--time-scale", "20", kv_events=False)
    spoke = start_spoke(spoke_config([sim]))
    body = {"model": "sim-model", "prompt": "cancel me " * 20, "max_tokens": 500, "stream": True}
    with httpx.stream("POST", spoke.url + "/v1/completions", json=body, timeout=30) as r:
        seen = 0
        for line in r.iter_lines():
            if line.startswith("data: {"):
                seen += 1
                if seen == 3:
                    break
    # The spoke dropped its upstream request; the engine aborts it instead of generating 500 tokens.
    def aborted():
        text = httpx.get(sim.url + "/metrics").text
        return re.search(r'^vllm:request_success_total\{[^}]*finished_reason="abort"[^}]*\} 1\.0$', text, re.M) is not None
    assert wait_for(aborted, timeout=5)
    assert sim.state()["running"] == 0


def test_engine_rendered_tokens_route_to_the_cache(start_sim, start_spoke):
    sim = start_sim(workers=3)
    spoke = start_spoke(spoke_config([sim], tokenizer_source="Engine"))
    rng = random.Random(4)
    shared = prompt(rng, 300)
    workers = []
    for i in range(6):
        body = {"model": "standard-model", "max_tokens": 2, "messages": [{"role": "system", "content": shared}, {"role": "user", "content": f"question {i}"}]}
        r = httpx.post(spoke.url + "/v1/chat/completions", json=body, timeout=60)
        assert r.status_code == 200, r.text
        workers.append(r.headers["x-switchyard-target"])
        cached = (r.json()["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        if i > 0:
            assert cached >= 290, cached
    assert len(set(workers)) == 1, workers
    assert spoke.status()["workerSets"]["local"]["mode"] == "EXACT"
