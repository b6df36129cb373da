"""Real vLLM engines for the real-engine suites, started on loopback and stopped by PID.

Run through `e2e/vllm/test`, which installs the engine (`e2e/vllm/setup`), builds Switchyard and
runs these tests inside a private network namespace. The engines are vLLM 0.32.0's CPU build
serving a tiny random Llama model that uses the project's own tokenizer, so every token id, KV
event and metric comes from the real engine.
"""

import json
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import httpx
import pytest

from conftest import free_port_pair

MODEL_NAME = "sim-model"
BLOCK_SIZE = 32
# Engines wait this long for their first /v1/models (cold imports take 40-60 s per process on a
# loaded 2-core machine; an engine has three).
START_TIMEOUT = 420


def vllm_paths():
    exe, model = os.environ.get("SWITCHYARD_VLLM"), os.environ.get("SWITCHYARD_VLLM_MODEL")
    if not exe or not model:
        raise RuntimeError("SWITCHYARD_VLLM and SWITCHYARD_VLLM_MODEL are not set; run these tests through e2e/vllm/test")
    return exe, model


def in_private_netns() -> bool:
    """Loopback is the only network interface (what `unshare -n` gives)."""
    lines = Path("/proc/net/dev").read_text().splitlines()[2:]
    return [line.split(":", 1)[0].strip() for line in lines] == ["lo"]


def vllm_env(scratch: Path, core: int | None):
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
           "VLLM_CACHE_ROOT": str(scratch / "vllm-cache"), "TORCHINDUCTOR_CACHE_DIR": str(scratch / "inductor")}
    if core is not None:
        env["VLLM_CPU_OMP_THREADS_BIND"] = str(core)
    return env


class VllmServer:
    """One `vllm serve` process group (API server, engine core, worker)."""

    def __init__(self, *, extra=(), core=None, block_size=BLOCK_SIZE, kv_events=True, max_model_len=4096):
        exe, model = vllm_paths()
        self.scratch = Path(tempfile.mkdtemp(prefix="vllm-"))
        self.port = free_port_pair(1)
        base = free_port_pair(1)
        self.kv_events = f"tcp://127.0.0.1:{base}" if kv_events else None
        self.kv_replay = f"tcp://127.0.0.1:{base + 1}" if kv_events else None
        self.url = f"http://127.0.0.1:{self.port}"
        args = [exe, "serve", model, "--served-model-name", MODEL_NAME, "--host", "127.0.0.1", "--port", str(self.port),
                "--dtype", "float32", "--max-model-len", str(max_model_len), "--block-size", str(block_size),
                "--enable-prefix-caching", "--enable-scale-out", "--enable-prompt-tokens-details",
                # vLLM's CBOR block hashes, which the simulator reproduces (the spoke ignores
                # engine hashes either way; `up --engine vllm` runs the default).
                "--prefix-caching-hash-algo", "sha256_cbor",
                # No torch.compile: it adds ~25 s to every start and nothing the tests observe.
                "-O0"]
        if kv_events:
            args += ["--kv-events-config", json.dumps({"enable_kv_cache_events": True, "publisher": "zmq",
                                                       "endpoint": f"tcp://*:{base}", "replay_endpoint": f"tcp://*:{base + 1}"})]
        args += list(extra)
        self.log_path = self.scratch / "vllm.log"
        self.proc = subprocess.Popen(args, stdout=open(self.log_path, "w"), stderr=subprocess.STDOUT,
                                     env=vllm_env(self.scratch, core), start_new_session=True)

    @property
    def workers(self):
        """The shape `spoke_config` takes (one worker per server)."""
        return [{"url": self.url, "kvEvents": self.kv_events, "kvReplay": self.kv_replay}]

    def wait_ready(self, deadline):
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if httpx.get(self.url + "/v1/models", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.time() > deadline:
                self.stop()
                raise RuntimeError(f"vLLM did not start in {START_TIMEOUT} s:\n{self.log_tail()}")
            time.sleep(1)

    def log_tail(self, lines=40):
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self):
        """SIGTERM to the process group, SIGKILL after 20 s; always reaps."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the engine core and worker, if still there
        except ProcessLookupError:
            pass
        self.proc.wait()


def start_engines(n, **kw):
    """Starts n servers at once (one CPU core each, round robin) and waits for all of them."""
    servers = [VllmServer(core=i % max(1, os.cpu_count() or 1), **kw) for i in range(n)]
    deadline = time.time() + START_TIMEOUT
    try:
        for s in servers:
            s.wait_ready(deadline)
    except BaseException:
        for s in servers:
            s.stop()
        raise
    return servers


class Engines:
    """The session's two engines, started on first use; `release()` frees their memory for a
    suite that starts engines of its own."""

    def __init__(self):
        self.servers = None

    def get(self):
        if self.servers is None:
            self.servers = start_engines(2)
        return self.servers

    def release(self):
        for s in self.servers or []:
            s.stop()
        self.servers = None


@pytest.fixture(scope="session", autouse=True)
def private_network():
    assert in_private_netns(), "real-engine tests run inside a private network namespace (e2e/vllm/test)"


@pytest.fixture(scope="session")
def engine_pool():
    pool = Engines()
    yield pool
    pool.release()


@pytest.fixture(scope="session")
def small_engine():
    """A real engine with 48 KV blocks (1,536 tokens), so a few prompts force evictions."""
    server = VllmServer(extra=["--num-gpu-blocks-override", "48"], max_model_len=1024, core=1 % max(1, os.cpu_count() or 1))
    try:
        server.wait_ready(time.time() + START_TIMEOUT)
        yield server
    finally:
        server.stop()


@pytest.fixture
def engines(engine_pool):
    """The two shared real vLLM workers (block size 32, prefix caching, KV events with replay)."""
    return engine_pool.get()
