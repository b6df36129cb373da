"""The spoke routes on the engines' own KV events: cache affinity, spread, SDK compatibility."""

import collections
import random
import threading
import time

import httpx
import openai

from conftest import spoke_config

WORDS = "model cache request token worker cluster policy route queue prompt latency region tenant batch stream event".split()


def prefix_text(i, words=2000):
    rng = random.Random(1000 + i)
    return " ".join(rng.choice(WORDS) for _ in range(words))


def run_workload(send, items, concurrency):
    """Runs `send(item)` over items with `concurrency` threads; returns results in send order."""
    results = [None] * len(items)
    lock = threading.Lock()
    next_i = [0]

    def worker():
        while True:
            with lock:
                i = next_i[0]
                next_i[0] += 1
            if i >= len(items):
                return
            results[i] = send(items[i])

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def shared_prefix_items(prefixes=8, repeats=6, seed=5):
    items = [(p, r) for p in range(prefixes) for r in range(repeats)]
    random.Random(seed).shuffle(items)
    return items


def hit_share(items, results, prefix_tokens):
    """Share of requests after the first of their prefix with cached >= 90% of the prefix."""
    seen, good, total = set(), 0, 0
    for (p, _), cached in zip(items, results):
        if p in seen:
            total += 1
            good += cached >= 0.9 * prefix_tokens[p]
        seen.add(p)
    return good / total


# The reference engine at 1/20 speed (a 2,000-token prefill costs ~42 ms of wall time, a cache
# hit ~2 ms) with 700 blocks (11,200 tokens) of KV cache per worker: the 8 prefixes (16k tokens)
# fit across three workers only if each prefix stays where it is cached.
REFERENCE = ("--profile", "l40s-27b-fp8", "--time-scale", "0.05", "--num-gpu-blocks-override", "700")
REFERENCE_PREFILL_RATE = int(1000 / 0.42 / 0.05)


def test_shared_prefixes_follow_the_cache(start_sim, start_spoke):
    sim = start_sim(*REFERENCE, workers=3)
    spoke = start_spoke(spoke_config([sim], prefill_tokens_per_second=REFERENCE_PREFILL_RATE))
    prefixes = {p: prefix_text(p) for p in range(8)}
    prefix_tokens = {p: httpx.post(sim.url + "/tokenize", json={"prompt": t}).json()["count"] for p, t in prefixes.items()}
    assert all(1900 <= n <= 2100 for n in prefix_tokens.values()), prefix_tokens
    items = shared_prefix_items()

    def via_spoke(item):
        p, r = item
        body = {"model": "standard-model", "prompt": prefixes[p] + f" unique {p} {r} " + " ".join(random.choice(WORDS) for _ in range(20)), "max_tokens": 4}
        resp = httpx.post(spoke.url + "/v1/completions", json=body, timeout=60)
        assert resp.status_code == 200, resp.text
        return (resp.json()["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0)

    spoke_share = hit_share(items, run_workload(via_spoke, items, 8), prefix_tokens)

    # The same workload sent at random to the workers of a fresh fleet (kube-proxy's routing).
    sim2 = start_sim(*REFERENCE, workers=3)
    rng = random.Random(3)

    def random_route(item):
        p, r = item
        w = rng.choice(sim2.workers)["url"]
        body = {"model": sim2.model, "prompt": prefixes[p] + f" unique {p} {r} " + " ".join(random.choice(WORDS) for _ in range(20)), "max_tokens": 4}
        return (httpx.post(w + "/v1/completions", json=body, timeout=60).json()["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0)

    random_share = hit_share(items, run_workload(random_route, items, 8), prefix_tokens)
    print(f"cache-hit share after first request per prefix: spoke {spoke_share:.2f}, random {random_share:.2f}")
    assert spoke_share >= 0.9, spoke_share
    # Random's share varies with thread interleaving (0.55–0.70 over many runs of 6 repeats per
    # prefix); the spoke's stays at 0.9–1.0.
    assert random_share <= 0.75 and spoke_share - random_share >= 0.15, (spoke_share, random_share)
    assert spoke.status()["workerSets"]["local"]["mode"] == "EXACT"


def test_unique_prompts_spread(start_sim, start_spoke):
    sim = start_sim(workers=3)
    spoke = start_spoke(spoke_config([sim]))
    rng = random.Random(9)
    items = [" ".join(rng.choice(WORDS) for _ in range(200)) + f" request {i}" for i in range(300)]

    def send(prompt):
        r = httpx.post(spoke.url + "/v1/completions", json={"model": "sim-model", "prompt": prompt, "max_tokens": 2}, timeout=60)
        assert r.status_code == 200, r.text
        return r.headers["x-switchyard-target"]

    counts = collections.Counter(run_workload(send, items, 6))
    print(counts)
    assert len(counts) == 3
    assert max(counts.values()) <= 0.45 * len(items), counts


def test_openai_sdk_through_the_spoke(start_sim, start_spoke):
    sim = start_sim(workers=2)
    spoke = start_spoke(spoke_config([sim]))
    c = openai.OpenAI(base_url=spoke.url + "/v1", api_key="unused", max_retries=0)
    assert {m.id for m in c.models.list().data} == {"sim-model", "standard-model"}
    chat = c.chat.completions.create(model="standard-model", messages=[{"role": "user", "content": "hello"}], max_tokens=5)
    assert chat.usage.completion_tokens == 5 and chat.choices[0].finish_reason == "length"
    chunks = list(c.chat.completions.create(model="standard-model", messages=[{"role": "user", "content": "hello"}], max_tokens=5, stream=True))
    assert all(ch.usage is None for ch in chunks), "usage the client did not ask for is stripped"
    assert sum(1 for ch in chunks if ch.choices and ch.choices[0].delta.content) == 5
    chunks = list(c.chat.completions.create(model="standard-model", messages=[{"role": "user", "content": "hello"}], max_tokens=5, stream=True,
                                            stream_options={"include_usage": True}))
    assert chunks[-1].usage.completion_tokens == 5
    comp = c.completions.create(model="sim-model", prompt="hello", max_tokens=3)
    assert comp.usage.completion_tokens == 3
    streamed = list(c.completions.create(model="sim-model", prompt="hello", max_tokens=3, stream=True))
    assert len([ch for ch in streamed if ch.choices and ch.choices[0].text]) == 3
    assert [ch.choices[0].finish_reason for ch in streamed if ch.choices[0].finish_reason] == ["length"]
    # Errors are OpenAI-shaped.
    try:
        c.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
        raise AssertionError("expected NotFoundError")
    except openai.NotFoundError as e:
        assert e.body["code"] == "model_not_found"
    r = httpx.post(spoke.url + "/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"


def test_a_queued_request_keeps_its_prefix_booked(start_sim, start_spoke):
    """The blocks a routed request will write count as cached on its worker for as long as it
    waits for the engine, however long that is: a request with the same prefix sent while the
    first one is still queued follows it (and hits the cache once the first one's prefill is
    done) instead of duplicating the prefix on an idle worker. A booking that expired by the
    clock (PENDING_TTL, 5 s) would send it to the idle worker."""
    sim = start_sim("--profile", "l40s-27b-fp8", "--time-scale", "1", workers=2)
    spoke = start_spoke(spoke_config([sim], prefill_tokens_per_second=int(1000 / 0.42)))
    prefix = prefix_text(41)
    prefix_tokens = httpx.post(sim.url + "/tokenize", json={"prompt": prefix}).json()["count"]
    # Ten times slower engines: the first request's ~2,000-token prefill takes ~8.4 s of wall
    # time, so it is still unstarted when the second one is routed 6.5 s after it.
    for w in range(2):
        sim.faults(worker=w, slowdown=10.0)
    results = {}

    def send(name):
        body = {"model": "sim-model", "prompt": prefix + f" unique {name}", "max_tokens": 2}
        r = httpx.post(spoke.url + "/v1/completions", json=body, timeout=90)
        assert r.status_code == 200, r.text
        results[name] = (r.headers["x-switchyard-target"],
                         (r.json()["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0))

    first = threading.Thread(target=send, args=("first",))
    first.start()
    time.sleep(6.5)
    assert first.is_alive(), "the first request must still be waiting for its first token"
    send("second")
    first.join()
    (t1, c1), (t2, c2) = results["first"], results["second"]
    assert t2 == t1, results
    assert c1 == 0 and c2 >= 0.9 * prefix_tokens, (results, prefix_tokens)
