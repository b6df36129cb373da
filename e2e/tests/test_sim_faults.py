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
    body = {"model": sim.model, "prompt": "slow " * 20, "max_tokens": 20}
    # A fresh server's first request also pays its start-up (connection, lazy set-up): time a
    # warm one, so the ratio compares steps with steps.
    httpx.post(sim.url + "/v1/completions", json=body)
    t0 = time.perf_counter()
    httpx.post(sim.url + "/v1/completions", json=body)
    fast = time.perf_counter() - t0
    sim.faults(slowdown=20.0)
    t0 = time.perf_counter()
    httpx.post(sim.url + "/v1/completions", json=body, timeout=30)
    slow = time.perf_counter() - t0
    assert slow > 5 * fast, (fast, slow)
