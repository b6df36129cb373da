"""The spoke's process lifecycle and surfaces: SIGTERM drains and then ends streams with an
error event; admin endpoints live only on the admin listener; decision ids are unguessable."""

import json
import signal
import threading
import time

import httpx

from conftest import spoke_config


def read_events(url, body, headers, out):
    """Streams `body`, appending ("chunk", text) per SSE frame and ("end", None) at the end."""
    try:
        with httpx.stream("POST", url, json=body, headers=headers, timeout=60) as r:
            out.append(("status", r.status_code))
            buf = ""
            for piece in r.iter_text():
                buf += piece
                while "\n\n" in buf:
                    frame, buf = buf.split("\n\n", 1)
                    out.append(("chunk", frame))
    except httpx.HTTPError as e:
        out.append(("transport-error", str(e)))
    out.append(("end", None))


def test_sigterm_drains_then_ends_streams_with_an_error_event(start_sim, start_spoke):
    # Slow steps: a 400-token stream takes far longer than the drain deadline.
    sim = start_sim("--time-scale", "20")
    spoke = start_spoke(spoke_config([sim]), "--drain-seconds", "2")
    openai_events, anthropic_events = [], []
    t1 = threading.Thread(target=read_events, args=(
        spoke.url + "/v1/chat/completions",
        {"model": "sim-model", "max_tokens": 400, "stream": True, "messages": [{"role": "user", "content": "hi"}]},
        {}, openai_events))
    t2 = threading.Thread(target=read_events, args=(
        spoke.url + "/v1/messages",
        {"model": "sim-model", "max_tokens": 400, "stream": True, "messages": [{"role": "user", "content": "hi"}]},
        {"anthropic-version": "2023-06-01"}, anthropic_events))
    t1.start()
    t2.start()
    deadline = time.time() + 20
    while time.time() < deadline and not (
            sum(k == "chunk" for k, _ in openai_events) >= 3 and sum(k == "chunk" for k, _ in anthropic_events) >= 5):
        time.sleep(0.05)
    sent = time.time()
    spoke.proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    # No new connections once draining.
    try:
        r = httpx.get(spoke.url + "/healthz", timeout=2)
        refused = False
    except httpx.HTTPError:
        refused = True
    assert refused, "the listener is closed while draining"
    t1.join(timeout=20)
    t2.join(timeout=20)
    assert not t1.is_alive() and not t2.is_alive()
    ended = time.time() - sent
    assert 1.5 <= ended <= 8, ended
    assert spoke.proc.wait(timeout=10) == 0
    # The streams were cut by the drain deadline, with an explicit error, not a normal end.
    oa = [v for k, v in openai_events if k == "chunk"]
    assert "[DONE]" not in oa[-1] and json.loads(oa[-1].removeprefix("data: "))["error"]["code"] == "shutting_down"
    an = [v for k, v in anthropic_events if k == "chunk"]
    assert an[-1].startswith("event: error\n")
    assert not any(f.startswith("event: message_stop") for f in an)


def test_admin_endpoints_only_on_the_admin_listener(start_sim, start_spoke):
    sim = start_sim()
    spoke = start_spoke(spoke_config([sim]))
    for path in ("/status", "/metrics", "/debug/decisions/x"):
        r = httpx.get(spoke.url + path, timeout=5)
        assert r.status_code == 404, (path, r.status_code)
    assert httpx.get(spoke.admin + "/status", timeout=5).status_code == 200
    metrics = httpx.get(spoke.admin + "/metrics", timeout=5).text
    assert "switchyard_spoke_requests_total" in metrics or "switchyard_spoke_worker_healthy" in metrics
    ids = []
    for _ in range(3):
        r = httpx.post(spoke.url + "/v1/completions", json={"model": "sim-model", "prompt": "hello", "max_tokens": 1}, timeout=30)
        assert r.status_code == 200
        ids.append(r.headers["request-id"])
    # 128 random bits per id: nothing sequential to walk.
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in ids) and len(set(ids)) == 3
    trace = spoke.decision(ids[0])
    assert trace["id"] == ids[0] and "hello" not in json.dumps(trace), "traces carry counts, never prompt text"


def test_request_spans_are_exported_over_otlp(start_sim, start_spoke, monkeypatch):
    """With the standard OTLP endpoint variable set, each request's span reaches the collector
    (OTLP/HTTP protobuf), carrying the request id and never the prompt text."""
    import http.server
    import socketserver

    received = []

    class Collector(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("content-length", 0)))
            received.append((self.path, self.headers.get("content-type"), body))
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Collector)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{server.server_address[1]}")
        sim = start_sim()
        spoke = start_spoke(spoke_config([sim]))
        r = httpx.post(spoke.url + "/v1/chat/completions", timeout=30, json={
            "model": "sim-model", "max_tokens": 2, "messages": [{"role": "user", "content": "secret-prompt-text"}]})
        assert r.status_code == 200
        request_id = r.headers["request-id"]
        spoke.stop()  # SIGTERM: the exporter flushes on the way out
        assert spoke.proc.returncode == 0
        deadline = time.time() + 10
        while time.time() < deadline and not any(request_id.encode() in b for _, _, b in received):
            time.sleep(0.1)
        traces = [(p, t, b) for p, t, b in received if p == "/v1/traces"]
        assert traces, received
        assert all(t == "application/x-protobuf" for _, t, _ in traces)
        body = b"".join(b for _, _, b in traces)
        assert request_id.encode() in body and b"request" in body
        assert b"secret-prompt-text" not in body
    finally:
        server.shutdown()
