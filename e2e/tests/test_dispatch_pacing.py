"""`dispatchPacing: Paced` (the default): a long prompt waits at the spoke while its worker still
has a prompt of the spoke's waiting for its first token that the two would not fit one step
with, and is sent when that first token comes; `Immediate` sends every request at once."""

import random
import re
import threading
import time

import httpx
import openai

from conftest import spoke_config

WORDS = "model cache request token worker cluster policy route queue prompt latency region tenant batch stream event".split()
# The reference engine at 1/20 speed: a 1,500-word prompt takes it tens of wall milliseconds.
REFERENCE = ("--profile", "l40s-27b-fp8", "--time-scale", "0.05", "--num-gpu-blocks-override", "2000")
# The step budget the spoke assumes: a 1,500-word prompt is longer, so two do not batch.
BUDGET = ", maxNumSeqs: 64, maxNumBatchedTokens: 1024"


def prompt(i, words=1500):
    rng = random.Random(i)
    return " ".join(rng.choice(WORDS) for _ in range(words))


def hold_histogram(spoke):
    """(requests, requests held under 1 ms, seconds held in all) from the spoke's metrics."""
    text = httpx.get(spoke.admin + "/metrics", timeout=5).text

    def value(pattern):
        m = re.search(pattern, text, re.M)
        return float(m.group(1)) if m else None

    count = value(r'^switchyard_spoke_dispatch_hold_seconds_count\{worker_set="local"\} (\S+)$')
    fast = value(r'^switchyard_spoke_dispatch_hold_seconds_bucket\{worker_set="local",le="0\.001"\} (\S+)$')
    total = value(r'^switchyard_spoke_dispatch_hold_seconds_sum\{worker_set="local"\} (\S+)$')
    return count, fast, total


def held_now(spoke):
    text = httpx.get(spoke.admin + "/metrics", timeout=5).text
    m = re.search(r'^switchyard_spoke_dispatch_held\{worker_set="local"\} (\S+)$', text, re.M)
    return float(m.group(1)) if m else None


def burst(spoke, n, words=1500, stagger=0.0):
    """`n` streams sent to the spoke at once (or the i-th `stagger` × i seconds after the first);
    each one's (sent, first token, done) wall times."""
    client = openai.OpenAI(base_url=spoke.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    times, errors = {}, []
    start = threading.Barrier(n)

    def stream(i):
        try:
            start.wait()
            time.sleep(stagger * i)
            sent = time.monotonic()
            first = None
            chunks = client.chat.completions.create(model="standard-model", stream=True, max_tokens=16,
                                                    messages=[{"role": "user", "content": prompt(i, words)}])
            for c in chunks:
                if first is None and c.choices and c.choices[0].delta.content:
                    first = time.monotonic()
            times[i] = (sent, first, time.monotonic())
        except Exception as e:  # noqa: BLE001 - collected and reported below
            errors.append(e)

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    return times


def test_long_prompts_for_one_worker_are_sent_one_first_token_after_another(start_sim, start_spoke):
    # Steps at a quarter of their modelled time (five times REFERENCE's): each prefill lasts far
    # longer than the four clients' send jitter on a busy machine (at REFERENCE's scale a late
    # sender could arrive after the first prompt's first token, and rightly not be held).
    sim = start_sim("--profile", "l40s-27b-fp8", "--time-scale", "0.25", "--num-gpu-blocks-override", "2000", workers=1)
    spoke = start_spoke(spoke_config([sim], capacity_extra=BUDGET))
    times = burst(spoke, 4)
    count, fast, total = hold_histogram(spoke)
    assert count == 4, (count, fast, total)
    # The first was sent at once; the other three waited for the one before them.
    assert fast == 1, (count, fast, total)
    assert total > 0
    # Held in turn, the prompts reached their first tokens one after another, none together.
    firsts = sorted(t[1] for t in times.values())
    assert all(b - a > 0.005 for a, b in zip(firsts, firsts[1:])), firsts
    # Every one of them reached the engine and finished there.
    assert httpx.get(sim.workers[0]["url"] + "/sim/state", timeout=5).json()["finished"] == 4


def test_prompts_held_for_one_worker_reach_it_oldest_first(start_sim, start_spoke):
    # At full speed a long prompt's prefill outlasts the arrivals of all the others, 100 ms
    # apart (far more than a Python client's send jitter), so all but the first are held.
    sim = start_sim("--profile", "l40s-27b-fp8", "--time-scale", "1", "--num-gpu-blocks-override", "2000", workers=1)
    spoke = start_spoke(spoke_config([sim], capacity_extra=BUDGET))
    burst(spoke, 1, words=20)  # a warm tokenizer: the first prompt is not slowed at the spoke
    times = burst(spoke, 6, stagger=0.1)
    count, fast, _ = hold_histogram(spoke)
    assert count == 7 and fast <= 3, (count, fast)
    # Held in one line, they were sent in the order they arrived: first tokens in that order.
    by_first_token = sorted(times, key=lambda i: times[i][1])
    assert by_first_token == sorted(times, key=lambda i: times[i][0]), times
    # Nobody is left in the line.
    assert held_now(spoke) == 0
    # A held request plans again when a change reaches it in line, not on a clock: a few
    # decisions per request, however long it waited (a millisecond poll made thousands).
    decisions = float(re.search(r"^switchyard_spoke_decision_seconds_count (\S+)$",
                                httpx.get(spoke.admin + "/metrics", timeout=5).text, re.M).group(1))
    assert decisions <= 5 * count, (decisions, count)


def test_short_prompts_wait_only_for_the_gap_and_immediate_holds_nothing(start_sim, start_spoke):
    sim = start_sim(*REFERENCE, workers=1)
    # Short prompts fit one step together: none waits for another's first token, only (at
    # most) for the gap after one, 8 % of a short wait.
    spoke = start_spoke(spoke_config([sim], capacity_extra=", maxNumBatchedTokens: 8192"))
    times = burst(spoke, 4, words=60)
    count, _, total = hold_histogram(spoke)
    assert count == 4
    slowest_first_token = max(t[1] - t[0] for t in times.values())
    assert total < 0.08 * slowest_first_token * 4 + 0.01, (total, slowest_first_token)
    spoke.stop()

    immediate = start_spoke(spoke_config([sim], capacity_extra=BUDGET, worker_set_extra="  dispatchPacing: Immediate\n"))
    burst(immediate, 4)
    count, fast, _ = hold_histogram(immediate)
    assert (count, fast) == (4, 4)
