"""Builds per-layer KV views the way vLLM >= 0.32 does (``create_kv_cache_views`` over one raw
buffer, for every ``KVCacheLayout``), hands them to the connector's worker side, and for each
accepted layout round-trips a block through tutti. Prints JSON on the last line. Run with the
vLLM venv's Python by tests/test_real_vllm.py.
"""

from __future__ import annotations

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

import torch  # noqa: E402
from vllm.v1.kv_cache_interface import (  # noqa: E402
    FullAttentionSpec, KVCacheTensor, compute_layout_strides, create_kv_cache_views,
)
from vllm.v1.kv_cache_layout import KVCacheLayout  # noqa: E402

import tutti  # noqa: E402
from tutti._connector.worker import LayoutError, WorkerSide  # noqa: E402

LAYERS, HEADS, HEAD, BLOCK, NUM_BLOCKS = 2, 2, 32, 32, 8


def claims() -> dict:
    """Which layouts vLLM's attention backends say they consume (None: any)."""
    out = {}
    for mod, cls in [("cpu_attn", "CPUAttentionBackend"), ("flash_attn", "FlashAttentionBackend"),
                     ("flashinfer", "FlashInferBackend")]:
        try:
            m = __import__(f"vllm.v1.attention.backends.{mod}", fromlist=[cls])
            got = getattr(m, cls).supported_kv_cache_layouts()
            out[cls] = None if got is None else [x.name for x in got]
        except Exception as e:  # noqa: BLE001 - a backend that cannot load on this machine
            out[cls] = f"unavailable: {type(e).__name__}"
    return out


def main() -> None:
    g = tutti.Geometry(LAYERS, HEADS, HEAD, BLOCK, "f16")
    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=HEADS, head_size=HEAD, dtype=torch.float16)
    names = [f"model.layers.{i}.self_attn.attn" for i in range(LAYERS)]
    res = {"claims": claims(), "layouts": {}}
    for layout in KVCacheLayout:
        strides = compute_layout_strides(spec, NUM_BLOCKS, LAYERS, layout)
        size = NUM_BLOCKS * LAYERS * spec.page_size_bytes
        kvt = KVCacheTensor(size=size, layers=names, layer_stride=strides[0], block_stride=strides[1])
        raw = torch.zeros(size, dtype=torch.int8)
        views = create_kv_cache_views(raw, spec, NUM_BLOCKS, layout, kvt)
        kv = dict(zip(names, views))
        entry = {"shape": list(views[0].shape), "strides": list(views[0].stride())}
        rt = tutti.Runtime(g, emulated_drives=1, emulated_capacity_bytes=16 << 20, open_mode="create")
        w = WorkerSide(rt, g, "layout-test", b"", 10.0)
        try:
            w.register(kv, {n: "CPU_ATTN" for n in names}, layout.name)
            entry["tag"] = w.layout_tag
            gen = torch.Generator().manual_seed(7)
            for v in views:
                v[1].copy_(torch.randn(v[1].shape, generator=gen, dtype=torch.float32).to(torch.float16))
            hashes = tutti.chain_hashes(list(range(BLOCK)), BLOCK)
            with rt.begin_store(hashes, [1]) as st:
                with st.submit() as job:
                    job.wait()
                st.commit()
            with rt.load(hashes, [5]) as job:
                job.wait()
            entry["round_trip"] = all(torch.equal(v[5], v[1]) for v in views)
            entry["other_blocks_untouched"] = all(
                not v[b].any().item() for v in views for b in range(NUM_BLOCKS) if b not in (1, 5)
            )
        except LayoutError as e:
            entry["error"] = str(e)
        finally:
            w.close()
            rt.close()
        res["layouts"][layout.name] = entry
    print("\nRESULT " + json.dumps(res))


if __name__ == "__main__":
    main()
