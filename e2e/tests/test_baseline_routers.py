"""The benchmark's baseline routers: random, round-robin, least-outstanding and the ground-truth
oracle."""

import collections
import signal
import subprocess
import time

import httpx
import pytest

from conftest import free_port, switchyard_bin


@pytest.fixture
def start_lb():
    procs = []

    def start(policy, sim):
        port = free_port()
        args = [switchyard_bin(), "lb", "--policy", policy, "--listen", f"127.0.0.1:{port}"]
        for w in sim.workers:
            args += ["--worker", w["url"]]
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        procs.append(proc)
        url = f"http://127.0.0.1:{port}"
        deadline = time.time() + 10
        while True:
            try:
                if httpx.get(url + "/health").status_code == 200:
                    return url
            except httpx.HTTPError:
                pass
            assert time.time() < deadline, "lb did not start"
            time.sleep(0.05)

    yield start
    for p in procs:
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=10)


def post(url, prompt, **kw):
    r = httpx.post(url + "/v1/completions", json={"model": "sim-model", "prompt": prompt, "max_tokens": 2, **kw}, timeout=30)
    assert r.status_code == 200, r.text
    return r


def test_round_robin_and_random_spread(start_sim, start_lb):
    sim = start_sim(workers=3, kv_events=False)
    rr = start_lb("round-robin", sim)
    assert [post(rr, f"p{i}").headers["x-lb-worker"] for i in range(6)] == ["0", "1", "2", "0", "1", "2"]
    rnd = start_lb("random", sim)
    counts = collections.Counter(post(rnd, f"q{i}").headers["x-lb-worker"] for i in range(90))
    assert set(counts) == {"0", "1", "2"} and max(counts.values()) < 50, counts
    # Streams pass through unchanged.
    with httpx.stream("POST", rnd + "/v1/completions", json={"model": "sim-model", "prompt": "s", "max_tokens": 3, "stream": True}) as r:
        lines = [l for l in r.iter_lines() if l.startswith("data: ")]
    assert lines[-1] == "data: [DONE]" and len(lines) == 4


def test_oracle_follows_the_true_cache(start_sim, start_lb):
    sim = start_sim(workers=3, kv_events=False)
    oracle = start_lb("oracle", sim)
    prompt = "the oracle reads the engine state " * 80
    first = post(oracle, prompt).headers["x-lb-worker"]
    for _ in range(4):
        r = post(oracle, prompt)
        assert r.headers["x-lb-worker"] == first
        assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 0


def test_oracle_decisions_see_each_other(start_sim, start_lb):
    # Three equal cold prompts sent at once: each oracle decision must see the requests placed
    # before it in the engines' true queues, so they land on three different workers. Without
    # that, all three would see idle engines and pick by the tie-break alone.
    import concurrent.futures

    sim = start_sim("--profile", "l40s-27b-fp8", "--time-scale", "0.05", workers=3, kv_events=False)
    oracle = start_lb("oracle", sim)

    def stream(i):
        # 200 output tokens keep each request on its worker for ~0.5 s of wall time, so the three
        # overlap even when a loaded machine starts the threads tens of milliseconds apart (with
        # 2 tokens the first could finish before the third was decided, freeing its worker).
        body = {"model": "sim-model", "prompt": f"request {i} " + "cold prompt words " * 600, "max_tokens": 200, "stream": True}
        with httpx.stream("POST", oracle + "/v1/completions", json=body, timeout=60) as r:
            assert r.status_code == 200
            worker = r.headers["x-lb-worker"]
            for _ in r.iter_lines():
                pass
        return worker

    for attempt in range(3):
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            workers = list(pool.map(stream, [f"{attempt}-{i}" for i in range(3)]))
        assert sorted(workers) == ["0", "1", "2"], workers


def test_least_outstanding_counts_open_streams(start_sim, start_lb):
    # Two streams held open on the first two workers it picks: the third request must go to the
    # worker with none, and once a stream is closed its worker counts as free again.
    sim = start_sim("--profile", "l40s-27b-fp8", "--time-scale", "0.05", workers=3, kv_events=False)
    lo = start_lb("least-outstanding", sim)
    body = {"model": "sim-model", "prompt": "long answer " * 20, "max_tokens": 8000, "stream": True}
    with httpx.Client(timeout=60) as c:
        held = []
        for _ in range(2):
            r = c.send(c.build_request("POST", lo + "/v1/completions", json=body), stream=True)
            assert r.status_code == 200
            held.append(r)
        busy = {r.headers["x-lb-worker"] for r in held}
        assert len(busy) == 2, busy
        third = post(lo, "short").headers["x-lb-worker"]
        assert third not in busy, (third, busy)
        closed = held.pop(0)
        freed = closed.headers["x-lb-worker"]
        closed.close()
        deadline = time.time() + 5
        while True:
            # Ties go in turn, so ask until the freed worker's count is seen (at most a few tries).
            picks = {post(lo, "again").headers["x-lb-worker"] for _ in range(3)}
            if freed in picks:
                break
            assert time.time() < deadline, (freed, picks)
        assert held[0].headers["x-lb-worker"] not in picks, picks
        held[0].close()
