"""Calls one Bedrock Runtime endpoint with boto3 (the official AWS SDK for Python) and prints
what the SDK parsed, reduced to its shape: response keys and types, content block kinds, stop
reason, usage keys, the order of stream events, and the error codes of bad requests.

Run by `test_bedrock_crosscheck.py` with the interpreter of a separate venv (MiniStack pins its
own botocore), once per endpoint: `python bedrock_crosscheck_client.py URL`.
"""

import json
import sys

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

MODEL_ID = "anthropic.claude-3-5-sonnet-20240620-v1:0"


def shape(value):
    if isinstance(value, dict):
        return {k: shape(v) for k, v in sorted(value.items())}
    if isinstance(value, list):
        return [shape(v) for v in value[:1]]
    return type(value).__name__


def main(url):
    client = boto3.client("bedrock-runtime", endpoint_url=url, region_name="us-east-1",
                          aws_access_key_id="AKIDCROSS", aws_secret_access_key="cross",
                          config=Config(retries={"max_attempts": 1}))
    messages = [{"role": "user", "content": [{"text": "Say hello to the fleet"}]}]
    out = {}
    r = client.converse(modelId=MODEL_ID, messages=messages, system=[{"text": "be brief"}],
                        inferenceConfig={"maxTokens": 64})
    r.pop("ResponseMetadata", None)
    out["converse"] = {
        "keys": sorted(r),
        "role": r["output"]["message"]["role"],
        "blocks": [sorted(b) for b in r["output"]["message"]["content"]],
        "textIsStr": all(isinstance(b.get("text", ""), str) for b in r["output"]["message"]["content"]),
        "stopReason": r["stopReason"],
        "usage": shape(r["usage"]),
        "metrics": shape(r["metrics"]),
    }
    s = client.converse_stream(modelId=MODEL_ID, messages=messages, inferenceConfig={"maxTokens": 64})
    events, text, usage = [], "", None
    for event in s["stream"]:
        (kind, payload), = event.items()
        if not events or events[-1] != kind:
            events.append(kind)
        if kind == "contentBlockDelta":
            text += payload["delta"].get("text", "")
        if kind == "metadata":
            usage = payload["usage"]
    out["stream"] = {"events": events, "textNonEmpty": bool(text), "usage": shape(usage)}
    errors = {}
    for name, bad in [("emptyContent", {"messages": [{"role": "user", "content": []}]}),
                      ("assistantFirst", {"messages": [{"role": "assistant", "content": [{"text": "hi"}]}]})]:
        try:
            client.converse(modelId=MODEL_ID, **bad)
            errors[name] = "accepted"
        except ClientError as e:
            errors[name] = {"code": e.response["Error"]["Code"], "status": e.response["ResponseMetadata"]["HTTPStatusCode"]}
        except Exception as e:  # botocore refuses some shapes before sending
            errors[name] = {"client-side": type(e).__name__}
    out["errors"] = errors
    print(json.dumps(out, sort_keys=True))


if __name__ == "__main__":
    main(sys.argv[1])
