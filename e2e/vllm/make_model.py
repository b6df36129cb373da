"""Builds the tiny, randomly initialised Llama model the real-vLLM tests serve.

Deterministic: the weights come from a fixed seed and the tokenizer is the project's own
(`tokenizer/files`), so two builds from the same inputs are byte-identical. Nothing is downloaded.

    python make_model.py <tokenizer dir> <output dir>
"""

import sys
from pathlib import Path

import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

# head_dim = hidden_size / num_attention_heads = 64, a size vLLM's CPU attention kernels support.
CONFIG = dict(
    vocab_size=8192,
    hidden_size=256,
    intermediate_size=512,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=8192,
    tie_word_embeddings=True,
    bos_token_id=None,
    eos_token_id=2,  # <|im_end|>
    pad_token_id=0,  # <|endoftext|>
)


def main(tokenizer_dir: str, out: str) -> None:
    out_dir = Path(out)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    if len(tokenizer) != CONFIG["vocab_size"]:
        raise SystemExit(f"tokenizer has {len(tokenizer)} tokens, the model expects {CONFIG['vocab_size']}")
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**CONFIG))
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    print(f"tiny model: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters in {out_dir}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    main(sys.argv[1], sys.argv[2])
