"""The official openai SDK drives the simulator: chat and completions, streaming and not."""

import time

import openai
import pytest


def client(sim):
    return openai.OpenAI(base_url=sim.url + "/v1", api_key="unused", max_retries=0, timeout=30)


def test_chat_and_completions_stream_and_not(start_sim):
    sim = start_sim()
    c = client(sim)
    models = c.models.list()
    assert [m.id for m in models.data] == [sim.model]

    chat = c.chat.completions.create(model=sim.model, messages=[{"role": "user", "content": "Say something."}], max_tokens=7)
    assert chat.choices[0].finish_reason == "length"
    assert chat.usage.completion_tokens == 7
    assert chat.choices[0].message.role == "assistant"
    assert len(chat.choices[0].message.content) > 0

    stream = c.chat.completions.create(model=sim.model, messages=[{"role": "user", "content": "Stream please."}],
                                       max_tokens=5, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert chunks[-1].usage.completion_tokens == 5
    assert chunks[0].choices[0].delta.role == "assistant"
    assert len(text.split()) == 5, text

    comp = c.completions.create(model=sim.model, prompt="Once upon a time", max_tokens=4)
    assert comp.usage.completion_tokens == 4 and comp.choices[0].finish_reason == "length"
    cstream = list(c.completions.create(model=sim.model, prompt="Once upon a time", max_tokens=4, stream=True))
    assert sum(1 for ch in cstream if ch.choices and ch.choices[0].text) == 4


def test_errors_are_vllm_shaped(start_sim):
    sim = start_sim()
    c = client(sim)
    with pytest.raises(openai.NotFoundError) as e:
        c.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "x"}])
    assert "does not exist" in str(e.value)
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model=sim.model, messages=[{"role": "user", "content": "x"}], max_tokens=10_000_000)
    assert "cannot be greater than max_model_len" in str(e.value)


def ttft(c, sim, messages):
    start = time.perf_counter()
    first = None
    usage = None
    for ch in c.chat.completions.create(model=sim.model, messages=messages, max_tokens=3, stream=True,
                                        stream_options={"include_usage": True}):
        if first is None and ch.choices and ch.choices[0].delta.content:
            first = time.perf_counter() - start
        if ch.usage:
            usage = ch.usage
    return first, usage


def test_repeated_prompt_is_cached_and_faster(start_sim):
    # The reference profile at 1/4 speed: a 4,000-token prefill takes ~270 ms, a cache hit ~10 ms.
    sim = start_sim("--profile", "l40s-27b-fp8", "--time-scale", "0.25")
    c = client(sim)
    words = ("model cache request token worker cluster policy route queue prompt latency region " * 400).split()
    messages = [{"role": "system", "content": " ".join(words[:3900])}, {"role": "user", "content": "Summarise."}]
    cold, cold_usage = ttft(c, sim, messages)
    warm, warm_usage = ttft(c, sim, messages)
    assert cold_usage.prompt_tokens == warm_usage.prompt_tokens > 3900
    assert cold_usage.prompt_tokens_details is None or cold_usage.prompt_tokens_details.cached_tokens == 0
    cached = warm_usage.prompt_tokens_details.cached_tokens
    assert cached > 0.95 * warm_usage.prompt_tokens, cached
    assert warm < cold / 2, (cold, warm)
