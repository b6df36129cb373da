"""`ttftPredictor: EngineReplica`: the spoke keeps a replica of each engine's scheduler, fed by
the requests it sends and the tokens it relays, and learns the engines' step cost online."""

import random
import threading
import time

import httpx
import openai

from conftest import spoke_config

WORDS = "model cache request token worker cluster policy route queue prompt latency region tenant batch stream event".split()

# The reference engine at 1/20 speed with 700 KV blocks per worker, as in test_spoke_routing.
REFERENCE = ("--profile", "l40s-27b-fp8", "--time-scale", "0.05", "--num-gpu-blocks-override", "700")
# Wall milliseconds per prompt token of that engine.
TRUE_PREFILL_MS = 0.42 * 0.05


def replicated_spoke(start_sim, start_spoke, prior_rate):
    sim = start_sim(*REFERENCE, workers=3)
    config = spoke_config([sim], prefill_tokens_per_second=prior_rate,
                          capacity_extra=", maxNumSeqs: 64, maxNumBatchedTokens: 8192",
                          worker_set_extra="  ttftPredictor: EngineReplica\n")
    return sim, start_spoke(config)


def prompt(i, words=1500):
    rng = random.Random(i)
    return " ".join(rng.choice(WORDS) for _ in range(words))


def replicas(spoke):
    return {w["worker"]: w["replica"] for w in spoke.status()["workers"]}


def settle(spoke, timeout=10.0):
    """The replicas once they hold no request (they drop each as its stream ends)."""
    deadline = time.time() + timeout
    while True:
        reps = replicas(spoke)
        if all(r and r["waiting"] == 0 and r["running"] == 0 for r in reps.values()) or time.time() > deadline:
            return reps
        time.sleep(0.1)


def test_replicas_follow_every_request_and_learn_the_engine_cost(start_sim, start_spoke):
    # The configured prefill rate is 4x the engines' true one: the learned cost must move to it.
    # Prompt lengths vary (150 to 2,600 words), so prefill and the fixed per-request cost can
    # be told apart.
    true_rate = int(1000 / TRUE_PREFILL_MS)
    sim, spoke = replicated_spoke(start_sim, start_spoke, prior_rate=true_rate * 4)
    client = openai.OpenAI(base_url=spoke.url + "/v1", api_key="unused", max_retries=0)
    errors = []

    def stream(i):
        try:
            chunks = client.chat.completions.create(model="standard-model", stream=True, max_tokens=24,
                                                    messages=[{"role": "user", "content": prompt(i, words=150 + 350 * (i % 8))}])
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            assert text, f"request {i} streamed no text"
        except Exception as e:  # noqa: BLE001 - collected and reported below
            errors.append(e)

    for wave in range(8):
        threads = [threading.Thread(target=stream, args=(wave * 10 + i,)) for i in range(10)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors, errors

    reps = settle(spoke)
    assert set(reps) == {"w0", "w1", "w2"}
    for name, r in reps.items():
        assert r is not None, f"{name} has no replica"
        # The KV capacity came from the engine's own vllm:cache_config_info.
        assert r["shape"] == {"blockSize": 16, "numBlocks": 700, "maxNumSeqs": 64, "maxNumBatchedTokens": 8192}, r
        assert (r["waiting"], r["running"]) == (0, 0), f"{name} still holds requests: {r}"
    samples = sum(r["samples"] for r in reps.values())
    # A first-token and a finish sample per request (a finish is skipped only when the
    # replica's clock was far off for it).
    assert 140 <= samples <= 160, reps
    # Per worker the learned cost comes from a few dozen noisy wall-clock samples; across the
    # fleet it has moved from a prior 4x too fast to within 2x of the engines' true prefill cost.
    learned = sorted(r["learnedCost"]["prefillMsPerToken"] for r in reps.values())
    median = learned[len(learned) // 2]
    costs = [(round(r["learnedCost"]["baseMs"], 3), round(r["learnedCost"]["prefillMsPerToken"], 4),
              round(r["learnedCost"]["decodeMsPerSeq"], 4), round(r["learnedCost"]["requestMs"], 2), r["samples"])
             for r in reps.values()]
    assert TRUE_PREFILL_MS / 2 <= median <= TRUE_PREFILL_MS * 2, (median, costs)


def test_a_cancelled_stream_leaves_its_replica(start_sim, start_spoke):
    sim, spoke = replicated_spoke(start_sim, start_spoke, prior_rate=int(1000 / TRUE_PREFILL_MS))
    body = {"model": "standard-model", "stream": True, "max_tokens": 2000, "messages": [{"role": "user", "content": prompt(7)}]}
    with httpx.Client(timeout=30) as http:
        with http.stream("POST", spoke.url + "/v1/chat/completions", json=body) as resp:
            assert resp.status_code == 200
            lines = resp.iter_lines()
            got = [next(lines) for _ in range(6)]
            assert any(l.startswith("data:") for l in got)
            held = [r for r in replicas(spoke).values() if r and r["running"] == 1]
            assert len(held) == 1, replicas(spoke)
    # The client went away mid-stream: the replica forgets the request.
    reps = settle(spoke)
    assert all((r["waiting"], r["running"]) == (0, 0) for r in reps.values() if r), reps
    # It is still usable afterwards.
    r = httpx.post(spoke.url + "/v1/chat/completions", timeout=30,
                   json={"model": "standard-model", "max_tokens": 4, "messages": [{"role": "user", "content": "hello"}]})
    assert r.status_code == 200, r.text
