"""The simulator tokenizes exactly like `transformers` with the same tokenizer directory."""

import os
import random

import httpx
from transformers import AutoTokenizer

from conftest import TOKENIZER_DIR

WORDS = ("the cache of worker route policy tenant model prompt token queue latency region cluster "
         "Ünïcödé naïve café — “quotes” 東京 🚀 tabs\tand\nnewlines {json: [1, 2.5, true]} <b>html</b> "
         "   leading spaces 1234567890 e-mail@example.com").split(" ")


def conversation(rng):
    msgs = []
    if rng.random() < 0.8:
        msgs.append({"role": "system", "content": " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 60)))})
    for turn in range(rng.randint(1, 5)):
        msgs.append({"role": "user", "content": " ".join(rng.choice(WORDS) for _ in range(rng.randint(0, 40)))})
        if turn < 4 and rng.random() < 0.7:
            msgs.append({"role": "assistant", "content": " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 30)))})
    return msgs


def test_chat_template_parity(start_sim):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    tok = AutoTokenizer.from_pretrained(str(TOKENIZER_DIR))
    sim = start_sim(kv_events=False)
    rng = random.Random(7)
    for _ in range(150):
        msgs = conversation(rng)
        for gen in (True, False):
            want = tok.apply_chat_template(msgs, tokenize=True, add_generation_prompt=gen)
            want = list(want["input_ids"] if hasattr(want, "keys") else want)
            got = httpx.post(sim.url + "/tokenize", json={"messages": msgs, "add_generation_prompt": gen}).json()["tokens"]
            assert got == want, msgs


def test_plain_prompt_parity(start_sim):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    tok = AutoTokenizer.from_pretrained(str(TOKENIZER_DIR))
    sim = start_sim(kv_events=False)
    rng = random.Random(11)
    for _ in range(100):
        text = "".join(rng.choice(WORDS) + rng.choice([" ", "", "\n", "  "]) for _ in range(rng.randint(1, 80)))
        got = httpx.post(sim.url + "/tokenize", json={"prompt": text}).json()["tokens"]
        assert got == tok(text)["input_ids"], text
        assert httpx.post(sim.url + "/detokenize", json={"tokens": got}).json()["prompt"] == text
