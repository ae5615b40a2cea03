"""``tutti.sglang`` with SGLang's real MLA pools (``MLATokenToKVPool`` on the CPU and its
``MLATokenToKVPoolHost``, DeepSeek's 512 + 64 latent) in every host layout SGLang builds for
MLA on the CPU: the registration is where ``get_page_buffer_meta`` says every page is; pages
round-trip byte for byte through the zero-copy and the page-tensor paths; nothing is stored
twice (a page is its latent bytes on the drives); fp8 KV (SGLang keeps e4m3 as uint8 host
buffers) round-trips; TP ranks share one copy through tuttid (a second rank's store of a page
is a counted no-op, every rank loads it, and TP sizes 1 and 4 read what TP 2 wrote); an MHA
pool never sees MLA pages; layouts and shapes tutti cannot address are refused by name; and
SGLang's own controller backs up and prefetches MLA pages."""

from __future__ import annotations

import pytest
import torch

import sglang_env as E
from tutti._connector.shared import find_tutti_bin
from tutti.sglang import UnsupportedPool

PAGE = 8


def _pages(host, idx, n, ps=PAGE):
    return [E.page_bytes(host, int(idx[i * ps])) for i in range(n)]


@pytest.fixture
def mla_backend(library, pool_extra):
    made = []

    def make(layout="page_first", dtype=torch.bfloat16, extra=None, pool=None, page=PAGE, **kw):
        dev = E.mla_device_pool(dtype=dtype, page=page, tokens=8 * page)
        host = E.mla_host_pool(dev, layout)
        b = E.make_backend(host, dict(pool if pool is not None else pool_extra, **(extra or {})), mla=True, **kw)
        made.append(b)
        return b, host

    yield make
    for b in made:
        b.close()


@pytest.mark.parametrize("layout", E.MLA_LAYOUTS)
def test_the_mla_registration_is_where_get_page_buffer_meta_says_every_page_is(mla_backend, layout):
    b, host = mla_backend(layout)
    lay = b.layout
    assert lay.latent and lay.geometry.head_dim * 2 == E.KV_LORA_RANK + E.QK_ROPE_HEAD_DIM
    pages = lay.num_blocks
    ptrs, sizes = host.get_page_buffer_meta(torch.arange(pages * PAGE, dtype=torch.int64))
    # One region per page and registered layer: the latent run, registered as its two halves.
    assert len(ptrs) == pages * len(lay.k_bases)
    want = [k + p * lay.block_stride for p in range(pages) for k in lay.k_bases]
    assert [int(x) for x in ptrs] == want
    assert set(int(s) for s in sizes) == {2 * lay.geometry.object_bytes}
    assert all(v - k == lay.geometry.object_bytes for k, v in zip(lay.k_bases, lay.v_bases))
    # Nothing twice: the pages are exactly SGLang's host buffer.
    assert lay.page_bytes * pages == host.kv_buffer.numel() * host.kv_buffer.element_size()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("layout", E.MLA_LAYOUTS)
def test_every_mla_page_round_trips_byte_for_byte(mla_backend, layout, dtype):
    b, host = mla_backend(layout, dtype)
    E.fill_random(host, 5)
    n = 6
    src = host.alloc(n * PAGE)
    order = [3, 0, 5, 1, 4, 2]  # scattered pages: block ids are not one run
    src = torch.cat([src[i * PAGE:(i + 1) * PAGE] for i in order])
    keys = E.hashes_for(E.tokens_for(n, PAGE), PAGE)
    want = _pages(host, src, n)
    assert b.batch_set_v1(keys, src) == [True] * n
    dst = host.alloc(n * PAGE)
    host.kv_buffer.view(-1).view(torch.uint8).fill_(0x5A)
    assert b.batch_exists(keys) == n
    assert b.batch_get_v1(keys, dst) == [True] * n
    assert _pages(host, dst, n) == want
    per_page = host.layer_num * PAGE * host.kv_cache_dim * host.kv_buffer.element_size()
    st = b.stats()
    assert b.layout.page_bytes == per_page
    # The drives hold each page once: its latent bytes, no K/V pair.
    assert st["bytes_set"] == n * per_page and st["runtime"]["bytes_stored"] == n * per_page
    assert st["bytes_got"] == n * per_page


def test_mla_page_tensors_round_trip(mla_backend):
    b, host = mla_backend("layer_first")
    E.fill_random(host, 9)
    n = 2
    idx = host.alloc(n * PAGE)
    keys = E.hashes_for(E.tokens_for(n, PAGE, start=70), PAGE)
    pages = [host.get_data_page(int(idx[i * PAGE]), flat=True).clone() for i in range(n)]
    assert b.batch_set(keys, pages) is True
    got = b.batch_get(keys)
    assert [g.view(torch.uint8).numpy().tobytes() for g in got] == [p.view(torch.uint8).numpy().tobytes()
                                                                    for p in pages]


def test_fp8_e4m3_mla_pages_round_trip(mla_backend):
    """kv_cache_dtype fp8 (e4m3): SGLang's device pool stores it as uint8, and so does its host pool."""
    ps = 16  # one byte per element: half a page of 8 tokens × 3 layers × 288 is not whole 512-byte blocks
    b, host = mla_backend("page_first", torch.float8_e4m3fn, page=ps)
    assert host.kv_buffer.dtype == torch.uint8 and b.layout.geometry.dtype == "i8"
    E.fill_random(host, 13)
    n = 3
    src = host.alloc(n * ps)
    keys = E.hashes_for(E.tokens_for(n, ps, start=9), ps)
    want = _pages(host, src, n, ps)
    assert b.batch_set_v1(keys, src) == [True] * n
    dst = host.alloc(n * ps)
    host.kv_buffer.view(-1).fill_(0)
    assert b.batch_get_v1(keys, dst) == [True] * n
    assert _pages(host, dst, n, ps) == want


def test_an_mha_pool_never_sees_mla_pages(library, tmp_path):
    """The same keys, model and pool directory: MHA and MLA identities differ, so no hit."""
    extra = {"interface_v1": 1, "emulated_drives": 2, "emulated_capacity_bytes": 16 << 20,
             "emulated_dir": str(tmp_path)}
    dev = E.mla_device_pool()
    host = E.mla_host_pool(dev, "page_first")
    E.fill_random(host, 1)
    keys = E.hashes_for(E.tokens_for(2, PAGE), PAGE)
    b = E.make_backend(host, extra, mla=True)
    try:
        assert b.batch_set_v1(keys, host.alloc(2 * PAGE)) == [True, True]
    finally:
        b.close()
    # An MHA pool whose page-major geometry has the same numbers (1 layer of 3 × 1 heads × 288, page 8).
    mdev = E.device_pool(tokens=64, page=PAGE, layers=3, heads=1, head_dim=288)
    mhost = E.host_pool(mdev, "page_first")
    m = E.make_backend(mhost, extra)
    try:
        assert m.layout.geometry == b.layout.geometry, "the test needs both pools on one geometry"
        assert m.batch_exists(keys) == 0
    finally:
        m.close()


def test_tp_ranks_share_one_copy_through_tuttid_and_other_tp_sizes_read_it(library, tmp_path):
    """Two TP ranks (each its own client of one tuttid, each its own host pool with the same
    latents, as SGLang's ranks have): rank 0 stores, rank 1's store of the same pages writes
    nothing (counted as present), both load rank 0's bytes; backends at TP 1 and TP 4 (rank 3)
    hit the same pages and read the same bytes."""
    import os

    os.environ.setdefault("TUTTI_BIN", find_tutti_bin())
    extra = {"interface_v1": 1, "emulated_drives": 2, "emulated_capacity_bytes": 16 << 20,
             "emulated_dir": str(tmp_path), "daemon": "auto", "daemon_idle_exit_s": 5}
    n = 4
    keys = E.hashes_for(E.tokens_for(n, PAGE, start=500), PAGE)
    made = []

    def rank(tp_rank, tp_size, seed):
        dev = E.mla_device_pool()
        host = E.mla_host_pool(dev, "page_first_direct")
        E.fill_random(host, seed)
        b = E.make_backend(host, extra, mla=True, tp_rank=tp_rank, tp_size=tp_size)
        made.append(b)
        return b, host

    try:
        r0, h0 = rank(0, 2, 21)
        r1, h1 = rank(1, 2, 21)
        src0, src1 = h0.alloc(n * PAGE), h1.alloc(n * PAGE)
        want = _pages(h0, src0, n)
        assert _pages(h1, src1, n) == want, "both ranks hold the same latents"
        assert r0.batch_set_v1(keys, src0) == [True] * n
        stored = r0.stats()["runtime"]["bytes_stored"]
        assert stored == n * r0.layout.page_bytes
        assert r1.batch_set_v1(keys, src1) == [True] * n
        s1 = r1.stats()
        assert s1["pages_present"] == n and s1["runtime"]["bytes_stored"] == 0, s1
        for b, h in ((r0, h0), (r1, h1)):
            h.kv_buffer.view(-1).view(torch.uint8).fill_(0)
            dst = h.alloc(n * PAGE)
            assert b.batch_exists(keys) == n
            assert b.batch_get_v1(keys, dst) == [True] * n
            assert _pages(h, dst, n) == want
        for tp_rank, tp_size in ((0, 1), (3, 4)):
            b, h = rank(tp_rank, tp_size, 99)
            h.kv_buffer.view(-1).view(torch.uint8).fill_(0)
            dst = h.alloc(n * PAGE)
            assert b.batch_exists(keys) == n, f"TP {tp_size} sees what TP 2 stored"
            assert b.batch_get_v1(keys, dst) == [True] * n
            assert _pages(h, dst, n) == want
    finally:
        for b in made:
            b.close()


def test_mla_shapes_tutti_cannot_address_are_refused_by_name(library, pool_extra):
    # A page whose half-latent objects are not whole 512-byte blocks: named, with a page size that fits.
    dev = E.mla_device_pool(page=1, tokens=64)
    host = E.mla_host_pool(dev, "layer_first")
    with pytest.raises(UnsupportedPool, match=r"page size 1 .*--page-size 8"):
        E.make_backend(host, pool_extra, mla=True)
    # An odd latent has no byte-exact halves.
    dev = E.mla_device_pool(kv_lora_rank=511, qk_rope_head_dim=64)
    host = E.mla_host_pool(dev, "page_first")
    with pytest.raises(UnsupportedPool, match="575 elements per token"):
        E.make_backend(host, pool_extra, mla=True)


def test_mla_page_unified_is_refused_naming_the_layouts(library, pool_extra):
    dev = E.mla_device_pool()
    try:
        host = E.mla_host_pool(dev, "page_unified")
    except Exception as e:  # noqa: BLE001 - SGLang itself may not build it on the CPU
        pytest.skip(f"SGLang does not build an MLA page_unified host pool here: {e}")
    with pytest.raises(UnsupportedPool, match="page_unified.*layer_first or page_first or page_first_direct"):
        E.make_backend(host, pool_extra, mla=True)


@pytest.mark.parametrize("layout", E.MLA_LAYOUTS)
def test_sglangs_controller_backs_up_and_prefetches_mla_pages(library, pool_extra, layout):
    """SGLang's HiCacheController with an MLA device pool: it builds the storage config itself
    (is_mla_model=True, rank 0 the storage writer); its backup thread stores, its prefetch
    thread finds and reads back every page byte for byte."""
    dev = E.mla_device_pool(tokens=128)
    host = E.mla_host_pool(dev, layout)
    ctl = E.controller(dev, host, pool_extra)
    try:
        assert ctl.storage_config.is_mla_model and ctl.storage_backend.layout.latent
        E.fill_random(host, 3)
        n = 4
        tokens = E.tokens_for(n, PAGE, start=42)
        src = host.alloc(n * PAGE)
        want = _pages(host, src, n)
        assert E.backup(ctl, src, tokens) == n * PAGE
        host.kv_buffer.view(-1).view(torch.uint8).fill_(0)
        hit, done, dst = E.prefetch(ctl, tokens)
        assert hit == n * PAGE and done == n * PAGE
        assert _pages(host, dst, n) == want
    finally:
        E.stop(ctl)
