"""Switchyard configuration the benchmark writes: worker sets over simulated fleets, and the pool
and backend that serve `sim-model` from them. One place, so the spoke-only and the federation
modes describe their fleets the same way."""


def worker_set_yaml(opts, workers, time_scale, name, cluster, region=None):
    """An InferenceWorkerSet over `workers` (as `start_fleet` returns them)."""
    eps = "\n".join(
        f"    - {{name: w{w['index']}, host: 127.0.0.1, httpPort: {w['url'].rsplit(':', 1)[1]}, "
        f"kvEventsPort: {w['kvEvents'].rsplit(':', 1)[1]}, kvReplayPort: {w['kvReplay'].rsplit(':', 1)[1]}}}"
        for w in workers)
    rate = int(1000 / opts.profile_prefill_ms / time_scale)
    region_line = f"  region: {region}\n" if region else ""
    return f"""apiVersion: switchyard.dev/v1alpha1
kind: InferenceWorkerSet
metadata: {{name: {name}}}
spec:
  model: sim-model
  cluster: {cluster}
{region_line}  endpoints:
    static:
{eps}
  kvBlockSize: 16
  capacity: {{prefillTokensPerSecond: {rate}, maxNumSeqs: {opts.max_num_seqs}, maxNumBatchedTokens: {opts.max_num_batched_tokens}}}
  ttftPredictor: {opts.ttft_predictor}
  dispatchPacing: {opts.dispatch_pacing}
  tokenizer: {{source: Files, path: {opts.tokenizer}}}
"""


def front_yaml(sets, name="fleet"):
    """The pool over worker sets `sets` and the backend serving `sim-model` from it."""
    members = ", ".join(f"{{workerSet: {s}}}" for s in sets)
    return f"""---
apiVersion: switchyard.dev/v1alpha1
kind: InferencePool
metadata: {{name: {name}}}
spec:
  members: [{members}]
---
apiVersion: switchyard.dev/v1alpha1
kind: GatewayBackend
metadata: {{name: {name}}}
spec:
  models: [{{name: sim-model, pool: {name}}}]
"""
