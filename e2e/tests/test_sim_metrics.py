"""`/metrics` parses as Prometheus text and its values move with load."""

import threading
import time

import httpx
from prometheus_client.parser import text_string_to_metric_families


def scrape(sim):
    text = httpx.get(sim.url + "/metrics").text
    samples = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            samples.setdefault(s.name, []).append(s)
    return samples


def value(samples, name, **labels):
    return sum(s.value for s in samples.get(name, []) if all(s.labels.get(k) == v for k, v in labels.items()))


def test_metrics_parse_and_move(start_sim):
    sim = start_sim("--time-scale", "5")  # slow enough to observe a running batch
    m0 = scrape(sim)
    for name in ["vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:prompt_tokens_total",
                 "vllm:generation_tokens_total", "vllm:time_to_first_token_seconds_count",
                 "vllm:inter_token_latency_seconds_count", "vllm:e2e_request_latency_seconds_count"]:
        assert name in m0, name
    assert m0["vllm:num_requests_running"][0].labels["model_name"] == sim.model
    assert value(m0, "vllm:prompt_tokens_total") == 0

    done = []

    def one(i):
        r = httpx.post(sim.url + "/v1/completions", json={"model": sim.model, "prompt": f"load {i} " * 30, "max_tokens": 40}, timeout=60)
        done.append(r.status_code)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    busy = None
    for _ in range(100):
        m = scrape(sim)
        if value(m, "vllm:num_requests_running") > 0 and value(m, "vllm:kv_cache_usage_perc") > 0:
            busy = m
            break
        threading.Event().wait(0.05)
    for t in threads:
        t.join()
    assert busy is not None, "never saw a running batch"
    m1 = scrape(sim)
    assert done == [200] * 6
    assert value(m1, "vllm:generation_tokens_total") == 240
    assert value(m1, "vllm:prompt_tokens_total") > 0
    assert value(m1, "vllm:num_requests_running") == 0
    assert value(m1, "vllm:time_to_first_token_seconds_count") == 6
    assert value(m1, "vllm:e2e_request_latency_seconds_count") == 6
    assert value(m1, "vllm:request_success_total", finished_reason="length") == 6
    # Identical prefixes across calls show up as prefix-cache hits.
    httpx.post(sim.url + "/v1/completions", json={"model": sim.model, "prompt": "load 0 " * 30, "max_tokens": 1}, timeout=60)
    assert value(scrape(sim), "vllm:prefix_cache_hits_total") > value(m1, "vllm:prefix_cache_hits_total")


def _load(sim, n, prefix):
    def one(i):
        httpx.post(sim.url + "/v1/completions", json={"model": sim.model, "prompt": f"{prefix} {i} " * 30, "max_tokens": 10},
                   timeout=60)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def test_behind_schedule_counts_steps_the_machine_could_not_keep(start_sim):
    # Time scale 5: every step lasts long enough that the loop keeps to the model.
    paced = start_sim("--time-scale", "5", kv_events=False)
    assert value(scrape(paced), "sim:behind_schedule_seconds_total") == 0
    t0 = time.monotonic()
    _load(paced, 4, "paced")
    elapsed = time.monotonic() - t0
    assert value(scrape(paced), "sim:behind_schedule_seconds_total") < 0.2 * elapsed
    # A time scale so small that no machine can step that fast: the loop falls behind and says so.
    rushed = start_sim("--time-scale", "0.00001", kv_events=False)
    _load(rushed, 4, "rushed")
    assert value(scrape(rushed), "sim:behind_schedule_seconds_total") > 0
