"""The connector's MLA pieces that need no vLLM: the worker's 3-D latent layer
(``[num_blocks, block_size, latent]``, MLA backends before vLLM 0.32) round-trips a block byte for
byte as its two halves, wrong shapes are refused by name, and an MLA rank's cache identity leaves
the TP rank out (so TP sizes share). vLLM's own MLA tensors and config: test_real_vllm_mla.py."""

from __future__ import annotations

import dataclasses

import pytest

import tutti
from tutti._connector.config import from_vllm
from tutti._connector.worker import LayoutError, WorkerSide, describe_vllm_layer
from vllm_standins import EXTRA, vllm_config

LATENT, BLOCK, BLOCKS = 576, 16, 4


def _geometry(dtype="bf16") -> tutti.Geometry:
    return tutti.Geometry(layers=2, kv_heads=1, head_dim=LATENT // 2, tokens_per_block=BLOCK, dtype=dtype)


@pytest.mark.parametrize("dtype", ["bf16", "fp8_e4m3"])
def test_a_3d_latent_layer_round_trips_as_its_two_halves(library, dtype):
    g = _geometry(dtype)
    es = g.element_size
    layers = {f"model.layers.{i}.self_attn.attn": tutti.HostTensor((BLOCKS, BLOCK, LATENT), es) for i in range(2)}
    rt = tutti.Runtime(g, emulated_drives=2, emulated_capacity_bytes=16 << 20, open_mode="create")
    w = WorkerSide(rt, g, "mla-unit", b"\0tutti-mla-latent", 10.0)
    try:
        w.register(layers)
        assert w.layout_tag == "vllm-mla-latent"
        block_bytes = BLOCK * LATENT * es
        assert 2 * g.object_bytes == block_bytes
        for i, t in enumerate(layers.values()):
            t.write(1 * block_bytes, bytes((7 * i + j) % 251 for j in range(block_bytes)))
        hashes = tutti.chain_hashes(list(range(BLOCK)), BLOCK)
        with rt.begin_store(hashes, [1]) as st:
            with st.submit() as job:
                job.wait()
            assert st.commit().stored == 1
        assert rt.stats().bytes_stored == 2 * block_bytes, "each layer's latent once, no K/V pair"
        with rt.load(hashes, [3]) as job:
            job.wait()
        for t in layers.values():
            assert t.read(3 * block_bytes, block_bytes) == t.read(block_bytes, block_bytes)
            assert t.read(0, block_bytes) == bytes(block_bytes) and t.read(2 * block_bytes, block_bytes) == bytes(block_bytes)
    finally:
        w.close()
        rt.close()


def test_a_latent_of_the_wrong_width_or_a_non_latent_geometry_is_refused_by_name(library):
    g = _geometry()
    t = tutti.HostTensor((BLOCKS, BLOCK, 512), 2)
    with pytest.raises(LayoutError, match=r"MLA latent layer .* \(16, 512\); the pool's geometry needs one KV head "
                                          r"and \(16, 576\)"):
        describe_vllm_layer("l0", t, g)
    mha = tutti.Geometry(layers=2, kv_heads=2, head_dim=LATENT // 2, tokens_per_block=BLOCK, dtype="bf16")
    with pytest.raises(LayoutError, match="the geometry has 2 KV heads of 288"):
        describe_vllm_layer("l0", tutti.HostTensor((BLOCKS, BLOCK, LATENT), 2), mha)


def test_an_mla_identity_leaves_the_tp_rank_out_and_keeps_the_pp_rank():
    g = _geometry()
    c2 = dataclasses.replace(from_vllm(vllm_config(g, dict(EXTRA))), latent=True, tp_size=2)
    c4 = dataclasses.replace(c2, tp_size=4)
    c1 = dataclasses.replace(c2, tp_size=1)
    salts = {c.rank_salt(r, 0) for c in (c1, c2, c4) for r in range(c.tp_size)}
    assert len(salts) == 1 and b"tutti-mla-latent" in salts.pop()
    pp = dataclasses.replace(c2, pp_size=2)
    assert pp.rank_salt(0, 0) != pp.rank_salt(0, 1) and pp.rank_salt(0, 1) == pp.rank_salt(1, 1)
    mha = dataclasses.replace(c2, latent=False)
    assert mha.rank_salt(0, 0) != mha.rank_salt(1, 0)
