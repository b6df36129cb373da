"""Differential test: the same requests to `switchyard sim` and to a real vLLM engine, with the
same tokenizer, model name and block size. Everything a router or client can observe must
match: response and error shapes, `/tokenize`, KV-event streams and metric families. Where the
simulator must differ, the difference is listed here with its reason, so any new drift fails.
"""

import json
import random
import time

import httpx
import msgpack
import pytest
import zmq
from prometheus_client.parser import text_string_to_metric_families

from .conftest import BLOCK_SIZE, MODEL_NAME

# Values that differ by nature (ids, clocks, sampled text, engine-specific hashes); their
# presence and type are still compared.
VOLATILE = {"id", "created", "request_id", "system_fingerprint", "content", "text", "root", "token_ids_sampled"}

# vLLM metric families the simulator does not export, and why.
NOT_SIMULATED = {
    # Speculative decoding, LoRA, multimodal, KV offloading, sleep mode, disaggregation: the
    # simulator models none of them, and nothing in Switchyard reads them.
    "vllm:mm_cache_queries": "no multimodal inputs",
    "vllm:mm_cache_hits": "no multimodal inputs",
    "vllm:engine_sleep_state": "no sleep mode",
    "vllm:external_prefix_cache_queries": "no KV connector (external cache)",
    "vllm:external_prefix_cache_hits": "no KV connector (external cache)",
    "vllm:estimated_flops_per_gpu": "roofline estimates of a real GPU",
    "vllm:estimated_read_bytes_per_gpu": "roofline estimates of a real GPU",
    "vllm:estimated_write_bytes_per_gpu": "roofline estimates of a real GPU",
}


def shape(v, key=None):
    """A JSON value's structure: dict keys with their shapes, list element shapes, leaf types."""
    if isinstance(v, dict):
        return {k: shape(x, k) for k, x in v.items()}
    if isinstance(v, list):
        return ["list", sorted({json.dumps(shape(x), sort_keys=True) for x in v})] if key not in VOLATILE else "list"
    if v is None:
        return None
    return type(v).__name__ if not isinstance(v, bool) else "bool"


def diff(a, b, path="$"):
    """Human-readable differences between two shapes (sim first, vLLM second)."""
    out = []
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a:
                out.append(f"{path}.{k}: missing in sim (vLLM: {json.dumps(b[k])[:80]})")
            elif k not in b:
                out.append(f"{path}.{k}: only in sim ({json.dumps(a[k])[:80]})")
            else:
                out += diff(a[k], b[k], f"{path}.{k}")
    elif a != b:
        out.append(f"{path}: sim {json.dumps(a)[:120]} vs vLLM {json.dumps(b)[:120]}")
    return out


@pytest.fixture
def pair(engines, start_sim):
    # vLLM's defaults where the fixture's differ: the empty topic.
    sim = start_sim("--block-size", str(BLOCK_SIZE), "--max-model-len", "4096", "--served-model-name", MODEL_NAME,
                    "--prefix-caching-hash-algo", "sha256_cbor", topic="")
    return sim.url, engines[0].url, sim, engines[0]


def both(pair, method, path, **kw):
    sim_url, vllm_url = pair[0], pair[1]
    return (httpx.request(method, sim_url + path, timeout=60, **kw), httpx.request(method, vllm_url + path, timeout=60, **kw))


def unique(tag):
    return f"{tag} {time.time_ns()} " + "the cache of worker route policy tenant model " * 12


def non_stream_cases():
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": unique("chat")}]
    return {
        "models": ("GET", "/v1/models", None),
        "chat": ("POST", "/v1/chat/completions", {"model": MODEL_NAME, "messages": msgs, "max_tokens": 3, "ignore_eos": True}),
        "completion": ("POST", "/v1/completions", {"model": MODEL_NAME, "prompt": unique("completion"), "max_tokens": 3, "ignore_eos": True}),
        "tokenize chat": ("POST", "/tokenize", {"model": MODEL_NAME, "messages": msgs, "add_generation_prompt": True}),
        "tokenize prompt": ("POST", "/tokenize", {"model": MODEL_NAME, "prompt": "Hello there, ünïcödé 東京 🚀"}),
        "tokenize no special": ("POST", "/tokenize", {"model": MODEL_NAME, "prompt": "<|im_start|>x", "add_special_tokens": False}),
        "detokenize": ("POST", "/detokenize", {"model": MODEL_NAME, "tokens": [1, 380, 259, 201, 42, 657]}),
        "render chat": ("POST", "/v1/chat/completions/render", {"model": MODEL_NAME, "messages": msgs}),
        "render completion": ("POST", "/v1/completions/render", {"model": MODEL_NAME, "prompt": "Hello there"}),
    }


def test_response_shapes_match(pair):
    problems = []
    for name, (method, path, body) in non_stream_cases().items():
        s, v = both(pair, method, path, **({"json": body} if body is not None else {}))
        assert (s.status_code, v.status_code) == (200, 200), (name, s.text, v.text)
        problems += [f"{name}: {p}" for p in diff(shape(s.json()), shape(v.json()))]
    assert not problems, "\n".join(problems)


def test_tokenize_output_is_identical(pair):
    for name, (method, path, body) in non_stream_cases().items():
        if path not in ("/tokenize", "/detokenize"):
            continue
        s, v = both(pair, method, path, json=body)
        assert s.json() == v.json(), name
    # The token ids a render returns are the ones /tokenize returns.
    cases = non_stream_cases()
    s, v = both(pair, "POST", "/v1/chat/completions/render", json=cases["render chat"][2])
    assert s.json()["token_ids"] == v.json()["token_ids"]


def sse(resp):
    out = []
    for line in resp.iter_lines():
        if line.startswith("data: "):
            out.append(line[6:])
    return out


def test_streams_match(pair):
    problems = []
    cases = {
        "chat stream": ("/v1/chat/completions", {"model": MODEL_NAME, "messages": [{"role": "user", "content": unique("s")}], "max_tokens": 4,
                                                 "ignore_eos": True, "stream": True}),
        "chat stream usage": ("/v1/chat/completions", {"model": MODEL_NAME, "messages": [{"role": "user", "content": unique("u")}], "max_tokens": 4,
                                                       "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}),
        "completion stream usage": ("/v1/completions", {"model": MODEL_NAME, "prompt": unique("c"), "max_tokens": 4, "ignore_eos": True,
                                                        "stream": True, "stream_options": {"include_usage": True}}),
    }
    for name, (path, body) in cases.items():
        events = []
        for url in pair[:2]:
            with httpx.stream("POST", url + path, json=body, timeout=60) as r:
                assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream"), (name, url)
                events.append(sse(r))
        s, v = events
        assert s[-1] == v[-1] == "[DONE]", (name, s[-1], v[-1])
        assert len(s) == len(v), (name, s, v)
        for i, (a, b) in enumerate(zip(s[:-1], v[:-1])):
            problems += [f"{name} event {i}: {p}" for p in diff(shape(json.loads(a)), shape(json.loads(b)))]
    assert not problems, "\n".join(problems)


ERROR_CASES = {
    "unknown model": ("/v1/chat/completions", {"model": "nope", "messages": [{"role": "user", "content": "x"}]}),
    "bad json": ("/v1/chat/completions", b"{"),
    "missing messages": ("/v1/chat/completions", {"model": MODEL_NAME}),
    "missing prompt": ("/v1/completions", {"model": MODEL_NAME}),
    "prompt too long": ("/v1/completions", {"model": MODEL_NAME, "prompt": "word " * 5000, "max_tokens": 5}),
    "max_tokens < 1": ("/v1/chat/completions", {"model": MODEL_NAME, "messages": [{"role": "user", "content": "x"}], "max_tokens": 0}),
    "temperature not a number": ("/v1/chat/completions", {"model": MODEL_NAME, "messages": [{"role": "user", "content": "x"}], "temperature": "hot"}),
    "token id out of vocabulary": ("/v1/completions", {"model": MODEL_NAME, "prompt": [1, 2, 999999], "max_tokens": 1}),
    "tokenize unknown model": ("/tokenize", {"model": "nope", "prompt": "x"}),
    "body not an object": ("/v1/chat/completions", [1]),
    "messages not a list": ("/v1/chat/completions", {"model": MODEL_NAME, "messages": "hi"}),
    "message without role": ("/v1/chat/completions", {"model": MODEL_NAME, "messages": [{"content": "x"}]}),
    "empty conversation": ("/v1/chat/completions", {"model": MODEL_NAME, "messages": []}),
    "empty prompt": ("/v1/completions", {"model": MODEL_NAME, "prompt": ""}),
    "max_tokens not a number": ("/v1/chat/completions", {"model": MODEL_NAME, "messages": [{"role": "user", "content": "x"}], "max_tokens": "abc"}),
    "max_tokens fractional": ("/v1/completions", {"model": MODEL_NAME, "prompt": "x", "max_tokens": 2.5}),
    "max_tokens negative": ("/v1/chat/completions", {"model": MODEL_NAME, "messages": [{"role": "user", "content": "x"}], "max_tokens": -1}),
    "stream not a boolean": ("/v1/chat/completions", {"model": MODEL_NAME, "messages": [{"role": "user", "content": "x"}], "stream": [1]}),
    "negative temperature": ("/v1/chat/completions", {"model": MODEL_NAME, "messages": [{"role": "user", "content": "x"}], "temperature": -1}),
    "top_p above 1": ("/v1/chat/completions", {"model": MODEL_NAME, "messages": [{"role": "user", "content": "x"}], "top_p": 2}),
    "max_tokens above the context": ("/v1/completions", {"model": MODEL_NAME, "prompt": "x", "max_tokens": 5000}),
    "n = 0": ("/v1/chat/completions", {"model": MODEL_NAME, "messages": [{"role": "user", "content": "x"}], "n": 0}),
}

# Inputs pydantic's lax mode accepts: both engines must serve them.
LAX_CASES = {
    "max_tokens as a string": ("/v1/chat/completions", {"model": MODEL_NAME, "messages": [{"role": "user", "content": "x"}], "max_tokens": "2"}),
    "stream as a word": ("/v1/completions", {"model": MODEL_NAME, "prompt": "x", "max_tokens": 2, "stream": "no"}),
    "temperature as a string": ("/v1/completions", {"model": MODEL_NAME, "prompt": "x", "max_tokens": 2, "temperature": "0.5"}),
    "max_tokens past the context is cut": ("/v1/completions", {"model": MODEL_NAME, "prompt": "word " * 1300, "max_tokens": 4096, "ignore_eos": True}),
}


def test_lax_inputs_are_served_by_both(pair):
    for name, (path, body) in LAX_CASES.items():
        s, v = both(pair, "POST", path, json=body)
        assert (s.status_code, v.status_code) == (200, 200), (name, s.text[:300], v.text[:300])
        if "past the context" in name:
            assert [r.json()["usage"]["total_tokens"] for r in (s, v)] == [4096, 4096]
    # The default output of a completion: 16 tokens, finish "length".
    s, v = both(pair, "POST", "/v1/completions", json={"model": MODEL_NAME, "prompt": "x", "ignore_eos": True})
    assert [(r.json()["usage"]["completion_tokens"], r.json()["choices"][0]["finish_reason"]) for r in (s, v)] == [(16, "length")] * 2


def test_error_bodies_match(pair):
    problems = []
    for name, (path, body) in ERROR_CASES.items():
        kw = {"content": body, "headers": {"content-type": "application/json"}} if isinstance(body, bytes) else {"json": body}
        s, v = both(pair, "POST", path, **kw)
        if s.status_code != v.status_code:
            problems.append(f"{name}: status sim {s.status_code} vs vLLM {v.status_code} ({v.text[:200]})")
            continue
        se, ve = s.json()["error"], v.json()["error"]
        for k in ("type", "param", "code"):
            if se.get(k) != ve.get(k):
                problems.append(f"{name}: error.{k} sim {se.get(k)!r} vs vLLM {ve.get(k)!r} (vLLM message: {ve['message'][:160]})")
        problems += [f"{name}: {p}" for p in diff(shape(s.json()), shape(v.json()))]
    assert not problems, "\n".join(problems)


def subscribe(endpoint):
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(endpoint)
    return sub


def drain(sub, idle=0.7):
    batches = []
    sub.setsockopt(zmq.RCVTIMEO, int(idle * 1000))
    while True:
        try:
            frames = sub.recv_multipart()
        except zmq.Again:
            return batches
        batches.append(frames)


def events_of(batches):
    """(frame layout, decoded batches): checks the envelope and returns every event."""
    out = []
    for topic, seq, payload in batches:
        assert len(seq) == 8
        ts, events, dp_rank = msgpack.unpackb(payload, raw=False)
        assert isinstance(ts, float) and dp_rank == 0
        out.append((topic, int.from_bytes(seq, "big"), events))
    return out


def test_kv_event_streams_match(pair):
    sim_url, vllm_url, sim, engine = pair
    subs = [subscribe(sim.workers[0]["kvEvents"].replace("*", "127.0.0.1")), subscribe(engine.kv_events)]
    time.sleep(0.5)  # slow joiner
    for s in subs:
        drain(s, idle=0.2)
    base = unique("kv") * 3
    sequence = [
        {"prompt": base, "max_tokens": 40},  # prefill blocks, then decode blocks
        {"prompt": base + " more words after the shared part " * 6, "max_tokens": 2},  # extends a cached prefix
        {"prompt": base, "max_tokens": 1},  # a full hit: no new blocks
    ]
    streams, per_request = [], []
    for url, sub in zip((sim_url, vllm_url), subs):
        batches, requests = [], []
        for body in sequence:
            r = httpx.post(url + "/v1/completions", json={"model": MODEL_NAME, "ignore_eos": True, **body}, timeout=60)
            assert r.status_code == 200, r.text
            time.sleep(0.3)
            got = events_of(drain(sub, idle=0.5))
            batches += got
            requests.append((r.json()["usage"]["prompt_tokens"], [e for _, _, evs in got for e in evs]))
        streams.append(batches)
        per_request.append(requests)
    sim_stream, vllm_stream = streams
    # The envelope: topic, consecutive sequence numbers.
    for st in streams:
        assert [t for t, _, _ in st] == [b""] * len(st)
        seqs = [s for _, s, _ in st]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), seqs
    # Per request, the same events field for field, apart from the generated tokens (a random
    # model's are not the simulator's): token ids are compared wherever the block holds prompt
    # tokens, and block hashes (sha256_cbor on both) wherever the chain so far is all prompt.
    ends = [{}, {}]  # per stream: block hash -> position after the block
    hashes_compared = []
    for (sim_prompt, sim_events), (vllm_prompt, vllm_events) in zip(*per_request):
        assert sim_prompt == vllm_prompt
        assert [e["type"] for e in sim_events] == [e["type"] for e in vllm_events], (sim_events, vllm_events)
        for a, b in zip(sim_events, vllm_events):
            assert sorted(a) == sorted(b), (sorted(a), sorted(b))
            for k in a:
                if k not in ("block_hashes", "parent_block_hash", "token_ids"):
                    assert a[k] == b[k], (k, a[k], b[k])
            if a["type"] != "BlockStored":
                continue
            assert len(a["block_hashes"]) == len(b["block_hashes"]) == len(a["token_ids"]) // BLOCK_SIZE
            assert len(a["token_ids"]) == len(b["token_ids"])
            starts = []
            for end, e in zip(ends, (a, b)):
                parent = e["parent_block_hash"]
                assert parent is None or parent in end, "a parent is a block stored before"
                start = 0 if parent is None else end[parent]
                starts.append(start)
                for i, h in enumerate(e["block_hashes"]):
                    end[h] = start + (i + 1) * BLOCK_SIZE
            assert starts[0] == starts[1], "the same chain position"
            prompt_part = max(0, min(len(a["token_ids"]), sim_prompt - starts[0]))
            assert a["token_ids"][:prompt_part] == b["token_ids"][:prompt_part]
            prompt_blocks = prompt_part // BLOCK_SIZE
            assert a["block_hashes"][:prompt_blocks] == b["block_hashes"][:prompt_blocks], "sha256_cbor hashes"
            if starts[0] <= sim_prompt:  # the parent block is all prompt
                assert a["parent_block_hash"] == b["parent_block_hash"]
            hashes_compared.append(prompt_blocks)
    assert sum(hashes_compared) >= 10, hashes_compared
    # Batching: one batch per engine step that stored blocks.
    assert [len(evs) for _, _, evs in sim_stream] == [len(evs) for _, _, evs in vllm_stream]
    # Replay from the first sequence number of the run: the same frames as live, then the end
    # marker (sequence 2^64-1, empty payload).
    for endpoint, live in ((sim.workers[0]["kvReplay"].replace("*", "127.0.0.1"), sim_stream), (engine.kv_replay, vllm_stream)):
        replayed = replay(endpoint, live[0][1])
        assert [len(m) for m in replayed[:-1]] == [4] * len(live), [len(m) for m in replayed]
        assert [events_of([m[1:]])[0][1:] for m in replayed[:-1]] == [(s, e) for _, s, e in live]
        assert replayed[-1][0] == b"" and replayed[-1][2] == END_SEQ.to_bytes(8, "big") and replayed[-1][3] == b"", replayed[-1]


END_SEQ = (1 << 64) - 1


def replay(endpoint, start):
    """Every message a replay request from `start` gets, up to and including the end marker."""
    dealer = zmq.Context.instance().socket(zmq.DEALER)
    dealer.setsockopt(zmq.RCVTIMEO, 3000)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(endpoint)
    dealer.send_multipart([b"", start.to_bytes(8, "big")])
    out = []
    while not out or out[-1][2] != END_SEQ.to_bytes(8, "big"):
        out.append(dealer.recv_multipart())
    dealer.close()
    return out


def families(url):
    out = {}
    for f in text_string_to_metric_families(httpx.get(url + "/metrics", timeout=5).text):
        if f.name.startswith("vllm:"):
            labels = {k for s in f.samples for k in s.labels if k not in ("le",)}
            out[f.name] = (f.type, frozenset(labels))
    return out


def test_metric_families_match(pair):
    sim_url, vllm_url = pair[:2]
    # Traffic first, so that labelled series (finished_reason, buckets) exist on both.
    for url in (sim_url, vllm_url):
        httpx.post(url + "/v1/completions", json={"model": MODEL_NAME, "prompt": unique("m"), "max_tokens": 2}, timeout=60)
    s, v = families(sim_url), families(vllm_url)
    problems = [f"{n}: only in sim" for n in sorted(set(s) - set(v))]
    problems += [f"{n}: missing in sim ({t})" for n, (t, _) in sorted(v.items())
                 if n not in s and n not in NOT_SIMULATED and n.removesuffix("_created") not in NOT_SIMULATED]
    for n in sorted(set(s) & set(v)):
        if s[n][0] != v[n][0]:
            problems.append(f"{n}: type sim {s[n][0]} vs vLLM {v[n][0]}")
        if s[n][1] != v[n][1]:
            problems.append(f"{n}: labels sim {sorted(s[n][1])} vs vLLM {sorted(v[n][1])}")
    assert not problems, "\n".join(problems)


def test_eviction_streams_are_identical(small_engine, start_sim):
    """A full cache, evicted and refilled: with the same hash algorithm, block count and
    prompts, the simulator's event stream equals vLLM's value for value — which blocks are
    stored, which are evicted in what order (LRU, tail first), every hash and parent — and
    both report the same cached tokens."""
    sim = start_sim("--block-size", str(BLOCK_SIZE), "--max-model-len", "1024", "--served-model-name", MODEL_NAME,
                    "--num-gpu-blocks-override", "48", "--prefix-caching-hash-algo", "sha256_cbor", topic="")
    rng = random.Random(time.time_ns())
    # 600 prompt tokens (18 full blocks; 2 output tokens stay inside the 19th), as token ids.
    prompts = [[rng.randrange(3, 8000) for _ in range(600)] for _ in range(3)]
    sequence = [prompts[0], prompts[1], prompts[2], prompts[0], prompts[1], prompts[2]]
    runs = []
    for url, endpoint in ((sim.url, sim.workers[0]["kvEvents"].replace("*", "127.0.0.1")), (small_engine.url, small_engine.kv_events)):
        sub = subscribe(endpoint)
        time.sleep(0.5)
        drain(sub, idle=0.2)
        run = []
        for p in sequence:
            r = httpx.post(url + "/v1/completions", json={"model": MODEL_NAME, "prompt": p, "max_tokens": 2, "ignore_eos": True}, timeout=60)
            assert r.status_code == 200, r.text
            time.sleep(0.3)
            events = [e for _, _, evs in events_of(drain(sub, idle=0.5)) for e in evs]
            run.append((r.json()["usage"]["prompt_tokens_details"]["cached_tokens"], events))
        sub.close()
        runs.append(run)
    sim_run, vllm_run = runs
    for i, (a, b) in enumerate(zip(sim_run, vllm_run)):
        assert a == b, (i, a, b)
    removed = sum(1 for _, evs in vllm_run for e in evs if e["type"] == "BlockRemoved")
    cached = [c for c, _ in vllm_run]
    assert removed >= 30 and any(0 < c < 576 for c in cached[3:]), (removed, cached)  # evictions, partial hits
