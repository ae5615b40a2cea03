"""Writes small random-weight Llama checkpoints for the real-vLLM tests and the benchmark.

No model hub is reachable here, so the models are made: a seeded
``LlamaForCausalLM`` saved with ``transformers``. ``initializer_range`` is
large (0.25) so that logits are far from flat: with the default 0.02 every
token gets nearly the same logprob and an output comparison proves nothing.
Prompts are passed as token ids (``skip_tokenizer_init=True``), so no
tokenizer is written.

    python tiny_llama.py DIR            # writes DIR/<name> for every model in MODELS

Each model directory gets a ``tutti-model.json`` stamp with its spec; a model
whose stamp matches is not rewritten.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

# name -> LlamaConfig fields. head_dim 32 (hidden 128 / 4 heads) is one of the CPU
# attention backend's supported head sizes; 2 KV heads (GQA) so that kv_heads == 2
# is exercised by the layout recognition.
MODELS = {
    "tiny-llama": dict(
        hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=512, max_position_embeddings=4096, seed=1234,
    ),
    # The benchmark's model: more layers and width so prefill dominates TTFT.
    "bench-llama": dict(
        hidden_size=512, intermediate_size=1536, num_hidden_layers=8, num_attention_heads=8,
        num_key_value_heads=4, vocab_size=2048, max_position_embeddings=8192, seed=4321,
    ),
}
INITIALIZER_RANGE = 0.25


def build(root: Path, name: str) -> Path:
    spec = dict(MODELS[name], initializer_range=INITIALIZER_RANGE)
    out = root / name
    stamp = out / "tutti-model.json"
    if stamp.exists() and json.loads(stamp.read_text()) == spec:
        return out
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    fields = dict(spec)
    seed = fields.pop("seed")
    torch.manual_seed(seed)
    config = LlamaConfig(**fields, torch_dtype="bfloat16", tie_word_embeddings=False)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    params = sum(p.numel() for p in model.parameters())
    spec_out = dict(spec)
    stamp.write_text(json.dumps(spec_out))
    (out / "tutti-params.txt").write_text(f"{params}\n")
    return out


def params(model_dir: Path) -> int:
    return int((Path(model_dir) / "tutti-params.txt").read_text())


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: tiny_llama.py DIR")
    for n in MODELS:
        print(build(Path(sys.argv[1]), n))
