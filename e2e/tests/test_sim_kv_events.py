"""An independent decoder (pyzmq + msgpack, real libzmq) reads the simulator's KV events."""

import time

import httpx
import msgpack
import pytest
import zmq

END_SEQ = (1 << 64) - 1


def subscribe(endpoint, topic=b"kv"):
    ctx = zmq.Context.instance()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, topic)
    sub.setsockopt(zmq.RCVTIMEO, 3000)
    sub.connect(endpoint)
    time.sleep(0.3)  # slow joiner: let the subscription reach the publisher
    return sub


def receive(sub, until_idle=0.5):
    """All batches until the stream is idle: list of (seq, payload)."""
    out = []
    sub.setsockopt(zmq.RCVTIMEO, int(until_idle * 1000))
    while True:
        try:
            topic, seq, payload = sub.recv_multipart()
        except zmq.Again:
            return out
        assert topic == b"kv" and len(seq) == 8
        out.append((int.from_bytes(seq, "big"), payload))


def decode_events(payload):
    batch = msgpack.unpackb(payload, raw=False)
    assert isinstance(batch, list) and len(batch) == 3, batch
    ts, events, dp_rank = batch
    assert isinstance(ts, float) and dp_rank == 0
    norm = []
    for e in events:
        if isinstance(e, dict):
            norm.append(e)
        else:  # legacy positional form
            tag = e[0]
            if tag == "BlockStored":
                norm.append({"type": tag, "block_hashes": e[1], "parent_block_hash": e[2], "token_ids": e[3], "block_size": e[4]})
            elif tag == "BlockRemoved":
                norm.append({"type": tag, "block_hashes": e[1]})
            else:
                norm.append({"type": tag})
    return norm


def stored_tokens(batches):
    toks = []
    for _, p in batches:
        for e in decode_events(p):
            if e["type"] == "BlockStored":
                assert len(e["token_ids"]) == e["block_size"] * len(e["block_hashes"])
                toks.extend(e["token_ids"])
    return toks


MESSAGES = [{"role": "system", "content": "You route requests to workers that hold their prefix in cache. " * 6},
            {"role": "user", "content": "Which worker should serve this conversation?"}]


@pytest.mark.parametrize("fmt", ["current", "legacy"])
def test_block_stored_tokens_equal_tokenize(start_sim, fmt):
    sim = start_sim("--kv-events-format", fmt)
    sub = subscribe(sim.workers[0]["kvEvents"])
    tokens = httpx.post(sim.url + "/tokenize", json={"model": sim.model, "messages": MESSAGES}).json()["tokens"]
    r = httpx.post(sim.url + "/v1/chat/completions", json={"model": sim.model, "messages": MESSAGES, "max_tokens": 1})
    assert r.status_code == 200
    batches = receive(sub)
    block = 16
    full = len(tokens) // block * block
    # Prompt blocks are announced in order with exactly the engine's tokens.
    assert stored_tokens(batches)[:full] == tokens[:full]
    seqs = [s for s, _ in batches]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
    # Parent links chain the stored blocks.
    hashes = []
    for _, p in batches:
        for e in decode_events(p):
            if e["type"] == "BlockStored":
                assert e["parent_block_hash"] == (hashes[-1] if hashes else None)
                hashes.extend(e["block_hashes"])


def replay(endpoint, start):
    ctx = zmq.Context.instance()
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.RCVTIMEO, 3000)
    dealer.connect(endpoint)
    dealer.send_multipart([b"", start.to_bytes(8, "big")])
    got = []
    while True:
        frames = dealer.recv_multipart()
        assert frames[0] == b""
        seq = int.from_bytes(frames[-2], "big")
        if seq == END_SEQ:
            assert frames[-1] == b""
            break
        got.append((seq, frames[-1]))
    dealer.close()
    return got


def test_replay_fills_a_forced_gap(start_sim):
    sim = start_sim()
    w = sim.workers[0]
    sub = subscribe(w["kvEvents"])
    httpx.post(sim.url + "/v1/completions", json={"model": sim.model, "prompt": "alpha " * 40, "max_tokens": 1})
    before = receive(sub)
    sim.faults(dropEventBatches=2)
    httpx.post(sim.url + "/v1/completions", json={"model": sim.model, "prompt": "beta " * 40, "max_tokens": 1})
    httpx.post(sim.url + "/v1/completions", json={"model": sim.model, "prompt": "gamma " * 40, "max_tokens": 1})
    httpx.post(sim.url + "/v1/completions", json={"model": sim.model, "prompt": "delta " * 40, "max_tokens": 1})
    after = receive(sub)
    last = before[-1][0]
    seen = {s for s, _ in after}
    missing = [s for s in range(last + 1, after[-1][0]) if s not in seen]
    assert len(missing) == 2, (last, sorted(seen))
    replayed = dict(replay(w["kvReplay"], missing[0]))
    assert all(m in replayed for m in missing)
    # Replayed batches are byte-identical to what later arrived live.
    for s, p in after:
        if s in replayed:
            assert replayed[s] == p
    assert stored_tokens([(s, replayed[s]) for s in missing])


def test_restart_resets_sequence_and_clears(start_sim):
    sim = start_sim()
    sub = subscribe(sim.workers[0]["kvEvents"])
    httpx.post(sim.url + "/v1/completions", json={"model": sim.model, "prompt": "alpha " * 40, "max_tokens": 1})
    assert receive(sub)
    sim.faults(restartEventStream=True)
    httpx.post(sim.url + "/v1/completions", json={"model": sim.model, "prompt": "beta " * 40, "max_tokens": 1})
    after = receive(sub)
    assert after[0][0] == 0
    assert decode_events(after[0][1]) == [{"type": "AllBlocksCleared"}]
    assert sim.oracle(prompt="alpha " * 40)["cachedPrefixTokens"] == 0


def test_eviction_emits_block_removed_and_loses_the_prefix(start_sim):
    sim = start_sim("--num-gpu-blocks-override", "24")  # 384 tokens of cache
    sub = subscribe(sim.workers[0]["kvEvents"])
    first = "first prefix " * 60
    r = httpx.post(sim.url + "/v1/completions", json={"model": sim.model, "prompt": first, "max_tokens": 1}).json()
    cached_before = sim.oracle(prompt=first)["cachedPrefixTokens"]
    assert cached_before >= 100
    for i in range(4):
        httpx.post(sim.url + "/v1/completions", json={"model": sim.model, "prompt": f"filler {i} " * 60, "max_tokens": 1})
    removed = [e for _, p in receive(sub) for e in decode_events(p) if e["type"] == "BlockRemoved"]
    assert sum(len(e["block_hashes"]) for e in removed) >= 10
    assert sim.oracle(prompt=first)["cachedPrefixTokens"] < cached_before
    again = httpx.post(sim.url + "/v1/completions", json={"model": sim.model, "prompt": first, "max_tokens": 1}).json()
    details = again["usage"]["prompt_tokens_details"]
    assert (details or {}).get("cached_tokens", 0) < cached_before
    assert r["usage"]["prompt_tokens"] == again["usage"]["prompt_tokens"]
