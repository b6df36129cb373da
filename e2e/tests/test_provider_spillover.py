"""Spillover to external providers, with real processes: a simulated vLLM worker kept busy, a
spoke with the cloud-spillover and pii-residency policies, and two faithful Bedrock Runtime
endpoints (`switchyard sim --api bedrock`) that the spoke reaches through the real
`aws-sdk-bedrockruntime` client (SigV4 with static keys from a mounted-Secret file).

The worker runs one sequence at a time (`--max-num-seqs 1`), so a few long requests leave
requests waiting for it; `MaxWaitingRequests: 2` then filters it out and the request goes to
the pool's providers, `bedrock-a` first (its expected TTFT is lower), `bedrock-b` when `a` is
refused. Every loop here is bounded in count and time.
"""

import concurrent.futures
import json
import re
import threading
import subprocess
import tempfile
import time
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from conftest import spoke_config, stop_process, switchyard_bin

MODEL_ID = "us.meta.llama3-3-70b-instruct-v1:0"

POLICIES = """---
apiVersion: switchyard.dev/v1alpha1
kind: InferencePolicy
metadata: {name: cloud-spillover}
spec:
  priority: 50
  match: {models: [sim-model, standard-model]}
  steps:
  - {type: MaxWaitingRequests, maxWaitingRequests: 2}
  minimize: PredictedTTFT
  onEmpty: Fallback
---
apiVersion: switchyard.dev/v1alpha1
kind: InferencePolicy
metadata: {name: pii-residency}
spec:
  priority: 1000
  match: {tags: [pii]}
  steps:
  - {type: ExcludeExternal}
  - {type: MaxWaitingRequests, maxWaitingRequests: 2}
  minimize: PredictedTTFT
  onEmpty: Reject
---
apiVersion: switchyard.dev/v1alpha1
kind: InferencePolicy
metadata: {name: background-local}
spec:
  priority: 900
  match: {tags: [background]}
  steps:
  - {type: ExcludeExternal}
  minimize: PredictedTTFT
  onEmpty: Reject
"""


def provider(name, url, ttft_ms, max_concurrency=64):
    return f"""---
apiVersion: switchyard.dev/v1alpha1
kind: InferenceProvider
metadata: {{name: {name}}}
spec:
  type: Bedrock
  region: us-east-1
  baseUrl: {url}
  credentials:
    secretRef: {{name: aws, key: credentials}}
  residency: {{external: true}}
  expectedTTFTMs: {ttft_ms}
  limits: {{breakerOpenSeconds: 30, firstByteTimeoutSeconds: 5, maxConcurrency: {max_concurrency}}}
  models:
  - name: sim-model
    providerModelId: {MODEL_ID}
    pricing: {{inputPerMillion: "0.72", outputPerMillion: "0.72", cachedInputPerMillion: "0.072"}}
"""


class Bedrock:
    def __init__(self, proc, url):
        self.proc = proc
        self.url = url

    def log(self):
        return httpx.get(self.url + "/sim/requests", timeout=5).json()["requests"]

    def clear(self):
        httpx.delete(self.url + "/sim/requests", timeout=5)

    def faults(self, **knobs):
        r = httpx.post(self.url + "/sim/faults", json=knobs, timeout=5)
        r.raise_for_status()
        return r.json()


def start_bedrock(first_token_ms=20, per_output_token_ms=2):
    tmp = Path(tempfile.mkdtemp(prefix="bedrock-"))
    ready = tmp / "ready.json"
    proc = subprocess.Popen([switchyard_bin(), "sim", "--api", "bedrock", "--port", "0", "--ready-file", str(ready),
                             "--first-token-ms", str(first_token_ms), "--per-output-token-ms", str(per_output_token_ms), MODEL_ID],
                            stdout=open(tmp / "bedrock.log", "w"), stderr=subprocess.STDOUT)
    deadline = time.time() + 30
    while not ready.exists():
        if proc.poll() is not None or time.time() > deadline:
            proc.kill()
            raise RuntimeError("the Bedrock endpoint did not start")
        time.sleep(0.05)
    time.sleep(0.05)
    return Bedrock(proc, json.loads(ready.read_text())["url"])


@pytest.fixture
def fleet(start_sim, start_spoke):
    """(spoke, worker sim, bedrock-a, bedrock-b), the spoke reading AWS keys from a Secret file."""
    a, b = start_bedrock(), start_bedrock()
    secrets = Path(tempfile.mkdtemp(prefix="secrets-"))
    (secrets / "aws").mkdir()
    (secrets / "aws" / "credentials").write_text("AWS_ACCESS_KEY_ID=AKIDSPILL\nAWS_SECRET_ACCESS_KEY=spill-secret\n")
    sim = start_sim("--max-num-seqs", "1", kv_events=False)
    members = ", {provider: bedrock-a, model: sim-model}, {provider: bedrock-b, model: sim-model}"
    cfg = spoke_config([sim], pool_members=members, policies=POLICIES + provider("bedrock-a", a.url, 300)
                       + provider("bedrock-b", b.url, 400))
    spoke = start_spoke(cfg, "--secrets-dir", str(secrets))
    yield spoke, sim, a, b
    for e in (a, b):
        stop_process(e.proc)


def occupy(spoke, bedrocks, n=4):
    """Saturates the worker with `n` long streamed requests until `release`: tagged
    `background`, they always stay local (policy background-local), and once 4 are on it (one
    running, three waiting) more than 2 wait, so ordinary requests spill. Clears the
    endpoints' logs afterwards, so they show only what the test itself sends."""
    stop = threading.Event()
    pool = concurrent.futures.ThreadPoolExecutor(n)

    def long_request(i):
        with httpx.stream("POST", spoke.url + "/v1/chat/completions", timeout=120,
                          headers={"x-switchyard-tags": "background"}, json={
                "model": "sim-model", "stream": True, "max_tokens": 4000, "ignore_eos": True,
                "messages": [{"role": "user", "content": f"long background job {i}"}]}) as r:
            for _ in r.iter_lines():
                if stop.is_set():
                    break

    futures = [pool.submit(long_request, i) for i in range(n)]
    deadline = time.time() + 15
    while spoke.status()["workers"][0]["inflight"] < 4:
        assert time.time() < deadline, f"the worker did not fill up: {spoke.status()['workers'][0]}"
        time.sleep(0.05)
    time.sleep(0.2)
    for b in bedrocks:
        b.clear()
    return stop, pool, futures


def release(occupied):
    stop, pool, futures = occupied
    stop.set()
    for f in futures:
        f.result(timeout=60)
    pool.shutdown()


def test_both_sdks_reach_bedrock_when_the_worker_is_saturated(fleet):
    spoke, sim, a, b = fleet
    occupied = occupy(spoke, (a, b))
    try:
        oc = openai.OpenAI(base_url=spoke.url + "/v1", api_key="unused", max_retries=0, timeout=60)
        raw = oc.chat.completions.with_raw_response.create(
            model="standard-model", max_tokens=40, messages=[{"role": "system", "content": "be brief"},
                                                              {"role": "user", "content": "Say hello"}])
        assert raw.headers["x-switchyard-provider"] == "bedrock-a"
        assert raw.headers["x-switchyard-route"] == "spillover"
        assert raw.headers["x-switchyard-policy"] == "cloud-spillover"
        done = raw.parse()
        assert done.choices[0].message.content and done.choices[0].finish_reason == "stop"
        assert done.usage.completion_tokens > 0 and done.usage.prompt_tokens > 0

        chunks = list(oc.chat.completions.create(model="standard-model", max_tokens=40, stream=True,
                                                 stream_options={"include_usage": True},
                                                 messages=[{"role": "user", "content": "Stream hello"}]))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        assert text and finish == ["stop"]
        assert chunks[-1].usage.completion_tokens == len(text.split(" "))

        tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
                  "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
        called = oc.chat.completions.create(model="standard-model", max_tokens=40, tools=tools, tool_choice="required",
                                            messages=[{"role": "user", "content": "weather in Paris?"}])
        call = called.choices[0].message.tool_calls[0]
        assert called.choices[0].finish_reason == "tool_calls"
        assert call.function.name == "get_weather" and isinstance(json.loads(call.function.arguments)["city"], str)

        ac = anthropic.Anthropic(base_url=spoke.url, api_key="sk-test", max_retries=0, timeout=60)
        msg = ac.messages.create(model="standard-model", max_tokens=3, messages=[{"role": "user", "content": "Hi"}])
        assert msg.stop_reason == "max_tokens" and msg.usage.output_tokens == 3 and msg.content[0].text
        with ac.messages.stream(model="standard-model", max_tokens=40, system="be brief",
                                messages=[{"role": "user", "content": "Stream hi"}]) as s:
            streamed = "".join(s.text_stream)
            final = s.get_final_message()
        assert streamed and final.stop_reason == "end_turn" and final.usage.output_tokens > 0
        tool_msg = ac.messages.create(
            model="standard-model", max_tokens=40, tool_choice={"type": "any"},
            tools=[{"name": "get_weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}],
            messages=[{"role": "user", "content": "weather?"}])
        assert tool_msg.stop_reason == "tool_use"
        use = [blk for blk in tool_msg.content if blk.type == "tool_use"][0]
        assert use.name == "get_weather" and isinstance(use.input["city"], str)
    finally:
        release(occupied)

    calls = a.log()
    ops = sorted({c["operation"] for c in calls})
    assert ops == ["Converse", "ConverseStream"], ops
    assert len(calls) == 6 and not b.log(), "every spilled request went to the first provider"
    for c in calls:
        assert c["auth"] == "sigv4" and c["amzDate"], c
        assert c["credentialScope"].startswith("AKIDSPILL/") and c["credentialScope"].endswith("/us-east-1/bedrock/aws4_request")
        assert c["modelId"] == MODEL_ID
    # The system prompt went as a system block, the tools as a toolConfig.
    assert any(c["body"].get("system") == [{"text": "be brief"}] for c in calls)
    assert any(c["body"].get("toolConfig", {}).get("toolChoice") == {"any": {}} for c in calls)
    spill = {(s["provider"], s["model"]): s for s in spoke.status()["spillover"]}
    assert spill[("bedrock-a", "sim-model")]["completed"] >= 6
    assert float(spill[("bedrock-a", "sim-model")]["costUsd"]) > 0


def test_pii_requests_never_reach_bedrock(fleet):
    spoke, sim, a, b = fleet
    occupied = occupy(spoke, (a, b))
    try:
        statuses = []
        for i in range(5):
            r = httpx.post(spoke.url + "/v1/chat/completions", timeout=30, headers={"x-switchyard-tags": "pii"},
                           json={"model": "standard-model", "max_tokens": 8,
                                 "messages": [{"role": "user", "content": f"PII-MARKER-{i} my card number"}]})
            statuses.append(r.status_code)
            if r.status_code != 200:
                err = r.json()["error"]
                assert "pii-residency" in err["message"], err
        ordinary = httpx.post(spoke.url + "/v1/chat/completions", timeout=30, json={
            "model": "standard-model", "max_tokens": 8, "messages": [{"role": "user", "content": "ordinary"}]})
        assert ordinary.headers.get("x-switchyard-provider") == "bedrock-a"
    finally:
        release(occupied)
    assert statuses == [503] * 5, f"the saturated worker refuses pii requests under Reject: {statuses}"
    bodies = json.dumps([c["body"] for c in a.log() + b.log()])
    assert "PII-MARKER" not in bodies


def test_throttling_opens_the_breaker_and_moves_to_the_next_provider(fleet):
    spoke, sim, a, b = fleet
    occupied = occupy(spoke, (a, b))
    try:
        a.faults(throttle=3)  # up to the SDK's three attempts
        oc = openai.OpenAI(base_url=spoke.url + "/v1", api_key="unused", max_retries=0, timeout=60)
        raw = oc.chat.completions.with_raw_response.create(model="standard-model", max_tokens=8,
                                                           messages=[{"role": "user", "content": "first"}])
        assert raw.headers["x-switchyard-provider"] == "bedrock-b"
        # The SDK retried the throttled call with backoff (at most 1 s, then 2 s: inside the
        # provider's 5 s first-byte timeout, which bounds the retries too).
        attempts = [c["attempt"] for c in a.log()]
        assert attempts == ["attempt=1; max=3", "attempt=2; max=3", "attempt=3; max=3"], attempts
        assert all(c["errorType"] == "ThrottlingException" for c in a.log())
        breakers = {p["name"]: p["breaker"] for p in spoke.status()["providers"]}
        assert breakers == {"bedrock-a": "open", "bedrock-b": "closed"}
        # While a's breaker is open, planning skips it: nothing more reaches it.
        raw = oc.chat.completions.with_raw_response.create(model="standard-model", max_tokens=8,
                                                           messages=[{"role": "user", "content": "second"}])
        assert raw.headers["x-switchyard-provider"] == "bedrock-b"
        assert len(a.log()) == len(attempts)
        # Both refusing: a clean refusal in the caller's dialect, at once.
        b.faults(throttle=3)
        a.faults(clear=True)
        t0 = time.monotonic()
        with pytest.raises(openai.APIStatusError) as e:
            oc.chat.completions.create(model="standard-model", max_tokens=8, messages=[{"role": "user", "content": "third"}])
        assert e.value.status_code == 503 and time.monotonic() - t0 < 10
        ac = anthropic.Anthropic(base_url=spoke.url, api_key="sk-test", max_retries=0, timeout=60)
        with pytest.raises(anthropic.APIStatusError) as e:
            ac.messages.create(model="standard-model", max_tokens=8, messages=[{"role": "user", "content": "fourth"}])
        assert e.value.status_code == 503 and e.value.body["type"] == "error"
    finally:
        release(occupied)


def test_a_provider_silent_past_its_first_byte_timeout_hands_over_to_the_next(fleet):
    spoke, sim, a, b = fleet
    occupied = occupy(spoke, (a, b))
    try:
        a.faults(slowFirstByte={"count": 1, "ms": 9000})
        t0 = time.monotonic()
        r = httpx.post(spoke.url + "/v1/chat/completions", timeout=30, json={
            "model": "standard-model", "max_tokens": 8, "stream": True,
            "messages": [{"role": "user", "content": "are you there"}]})
        took = time.monotonic() - t0
        assert r.status_code == 200 and r.headers["x-switchyard-provider"] == "bedrock-b"
        assert r.text.rstrip().endswith("data: [DONE]")
        assert 5 <= took < 9, f"handed over after the 5 s first-byte timeout, not the 9 s stall: {took:.2f} s"
        assert {p["name"]: p["breaker"] for p in spoke.status()["providers"]}["bedrock-a"] == "open"
    finally:
        release(occupied)


def test_a_provider_at_its_concurrency_cap_is_skipped(start_sim, start_spoke, tmp_path):
    a, b = start_bedrock(first_token_ms=200, per_output_token_ms=5), start_bedrock()
    try:
        secrets = tmp_path / "secrets"
        (secrets / "aws").mkdir(parents=True)
        (secrets / "aws" / "credentials").write_text("AWS_ACCESS_KEY_ID=AKIDCAP\nAWS_SECRET_ACCESS_KEY=cap\n")
        sim = start_sim("--max-num-seqs", "1", kv_events=False)
        members = ", {provider: bedrock-a, model: sim-model}, {provider: bedrock-b, model: sim-model}"
        cfg = spoke_config([sim], pool_members=members, policies=POLICIES + provider("bedrock-a", a.url, 300, 1)
                           + provider("bedrock-b", b.url, 400))
        spoke = start_spoke(cfg, "--secrets-dir", str(secrets))
        occupied = occupy(spoke, (a, b))
        try:
            def ask(i):
                r = httpx.post(spoke.url + "/v1/chat/completions", timeout=30, json={
                    "model": "standard-model", "max_tokens": 100,
                    "messages": [{"role": "user", "content": f"capped {i}"}]})
                return r.status_code, r.headers.get("x-switchyard-provider")
            with concurrent.futures.ThreadPoolExecutor(3) as pool:
                answers = list(pool.map(ask, range(3)))
        finally:
            release(occupied)
        assert all(status == 200 for status, _ in answers), answers
        # One at a time on a (cap 1, and it answers in about 0.7 s); the others went to b.
        assert sorted(p for _, p in answers) == ["bedrock-a", "bedrock-b", "bedrock-b"], answers
        assert len(a.log()) == 1
    finally:
        for e in (a, b):
            stop_process(e.proc)


def test_a_stream_cut_mid_way_ends_with_an_error_event_in_each_dialect(fleet):
    spoke, sim, a, b = fleet
    occupied = occupy(spoke, (a, b))
    try:
        # A cut is a provider failure: it opens that provider's breaker, so cut both.
        for e in (a, b):
            e.faults(cutStreams={"count": 1, "afterDeltas": 3})
        t0 = time.monotonic()
        with httpx.stream("POST", spoke.url + "/v1/chat/completions", timeout=30, json={
                "model": "standard-model", "stream": True, "max_tokens": 40,
                "messages": [{"role": "user", "content": "cut me"}]}) as r:
            events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
        assert events[-1] != "[DONE]" and "error" in json.loads(events[-1]), events[-3:]
        with httpx.stream("POST", spoke.url + "/v1/messages", timeout=30,
                          headers={"anthropic-version": "2023-06-01", "x-api-key": "sk-test"},
                          json={"model": "standard-model", "stream": True, "max_tokens": 40,
                                "messages": [{"role": "user", "content": "cut me too"}]}) as r:
            lines = list(r.iter_lines())
        kinds = [line[7:] for line in lines if line.startswith("event: ")]
        assert kinds[-1] == "error" and "message_stop" not in kinds, kinds
        assert time.monotonic() - t0 < 20, "no request hangs"
    finally:
        release(occupied)


def test_switchyard_up_spills_over_to_its_bedrock_endpoint(tmp_path):
    import random
    import signal

    from conftest import REPO

    rng = random.Random()
    port, admin = 18000 + rng.randint(0, 499), 18500 + rng.randint(0, 499)
    log = tmp_path / "up.log"
    proc = subprocess.Popen([switchyard_bin(), "up", "--workers", "1", "--port", str(port), "--admin-port", str(admin)],
                            cwd=REPO, stdout=open(log, "w"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 30
        while "Front door" not in log.read_text():
            assert time.time() < deadline and proc.poll() is None, log.read_text()
            time.sleep(0.1)
        assert "spillover: local Bedrock endpoint" in log.read_text()

        def ask(i, tags=None):
            r = httpx.post(url + "/v1/chat/completions", timeout=60, headers={"x-switchyard-tags": tags} if tags else {},
                           json={"model": "standard-model", "max_tokens": 300,
                                 "messages": [{"role": "user", "content": f"request {i}: tell me a long story"}]})
            return r.status_code, r.headers.get("x-switchyard-provider")

        # 100 at once on two clusters of one worker (32 sequences each): more than 2 wait, so
        # the rest spill over. pii-tagged requests arrive in the same burst.
        with concurrent.futures.ThreadPoolExecutor(108) as pool:
            ordinary = [pool.submit(ask, i) for i in range(100)]
            tagged = [pool.submit(ask, 100 + i, "pii") for i in range(8)]
            answers = [f.result() for f in ordinary]
            pii = [f.result() for f in tagged]
        assert all(status == 200 for status, _ in answers), answers
        spilled = sum(1 for _, p in answers if p == "local-bedrock")
        assert 0 < spilled < 100, answers
        # pii requests wait for the local worker (the pii-residency policy excludes external
        # providers), however busy it is.
        assert all(status == 200 and p is None for status, p in pii), pii
        # `up` is a federation: the hub spills what both clusters cannot take at once, and each
        # spoke spills what its own workers cannot; together they account for every spilled
        # request, each priced.
        st = httpx.get(f"http://127.0.0.1:{admin}/status", timeout=5).json()
        assert sorted(st["liveClusters"]) == ["east", "west"], st
        assert st["providers"][0]["name"] == "local-bedrock" and st["providers"][0]["breaker"] == "closed"
        spokes = re.findall(r"spoke http://\S+ \(admin (http://[^)]+)\)", log.read_text())
        assert len(spokes) == 2, log.read_text()
        ledgers = st["spillover"] + [s for a in spokes for s in httpx.get(a + "/status", timeout=5).json()["spillover"]]
        assert sum(s["completed"] for s in ledgers) == spilled, ledgers
        assert all(float(s["costUsd"]) > 0 for s in ledgers if s["completed"]), ledgers
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0


def test_an_openai_compatible_provider_takes_spillover_with_its_key(start_sim, start_spoke, tmp_path):
    # The provider is another OpenAI-compatible server (a simulated vLLM worker) with an API key
    # from a mounted Secret; the spoke's own worker is kept busy as above.
    local = start_sim("--max-num-seqs", "1", kv_events=False)
    remote = start_sim(kv_events=False)
    secrets = tmp_path / "secrets"
    (secrets / "openai").mkdir(parents=True)
    (secrets / "openai" / "api-key").write_text("sk-spill-test\n")
    openai_provider = f"""---
apiVersion: switchyard.dev/v1alpha1
kind: InferenceProvider
metadata: {{name: openai-compat}}
spec:
  type: OpenAI
  baseUrl: {remote.url}/v1
  credentials:
    secretRef: {{name: openai, key: api-key}}
  residency: {{external: true}}
  models:
  - {{name: sim-model, providerModelId: sim-model, pricing: {{inputPerMillion: "1", outputPerMillion: "2"}}}}
"""
    cfg = spoke_config([local], pool_members=", {provider: openai-compat, model: sim-model}",
                       policies=POLICIES + openai_provider)
    spoke = start_spoke(cfg, "--secrets-dir", str(secrets))
    occupied = occupy(spoke, ())
    try:
        oc = openai.OpenAI(base_url=spoke.url + "/v1", api_key="unused", max_retries=0, timeout=60)
        raw = oc.chat.completions.with_raw_response.create(model="standard-model", max_tokens=5,
                                                           messages=[{"role": "user", "content": "spill to openai"}])
        assert raw.headers["x-switchyard-provider"] == "openai-compat"
        done = raw.parse()
        assert done.usage.completion_tokens == 5 and done.choices[0].finish_reason == "length"
        chunks = list(oc.chat.completions.create(model="standard-model", max_tokens=5, stream=True,
                                                 messages=[{"role": "user", "content": "stream to openai"}]))
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finally:
        release(occupied)
    served = httpx.get(remote.url + "/metrics", timeout=5).text
    assert 'vllm:request_success_total{' in served and 'finished_reason="length"' in served
    spill = {s["provider"]: s for s in spoke.status()["spillover"]}
    assert spill["openai-compat"]["completed"] == 2
    assert float(spill["openai-compat"]["costUsd"]) > 0
