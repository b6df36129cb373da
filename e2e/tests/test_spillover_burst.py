"""A burst three times the local capacity, with and without cloud spillover (real processes).

One simulated worker (tiny profile, 4 sequences at a time, 5x slower than the profile, so a
200-token answer takes about 2 s and the worker completes about 1.8 requests/s) behind a spoke.
Open-loop arrivals at 5.5 requests/s for `SWITCHYARD_BURST_SECONDS` (default 60), streamed,
time to first token measured at the client:

- with spillover: the cloud-spillover policy (`MaxWaitingRequests: 2`, `onEmpty: Fallback`)
  and a faithful Bedrock endpoint (300 ms to the first token, 5 ms per token) reached through
  the real AWS SDK. Every request must succeed; the share spilled is reported; after the burst,
  a request must land on the local worker again within 5 s;
- without: the same worker and spoke with no provider in the pool. The run stops 5 s after the
  burst; a request still without its first token counts with the time it had waited so far (a
  lower bound, so the ratio reported is conservative).

The p95 time to first token with spillover must be at least 3x lower. The figures are printed
and, when `SWITCHYARD_BURST_REPORT` names a file, written there as JSON.
"""

import asyncio
import json
import os
import random
import time

import httpx

from conftest import spoke_config
from test_provider_spillover import MODEL_ID, POLICIES, provider, start_bedrock, stop_process

RATE = 5.5
BURST_SECONDS = float(os.environ.get("SWITCHYARD_BURST_SECONDS", "60"))
MAX_TOKENS = 200
RETURN_LIMIT_S = 5.0
# Every 20th request is tagged pii: it may wait for the local worker, never spill.
PII_EVERY = 20
# The pii-residency policy here excludes external providers and keeps the request local
# however busy the worker is (no `MaxWaitingRequests`, so nothing is refused).
BURST_POLICIES = POLICIES.replace("  - {type: ExcludeExternal}\n  - {type: MaxWaitingRequests, maxWaitingRequests: 2}\n",
                                  "  - {type: ExcludeExternal}\n")


async def one(client, url, i, results, sent_at):
    pii = i % PII_EVERY == 0
    text = f"PII-MARKER-{i} my account number" if pii else f"burst request {i}: summarise the routing report"
    body = {"model": "standard-model", "stream": True, "max_tokens": MAX_TOKENS, "ignore_eos": True,
            "messages": [{"role": "user", "content": text}]}
    rec = {"i": i, "sent": sent_at, "ttft": None, "ok": False, "target": None, "error": None, "pii": pii}
    results.append(rec)
    try:
        async with client.stream("POST", url + "/v1/chat/completions", json=body,
                                 headers={"x-switchyard-tags": "pii"} if pii else {}) as r:
            rec["target"] = r.headers.get("x-switchyard-target")
            rec["provider"] = r.headers.get("x-switchyard-provider")
            if r.status_code != 200:
                rec["error"] = f"status {r.status_code}: {(await r.aread())[:200]!r}"
                return
            last = None
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                last = line[6:]
                if rec["ttft"] is None and '"content"' in last:
                    rec["ttft"] = time.monotonic() - sent_at
            rec["ok"] = last == "[DONE]"
            if not rec["ok"]:
                rec["error"] = f"stream ended with {last[:200] if last else None!r}"
    except Exception as e:  # a failed request is a result here, not a crash of the load
        rec["error"] = repr(e)


async def burst(url, rng):
    """Open-loop Poisson arrivals at RATE for BURST_SECONDS; returns (results, tasks, end time)."""
    client = httpx.AsyncClient(timeout=httpx.Timeout(300.0), limits=httpx.Limits(max_connections=2000))
    results, tasks = [], []
    start = time.monotonic()
    next_at, i = start, 0
    while next_at < start + BURST_SECONDS:
        delay = next_at - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(client, url, i, results, time.monotonic())))
        i += 1
        next_at += rng.expovariate(RATE)
    return client, results, tasks, time.monotonic()


def p(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else None


async def run_with_spillover(url):
    client, results, tasks, ended = await burst(url, random.Random(1))
    # Back to local: sequential probes until one lands on the worker.
    returned = None
    async with httpx.AsyncClient(timeout=30) as probe:
        while time.monotonic() - ended < 20:
            r = await probe.post(url + "/v1/chat/completions", json={
                "model": "standard-model", "max_tokens": 4, "messages": [{"role": "user", "content": "probe"}]})
            if r.headers.get("x-switchyard-provider") is None and r.status_code == 200:
                returned = time.monotonic() - ended
                break
            await asyncio.sleep(0.1)
    await asyncio.wait_for(asyncio.gather(*tasks), timeout=120)
    await client.aclose()
    return results, returned


async def run_without_spillover(url):
    client, results, tasks, ended = await burst(url, random.Random(1))
    await asyncio.sleep(5)
    stopped = time.monotonic()
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await client.aclose()
    for rec in results:
        if rec["ttft"] is None:
            rec["ttft_lower_bound"] = stopped - rec["sent"]
    return results


def summary(results):
    ttfts = [r["ttft"] if r["ttft"] is not None else r.get("ttft_lower_bound") for r in results]
    ttfts = [t for t in ttfts if t is not None]
    spilled = sum(1 for r in results if r.get("provider"))
    return {
        "requests": len(results),
        "failed": sum(1 for r in results if not r["ok"]),
        "spilled": spilled,
        "spilledShare": round(spilled / len(results), 3) if results else 0,
        "ttftP50S": round(p(ttfts, 0.5), 3),
        "ttftP95S": round(p(ttfts, 0.95), 3),
        "ttftP99S": round(p(ttfts, 0.99), 3),
    }


def start_worker(start_sim):
    return start_sim("--max-num-seqs", "4", "--time-scale", "5", kv_events=False)


def test_spillover_keeps_ttft_low_under_a_burst_and_traffic_returns(start_sim, start_spoke, tmp_path):
    bedrock = start_bedrock(first_token_ms=300, per_output_token_ms=5)
    secrets = tmp_path / "secrets"
    (secrets / "aws").mkdir(parents=True)
    (secrets / "aws" / "credentials").write_text("AWS_ACCESS_KEY_ID=AKIDBURST\nAWS_SECRET_ACCESS_KEY=burst\n")
    try:
        sim = start_worker(start_sim)
        cfg = spoke_config([sim], pool_members=", {provider: bedrock-a, model: sim-model}",
                           policies=BURST_POLICIES + provider("bedrock-a", bedrock.url, 300))
        spoke = start_spoke(cfg, "--secrets-dir", str(secrets))
        with_spill, returned = asyncio.run(run_with_spillover(spoke.url))
        spoke.stop()
        sim.stop()
        calls = bedrock.log()
        converse_calls = len(calls)
    finally:
        stop_process(bedrock.proc)

    sim = start_worker(start_sim)
    spoke = start_spoke(spoke_config([sim]))
    without = asyncio.run(run_without_spillover(spoke.url))

    a, b = summary(with_spill), summary(without)
    report = {"rate": RATE, "burstSeconds": BURST_SECONDS, "maxTokens": MAX_TOKENS, "withSpillover": a,
              "withoutSpillover": b, "returnedToLocalAfterS": returned,
              "p95Ratio": round(b["ttftP95S"] / a["ttftP95S"], 2) if a["ttftP95S"] else None}
    pii = [r for r in with_spill if r["pii"]]
    report["withSpillover"]["piiRequests"] = len(pii)
    report["withSpillover"]["piiSpilled"] = sum(1 for r in pii if r.get("provider"))
    print("\nspillover burst:", json.dumps(report, indent=2))
    if os.environ.get("SWITCHYARD_BURST_REPORT"):
        with open(os.environ["SWITCHYARD_BURST_REPORT"], "w") as f:
            json.dump(report, f, indent=2)

    assert BURST_POLICIES != POLICIES
    assert pii and all(r["ok"] and not r.get("provider") for r in pii), pii[:3]
    assert "PII-MARKER" not in json.dumps([c["body"] for c in calls]), "a pii request reached the provider"
    errors = [r["error"] for r in with_spill if not r["ok"]]
    assert a["failed"] == 0, f"failed with spillover: {errors[:5]}"
    # The endpoint saw every spilled request (and perhaps a probe or two).
    assert a["spilled"] > 0 and converse_calls >= a["spilled"], (a, converse_calls)
    assert a["spilled"] < a["requests"], "some of the burst stayed local"
    assert returned is not None and returned <= RETURN_LIMIT_S, f"traffic came back to the worker after {returned} s"
    assert b["ttftP95S"] >= 3 * a["ttftP95S"], report
