"""Fault knobs: failed requests, cut streams, duplicated event batches, slowdown."""

import time

import httpx
import openai
import pytest

from test_sim_kv_events import receive, subscribe


def test_failed_requests_and_cut_streams(start_sim):
    sim = start_sim(kv_events=False)
    body = {"model": sim.model, "prompt": "hello world", "max_tokens": 8}
    sim.faults(failRequests=2)
    assert httpx.post(sim.url + "/v1/completions", json=body).status_code == 500
    assert httpx.post(sim.url + "/v1/completions", json=body).status_code == 500
    assert httpx.post(sim.url + "/v1/completions", json=body).status_code == 200

    sim.faults(cutStreams={"count": 1, "afterTokens": 3})
    c = openai.OpenAI(base_url=sim.url + "/v1", api_key="x", max_retries=0)
    got = []
    with pytest.raises(Exception):
        for ch in c.completions.create(model=sim.model, prompt="hello", max_tokens=8, stream=True):
            got.append(ch.choices[0].text)
    assert len(got) == 3
    # The next stream is whole again.
    assert len([ch for ch in c.completions.create(model=sim.model, prompt="hello", max_tokens=8, stream=True)]) == 8


def test_duplicate_batches_repeat_the_sequence_number(start_sim):
    sim = start_sim()
    sub = subscribe(sim.workers[0]["kvEvents"])
    sim.faults(duplicateEventBatches=1)
    httpx.post(sim.url + "/v1/completions", json={"model": sim.model, "prompt": "dup " * 40, "max_tokens": 1})
    seqs = [s for s, _ in receive(sub)]
    assert seqs[0] == seqs[1], seqs
    assert len(set(seqs)) == len(seqs) - 1


def test_slowdown_stretches_steps(start_sim):
    sim = start_sim(kv_events=False)
    # 100 decode steps: the modelled steps (~0.25 s) outweigh a request's overhead, which on a
    # busy machine can reach a few hundred milliseconds by itself.
    body = {"model": sim.model, "prompt": "slow " * 20, "max_tokens": 100, "ignore_eos": True}

    def timed():
        t0 = time.perf_counter()
        assert httpx.post(sim.url + "/v1/completions", json=body, timeout=60).status_code == 200
        return time.perf_counter() - t0

    # A fresh server's first request also pays its start-up (connection, lazy set-up); the
    # fastest of three warm ones is the steps plus the least overhead seen.
    timed()
    fast = min(timed() for _ in range(3))
    sim.faults(slowdown=20.0)
    slow = timed()
    # 20x the steps is more than 5x steps-plus-overhead unless the overhead dominates 3:1.
    assert slow > 5 * fast, (fast, slow)
