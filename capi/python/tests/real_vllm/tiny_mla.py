"""Writes a small random-weight DeepSeek-V2-style (MLA) checkpoint for the real-vLLM MLA tests.

No model hub is reachable here, so the model is made: a seeded ``DeepseekV2ForCausalLM`` from
``transformers``' own config class, saved with ``save_pretrained``. The latent is DeepSeek's
real one (``kv_lora_rank`` 512 + ``qk_rope_head_dim`` 64 = 576, the only head size vLLM's CPU
MLA backend compiles its decode kernel for); everything else is tiny, and every MLP is dense
(``first_k_dense_replace`` = the layer count: the 4 routed experts are never used). ``initializer_range`` is large (0.25),
as for the tiny Llama, so logits are far from flat and an output comparison means something.

    python tiny_mla.py DIR      # writes DIR/tiny-mla (skipped when its stamp matches)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

SPEC = dict(
    hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=4, vocab_size=512, max_position_embeddings=4096,
    kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=32, v_head_dim=32, q_lora_rank=None,
    first_k_dense_replace=2, n_routed_experts=4, moe_intermediate_size=64, num_experts_per_tok=2,
    initializer_range=0.25, seed=2024,
)


def build(root: Path) -> Path:
    out = root / "tiny-mla"
    stamp = out / "tutti-model.json"
    if stamp.exists() and json.loads(stamp.read_text()) == SPEC:
        return out
    import torch
    from transformers import DeepseekV2Config, DeepseekV2ForCausalLM

    fields = dict(SPEC)
    torch.manual_seed(fields.pop("seed"))
    config = DeepseekV2Config(**fields, tie_word_embeddings=False)
    model = DeepseekV2ForCausalLM(config).to(torch.bfloat16)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    stamp.write_text(json.dumps(SPEC))
    return out


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: tiny_mla.py DIR")
    print(build(Path(sys.argv[1])))
