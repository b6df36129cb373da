"""Shared fixtures: start real `switchyard` processes on loopback and stop them by PID."""

import json
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]
TOKENIZER_DIR = REPO / "tokenizer" / "files"


def switchyard_bin() -> str:
    path = os.environ.get("SWITCHYARD_BIN")
    if not path:
        raise RuntimeError("SWITCHYARD_BIN is not set; run the tests through scripts/test")
    return path


def stop_process(proc):
    """SIGTERM, then SIGKILL after 10 s; always reaps the process."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class Sim:
    """A running `switchyard sim` process with one or more workers."""

    def __init__(self, proc, ready, log_path):
        self.proc = proc
        self.model = ready["model"]
        self.workers = ready["workers"]
        self.log_path = log_path

    @property
    def url(self) -> str:
        return self.workers[0]["url"]

    def faults(self, worker=0, **knobs):
        r = httpx.post(f"{self.workers[worker]['url']}/sim/faults", json=knobs, timeout=5)
        r.raise_for_status()
        return r.json()

    def oracle(self, worker=0, **body):
        r = httpx.post(f"{self.workers[worker]['url']}/sim/oracle", json=body, timeout=10)
        r.raise_for_status()
        return r.json()

    def state(self, worker=0):
        return httpx.get(f"{self.workers[worker]['url']}/sim/state", timeout=5).json()

    def stop(self):
        stop_process(self.proc)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def start_sim():
    """Factory: start_sim(*extra_args, kv_events=True, workers=1, replay=True, topic="kv") -> Sim."""
    started = []

    def start(*extra, kv_events=True, workers=1, replay=True, topic="kv"):
        tmp = Path(tempfile.mkdtemp(prefix="sim-"))
        ready = tmp / "ready.json"
        args = [switchyard_bin(), "sim", "--port", "0", "--workers", str(workers), "--ready-file", str(ready),
                "--tokenizer", str(TOKENIZER_DIR), "--enable-prompt-tokens-details"]
        if kv_events:
            # Explicit free ports: worker i uses base + 2i (events) and base + 1 + 2i (replay).
            base = free_port_pair(workers)
            cfg = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{base}", "topic": topic}
            if replay:
                cfg["replay_endpoint"] = f"tcp://*:{base + 1}"
            args += ["--kv-events-config", json.dumps(cfg)]
        args += list(extra)
        log = tmp / "sim.log"
        proc = subprocess.Popen(args, stdout=open(log, "w"), stderr=subprocess.STDOUT)
        deadline = time.time() + 30
        while not ready.exists():
            if proc.poll() is not None or time.time() > deadline:
                proc.kill()
                raise RuntimeError(f"sim did not start: {log.read_text()}")
            time.sleep(0.05)
        time.sleep(0.05)
        sim = Sim(proc, json.loads(ready.read_text()), log)
        started.append(sim)
        return sim

    yield start
    for s in started:
        s.stop()


def free_port_pair(workers: int) -> int:
    """A base port such that base .. base + 2*workers are free."""
    import socket

    for _ in range(50):
        base = free_port()
        socks = []
        try:
            for p in range(base, base + 2 * workers):
                s = socket.socket()
                s.bind(("127.0.0.1", p))
                socks.append(s)
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free port range")


def spoke_config(sims, *, model="sim-model", tokenizer_source="Files", chat_template=None, policies="", worker_set="local",
                 prefill_tokens_per_second=100_000, block_size=16, capacity_extra="",
                 worker_set_extra="", pool_members=""):
    """YAML for a spoke fronting every worker of `sims` (one worker set); `pool_members` adds
    members to the pool (e.g. `, {provider: bedrock, model: sim-model}`)."""
    lines = []
    for sim in sims:
        for w in sim.workers:
            port = w["url"].rsplit(":", 1)[1]
            kv = w.get("kvEvents") or ""
            rp = w.get("kvReplay") or ""
            kvp = kv.rsplit(":", 1)[1] if kv else "1"
            rpp = rp.rsplit(":", 1)[1] if rp else "1"
            lines.append(f"    - {{name: w{len(lines)}, host: 127.0.0.1, httpPort: {port}, kvEventsPort: {kvp}, kvReplayPort: {rpp}}}")
    tok = f"    source: {tokenizer_source}\n"
    if tokenizer_source == "Files":
        tok += f"    path: {TOKENIZER_DIR}\n"
    if chat_template:
        tok += f"    chatTemplate: {chat_template}\n"
    return f"""apiVersion: switchyard.dev/v1alpha1
kind: InferenceWorkerSet
metadata: {{name: {worker_set}}}
spec:
  model: {model}
  cluster: test
  endpoints:
    static:
{chr(10).join(lines)}
  kvBlockSize: {block_size}
  capacity: {{prefillTokensPerSecond: {prefill_tokens_per_second}{capacity_extra}}}
{worker_set_extra}  tokenizer:
{tok}---
apiVersion: switchyard.dev/v1alpha1
kind: InferencePool
metadata: {{name: local}}
spec:
  members: [{{workerSet: {worker_set}}}{pool_members}]
---
apiVersion: switchyard.dev/v1alpha1
kind: GatewayBackend
metadata: {{name: local}}
spec:
  models: [{{name: {model}, pool: local}}]
  aliases: [{{name: standard-model, targets: [{model}]}}]
{policies}"""


class Spoke:
    def __init__(self, proc, ready, config_dir, log_path):
        self.proc = proc
        self.url = ready["url"]
        self.admin = ready["admin"]
        self.config_dir = config_dir
        self.log_path = log_path

    def status(self):
        return httpx.get(self.admin + "/status", timeout=5).json()

    def decision(self, decision_id):
        return httpx.get(f"{self.admin}/debug/decisions/{decision_id}", timeout=5).json()

    def write_config(self, text):
        tmp = self.config_dir / "fleet.yaml.tmp"
        tmp.write_text(text)
        tmp.rename(self.config_dir / "fleet.yaml")

    def stop(self):
        stop_process(self.proc)


@pytest.fixture
def start_spoke():
    started = []

    def start(config_text, *extra):
        tmp = Path(tempfile.mkdtemp(prefix="spoke-"))
        cfg = tmp / "config"
        cfg.mkdir()
        (cfg / "fleet.yaml").write_text(config_text)
        ready = tmp / "ready.json"
        log = tmp / "spoke.log"
        proc = subprocess.Popen([switchyard_bin(), "spoke", "--config", str(cfg), "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--ready-file", str(ready), *extra],
                                stdout=open(log, "w"), stderr=subprocess.STDOUT, env={**os.environ, "SWITCHYARD_LOG": "info"})
        deadline = time.time() + 30
        while not ready.exists():
            if proc.poll() is not None or time.time() > deadline:
                proc.kill()
                raise RuntimeError(f"spoke did not start: {log.read_text()}")
            time.sleep(0.05)
        spoke = Spoke(proc, json.loads(ready.read_text()), cfg, log)
        started.append(spoke)
        # Ready once every worker has been scraped.
        while time.time() < deadline:
            st = spoke.status()
            if st["workers"] and all(w["scraped"] for w in st["workers"]):
                break
            time.sleep(0.05)
        time.sleep(0.3)  # let the KV subscribers connect
        return spoke

    yield start
    for s in started:
        s.stop()
