"""Both front doors through the spoke with the official SDKs: multi-turn conversations with a
system prompt, tools and a tool-result turn, streaming and not; usage and cached tokens as the
engine reports them; `count_tokens`; cache-aware routing for Messages requests."""

import random

import anthropic
import httpx
import openai

from conftest import spoke_config

WORDS = "model cache request token worker cluster policy route queue prompt latency region tenant batch stream event".split()

WEATHER = {
    "name": "get_weather",
    "description": "Current weather of a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                     "required": ["city"]},
}


def text(seed, words):
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(words))


def tool_conversation():
    """A user question, an assistant tool call, the tool's result, and a follow-up."""
    return [
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": [{"type": "text", "text": "Let me check."},
                                          {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "18 C and sunny"},
                                     {"type": "text", "text": "And tomorrow?"}]},
    ]


def anthropic_client(spoke, **kw):
    return anthropic.Anthropic(base_url=spoke.url, api_key="sk-test", max_retries=0, **kw)


def test_anthropic_sdk_multi_turn_with_tools(start_sim, start_spoke):
    sim = start_sim(workers=1)
    spoke = start_spoke(spoke_config([sim]))
    c = anthropic_client(spoke)
    system = "You are a weather assistant. " + text(1, 200)
    kwargs = dict(model="standard-model", system=system, messages=tool_conversation(), tools=[WEATHER])

    # Non-streaming: text, the stop reason for the token limit, usage.
    first = c.messages.create(max_tokens=6, **kwargs)
    assert first.type == "message" and first.role == "assistant" and first.model == "standard-model"
    assert first.stop_reason == "max_tokens"
    assert first.content[0].type == "text" and first.content[0].text.strip()
    assert first.usage.output_tokens == 6

    # count_tokens equals the engine's prompt tokens for the same messages.
    counted = c.messages.count_tokens(**kwargs).input_tokens
    assert first.usage.input_tokens + first.usage.cache_read_input_tokens == counted

    # A repeat is served from the engine's prefix cache, and the usage says so.
    again = c.messages.create(max_tokens=6, **kwargs)
    assert again.usage.cache_read_input_tokens >= 0.9 * counted
    assert again.usage.input_tokens + again.usage.cache_read_input_tokens == counted

    # Streaming through the SDK's accumulator (it enforces the event order).
    with c.messages.stream(max_tokens=5, **kwargs) as stream:
        deltas = [e for e in stream if e.type == "content_block_delta"]
        final = stream.get_final_message()
    assert len(deltas) == 5
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 5
    assert final.content[0].text == "".join(d.delta.text for d in deltas)
    assert final.usage.cache_read_input_tokens >= 0.9 * counted

    # Raw events: every one has an `event:` line; message_start first with empty content.
    with httpx.stream("POST", spoke.url + "/v1/messages", json={"max_tokens": 3, "stream": True, **kwargs},
                      headers={"x-api-key": "sk-test", "anthropic-version": "2023-06-01"}, timeout=30) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        frames = [f for f in r.read().decode().split("\n\n") if f.strip()]
    names = [f.splitlines()[0] for f in frames]
    assert all(n.startswith("event: ") for n in names)
    assert names[0] == "event: message_start" and '"content":[]' in frames[0]
    assert names[-2:] == ["event: message_delta", "event: message_stop"]


def test_anthropic_sdk_tool_use_stream_and_not(start_sim, start_spoke):
    sim = start_sim(workers=1)
    spoke = start_spoke(spoke_config([sim]))
    c = anthropic_client(spoke)
    kwargs = dict(model="standard-model", max_tokens=64, tools=[WEATHER], tool_choice={"type": "any"},
                  messages=[{"role": "user", "content": "Weather in Oslo?"}])
    msg = c.messages.create(**kwargs)
    assert msg.stop_reason == "tool_use"
    calls = [b for b in msg.content if b.type == "tool_use"]
    assert len(calls) == 1 and calls[0].name == "get_weather" and calls[0].id
    assert isinstance(calls[0].input, dict) and "city" in calls[0].input
    with c.messages.stream(**kwargs) as stream:
        final = stream.get_final_message()
    streamed = [b for b in final.content if b.type == "tool_use"]
    assert final.stop_reason == "tool_use" and len(streamed) == 1
    assert isinstance(streamed[0].input, dict) and "city" in streamed[0].input
    # The tool's answer goes back as a tool_result turn and the conversation continues.
    follow = c.messages.create(model="standard-model", max_tokens=4, tools=[WEATHER], messages=[
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": calls[0].id, "name": "get_weather", "input": calls[0].input}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": calls[0].id, "content": "3 C, snow"}]},
    ])
    assert follow.stop_reason == "max_tokens" and follow.content[0].type == "text"


def test_anthropic_versions_auth_headers_and_errors(start_sim, start_spoke):
    sim = start_sim(workers=1)
    spoke = start_spoke(spoke_config([sim]))
    body = {"model": "standard-model", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    for headers in ({"x-api-key": "k", "anthropic-version": "2023-06-01"},
                    {"authorization": "Bearer k", "anthropic-version": "2026-10-21"}):
        r = httpx.post(spoke.url + "/v1/messages", json=body, headers=headers, timeout=30)
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["output_tokens"] == 2 and r.headers["request-id"]
    # 2026-10-21 removed sampling parameters.
    r = httpx.post(spoke.url + "/v1/messages", json={**body, "temperature": 0.5},
                   headers={"anthropic-version": "2026-10-21"}, timeout=30)
    assert r.status_code == 400 and r.json()["type"] == "error" and r.json()["error"]["type"] == "invalid_request_error"
    c = anthropic_client(spoke)
    try:
        c.messages.create(model="nope", max_tokens=2, messages=[{"role": "user", "content": "x"}])
        raise AssertionError("expected NotFoundError")
    except anthropic.NotFoundError as e:
        assert e.body["error"]["type"] == "not_found_error"
    try:
        c.messages.create(model="standard-model", max_tokens=2, messages=[])
        raise AssertionError("expected BadRequestError")
    except anthropic.BadRequestError as e:
        assert e.body["type"] == "error"


def test_openai_sdk_tools_and_tool_results(start_sim, start_spoke):
    sim = start_sim(workers=1)
    spoke = start_spoke(spoke_config([sim]))
    c = openai.OpenAI(base_url=spoke.url + "/v1", api_key="unused", max_retries=0)
    tool = {"type": "function", "function": {"name": WEATHER["name"], "description": WEATHER["description"],
                                             "parameters": WEATHER["input_schema"]}}
    messages = [{"role": "system", "content": "You are a weather assistant."},
                {"role": "user", "content": "Weather in Rome?"}]
    forced = c.chat.completions.create(model="standard-model", messages=messages, tools=[tool], tool_choice="required", max_tokens=64)
    call = forced.choices[0].message.tool_calls[0]
    assert forced.choices[0].finish_reason == "tool_calls" and call.function.name == "get_weather"
    chunks = list(c.chat.completions.create(model="standard-model", messages=messages, tools=[tool], tool_choice="required",
                                            max_tokens=64, stream=True, stream_options={"include_usage": True}))
    args = "".join(tc.function.arguments or "" for ch in chunks if ch.choices for tc in (ch.choices[0].delta.tool_calls or []))
    assert '"city"' in args and chunks[-1].usage.completion_tokens > 0
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason] == ["tool_calls"]
    # The tool's result goes back and the conversation continues, with cached tokens reported.
    turn = messages + [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                       {"role": "tool", "tool_call_id": call.id, "content": "21 C"}]
    for _ in range(2):
        done = c.chat.completions.create(model="standard-model", messages=turn, tools=[tool], max_tokens=4)
    assert done.choices[0].finish_reason == "length" and done.usage.completion_tokens == 4
    assert done.usage.prompt_tokens_details.cached_tokens >= 0.8 * done.usage.prompt_tokens


def test_long_system_prompt_through_messages_follows_the_cache(start_sim, start_spoke):
    """Messages requests route on the KV index exactly as chat does."""
    sim = start_sim(workers=3)
    spoke = start_spoke(spoke_config([sim]))
    c = anthropic_client(spoke)
    systems = [f"Instructions {i}. " + text(100 + i, 1500) for i in range(3)]
    order = [(p, q) for q in range(4) for p in range(3)]
    random.Random(3).shuffle(order)
    counted = {p: c.messages.count_tokens(model="standard-model", system=systems[p],
                                          messages=[{"role": "user", "content": "q"}]).input_tokens for p in range(3)}
    seen, served_by, ratios = set(), {}, []
    for p, q in order:
        raw = c.messages.with_raw_response.create(model="standard-model", max_tokens=2, system=systems[p],
                                                  messages=[{"role": "user", "content": f"question {q}"}])
        msg = raw.parse()
        target = raw.headers["x-switchyard-target"]
        if p in seen:
            ratios.append(msg.usage.cache_read_input_tokens / counted[p])
            assert target == served_by[p], "a cached system prompt stays on its worker"
        seen.add(p)
        served_by.setdefault(p, target)
    assert min(ratios) >= 0.9, ratios
