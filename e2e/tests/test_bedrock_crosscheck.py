"""The faithful Bedrock endpoint checked once against an independent implementation: MiniStack
1.5.33 (PyPI, MIT; an AWS emulator with Converse and ConverseStream), both called with boto3,
the official AWS SDK for Python, so a second real client parses our JSON and event-stream frames.

Both run on loopback inside `unshare -n` (MiniStack is a third-party server). The client
(`bedrock_crosscheck_client.py`) reduces what boto3 parsed to its shape; the two must agree on
the Converse response's members and types, the content block kinds, the stop reason, the
order of stream events (messageStart, deltas, contentBlockStop, messageStop, metadata with
usage last) and the error code of an empty content list. Where they differ, ours follows
AWS's documented behaviour, and the test pins the difference:
- ours reports `cacheReadInputTokens` / `cacheWriteInputTokens` (0 without cache points);
- ours refuses a conversation that starts with an assistant message (`ValidationException`,
  as Bedrock does); MiniStack accepts it.
"""

import json
import os
import subprocess
from pathlib import Path

import pytest

from conftest import switchyard_bin

HERE = Path(__file__).resolve().parent
PINS = ["ministack==1.5.33", "boto3==1.43.106"]


@pytest.fixture(scope="module")
def ministack_python():
    cache = Path(os.environ.get("SWITCHYARD_CACHE", Path.home() / ".cache" / "switchyard"))
    venv = cache / "venv-ministack"
    stamp = venv / ".pins"
    if not (venv / "bin" / "python").exists() or not stamp.exists() or stamp.read_text() != " ".join(PINS):
        subprocess.run(["python3", "-m", "venv", "--clear", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", *PINS], check=True, timeout=600)
        stamp.write_text(" ".join(PINS))
    return venv / "bin" / "python"


def run_both(python):
    script = f"""
set -e
ip link set lo up
{switchyard_bin()} sim --api bedrock --host 127.0.0.1 --port 18755 --first-token-ms 5 --per-output-token-ms 1 >/dev/null 2>&1 &
ours=$!
BIND_HOST=127.0.0.1 GATEWAY_PORT=18766 {Path(python).parent / "ministack"} >/dev/null 2>&1 &
theirs=$!
trap 'kill $ours $theirs 2>/dev/null || true' EXIT
for i in $(seq 1 100); do
  if python3 -c 'import socket,sys; [socket.create_connection(("127.0.0.1", p), 0.2).close() for p in (18755, 18766)]' 2>/dev/null; then break; fi
  sleep 0.1
done
{python} {HERE / "bedrock_crosscheck_client.py"} http://127.0.0.1:18755
{python} {HERE / "bedrock_crosscheck_client.py"} http://127.0.0.1:18766
"""
    out = subprocess.run(["unshare", "-n", "bash", "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    ours, theirs = [json.loads(line) for line in out.stdout.strip().splitlines()[-2:]]
    return ours, theirs


def test_our_endpoint_and_ministack_agree_for_boto3(ministack_python):
    ours, theirs = run_both(ministack_python)
    for part in ("keys", "role", "blocks", "textIsStr", "metrics"):
        assert ours["converse"][part] == theirs["converse"][part], part
    assert ours["converse"]["stopReason"] == theirs["converse"]["stopReason"] == "end_turn"
    assert ours["stream"]["events"] == theirs["stream"]["events"] == [
        "messageStart", "contentBlockDelta", "contentBlockStop", "messageStop", "metadata"]
    assert ours["stream"]["textNonEmpty"] and theirs["stream"]["textNonEmpty"]
    for where in ("converse", "stream"):
        mine, other = ours[where]["usage"], theirs[where]["usage"]
        assert {k: mine[k] for k in other} == other, where
        assert set(mine) - set(other) == {"cacheReadInputTokens", "cacheWriteInputTokens"}
    assert ours["errors"]["emptyContent"] == theirs["errors"]["emptyContent"] == {
        "code": "ValidationException", "status": 400}
    assert ours["errors"]["assistantFirst"] == {"code": "ValidationException", "status": 400}
    assert theirs["errors"]["assistantFirst"] == "accepted"
