"""Hostile inputs against a real spoke: the front door answers every one with its documented
status in the caller's dialect, never panics, and keeps serving health checks and ordinary
traffic while it is under attack.

The attack (one spoke, two simulated workers):

- `sim-model` (worker set `main`) carries the ordinary traffic and the hostile requests that
  reach an engine (huge `max_tokens`, 500k-special-token prompts, oddities that are valid);
- `faulty-model` (worker set `faulty`) is a worker with armed faults: streams cut mid-way
  (`cutStreams`), headers and then nothing (`stallAfterHeaders`), HTTP 500 (`failRequests`).
  Keeping it a separate model means the faults hit exactly the requests meant for them.

Every loop is bounded in count and in time. Timeouts the attack relies on are lowered by flags
(`--header-read-seconds`, `--body-read-seconds`, `--upstream-idle-seconds`) so a slow-drip or a
stalled worker costs seconds, not minutes.

Also here: the concurrency bound (503 / 529 with `Retry-After` at once, permits returned), and
the edges found while building this suite: silent connections closed by the header timeout,
wrong methods answered in the dialect, out-of-vocabulary token ids refused, a non-UTF-8
`anthropic-version` refused, a declared oversized body refused before it is read, and
`Connection: close` announced whenever an answer leaves part of a body unread.
"""

import collections
import concurrent.futures
import json
import os
import select
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from conftest import TOKENIZER_DIR

MODEL = "sim-model"
FAULTY_MODEL = "faulty-model"
MAX_BODY = 8 * 1024 * 1024  # large enough for a 500k-special-token prompt (6 MB)
HEADER_READ_S = 2
BODY_READ_S = 2
IDLE_S = 5
SPOKE_ARGS = ("--max-body-bytes", str(MAX_BODY), "--header-read-seconds", str(HEADER_READ_S),
              "--body-read-seconds", str(BODY_READ_S), "--upstream-idle-seconds", str(IDLE_S))
MIN_HOSTILE = 2000
ATTACK_THREADS = 16
HEALTHZ_P99_MS = 100.0
AV = ("anthropic-version", "2023-06-01")

# The tokenizer's special tokens (tokenizer/files/tokenizer.json `added_tokens`).
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

# Error `type` per status, as gateway/src/error.rs renders it.
OPENAI_TYPES = {400: "invalid_request_error", 404: "invalid_request_error", 405: "invalid_request_error", 408: "timeout_error",
                413: "invalid_request_error", 502: "api_error", 503: "service_unavailable", 504: "timeout_error"}
ANTHROPIC_TYPES = {400: "invalid_request_error", 404: "not_found_error", 405: "invalid_request_error", 408: "timeout_error",
                   413: "request_too_large", 502: "api_error", 504: "timeout_error", 529: "overloaded_error"}


# ---------------------------------------------------------------------------------------------
# Configuration and processes
# ---------------------------------------------------------------------------------------------

def _endpoints(sim, prefix):
    lines = []
    for i, w in enumerate(sim.workers):
        port = w["url"].rsplit(":", 1)[1]
        kv = (w.get("kvEvents") or ":1").rsplit(":", 1)[1]
        rp = (w.get("kvReplay") or ":1").rsplit(":", 1)[1]
        lines.append(f"    - {{name: {prefix}{i}, host: 127.0.0.1, httpPort: {port}, kvEventsPort: {kv}, kvReplayPort: {rp}}}")
    return "\n".join(lines)


def _worker_set(name, model, sim, prefix):
    return f"""apiVersion: switchyard.dev/v1alpha1
kind: InferenceWorkerSet
metadata: {{name: {name}}}
spec:
  model: {model}
  cluster: test
  endpoints:
    static:
{_endpoints(sim, prefix)}
  kvBlockSize: 16
  capacity: {{prefillTokensPerSecond: 100000}}
  tokenizer:
    source: Files
    path: {TOKENIZER_DIR}
---
apiVersion: switchyard.dev/v1alpha1
kind: InferencePool
metadata: {{name: {name}}}
spec:
  members: [{{workerSet: {name}}}]
---
"""


def two_model_config(main_sim, faulty_sim):
    """`sim-model` on `main_sim`, `faulty-model` on `faulty_sim`, one gateway backend."""
    return (_worker_set("main", MODEL, main_sim, "m") + _worker_set("faulty", FAULTY_MODEL, faulty_sim, "f") +
            f"""apiVersion: switchyard.dev/v1alpha1
kind: GatewayBackend
metadata: {{name: local}}
spec:
  models: [{{name: {MODEL}, pool: main}}, {{name: {FAULTY_MODEL}, pool: faulty}}]
  aliases: [{{name: standard-model, targets: [{MODEL}]}}]
""")


def one_model_config(sim):
    return _worker_set("main", MODEL, sim, "m") + f"""apiVersion: switchyard.dev/v1alpha1
kind: GatewayBackend
metadata: {{name: local}}
spec:
  models: [{{name: {MODEL}, pool: main}}]
"""


def host_port(url):
    host, port = url.split("://", 1)[1].rsplit(":", 1)
    return host, int(port)


def wait_for(pred, timeout=5.0, interval=0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(interval)
    return pred()


def fd_count(pid):
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return -1


def assert_spoke_survived(spoke, sims):
    assert spoke.proc.poll() is None, "the spoke exited: " + spoke.log_path.read_text()[-3000:]
    for s in sims:
        assert s.proc.poll() is None, "a simulator exited: " + s.log_path.read_text()[-2000:]
    log = spoke.log_path.read_text(errors="replace")
    assert "panicked" not in log, log[max(0, log.index("panicked") - 2000):][:4000]
    r = httpx.get(spoke.admin + "/status", timeout=5)
    assert r.status_code == 200 and r.json()["workers"], r.text[:500]
    assert httpx.get(spoke.url + "/healthz", timeout=5).status_code == 200


# ---------------------------------------------------------------------------------------------
# Verdicts: is an answer the documented one, in the caller's dialect?
# ---------------------------------------------------------------------------------------------

def _json(body):
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None


def error_problem(dialect, want_status, status, headers, body, code=None, request_id=True):
    """None when `body` is the dialect's error body for `want_status`, else what is wrong."""
    if status != want_status:
        return f"status {status}, want {want_status}"
    ctype = headers.get("content-type", "")
    if not ctype.startswith("application/json"):
        return f"content-type {ctype!r}"
    v = _json(body)
    if not isinstance(v, dict):
        return "body is not a JSON object"
    if dialect == "openai":
        e = v.get("error")
        if not isinstance(e, dict) or set(e) != {"message", "type", "param", "code"}:
            return "not an OpenAI error body"
        if not isinstance(e["message"], str) or not e["message"]:
            return "empty message"
        if e["type"] != OPENAI_TYPES[want_status]:
            return f"error.type {e['type']!r}, want {OPENAI_TYPES[want_status]!r}"
        if e["param"] is not None and not isinstance(e["param"], str):
            return "error.param is neither null nor a string"
        if code is not None and e["code"] != code:
            return f"error.code {e['code']!r}, want {code!r}"
    else:
        e = v.get("error")
        if v.get("type") != "error" or not isinstance(e, dict):
            return "not an Anthropic error body"
        if e.get("type") != ANTHROPIC_TYPES[want_status]:
            return f"error.type {e.get('type')!r}, want {ANTHROPIC_TYPES[want_status]!r}"
        if not isinstance(e.get("message"), str) or not e["message"]:
            return "empty message"
        if request_id and (not isinstance(v.get("request_id"), str) or v["request_id"] != headers.get("request-id")):
            return f"request_id {v.get('request_id')!r} does not match the request-id header {headers.get('request-id')!r}"
    if request_id and not headers.get("request-id"):
        return "no request-id header"
    return None


def success_problem(dialect, path, status, headers, body):
    if status != 200:
        return f"status {status}, want 200"
    v = _json(body)
    if not isinstance(v, dict):
        return "body is not a JSON object"
    if path.endswith("/count_tokens"):
        return None if isinstance(v.get("input_tokens"), int) else "no input_tokens"
    if dialect == "anthropic":
        ok = v.get("type") == "message" and isinstance(v.get("content"), list) and v.get("stop_reason")
    else:
        ok = v.get("choices") and v["choices"][0].get("finish_reason") and v.get("usage")
    return None if ok else "not a completed response"


def parse_sse(text):
    """SSE text → [(event name or None, data)]."""
    events = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        name, data = None, []
        for line in block.split("\n"):
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].lstrip(" "))
        if name is not None or data:
            events.append((name, "\n".join(data)))
    return events


def stream_problem(dialect, events, want, etype=None, code=None):
    """`want` is 'done' (a normal end) or 'error' (an explicit error event of `etype`, no normal end)."""
    if not events:
        return "empty stream"
    if dialect == "openai":
        datas = [d for _, d in events]
        if want == "done":
            if datas[-1] != "[DONE]":
                return f"last event {datas[-1][:200]!r}, want [DONE]"
            if any('"error"' in d and (_json(d) or {}).get("error") for d in datas):
                return "an error event in a completed stream"
            return None
        if "[DONE]" in datas:
            return "[DONE] in a stream that failed"
        last = _json(datas[-1])
        if not isinstance(last, dict) or not isinstance(last.get("error"), dict):
            return f"last event {datas[-1][:200]!r} is not an error event"
        e = last["error"]
        if set(e) != {"message", "type", "param", "code"}:
            return f"error event {e} is not an OpenAI error"
        if etype and e["type"] != etype:
            return f"error.type {e['type']!r}, want {etype!r}"
        if code and e["code"] != code:
            return f"error.code {e['code']!r}, want {code!r}"
        return None
    names = [n for n, _ in events]
    if names[0] != "message_start":
        return f"first event {names[0]!r}, want message_start"
    if any(n is None for n in names):
        return "an Anthropic event without an event: line"
    if want == "done":
        if names[-1] != "message_stop" or "error" in names:
            return f"events end with {names[-3:]}, want message_stop and no error"
        return None
    if "message_stop" in names:
        return "message_stop in a stream that failed"
    if names[-1] != "error":
        return f"last event {names[-1]!r}, want error"
    last = _json(events[-1][1]) or {}
    if last.get("type") != "error" or not isinstance(last.get("error"), dict):
        return f"error event data {events[-1][1][:200]!r}"
    if etype and last["error"].get("type") != etype:
        return f"error.type {last['error'].get('type')!r}, want {etype!r}"
    return None


# ---------------------------------------------------------------------------------------------
# The table of hostile requests
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Case:
    kind: str  # reporting bucket
    name: str
    path: str
    body: bytes
    dialect: str  # "openai" | "anthropic"
    status: int
    code: str | None = None  # OpenAI `code` when it is fixed
    headers: tuple = ()
    request_id: bool = True  # False for the unknown-path fallback (no request was started)
    weight: int = 1  # relative share of the attack
    # Sent on a connection of its own: the spoke closes the connection after answering it without
    # saying `Connection: close` (see test_connection_closed_after_an_early_answer_is_announced), so a pooled
    # client would lose its next request on it.
    own_connection: bool = False

    def describe(self):
        return f"{self.kind}/{self.name}: POST {self.path} ({len(self.body)} bytes: {self.body[:120]!r})"


def j(v):
    return json.dumps(v).encode()


CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
COMPLETION = {"model": MODEL, "prompt": "hi", "max_tokens": 2}
MESSAGES = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
COUNT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}

ENDPOINTS = (  # path, dialect, a valid body, headers
    ("/v1/chat/completions", "openai", CHAT, ()),
    ("/v1/completions", "openai", COMPLETION, ()),
    ("/v1/messages", "anthropic", MESSAGES, (AV,)),
    ("/v1/messages/count_tokens", "anthropic", COUNT, (AV,)),
)

UNSET = object()


def with_(base, **changes):
    out = dict(base)
    for k, v in changes.items():
        if v is UNSET:
            out.pop(k, None)
        else:
            out[k] = v
    return out


def build_cases():
    cases = []

    def add(kind, name, path, body, dialect, status, code=None, headers=(), **kw):
        cases.append(Case(kind, name, path, body, dialect, status, code, tuple(headers), **kw))

    # Malformed JSON, invalid UTF-8, deep nesting, not an object: same answer on every endpoint.
    malformed = {
        "truncated": b'{"model": "sim-model", "messages": [',
        "single-quotes": b"{'model': 'sim-model'}",
        "trailing-comma": b'{"model": "sim-model",}',
        "two-documents": b'{"model": "sim-model"}{"model": "sim-model"}',
        "empty": b"",
        "whitespace": b" \r\n\t ",
        "nan": b'{"model": "sim-model", "max_tokens": NaN}',
        "bom": b'\xef\xbb\xbf{"model": "sim-model"}',
        "number-out-of-range": b'{"model": "sim-model", "max_tokens": 1e999}',
        "lone-surrogate-escape": b'{"model": "sim-model\\ud800"}',
        "bad-escape": b'{"model": "\\x41"}',
        "nul-byte": b'{"model": "sim-\x00model"}',
        "binary": bytes(range(256)),
    }
    invalid_utf8 = {
        "in-value": b'{"model": "\xff\xfe", "messages": []}',
        "in-content": b'{"model": "sim-model", "max_tokens": 2, "prompt": "ab\xc3\x28cd", "messages": [{"role": "user", "content": "ab\xc3\x28cd"}]}',
        "in-key": b'{"mo\xffdel": "sim-model"}',
        "overlong": b'{"model": "\xc0\xaf"}',
        "utf8-surrogate": b'{"model": "\xed\xa0\x80"}',
        "truncated-multibyte": b'{"model": "sim-model", "x": "\xe2\x82',
        "latin1": '{"model": "caf\xe9"}'.encode("latin-1"),
    }
    nested = {
        "100k-brackets": b"[" * 100_000,
        "100k-balanced": b"[" * 100_000 + b"]" * 100_000,
        "50k-objects": b'{"a":' * 50_000,
        "nested-messages": b'{"model": "sim-model", "messages": ' + b"[" * 100_000,
        "nested-content": b'{"model": "sim-model", "max_tokens": 2, "messages": [{"role": "user", "content": ' + b"[" * 60_000 + b"]" * 60_000 + b"}]}",
        "1M-brackets": b"[" * 1_000_000,
    }
    not_object = {"array": b"[]", "string": b'"sim-model"', "number": b"123", "null": b"null", "true": b"true"}
    for path, dialect, _, headers in ENDPOINTS:
        for group, table in (("malformed-json", malformed), ("invalid-utf8", invalid_utf8),
                             ("deep-nesting", nested), ("not-an-object", not_object)):
            for name, body in table.items():
                add(group, f"{path}:{name}", path, body, dialect, 400, "invalid_request" if dialect == "openai" else None,
                    headers)

    # Wrong types and missing fields, OpenAI chat.
    chat_bad = {
        "model-int": with_(CHAT, model=123), "model-empty": with_(CHAT, model=""), "model-null": with_(CHAT, model=None),
        "model-list": with_(CHAT, model=[MODEL]), "model-missing": with_(CHAT, model=UNSET),
        "messages-missing": with_(CHAT, messages=UNSET), "messages-string": with_(CHAT, messages="hi"),
        "messages-object": with_(CHAT, messages={"role": "user"}), "messages-empty": with_(CHAT, messages=[]),
        "message-int": with_(CHAT, messages=[1]), "role-int": with_(CHAT, messages=[{"role": 5, "content": "x"}]),
        "role-unknown": with_(CHAT, messages=[{"role": "wizard", "content": "x"}]),
        "role-missing": with_(CHAT, messages=[{"content": "x"}]),
        "content-int": with_(CHAT, messages=[{"role": "user", "content": 5}]),
        "content-part-unknown": with_(CHAT, messages=[{"role": "user", "content": [{"type": "bogus"}]}]),
        "max_tokens-string": with_(CHAT, max_tokens="ten"), "max_tokens-negative": with_(CHAT, max_tokens=-1),
        "max_tokens-zero": with_(CHAT, max_tokens=0), "max_tokens-float": with_(CHAT, max_tokens=1.5),
        "max_tokens-bool": with_(CHAT, max_tokens=True), "max_tokens-2^64": with_(CHAT, max_tokens=2**64),
        "max_tokens-1e30": with_(CHAT, max_tokens=1e30), "max_completion_tokens-list": with_(CHAT, max_completion_tokens=[1]),
        "temperature-string": with_(CHAT, temperature="hot"), "top_p-object": with_(CHAT, top_p={}),
        "top_k-float": with_(CHAT, top_k=1.5), "seed-string": with_(CHAT, seed="42"),
        "stream-string": with_(CHAT, stream="yes"), "stream-int": with_(CHAT, stream=1),
        "stream_options-string": with_(CHAT, stream_options="x"),
        "include_usage-string": with_(CHAT, stream=True, stream_options={"include_usage": "yes"}),
        "stop-int": with_(CHAT, stop=5), "stop-ints": with_(CHAT, stop=[1, 2]),
        "n-2": with_(CHAT, n=2), "n-string": with_(CHAT, n="1"),
        "tools-string": with_(CHAT, tools="x"), "tool-no-function": with_(CHAT, tools=[{"type": "function"}]),
        "tool-name-int": with_(CHAT, tools=[{"type": "function", "function": {"name": 5}}]),
        "tool_choice-unknown": with_(CHAT, tool_choice="sometimes"),
    }
    for name, body in chat_bad.items():
        add("wrong-types", f"chat:{name}", "/v1/chat/completions", j(body), "openai", 400, "invalid_request")
    completion_bad = {
        "prompt-missing": with_(COMPLETION, prompt=UNSET), "prompt-object": with_(COMPLETION, prompt={"a": 1}),
        "prompt-int": with_(COMPLETION, prompt=5), "prompt-null": with_(COMPLETION, prompt=None),
        "prompt-batch": with_(COMPLETION, prompt=[[1, 2], [3]]), "prompt-strings": with_(COMPLETION, prompt=["a", "b"]),
        "prompt-negative-id": with_(COMPLETION, prompt=[-1]), "prompt-float-id": with_(COMPLETION, prompt=[1.5]),
        "prompt-empty-list": with_(COMPLETION, prompt=[]), "model-int": with_(COMPLETION, model=7),
        "max_tokens-string": with_(COMPLETION, max_tokens="2"), "echo-and-n": with_(COMPLETION, n=3),
    }
    for name, body in completion_bad.items():
        add("wrong-types", f"completions:{name}", "/v1/completions", j(body), "openai", 400, "invalid_request")
    messages_bad = {
        "max_tokens-missing": with_(MESSAGES, max_tokens=UNSET), "max_tokens-string": with_(MESSAGES, max_tokens="10"),
        "max_tokens-zero": with_(MESSAGES, max_tokens=0), "max_tokens-negative": with_(MESSAGES, max_tokens=-5),
        "max_tokens-float": with_(MESSAGES, max_tokens=1.5), "max_tokens-null": with_(MESSAGES, max_tokens=None),
        "max_tokens-2^64": with_(MESSAGES, max_tokens=2**64),
        "model-missing": with_(MESSAGES, model=UNSET), "model-int": with_(MESSAGES, model=123),
        "model-empty": with_(MESSAGES, model=""),
        "messages-missing": with_(MESSAGES, messages=UNSET), "messages-string": with_(MESSAGES, messages="hi"),
        "messages-empty": with_(MESSAGES, messages=[]),
        "role-system": with_(MESSAGES, messages=[{"role": "system", "content": "x"}]),
        "role-missing": with_(MESSAGES, messages=[{"content": "x"}]),
        "content-int": with_(MESSAGES, messages=[{"role": "user", "content": 5}]),
        "block-unknown": with_(MESSAGES, messages=[{"role": "user", "content": [{"type": "bogus"}]}]),
        "block-no-type": with_(MESSAGES, messages=[{"role": "user", "content": [{"text": "x"}]}]),
        "text-block-no-text": with_(MESSAGES, messages=[{"role": "user", "content": [{"type": "text"}]}]),
        "tool_use-from-user": with_(MESSAGES, messages=[{"role": "user", "content": [{"type": "tool_use", "name": "f", "id": "t"}]}]),
        "tool_result-no-id": with_(MESSAGES, messages=[{"role": "user", "content": [{"type": "tool_result", "content": "x"}]}]),
        "image-bad-source": with_(MESSAGES, messages=[{"role": "user", "content": [{"type": "image", "source": {"type": "ftp"}}]}]),
        "system-int": with_(MESSAGES, system=5), "system-image": with_(MESSAGES, system=[{"type": "image"}]),
        "tools-string": with_(MESSAGES, tools="x"), "tool-no-name": with_(MESSAGES, tools=[{"name": ""}]),
        "tool-no-schema": with_(MESSAGES, tools=[{"name": "f"}]),
        "tool_choice-unknown": with_(MESSAGES, tool_choice={"type": "nope"}),
        "tool_choice-no-name": with_(MESSAGES, tool_choice={"type": "tool"}),
        "stop_sequences-string": with_(MESSAGES, stop_sequences="x"), "stop_sequences-ints": with_(MESSAGES, stop_sequences=[1]),
        "stream-string": with_(MESSAGES, stream="yes"), "temperature-string": with_(MESSAGES, temperature="hot"),
        "top_k-float": with_(MESSAGES, top_k=1.5),
    }
    for name, body in messages_bad.items():
        add("wrong-types", f"messages:{name}", "/v1/messages", j(body), "anthropic", 400, headers=(AV,))
    count_bad = {
        "model-missing": with_(COUNT, model=UNSET), "messages-string": with_(COUNT, messages="hi"),
        "messages-empty": with_(COUNT, messages=[]), "block-unknown": with_(COUNT, messages=[{"role": "user", "content": [{"type": "x"}]}]),
    }
    for name, body in count_bad.items():
        add("wrong-types", f"count_tokens:{name}", "/v1/messages/count_tokens", j(body), "anthropic", 400, headers=(AV,))

    # anthropic-version: 2026-10-21 removed sampling parameters; unknown versions are refused.
    v2026 = ("anthropic-version", "2026-10-21")
    for k, v in (("temperature", 0.5), ("top_p", 0.9), ("top_k", 5)):
        add("anthropic-version", f"2026-10-21+{k}", "/v1/messages", j(with_(MESSAGES, **{k: v})), "anthropic", 400, headers=(v2026,))
    for version in ("1999-01-01", "latest", "2023-06-01,2026-10-21", "2023-06-02", "x" * 2000):
        for path, body in (("/v1/messages", MESSAGES), ("/v1/messages/count_tokens", COUNT)):
            add("anthropic-version", f"{path}:{version[:20]}", path, j(body), "anthropic", 400,
                headers=(("anthropic-version", version),))

    # Unknown models: 404, `model_not_found` (OpenAI) / `not_found_error` (Anthropic).
    for model in ("nope", "sim-model ", "SIM-MODEL", "../../etc/passwd", "m" * 10_000, "\u0000", "模型", "sim-model\n"):
        for path, dialect, base, headers in ENDPOINTS:
            add("unknown-model", f"{path}:{model[:12]!r}", path, j(with_(base, model=model)), dialect, 404,
                "model_not_found" if dialect == "openai" else None, headers)
    # Unknown paths: 404 in the dialect the headers suggest.
    add("unknown-path", "openai", "/v1/nope", j(CHAT), "openai", 404, "not_found", request_id=False)
    add("unknown-path", "openai-deep", "/v1/chat/completions/x/y", j(CHAT), "openai", 404, "not_found", request_id=False)
    add("unknown-path", "anthropic", "/v1/messages/nope", j(MESSAGES), "anthropic", 404, headers=(AV,), request_id=False)

    # Huge max_tokens: the engine refuses (context length) and the spoke relays its 400.
    for n in (10**6, 10**9, 2**32 - 1, 2**32, 2**40, 2**63):
        add("huge-max_tokens", f"chat:{n}", "/v1/chat/completions", j(with_(CHAT, max_tokens=n)), "openai", 400, "upstream_error")
        add("huge-max_tokens", f"chat-stream:{n}", "/v1/chat/completions", j(with_(CHAT, max_tokens=n, stream=True)), "openai", 400, "upstream_error")
        add("huge-max_tokens", f"completions:{n}", "/v1/completions", j(with_(COMPLETION, max_tokens=n)), "openai", 400, "upstream_error")
        add("huge-max_tokens", f"messages:{n}", "/v1/messages", j(with_(MESSAGES, max_tokens=n)), "anthropic", 400, headers=(AV,))
        add("huge-max_tokens", f"messages-stream:{n}", "/v1/messages", j(with_(MESSAGES, max_tokens=n, stream=True)), "anthropic", 400, headers=(AV,))
    add("huge-max_tokens", "max_completion_tokens", "/v1/chat/completions", j(with_(CHAT, max_completion_tokens=10**9)), "openai", 400, "upstream_error")

    # Odd but valid: answered 200.
    odd = "\u0000\u202e\U0001F600\u0301\ufeff" * 20
    add("odd-but-valid", "chat-control-chars", "/v1/chat/completions", j(with_(CHAT, max_tokens=1, messages=[{"role": "user", "content": odd}])), "openai", 200)
    add("odd-but-valid", "messages-control-chars", "/v1/messages", j(with_(MESSAGES, max_tokens=1, messages=[{"role": "user", "content": odd}])), "anthropic", 200, headers=(AV,))
    add("odd-but-valid", "duplicate-keys", "/v1/chat/completions", b'{"model": "nope", "model": "sim-model", "max_tokens": 1, "messages": [{"role": "user", "content": "x"}]}', "openai", 200)
    add("odd-but-valid", "nested-passthrough", "/v1/chat/completions", j(with_(CHAT, max_tokens=1)).rstrip(b"}") + b', "x_extra": ' + b"[" * 100 + b"]" * 100 + b"}", "openai", 200)
    add("odd-but-valid", "padded-body", "/v1/completions", b" " * 200_000 + j(with_(COMPLETION, max_tokens=1)) + b"\n" * 100_000, "openai", 200)
    add("odd-but-valid", "no-anthropic-version", "/v1/messages", j(with_(MESSAGES, max_tokens=1)), "anthropic", 200)
    add("odd-but-valid", "alias", "/v1/chat/completions", j(with_(CHAT, model="standard-model", max_tokens=1)), "openai", 200)
    add("odd-but-valid", "count-tokens-control-chars", "/v1/messages/count_tokens", j(with_(COUNT, messages=[{"role": "user", "content": odd}])), "anthropic", 200, headers=(AV,))

    # Oversized bodies: 413 once the body passes --max-body-bytes (declared or chunked).
    big = b'{"model": "sim-model", "prompt": "' + b"a" * (MAX_BODY + 1024 * 1024) + b'"}'
    for path, dialect, _, headers in ENDPOINTS[:3]:
        add("oversized-body", f"{path}:9MiB", path, big, dialect, 413, "body_too_large" if dialect == "openai" else None, headers,
            weight=2, own_connection=True)
    return cases


CASES = build_cases()


def send_case(client, case):
    """Sends one case; returns a problem string or None, and the latency."""
    headers = {"content-type": "application/json", **dict(case.headers)}
    t0 = time.monotonic()
    try:
        r = client.post(case.path, content=case.body, headers=headers)
    except httpx.HTTPError as e:
        return f"transport error {e!r}", time.monotonic() - t0
    dt = time.monotonic() - t0
    if case.status == 200:
        p = success_problem(case.dialect, case.path, r.status_code, r.headers, r.content)
    else:
        p = error_problem(case.dialect, case.status, r.status_code, r.headers, r.content, case.code, case.request_id)
    if p:
        return f"{p}; got {r.status_code} {r.content[:300]!r}", dt
    return None, dt


# ---------------------------------------------------------------------------------------------
# Raw-socket attackers: slow-drip headers and bodies
# ---------------------------------------------------------------------------------------------

def read_http_response(sock, deadline):
    """Reads one HTTP/1.1 response (status, headers, body) or None if the peer closed first."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        if time.monotonic() > deadline:
            return None
        r, _, _ = select.select([sock], [], [], 0.05)
        if r:
            try:
                chunk = sock.recv(65536)
            except OSError:
                return None
            if not chunk:
                return None
            buf += chunk
    head, body = buf.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    want = int(headers.get("content-length", "0"))
    while len(body) < want and time.monotonic() < deadline:
        r, _, _ = select.select([sock], [], [], 0.05)
        if r:
            chunk = sock.recv(65536)
            if not chunk:
                break
            body += chunk
    return status, headers, body


def drip_headers(url, path, anthropic_headers):
    """Sends request headers one byte every 100 ms, never finishing them. The server must close
    the connection once --header-read-seconds have passed (no request is started)."""
    host, port = host_port(url)
    head = (f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            + ("anthropic-version: 2023-06-01\r\n" if anthropic_headers else "") + "X-Drip: " + "a" * 200).encode()
    s = socket.create_connection((host, port), timeout=5)
    s.setblocking(False)
    t0 = time.monotonic()
    deadline = t0 + HEADER_READ_S + 5
    sent, got, next_send = 0, b"", t0
    try:
        while time.monotonic() < deadline:
            now = time.monotonic()
            if now >= next_send and sent < len(head):
                try:
                    sent += s.send(head[sent:sent + 1])
                except (BlockingIOError, InterruptedError):
                    pass
                except OSError:
                    return time.monotonic() - t0, got
                next_send = now + 0.1
            r, _, _ = select.select([s], [], [], 0.02)
            if r:
                try:
                    chunk = s.recv(65536)
                except OSError:
                    return time.monotonic() - t0, got
                if not chunk:
                    return time.monotonic() - t0, got
                got += chunk
        return None, got
    finally:
        s.close()


def drip_headers_problem(url, path, anthropic_headers):
    closed_after, got = drip_headers(url, path, anthropic_headers)
    if closed_after is None:
        return f"the connection was still open after {HEADER_READ_S + 5} s of dripped headers"
    if not HEADER_READ_S - 0.5 <= closed_after <= HEADER_READ_S + 3:
        return f"closed after {closed_after:.2f} s, want about {HEADER_READ_S} s"
    if got and not got.startswith(b"HTTP/1.1 408"):
        return f"answered {got[:200]!r} to unfinished headers"
    return None


def drip_body_problem(url, path, dialect, body, code):
    """Complete headers, then the body one byte every 250 ms: 408 in the dialect after --body-read-seconds."""
    host, port = host_port(url)
    head = (f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n" + ("anthropic-version: 2023-06-01\r\n" if dialect == "anthropic" else "")
            + "\r\n").encode()
    s = socket.create_connection((host, port), timeout=5)
    try:
        s.sendall(head)
        t0 = time.monotonic()
        deadline = t0 + BODY_READ_S + 5
        sent = 0
        while time.monotonic() < deadline:
            r, _, _ = select.select([s], [], [], 0.25)
            if r:
                break
            if sent < len(body) - 1:  # never the last byte
                try:
                    s.sendall(body[sent:sent + 1])
                    sent += 1
                except OSError as e:
                    return f"the connection failed while dripping: {e!r}"
        resp = read_http_response(s, deadline)
        elapsed = time.monotonic() - t0
    finally:
        s.close()
    if resp is None:
        return f"no response within {BODY_READ_S + 5} s of a dripped body"
    status, headers, rbody = resp
    if not BODY_READ_S - 0.5 <= elapsed <= BODY_READ_S + 3:
        return f"answered after {elapsed:.2f} s, want about {BODY_READ_S} s"
    p = error_problem(dialect, 408, status, headers, rbody, code)
    return f"{p}; got {status} {rbody[:300]!r}" if p else None


# ---------------------------------------------------------------------------------------------
# Streams against the faulty worker
# ---------------------------------------------------------------------------------------------

def read_stream(client, path, body, headers=(), timeout=IDLE_S + 10):
    """POSTs a streaming request; returns (status, headers, events, elapsed, raw body, transport error)."""
    t0 = time.monotonic()
    try:
        with client.stream("POST", path, json=body, headers=dict(headers), timeout=timeout) as r:
            raw = b""
            for chunk in r.iter_raw():
                raw += chunk
                if len(raw) > 4 * 1024 * 1024 or time.monotonic() - t0 > timeout:
                    break
            return r.status_code, r.headers, parse_sse(raw.decode("utf-8", "replace")), time.monotonic() - t0, raw, None
    except httpx.HTTPError as e:
        return None, {}, [], time.monotonic() - t0, b"", repr(e)


FAULT_REQUESTS = (  # name, path, dialect, body, headers
    ("chat-stream", "/v1/chat/completions", "openai", {"model": FAULTY_MODEL, "max_tokens": 24, "stream": True, "messages": [{"role": "user", "content": "tell me"}]}, ()),
    ("completions-stream", "/v1/completions", "openai", {"model": FAULTY_MODEL, "max_tokens": 24, "stream": True, "prompt": "tell me"}, ()),
    ("messages-stream", "/v1/messages", "anthropic", {"model": FAULTY_MODEL, "max_tokens": 24, "stream": True, "messages": [{"role": "user", "content": "tell me"}]}, (AV,)),
    ("chat", "/v1/chat/completions", "openai", {"model": FAULTY_MODEL, "max_tokens": 24, "messages": [{"role": "user", "content": "tell me"}]}, ()),
    ("messages", "/v1/messages", "anthropic", {"model": FAULTY_MODEL, "max_tokens": 24, "messages": [{"role": "user", "content": "tell me"}]}, (AV,)),
)


def fault_problem(client, req, fault):
    """Sends one request to the faulty worker with `fault` armed; None if the answer is documented."""
    name, path, dialect, body, headers = req
    status, rheaders, events, elapsed, raw, err = read_stream(client, path, body, headers)
    if err:
        return f"{fault}/{name}: transport error {err} after {elapsed:.2f} s (the stream must end with an error event, not a broken connection)"
    streamed = body.get("stream")
    if fault == "stall":
        if elapsed > IDLE_S + 5 or elapsed < IDLE_S - 0.5:
            return f"stall/{name}: ended after {elapsed:.2f} s, want about --upstream-idle-seconds={IDLE_S}"
        if streamed:
            p = None if status == 200 else f"status {status}"
            p = p or stream_problem(dialect, events, "error", "timeout_error", "upstream_idle" if dialect == "openai" else None)
        else:
            p = error_problem(dialect, 504, status, rheaders, raw, "upstream_idle" if dialect == "openai" else None)
    elif fault == "cut":
        if streamed:
            p = None if status == 200 else f"status {status}"
            p = p or stream_problem(dialect, events, "error", "api_error", "upstream_failed" if dialect == "openai" else None)
            content = [d for n, d in events if (n == "content_block_delta") or (dialect == "openai" and d.startswith("{") and '"choices"' in d)]
            if not p and not content:
                p = "no content before the cut"
        else:
            p = error_problem(dialect, 502, status, rheaders, raw, "upstream_failed" if dialect == "openai" else None)
    else:  # "fail": the worker answers 500 before any byte of the stream
        p = error_problem(dialect, 502, status, rheaders, raw)
    if p:
        return f"{fault}/{name}: {p}; got {status} {raw[-400:]!r}"
    return None


# ---------------------------------------------------------------------------------------------
# Health prober (a separate process: the attack's threads must not hold its GIL)
# ---------------------------------------------------------------------------------------------

PROBER = r"""
import http.client, json, os, sys, time
host, port, stop_path, out_path = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
lat, errors = [], []
deadline = time.monotonic() + 150
while not os.path.exists(stop_path) and time.monotonic() < deadline and len(lat) < 20000:
    t0 = time.monotonic()
    try:
        c = http.client.HTTPConnection(host, port, timeout=2)
        c.request("GET", "/healthz")
        r = c.getresponse()
        r.read()
        c.close()
        if r.status != 200:
            errors.append("status %d" % r.status)
    except Exception as e:
        errors.append(repr(e))
    lat.append((time.monotonic() - t0) * 1000.0)
    time.sleep(0.02)
with open(out_path + ".tmp", "w") as f:
    json.dump({"latencies_ms": lat, "errors": errors}, f)
os.rename(out_path + ".tmp", out_path)
"""


class HealthProber:
    def __init__(self, url):
        self.dir = Path(tempfile.mkdtemp(prefix="healthz-"))
        self.stop_path, self.out_path = self.dir / "stop", self.dir / "out.json"
        host, port = host_port(url)
        self.proc = subprocess.Popen([sys.executable, "-c", PROBER, host, str(port), str(self.stop_path), str(self.out_path)])

    def finish(self):
        self.stop_path.touch()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        return json.loads(self.out_path.read_text())


def percentile(values, q):
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


# ---------------------------------------------------------------------------------------------
# Ordinary traffic through the official SDKs
# ---------------------------------------------------------------------------------------------

def ordinary_openai(url, stop, done, failures, limit=3000, max_s=120):
    client = openai.OpenAI(base_url=url + "/v1", api_key="test", max_retries=0, timeout=60)
    i, deadline = 0, time.monotonic() + max_s
    while not stop.is_set() and i < limit and time.monotonic() < deadline:
        i += 1
        try:
            if i % 3 == 0:
                r = client.chat.completions.create(model=MODEL, max_tokens=4, messages=[{"role": "user", "content": f"hello {i}"}])
                assert r.choices[0].finish_reason in ("length", "stop") and r.usage.completion_tokens >= 1, r
            elif i % 3 == 1:
                finish = None
                for chunk in client.chat.completions.create(model=MODEL, max_tokens=4, stream=True, messages=[{"role": "user", "content": f"stream {i}"}]):
                    if chunk.choices and chunk.choices[0].finish_reason:
                        finish = chunk.choices[0].finish_reason
                assert finish in ("length", "stop"), finish
            else:
                r = client.completions.create(model=MODEL, max_tokens=4, prompt=f"complete {i}")
                assert r.choices[0].finish_reason in ("length", "stop"), r
            done.append("openai")
        except Exception as e:  # noqa: BLE001 - every failure of ordinary traffic is reported
            failures.append(f"openai #{i}: {e!r}")


def ordinary_anthropic(url, stop, done, failures, limit=3000, max_s=120):
    client = anthropic.Anthropic(base_url=url, api_key="test", max_retries=0, timeout=60)
    i, deadline = 0, time.monotonic() + max_s
    while not stop.is_set() and i < limit and time.monotonic() < deadline:
        i += 1
        try:
            if i % 2:
                m = client.messages.create(model=MODEL, max_tokens=4, messages=[{"role": "user", "content": f"hello {i}"}])
                assert m.stop_reason in ("max_tokens", "end_turn") and m.content, m
            else:
                with client.messages.stream(model=MODEL, max_tokens=4, messages=[{"role": "user", "content": f"stream {i}"}]) as s:
                    m = s.get_final_message()
                assert m.stop_reason in ("max_tokens", "end_turn"), m
            done.append("anthropic")
        except Exception as e:  # noqa: BLE001
            failures.append(f"anthropic #{i}: {e!r}")


# ---------------------------------------------------------------------------------------------
# The attack
# ---------------------------------------------------------------------------------------------

@dataclass
class Tally:
    lock: threading.Lock = field(default_factory=threading.Lock)
    counts: collections.Counter = field(default_factory=collections.Counter)
    slowest: dict = field(default_factory=dict)
    failures: list = field(default_factory=list)

    def record(self, kind, problem, latency, what):
        with self.lock:
            self.counts[kind] += 1
            self.slowest[kind] = max(self.slowest.get(kind, 0.0), latency)
            if problem:
                self.failures.append(f"{what}: {problem}")

    @property
    def total(self):
        return sum(self.counts.values())


HEAVY_PROMPTS = 6


def heavy_prompts():
    """Prompts of 500k special tokens (6 MB bodies): answered, never a stall."""
    im_start, im_end, eot = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
    assert {im_start, im_end, eot} == set(SPECIAL_TOKENS)
    n = 500_000
    prompts = [
        ("completions", "/v1/completions", "openai", j({"model": MODEL, "prompt": im_start * n, "max_tokens": 4}), (), 400),
        ("chat", "/v1/chat/completions", "openai", j({"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": im_end * n}]}), (), 400),
        ("messages", "/v1/messages", "anthropic", j({"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": eot * n}]}), (AV,), 400),
        ("count_tokens", "/v1/messages/count_tokens", "anthropic", j({"model": MODEL, "messages": [{"role": "user", "content": im_start * n}]}), (AV,), 200),
        ("chat-stream", "/v1/chat/completions", "openai", j({"model": MODEL, "max_tokens": 4, "stream": True, "messages": [{"role": "user", "content": (im_start + im_end) * (n // 2)}]}), (), 400),
        ("completions-token-ids", "/v1/completions", "openai", j({"model": MODEL, "prompt": [1] * n, "max_tokens": 4}), (), 400),
    ]
    assert len(prompts) == HEAVY_PROMPTS
    return prompts


def run_heavy(url, tally):
    with httpx.Client(base_url=url, timeout=120) as client:
        for name, path, dialect, body, headers, status in heavy_prompts():
            t0 = time.monotonic()
            try:
                r = client.post(path, content=body, headers={"content-type": "application/json", **dict(headers)})
            except httpx.HTTPError as e:
                tally.record("500k-special-tokens", f"transport error {e!r}", time.monotonic() - t0, name)
                continue
            dt = time.monotonic() - t0
            if status == 200:
                p = success_problem(dialect, path, r.status_code, r.headers, r.content)
                if not p and r.json()["input_tokens"] < 500_000:
                    p = f"input_tokens {r.json()['input_tokens']} < 500000"
            else:
                p = error_problem(dialect, status, r.status_code, r.headers, r.content, "upstream_error" if dialect == "openai" else None)
                if not p and "context length" not in r.text:
                    p = "not the engine's context-length error"
            tally.record("500k-special-tokens", p and f"{p}; got {r.status_code} {r.content[:300]!r}", dt, name)


DRIP_ROUNDS = 2  # each round: a header drip and a body drip per endpoint


def run_drips(url, tally):
    jobs = []
    for _ in range(DRIP_ROUNDS):
        for path, dialect, _, _ in ENDPOINTS:
            jobs.append(("slow-drip-headers", path, lambda p=path, d=dialect: drip_headers_problem(url, p, d == "anthropic")))
        for path, dialect, base, _ in ENDPOINTS:
            code = "body_timeout" if dialect == "openai" else None
            jobs.append(("slow-drip-body", path, lambda p=path, d=dialect, b=base, c=code: drip_body_problem(url, p, d, j(b), c)))
    def timed(fn):
        t0 = time.monotonic()
        return fn(), time.monotonic() - t0

    with concurrent.futures.ThreadPoolExecutor(8) as ex:
        futs = {ex.submit(timed, fn): (kind, path) for kind, path, fn in jobs}
        for f in concurrent.futures.as_completed(futs, timeout=60):
            kind, path = futs[f]
            problem, elapsed = f.result()
            tally.record(kind, problem, elapsed, f"{kind} {path}")


CUT_ROUNDS, FAIL_ROUNDS = 3, 2
FAULT_ROUNDS = 1 + CUT_ROUNDS + FAIL_ROUNDS  # one stall round


def run_faults(url, faulty_sim, tally):
    with httpx.Client(base_url=url, timeout=IDLE_S + 10) as client:
        # Headers and then nothing: every answer ends at --upstream-idle-seconds with an error.
        faulty_sim.faults(stallAfterHeaders=len(FAULT_REQUESTS))
        with concurrent.futures.ThreadPoolExecutor(len(FAULT_REQUESTS)) as ex:
            t0 = time.monotonic()
            for req, p in zip(FAULT_REQUESTS, ex.map(lambda r: fault_problem(client, r, "stall"), FAULT_REQUESTS, timeout=IDLE_S + 20)):
                tally.record("stalled-worker", p, time.monotonic() - t0, req[0])
        # Truncated streams: an explicit error event, never [DONE] / message_stop.
        for _ in range(CUT_ROUNDS):
            faulty_sim.faults(cutStreams={"count": len(FAULT_REQUESTS), "afterTokens": 3})
            for req in FAULT_REQUESTS:
                t0 = time.monotonic()
                tally.record("truncated-stream", fault_problem(client, req, "cut"), time.monotonic() - t0, req[0])
        # The worker answers 500: 502 in the dialect.
        for _ in range(FAIL_ROUNDS):
            faulty_sim.faults(failRequests=len(FAULT_REQUESTS))
            for req in FAULT_REQUESTS:
                t0 = time.monotonic()
                tally.record("failing-worker", fault_problem(client, req, "fail"), time.monotonic() - t0, req[0])
    armed = httpx.get(faulty_sim.url + "/sim/faults", timeout=5).json()
    assert armed["stallAfterHeaders"] == 0 and armed["cutStreams"]["count"] == 0 and armed["failRequests"] == 0, \
        f"not every armed fault reached the faulty worker: {armed}"


def run_table(url, tally, target):
    """Cycles through the case table (by weight) from a bounded pool until `target` requests."""
    schedule = []
    while len(schedule) < target:
        for c in CASES:
            schedule.extend([c] * c.weight)
    schedule = schedule[:target]
    local = threading.local()
    clients = []

    def one(case):
        if not hasattr(local, "client"):
            # The spoke closes a connection idle for its header-read timeout (it waits for the
            # next request's headers); a pooled connection idle that long while this thread ran
            # an own-connection case can meet the close in flight. A client keeps pooled
            # connections for less than the server's idle limit, as any well-configured one does.
            limits = httpx.Limits(keepalive_expiry=HEADER_READ_S / 2)
            local.client = httpx.Client(base_url=url, timeout=30, limits=limits)
            clients.append(local.client)
        if case.own_connection:
            with httpx.Client(base_url=url, timeout=30) as own:
                p, dt = send_case(own, case)
        else:
            p, dt = send_case(local.client, case)
        tally.record(case.kind, p, dt, case.describe())

    try:
        with concurrent.futures.ThreadPoolExecutor(ATTACK_THREADS) as ex:
            list(ex.map(one, schedule, timeout=120))
    finally:
        for c in clients:
            c.close()


def test_hostile_inputs_get_documented_answers_and_the_spoke_stays_healthy(start_sim, start_spoke):
    main_sim = start_sim()
    faulty_sim = start_sim("--served-model-name", FAULTY_MODEL)
    spoke = start_spoke(two_model_config(main_sim, faulty_sim), *SPOKE_ARGS)
    fds_before = fd_count(spoke.proc.pid)

    prober = HealthProber(spoke.url)
    stop = threading.Event()
    ordinary_done, ordinary_failures = [], []
    ordinary = [threading.Thread(target=ordinary_openai, args=(spoke.url, stop, ordinary_done, ordinary_failures)),
                threading.Thread(target=ordinary_anthropic, args=(spoke.url, stop, ordinary_done, ordinary_failures))]
    for t in ordinary:
        t.start()

    tally = Tally()
    started = time.monotonic()
    side = {"heavy": lambda: run_heavy(spoke.url, tally), "drips": lambda: run_drips(spoke.url, tally),
            "faults": lambda: run_faults(spoke.url, faulty_sim, tally)}
    try:
        with concurrent.futures.ThreadPoolExecutor(len(side)) as ex:
            futs = {name: ex.submit(fn) for name, fn in side.items()}
            # The table makes up the rest of the attack (at least MIN_HOSTILE requests in all).
            side_requests = HEAVY_PROMPTS + DRIP_ROUNDS * 2 * len(ENDPOINTS) + FAULT_ROUNDS * len(FAULT_REQUESTS)
            run_table(spoke.url, tally, MIN_HOSTILE - side_requests + 100)
            for name, f in futs.items():
                f.result(timeout=90)
    finally:
        stop.set()
        for t in ordinary:
            t.join(timeout=70)
        health = prober.finish()
    attack_s = time.monotonic() - started

    lat = health["latencies_ms"]
    p99 = percentile(lat, 0.99) if lat else float("inf")
    summary = (f"{tally.total} hostile requests in {attack_s:.1f} s: {dict(sorted(tally.counts.items()))}; slowest (s): "
               f"{ {k: round(v, 2) for k, v in sorted(tally.slowest.items())} }; /healthz probes {len(lat)}, "
               f"p50 {percentile(lat, 0.5) if lat else 0:.1f} ms, p99 {p99:.1f} ms, max {max(lat, default=0):.1f} ms; "
               f"ordinary requests completed {collections.Counter(ordinary_done)}; {len(CASES)} table cases; "
               f"spoke fds before {fds_before}, after {fd_count(spoke.proc.pid)}")
    print("\n" + summary)

    assert not tally.failures, f"{len(tally.failures)} undocumented answers, e.g.:\n" + "\n".join(tally.failures[:25])
    assert tally.total >= MIN_HOSTILE, summary
    assert not ordinary_failures, "ordinary requests failed during the attack:\n" + "\n".join(ordinary_failures[:20])
    assert not any(t.is_alive() for t in ordinary), "an ordinary request hung"
    assert len(ordinary_done) >= 20, summary
    assert not health["errors"], f"/healthz failed during the attack: {health['errors'][:10]}"
    assert len(lat) >= 200, summary
    assert p99 < HEALTHZ_P99_MS, summary

    assert_spoke_survived(spoke, [main_sim, faulty_sim])
    # Nothing left behind: stalled upstream bodies were dropped, connections closed.
    assert wait_for(lambda: faulty_sim.state()["stalledRequests"] == 0, timeout=5), faulty_sim.state()
    assert wait_for(lambda: fd_count(spoke.proc.pid) <= fds_before + 64, timeout=10), (fds_before, fd_count(spoke.proc.pid))
    # And the spoke still serves.
    r = httpx.post(spoke.url + "/v1/chat/completions", json={"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "still there?"}]}, timeout=30)
    assert r.status_code == 200, r.text


# ---------------------------------------------------------------------------------------------
# The concurrency bound
# ---------------------------------------------------------------------------------------------

class HeldStream:
    """A streaming request held open in a thread; `first` is set once its first event arrived."""

    def __init__(self, url, path, body, headers=()):
        self.first = threading.Event()
        self.result = None
        self.close_early = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(url, path, body, headers))
        self.thread.start()

    def _run(self, url, path, body, headers):
        t0 = time.monotonic()
        try:
            with httpx.stream("POST", url + path, json=body, headers=dict(headers), timeout=30) as r:
                raw = b""
                for chunk in r.iter_raw():
                    raw += chunk
                    self.first.set()
                    if self.close_early.is_set() or time.monotonic() - t0 > 30:
                        self.result = ("closed", r.status_code, raw)
                        return
                self.result = ("ended", r.status_code, raw)
        except httpx.HTTPError as e:
            self.result = ("error", None, repr(e).encode())
        finally:
            self.first.set()


def test_concurrency_bound_refuses_at_once_with_retry_after(start_sim, start_spoke):
    # 50x slower steps (about 110 ms per token): 40 tokens keep a stream open for ~4 s.
    sim = start_sim("--time-scale", "50", kv_events=False)
    spoke = start_spoke(one_model_config(sim), "--max-concurrent", "4")
    slow = 40
    held = [
        HeldStream(spoke.url, "/v1/chat/completions", {"model": MODEL, "max_tokens": slow, "stream": True, "messages": [{"role": "user", "content": "a"}]}),
        HeldStream(spoke.url, "/v1/completions", {"model": MODEL, "max_tokens": slow, "stream": True, "prompt": "b"}),
        HeldStream(spoke.url, "/v1/messages", {"model": MODEL, "max_tokens": slow, "stream": True, "messages": [{"role": "user", "content": "c"}]}, (AV,)),
        HeldStream(spoke.url, "/v1/messages", {"model": MODEL, "max_tokens": slow, "stream": True, "messages": [{"role": "user", "content": "d"}]}, (AV,)),
    ]
    for h in held:
        assert h.first.wait(15), "a held stream did not start"
        assert h.result is None, h.result

    # At the bound: refused at once, before the body is read, in the caller's dialect.
    refused = [
        ("/v1/chat/completions", "openai", 503, j(CHAT), {}),
        ("/v1/completions", "openai", 503, j(COMPLETION), {}),
        ("/v1/chat/completions", "openai", 503, b"{not json", {}),
        ("/v1/messages", "anthropic", 529, j(MESSAGES), dict([AV])),
        ("/v1/messages/count_tokens", "anthropic", 529, j(COUNT), dict([AV])),
        ("/v1/messages", "anthropic", 529, b"\xff\xfe", dict([AV])),
    ]
    # One connection per refusal: the spoke closes the connection after refusing (the body is not
    # read) without saying so (see test_connection_closed_after_an_early_answer_is_announced).
    with httpx.Client(base_url=spoke.url, timeout=10) as c:
        for path, dialect, status, body, headers in refused:
            t0 = time.monotonic()
            with httpx.Client(base_url=spoke.url, timeout=10) as own:
                r = own.post(path, content=body, headers={"content-type": "application/json", **headers})
            dt = time.monotonic() - t0
            p = error_problem(dialect, status, r.status_code, r.headers, r.content, "overloaded" if dialect == "openai" else None)
            assert p is None, (path, p, r.status_code, r.text)
            assert int(r.headers["retry-after"]) >= 1, r.headers
            assert int(r.headers["retry-after-ms"]) >= 1, r.headers
            assert dt < 0.5, f"refusal took {dt:.2f} s"
        # Liveness and the model list are not behind the bound.
        assert c.get("/healthz").status_code == 200
        assert c.get("/v1/models").status_code == 200
    # The SDKs see their overload errors.
    with pytest.raises(openai.InternalServerError) as oe:
        openai.OpenAI(base_url=spoke.url + "/v1", api_key="x", max_retries=0).chat.completions.create(
            model=MODEL, max_tokens=2, messages=[{"role": "user", "content": "x"}])
    assert oe.value.status_code == 503
    with pytest.raises(anthropic.OverloadedError) as ae:
        anthropic.Anthropic(base_url=spoke.url, api_key="x", max_retries=0).messages.create(
            model=MODEL, max_tokens=2, messages=[{"role": "user", "content": "x"}])
    assert ae.value.status_code == 529

    # A client that goes away returns its permit.
    held[0].close_early.set()
    held[0].thread.join(10)
    assert held[0].result[0] == "closed", held[0].result
    assert all(h.thread.is_alive() for h in held[1:]), "the held streams ended too early for this check"

    def admitted():
        r = httpx.post(spoke.url + "/v1/messages", json=with_(MESSAGES, max_tokens=1), headers=dict([AV]), timeout=30)
        return r.status_code == 200
    assert wait_for(admitted, timeout=3, interval=0.1), "a permit was not returned when its client went away"

    # The other held streams end normally; then requests are admitted again.
    for h, dialect in zip(held[1:], ("openai", "anthropic", "anthropic")):
        h.thread.join(30)
        assert not h.thread.is_alive(), "a held stream hung"
        how, status, raw = h.result
        assert how == "ended" and status == 200, h.result
        assert stream_problem(dialect, parse_sse(raw.decode()), "done") is None, raw[-300:]

    def all_admitted():
        rs = [httpx.post(spoke.url + "/v1/chat/completions", json=with_(CHAT, max_tokens=1), timeout=30) for _ in range(4)]
        return all(r.status_code == 200 for r in rs)
    assert wait_for(all_admitted, timeout=5, interval=0.1)
    assert_spoke_survived(spoke, [sim])


# ---------------------------------------------------------------------------------------------
# Known gaps: each asserts the behaviour the issue asks for and is expected to fail until the
# spoke is fixed (strict: a fix makes it pass, and the marker must then go).
# ---------------------------------------------------------------------------------------------

@pytest.fixture
def plain_spoke(start_sim, start_spoke):
    sim = start_sim(kv_events=False)
    return start_spoke(one_model_config(sim), *SPOKE_ARGS)


def closed_within(s, limit):
    """Seconds until the peer closed `s`, or None if it is still open after `limit` seconds."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit:
        r, _, _ = select.select([s], [], [], 0.1)
        if r:
            try:
                if not s.recv(4096):
                    return time.monotonic() - t0
            except OSError:
                return time.monotonic() - t0
    return None


def silent_connection_closed_after(url, payload=b"", limit=HEADER_READ_S + 2):
    host, port = host_port(url)
    s = socket.create_connection((host, port), timeout=5)
    try:
        if payload:
            s.sendall(payload)
        return closed_within(s, limit)
    finally:
        s.close()


def test_silent_connections_are_closed_after_the_header_timeout(plain_spoke):
    with concurrent.futures.ThreadPoolExecutor(2) as ex:
        closed = list(ex.map(lambda payload: silent_connection_closed_after(plain_spoke.url, payload),
                             (b"", b"PRI * HTTP/2.0\r\n")))
    assert all(c is not None for c in closed), f"still open after {HEADER_READ_S + 2} s: {closed}"


def test_wrong_method_is_answered_in_the_dialect(plain_spoke):
    r = httpx.get(plain_spoke.url + "/v1/chat/completions", timeout=5)
    assert error_problem("openai", 405, r.status_code, r.headers, r.content, request_id=False) is None, (r.status_code, r.text)


def test_out_of_vocabulary_token_ids_are_refused(plain_spoke):
    for ids in ([2**40], [4_294_967_295], [10**6]):
        r = httpx.post(plain_spoke.url + "/v1/completions", json={"model": MODEL, "prompt": ids, "max_tokens": 1}, timeout=30)
        assert r.status_code == 400, (ids, r.status_code, r.text[:200])


def test_non_utf8_anthropic_version_is_refused(plain_spoke):
    host, port = host_port(plain_spoke.url)
    body = j(with_(MESSAGES, max_tokens=1))
    s = socket.create_connection((host, port), timeout=10)
    try:
        s.sendall(b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nanthropic-version: \xff\xfe\r\n"
                  + b"Content-Length: %d\r\n\r\n" % len(body) + body)
        resp = read_http_response(s, time.monotonic() + 20)
    finally:
        s.close()
    assert resp is not None
    status, headers, rbody = resp
    assert error_problem("anthropic", 400, status, headers, rbody) is None, (status, rbody[:300])


def test_declared_oversized_body_is_refused_at_once(plain_spoke):
    host, port = host_port(plain_spoke.url)
    s = socket.create_connection((host, port), timeout=10)
    try:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 100000000000\r\n\r\n{")
        t0 = time.monotonic()
        resp = read_http_response(s, t0 + BODY_READ_S + 3)
        dt = time.monotonic() - t0
    finally:
        s.close()
    assert resp is not None
    status, headers, rbody = resp
    assert error_problem("openai", 413, status, headers, rbody, "body_too_large") is None, (status, rbody[:300])
    assert dt < 1.0, dt


def answer_then_closed(url, head, body):
    """Sends `head` and `body` on a raw connection; returns (status, response headers, whether the
    server closed the connection right after answering)."""
    host, port = host_port(url)
    s = socket.create_connection((host, port), timeout=10)
    try:
        s.sendall(head)
        try:
            s.sendall(body)
        except OSError:
            pass  # the server may stop reading once it has answered
        resp = read_http_response(s, time.monotonic() + 10)
        assert resp is not None, "no answer"
        # Within 0.5 s: well before --header-read-seconds would close an idle keep-alive connection.
        closed = closed_within(s, 0.5) is not None
        return resp[0], resp[1], closed
    finally:
        s.close()


def test_connection_closed_after_an_early_answer_is_announced(start_sim, start_spoke):
    sim = start_sim("--time-scale", "50", kv_events=False)
    spoke = start_spoke(one_model_config(sim), *SPOKE_ARGS, "--max-concurrent", "1")
    big = next(c for c in CASES if c.kind == "oversized-body").body
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
    answers = [answer_then_closed(spoke.url, head % len(big), big), answer_then_closed(spoke.url, head % 50, b"{")]
    held = HeldStream(spoke.url, "/v1/completions", {"model": MODEL, "max_tokens": 40, "stream": True, "prompt": "x"})
    try:
        assert held.first.wait(15) and held.result is None, held.result
        answers.append(answer_then_closed(spoke.url, head % 50, b""))  # refused before its body is sent
    finally:
        held.close_early.set()
        held.thread.join(10)
    # Fallbacks answer without reading the body; here it has not even arrived (as when a client's
    # body segment waits for Nagle's algorithm), so the answer leaves it unread on the connection.
    for method, path in ((b"POST", b"/v1/nope"), (b"POST", b"/v1/chat/completions/x/y"), (b"PUT", b"/v1/chat/completions")):
        fallback_head = method + b" " + path + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 50\r\n\r\n"
        answers.append(answer_then_closed(spoke.url, fallback_head, b""))
    assert [a[0] for a in answers] == [413, 408, 503, 404, 404, 405], answers
    unannounced = [status for status, headers, closed in answers
                   if closed and headers.get("connection", "").lower() != "close"]
    assert not unannounced, f"closed without `Connection: close` after answering {unannounced}"
