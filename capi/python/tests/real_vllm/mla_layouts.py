"""MLA KV tensors as vLLM builds them, handed to the connector's worker side, no forward pass.

The geometry comes from the connector's own ``geometry_from_vllm`` on vLLM's real config of the
tiny MLA model (``use_mla``: one KV head, head size 576 = 512 + 64). The per-layer tensors come
from vLLM's own code: ``create_kv_cache_views`` over one raw buffer with an ``MLAAttentionSpec``
(vLLM >= 0.32 hands every backend, CPU_MLA included, a 4-D ``[num_blocks, 1, block_size,
576]`` view) for every ``KVCacheLayout``, and a plain 3-D ``[num_blocks, block_size, 576]``
tensor (what MLA backends' ``get_kv_cache_shape`` allocated before vLLM 0.32; 0.32 has no such
method). Each is
registered and one block round-trips through tutti byte for byte, other blocks untouched, in
float32, bfloat16 and fp8 (e4m3, the dtype vLLM's ``kv_cache_dtype="fp8"`` gives; vLLM's CPU
MLA backend itself accepts only ``"auto"``). Prints JSON on the last line.

    python mla_layouts.py MODEL_DIR
"""

from __future__ import annotations

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

import torch  # noqa: E402
from vllm.engine.arg_utils import EngineArgs  # noqa: E402
from vllm.v1.kv_cache_interface import (  # noqa: E402
    KVCacheTensor, MLAAttentionSpec, compute_layout_strides, create_kv_cache_views,
)
from vllm.v1.kv_cache_layout import KVCacheLayout  # noqa: E402

import tutti  # noqa: E402
from tutti._connector.config import geometry_from_vllm, uses_mla  # noqa: E402
from tutti._connector.worker import LayoutError, WorkerSide  # noqa: E402

NUM_BLOCKS = 6
DTYPES = {"float32": (torch.float32, "f32"), "bfloat16": (torch.bfloat16, "bf16"),
          "fp8_e4m3": (torch.float8_e4m3fn, "fp8_e4m3")}


def round_trip(views: list[torch.Tensor], g: tutti.Geometry, layout_name: str | None) -> dict:
    names = [f"model.layers.{i}.self_attn.attn" for i in range(len(views))]
    kv = dict(zip(names, views))
    entry = {"shape": list(views[0].shape), "strides": list(views[0].stride())}
    rt = tutti.Runtime(g, emulated_drives=1, emulated_capacity_bytes=16 << 20, open_mode="create")
    w = WorkerSide(rt, g, "mla-layout-test", b"\0tutti-mla-latent", 10.0)
    try:
        w.register(kv, {n: "CPU_MLA" for n in names}, layout_name)
        entry["tag"] = w.layout_tag
        gen = torch.Generator().manual_seed(11)
        for v in views:
            raw = v[1].view(torch.uint8) if v.element_size() == 1 else v[1]
            if v.element_size() == 1:
                raw.copy_(torch.randint(0, 256, raw.shape, generator=gen, dtype=torch.uint8))
            else:
                raw.copy_(torch.randn(raw.shape, generator=gen, dtype=torch.float32).to(v.dtype))
        block = g.tokens_per_block
        hashes = tutti.chain_hashes(list(range(block)), block)
        with rt.begin_store(hashes, [1]) as st:
            with st.submit() as job:
                job.wait()
            entry["stored"] = st.commit().stored
        with rt.load(hashes, [4]) as job:
            job.wait()
        as_bytes = [v.view(torch.uint8) if v.element_size() == 1 else v for v in views]
        entry["round_trip"] = all(torch.equal(v[4], v[1]) for v in as_bytes)
        entry["other_blocks_untouched"] = all(
            not v[b].any().item() for v in as_bytes for b in range(NUM_BLOCKS) if b not in (1, 4)
        )
        entry["bytes_stored"] = rt.stats().bytes_stored
    except LayoutError as e:
        entry["error"] = str(e)
    finally:
        w.close()
        rt.close()
    return entry


def main(model_dir: str) -> None:
    cfg = EngineArgs(model=model_dir, skip_tokenizer_init=True, block_size=16, dtype="float32",
                     enforce_eager=True, max_model_len=2048).create_engine_config()
    res = {"use_mla": uses_mla(cfg), "head_size": cfg.model_config.get_head_size(),
           "kv_heads": cfg.model_config.get_num_kv_heads(cfg.parallel_config), "layouts": {}, "3d": {}}
    base = geometry_from_vllm(cfg, {})
    res["geometry"] = [base.layers, base.kv_heads, base.head_dim, base.tokens_per_block, base.dtype]
    latent = res["head_size"]
    for dname, (torch_dtype, tdtype) in DTYPES.items():
        g = tutti.Geometry(base.layers, base.kv_heads, base.head_dim, base.tokens_per_block, tdtype)
        spec = MLAAttentionSpec(block_size=g.tokens_per_block, num_kv_heads=1, head_size=latent, dtype=torch_dtype)
        names = [f"model.layers.{i}.self_attn.attn" for i in range(g.layers)]
        for layout in KVCacheLayout:
            strides = compute_layout_strides(spec, NUM_BLOCKS, g.layers, layout)
            size = NUM_BLOCKS * g.layers * spec.page_size_bytes
            kvt = KVCacheTensor(size=size, layers=names, layer_stride=strides[0], block_stride=strides[1])
            raw = torch.zeros(size, dtype=torch.int8)
            views = create_kv_cache_views(raw, spec, NUM_BLOCKS, layout, kvt)
            res["layouts"][f"{layout.name}/{dname}"] = round_trip(views, g, layout.name)
        shape = (NUM_BLOCKS, g.tokens_per_block, latent)
        views = [torch.zeros(shape, dtype=torch_dtype) for _ in range(g.layers)]
        res["3d"][dname] = round_trip(views, g, None)
    print("\nRESULT " + json.dumps(res))


if __name__ == "__main__":
    main(sys.argv[1])
