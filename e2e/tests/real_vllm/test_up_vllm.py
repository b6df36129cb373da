"""`switchyard up --engine vllm`: the one-command local fleet on real vLLM workers, served to
the official `openai` SDK through the hub and the spoke, with cache-aware routing visible in
`cached_tokens`."""

import os
import random
import signal
import subprocess
import time

import httpx
import openai

from conftest import REPO, free_port, switchyard_bin
from test_spoke_routing import WORDS

from .conftest import BLOCK_SIZE, vllm_paths


def test_up_with_real_vllm_workers_serves_the_openai_sdk(engine_pool, tmp_path):
    engine_pool.release()  # the shared engines' memory, for the two `up` starts
    exe, model = vllm_paths()
    port, admin = free_port(), free_port()
    log = tmp_path / "up.log"
    proc = subprocess.Popen([switchyard_bin(), "up", "--engine", "vllm", "--vllm", exe, "--vllm-model", model,
                             "--port", str(port), "--admin-port", str(admin)],
                            cwd=REPO, stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.time() + 600
        while True:
            assert proc.poll() is None, log.read_text()
            try:
                if httpx.get(f"http://127.0.0.1:{admin}/readyz", timeout=2).status_code == 200 \
                        and "Front door" in log.read_text():
                    break
            except httpx.HTTPError:
                pass
            assert time.time() < deadline, log.read_text()
            time.sleep(1)
        # The admin listener is the hub's: one cluster whose spoke reports both engines healthy
        # (`up` is ready only then).
        status = httpx.get(f"http://127.0.0.1:{admin}/status", timeout=5).json()
        assert [c["cluster"] for c in status["clusters"]] == ["east"], status
        (ws,) = status["clusters"][0]["workerSets"]
        assert ws["workers"] == 2 and ws["load"]["healthyWorkers"] == 2, status
        assert "real vLLM" in log.read_text()

        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
        assert {m.id for m in client.models.list().data} == {"sim-model", "standard-model"}
        rng = random.Random(4)
        system = f"up {time.time()} " + " ".join(rng.choice(WORDS) for _ in range(400))
        prompt_tokens, first_cached, repeat_cached, targets = None, None, [], set()
        for i in range(4):
            raw = client.chat.completions.with_raw_response.create(
                model="standard-model", max_tokens=4,
                messages=[{"role": "system", "content": system}, {"role": "user", "content": f"question {i}"}])
            chat = raw.parse()
            targets.add((raw.headers["x-switchyard-target"], raw.headers["x-switchyard-worker"]))
            cached = chat.usage.prompt_tokens_details.cached_tokens
            if first_cached is None:
                first_cached, prompt_tokens = cached, chat.usage.prompt_tokens
            else:
                repeat_cached.append(cached)
        assert first_cached == 0
        shared = (prompt_tokens - 8) // BLOCK_SIZE * BLOCK_SIZE  # the system prompt's full blocks, at least
        assert len(targets) == 1, targets
        assert all(c >= shared for c in repeat_cached), (repeat_cached, shared)
        stream = client.chat.completions.create(model="standard-model", max_tokens=4, stream=True,
                                                stream_options={"include_usage": True},
                                                messages=[{"role": "system", "content": system}, {"role": "user", "content": "streamed"}])
        chunks = list(stream)
        assert chunks[-1].usage.prompt_tokens_details.cached_tokens >= shared
        engines = descendants(proc.pid)
        assert len(engines) >= 6, engines  # API server, engine core and worker per engine
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, log.read_text()
    # Every engine process is gone with `up` (killed ones may linger a moment as zombies).
    deadline = time.time() + 10
    while alive(engines) and time.time() < deadline:
        time.sleep(0.2)
    assert not alive(engines), alive(engines)


def alive(pids):
    out = []
    for p in pids:
        try:
            state = open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            out.append(p)
    return out


def descendants(root):
    """Pids of every process below `root`."""
    parent = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                stat = open(f"/proc/{d}/stat").read()
            except OSError:
                continue
            parent[int(d)] = int(stat.rsplit(")", 1)[1].split()[1])
    out, frontier = set(), {root}
    while frontier:
        frontier = {p for p, pp in parent.items() if pp in frontier} - out
        out |= frontier
    return out
