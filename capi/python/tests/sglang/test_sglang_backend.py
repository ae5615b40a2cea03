"""``tutti.sglang`` against real SGLang classes: its storage base and dynamic factory, its MHA
host KV pool in every layout it offers (on the CPU), and page addresses from
``get_page_buffer_meta``. Every page is compared byte for byte."""

from __future__ import annotations

import random
import time

import pytest
import torch

import sglang_env as E
from sglang.srt.mem_cache.hicache_storage import HiCacheStorage
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

from tutti.sglang import (
    ConfigError,
    KeyTypeError,
    NotRegisteredError,
    PageIndexError,
    TuttiHiCacheStorage,
    UnsupportedPool,
)

PAGE = 4
DTYPES = [torch.bfloat16, torch.float32]


def _pages(host, idx, n, ps=PAGE):
    return [E.page_bytes(host, int(idx[i * ps])) for i in range(n)]


@pytest.fixture
def backend(library, pool_extra):
    made = []

    def make(layout="page_first", dtype=torch.bfloat16, extra=None, **dev_kw):
        dev = E.device_pool(dtype=dtype, **dev_kw)
        host = E.host_pool(dev, layout)
        b = E.make_backend(host, dict(pool_extra, **(extra or {})))
        made.append(b)
        return b, host

    yield make
    for b in made:
        b.close()


def test_the_dynamic_factory_builds_it_by_module_path_and_class_name(library, pool_extra):
    dev = E.device_pool()
    host = E.host_pool(dev, "page_first")
    cfg = E.storage_config(dict(E.BACKEND, **pool_extra))
    b = StorageBackendFactory.create_backend("dynamic", cfg, host)
    try:
        assert type(b) is TuttiHiCacheStorage and isinstance(b, HiCacheStorage)
        # SGLang registers the host pool after building the backend: nothing moves before that.
        with pytest.raises(NotRegisteredError, match="register_mem_pool_host"):
            b.batch_exists(E.hashes_for(E.tokens_for(1, PAGE), PAGE))
        b.register_mem_pool_host(host)
        assert b.mem_pool_host is host
        assert b.batch_exists(E.hashes_for(E.tokens_for(2, PAGE), PAGE)) == 0
    finally:
        b.close()


@pytest.mark.parametrize("layout", E.LAYOUTS)
def test_the_registration_is_where_get_page_buffer_meta_says_every_page_is(backend, layout):
    b, host = backend(layout)
    lay = b.layout
    pages = lay.num_blocks
    ptrs, sizes = host.get_page_buffer_meta(torch.arange(pages * PAGE, dtype=torch.int64))
    per_page = 2 * lay.geometry.layers
    assert len(ptrs) == pages * per_page
    want = []
    for p in range(pages):
        for k, v in zip(lay.k_bases, lay.v_bases):
            want += [k + p * lay.block_stride, v + p * lay.block_stride]
    assert [int(x) for x in ptrs] == want
    assert set(int(s) for s in sizes) == {lay.geometry.object_bytes}
    assert lay.page_bytes * pages == host.kv_buffer.numel() * host.kv_buffer.element_size()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", E.LAYOUTS)
def test_every_page_round_trips_byte_for_byte(backend, layout, dtype):
    b, host = backend(layout, dtype)
    E.fill_random(host, 7)
    rnd = random.Random(3)
    n = 12
    src = host.alloc(n * PAGE)
    # Pages in a scattered order, so block ids are not one run.
    order = list(range(n))
    rnd.shuffle(order)
    src = torch.cat([src[i * PAGE:(i + 1) * PAGE] for i in order])
    keys = E.hashes_for(E.tokens_for(n, PAGE), PAGE)
    want = _pages(host, src, n)
    assert b.batch_set_v1(keys[:5], src[: 5 * PAGE]) == [True] * 5
    assert b.batch_set_v1(keys[5:], src[5 * PAGE:]) == [True] * 7
    # Read into other pages of the pool, after scribbling over everything.
    dst = host.alloc(n * PAGE)
    host.kv_buffer.view(-1).view(torch.uint8).fill_(0xA5)
    assert b.batch_exists(keys) == n
    assert b.batch_get_v1(keys, dst) == [True] * n
    assert _pages(host, dst, n) == want
    st = b.stats()
    assert st["pages_set"] == n and st["pages_got"] == n and st["bytes_got"] == n * b.layout.page_bytes
    assert st["pins_held"] == 0


@pytest.mark.parametrize("layout", E.LAYOUTS)
def test_v0_page_tensors_round_trip(backend, layout):
    b, host = backend(layout)
    E.fill_random(host, 11)
    n = 3
    idx = host.alloc(n * PAGE)
    keys = E.hashes_for(E.tokens_for(n, PAGE, start=50), PAGE)
    pages = [host.get_data_page(int(idx[i * PAGE]), flat=True) for i in range(n)]
    want = [p.view(torch.uint8).numpy().tobytes() for p in pages]
    free_before = host.available_size()
    assert b.set(keys[0], pages[0]) is True
    assert b.batch_set(keys[1:], pages[1:]) is True
    assert host.available_size() == free_before  # borrowed pages went back
    assert b.exists(keys[0]) and b.exists(keys[2]) and not b.exists("0" * 64)
    dummy = host.get_dummy_flat_data_page()
    got = b.get(keys[1], dummy)
    assert got is dummy and dummy.view(torch.uint8).numpy().tobytes() == want[1]
    outs = b.batch_get(keys + ["f" * 64], [host.get_dummy_flat_data_page() for _ in range(n + 1)])
    assert [o.view(torch.uint8).numpy().tobytes() for o in outs[:n]] == want
    assert outs[n] is None
    assert b.get(keys[2]).view(torch.uint8).numpy().tobytes() == want[2]
    assert host.available_size() == free_before
    with pytest.raises(PageIndexError, match="page tensor 0"):
        b.set("a" * 64, torch.zeros(7, dtype=torch.bfloat16))
    with pytest.raises(PageIndexError, match="float32"):
        b.set("a" * 64, torch.zeros(pages[0].numel() // 2, dtype=torch.float32))


def test_v0_with_no_free_host_pages_is_a_miss(backend):
    b, host = backend("page_first")
    idx = host.alloc(host.available_size())
    page = host.get_data_page(int(idx[0]), flat=True).clone()
    assert b.set("b" * 64, page) is False
    assert b.get("b" * 64) is None
    assert b.stats()["borrow_failed"] == 2


def test_batch_exists_is_the_leading_run_and_pins_it_until_the_get(backend):
    b, host = backend("layer_first", extra={"pin_ttl_ms": 400})
    E.fill_random(host, 5)
    n = 6
    idx = host.alloc(n * PAGE)
    keys = E.hashes_for(E.tokens_for(n, PAGE), PAGE)
    stored = [0, 1, 3, 4, 5]
    sel = torch.cat([idx[i * PAGE:(i + 1) * PAGE] for i in stored])
    assert b.batch_set_v1([keys[i] for i in stored], sel) == [True] * 5
    assert b.batch_exists(keys) == 2
    assert b.pins_held() == 1
    assert b.rt.stats().files_pinned == 2
    assert b.batch_exists(keys[3:]) == 3
    assert b.pins_held() == 2 and b.rt.stats().files_pinned == 5
    # The get of a run releases that run's pin (a prefix of it, as SGLang reads after a
    # rank-wide minimum, releases it too).
    assert b.batch_get_v1(keys[:1], idx[:PAGE]) == [True]
    assert b.pins_held() == 1 and b.rt.stats().files_pinned == 3
    # A hit nobody reads (SGLang revoked the prefetch) is released after pin_ttl_ms.
    time.sleep(0.5)
    b.batch_exists(keys[:1])
    assert b.pins_held() == 1 and b.rt.stats().files_pinned == 1
    assert b.stats()["pins_expired"] == 1
    b.clear()
    assert b.pins_held() == 0 and b.rt.stats().files_pinned == 0
    assert b.batch_exists(keys) == 2  # clear() keeps what is stored (tutti has no delete)
    b.clear()


def test_pinned_hits_survive_eviction_and_unpinned_ones_do_not(backend):
    # Pages of 64 tokens × 3 layers × 2 heads × 32 × bf16 ×2 (K, V) = 48 KiB; two 4 MiB drives
    # hold some 160 of them.
    ps = 64
    b, host = backend("page_first", extra={"emulated_capacity_bytes": 4 << 20}, tokens=512, page=ps)
    files = b.rt.info().files
    E.fill_random(host, 9)
    batch = 16
    idx = host.alloc(batch * ps)
    first = E.hashes_for(E.tokens_for(batch, ps, start=0), ps)
    assert b.batch_set_v1(first, idx) == [True] * batch
    want = _pages(host, idx, batch, ps)
    assert b.batch_exists(first[:8]) == 8  # pinned
    # Write the pool over twice with other keys: least-recently-used unpinned files go.
    start = 10_000
    for _ in range(2 * files // batch + 1):
        keys = E.hashes_for(E.tokens_for(batch, ps, start=start), ps)
        start += batch * ps
        assert all(b.batch_set_v1(keys, idx))
    assert b.rt.stats().evictions > 0
    assert b.batch_exists(first[8:]) == 0  # not pinned: evicted
    host.kv_buffer.zero_()
    assert b.batch_get_v1(first[:8], idx[: 8 * ps]) == [True] * 8
    assert _pages(host, idx, 8, ps) == want[:8]


@pytest.mark.parametrize("bad", [5, b"\x00" * 32, None, ("k",)], ids=["int", "bytes", "None", "tuple"])
def test_a_key_of_the_wrong_type_is_refused_naming_it(backend, bad):
    b, host = backend("page_first")
    idx = host.alloc(2 * PAGE)
    keys = ["a" * 64, bad]
    for call in (lambda: b.batch_exists(keys), lambda: b.batch_set_v1(keys, idx), lambda: b.batch_get_v1(keys, idx)):
        with pytest.raises(KeyTypeError, match=f"key 1 is {type(bad).__name__}"):
            call()
    with pytest.raises(KeyTypeError, match="keys must be a list of str"):
        b.batch_exists("a" * 64)
    with pytest.raises(KeyTypeError, match="key 0 is"):
        b.exists(bad)
    assert b.stats()["pages_set"] == 0


def test_non_hex_keys_are_pages_too(backend):
    b, host = backend("page_first")
    E.fill_random(host, 2)
    idx = host.alloc(2 * PAGE)
    keys = ["h0", "some/other key"]
    want = _pages(host, idx, 2)
    assert b.batch_set_v1(keys, idx) == [True, True]
    host.kv_buffer.zero_()
    assert b.batch_exists(keys) == 2 and b.batch_get_v1(keys, idx) == [True, True]
    assert _pages(host, idx, 2) == want


def test_host_indices_that_are_not_whole_pages_are_refused(backend):
    b, host = backend("layer_first")
    keys = E.hashes_for(E.tokens_for(2, PAGE), PAGE)
    idx = host.alloc(2 * PAGE)
    cases = [
        (idx[:PAGE], "2 keys need 2 pages of 4 tokens = 8 host indices, got 4"),
        (idx + 1, "not a multiple of the page size 4"),
        (idx.flip(0), "each page's 4 indices must be consecutive"),
        (idx + 10_000 * PAGE, "outside the registered pool"),
        (idx.to(torch.float32), "must be integers"),
        (idx.tolist(), "must be a torch tensor"),
    ]
    for indices, msg in cases:
        for call in (b.batch_set_v1, b.batch_get_v1):
            with pytest.raises(PageIndexError, match=msg):
                call(keys, indices)
    assert b.stats()["pages_set"] == 0 and b.rt.stats().bytes_stored == 0


def test_a_page_size_that_does_not_fit_the_geometry_is_refused_before_anything_opens(library, tmp_path):
    # layer_first, page 1: one object is 1 token × 2 heads × 32 × 2 bytes = 128 bytes.
    dev = E.device_pool(page=1, tokens=64)
    host = E.host_pool(dev, "layer_first")
    d = tmp_path / "pool"
    extra = {"interface_v1": 1, "emulated_drives": 2, "emulated_dir": str(d)}
    with pytest.raises(UnsupportedPool, match=r"page size 1 does not fit .* is 128 bytes.*use --page-size 4"):
        E.make_backend(host, extra)
    assert not d.exists()  # refused before the pool was opened
    # The same pool page-first is one object per page: 3 layers × 128 bytes is not whole blocks either.
    with pytest.raises(UnsupportedPool, match="page size 1 does not fit"):
        E.make_backend(E.host_pool(dev, "page_first"), extra)
    # Page 4 fits both.
    b = E.make_backend(E.host_pool(E.device_pool(page=4), "layer_first"), extra)
    b.close()


def test_an_unknown_layout_and_a_pool_that_is_only_mla_like_are_refused(library, pool_extra):
    dev = E.device_pool()
    host = E.host_pool(dev, "page_first")
    b = StorageBackendFactory.create_backend("dynamic", E.storage_config(dict(E.BACKEND, **pool_extra)), host)
    host.layout = "page_unified"  # one SGLang offers whose K and V of a layer interleave per head group
    with pytest.raises(UnsupportedPool, match="layout 'page_unified' is not one tutti can address"):
        b.register_mem_pool_host(host)
    host.layout = "page_first"

    class MLALike:  # MLA's attributes, none of the host pool's (tests/sglang/test_sglang_mla.py: the real one)
        kv_lora_rank = 512

    with pytest.raises(UnsupportedPool, match="MLA host pool MLALike has no 'layout'"):
        b.register_mem_pool_host(MLALike())
    assert b.rt is None


def test_a_pool_whose_pages_are_not_where_sglang_says_is_refused(library, pool_extra):
    dev = E.device_pool()
    host = E.host_pool(dev, "page_first")
    real = host.get_page_buffer_meta

    def shifted(indices):
        ptrs, sizes = real(indices)
        return [p + 64 for p in ptrs], sizes

    host.get_page_buffer_meta = shifted
    with pytest.raises(UnsupportedPool, match="reports page regions tutti cannot address"):
        E.make_backend(host, pool_extra)


@pytest.mark.parametrize(
    "extra,msg",
    [
        ({"emulated_drives": 2, "colour": 1}, r"unknown hicache_storage_backend_extra_config keys \['colour'\]"),
        ({"emulated_drives": 2, "executor": "direct"}, "'direct' is refused"),
        ({}, "needs exactly one of 'emulated_drives'"),
        ({"emulated_drives": 2, "daemon_socket": "/tmp/x.sock"}, "the daemon owns the drives"),
        ({"emulated_drives": 2, "daemon": "auto"}, "'auto' starts tuttid for an emulated pool kept in 'emulated_dir'"),
        ({"emulated_drives": "two"}, r"\['emulated_drives'\] = 'two' is not an integer"),
        ({"emulated_drives": 2, "timeout_ms": 0}, r"\['timeout_ms'\] = 0 must be an integer in 1"),
        ({"emulated_drives": 2, "model": ""}, "'model'\\] must be a non-empty string"),
    ],
)
def test_bad_config_is_refused_naming_the_key(library, extra, msg):
    with pytest.raises(ConfigError, match=msg):
        TuttiHiCacheStorage(E.storage_config(dict(E.BACKEND, **extra)), {})


def test_tp_above_one_without_a_daemon_is_refused(library):
    cfg = E.storage_config(dict(E.BACKEND, emulated_drives=2), tp_rank=1, tp_size=2)
    with pytest.raises(ConfigError, match="TP×PP = 2 ranks, each its own process"):
        TuttiHiCacheStorage(cfg, {})


def test_no_model_name_is_refused(library, pool_extra):
    with pytest.raises(ConfigError, match="no model name"):
        TuttiHiCacheStorage(E.storage_config(dict(E.BACKEND, **pool_extra), model=None), {})


def test_two_backends_on_one_in_process_pool_are_refused(backend, pool_extra):
    b, host = backend("page_first")
    host2 = E.host_pool(E.device_pool(), "page_first")
    with pytest.raises(ConfigError, match="another TuttiHiCacheStorage of this process holds this pool"):
        E.make_backend(host2, pool_extra)
    # The first one still works.
    idx = host.alloc(PAGE)
    assert b.batch_set_v1(["c" * 64], idx) == [True]


def test_a_pool_keeps_one_layout_family(library, tmp_path):
    extra = {"interface_v1": 1, "emulated_drives": 2, "emulated_dir": str(tmp_path / "pool")}
    dev = E.device_pool()
    host = E.host_pool(dev, "page_head")
    E.fill_random(host, 1)
    idx = host.alloc(2 * PAGE)
    keys = E.hashes_for(E.tokens_for(2, PAGE), PAGE)
    b = E.make_backend(host, extra)
    assert b.batch_set_v1(keys, idx) == [True, True]
    b.close()
    # page_first has page_head's geometry (one object per page half) and another byte order
    # inside it: the same keys are misses under its identity.
    b = E.make_backend(E.host_pool(dev, "page_first"), extra)
    assert b.batch_exists(keys) == 0
    b.close()
    b = E.make_backend(E.host_pool(dev, "page_head"), extra)
    assert b.batch_exists(keys) == 2
    b.clear()
    b.close()
    # A pool formatted for page-major objects refuses per-layer ones, saying how it was formatted.
    with pytest.raises(ConfigError, match=r"formatted for 1 layers × 6 KV heads.*--layers 3 --kv-heads 2"):
        E.make_backend(E.host_pool(dev, "layer_first"), extra)


def test_get_stats_gives_sglang_its_storage_metrics_per_call(backend):
    from sglang.srt.observability.metrics_collector import StorageMetrics

    b, host = backend("page_first")
    idx = host.alloc(3 * PAGE)
    keys = E.hashes_for(E.tokens_for(3, PAGE), PAGE)
    b.batch_set_v1(keys, idx)
    assert b.get_stats().backup_pgs == []  # SGLang runs without --enable-storage-metrics
    b.close()
    b = E.make_backend(host, {"interface_v1": 1, "emulated_drives": 2, "emulated_capacity_bytes": 16 << 20},
                       metrics=True)
    b.batch_set_v1(keys, idx)
    b.batch_set_v1(keys[:1], idx[:PAGE])
    b.batch_get_v1(keys, idx)
    m = b.get_stats()
    assert isinstance(m, StorageMetrics)
    assert m.backup_pgs == [3, 1] and m.prefetch_pgs == [3]
    assert len(m.backup_bandwidth) == 2 and all(x > 0 for x in m.prefetch_bandwidth)
    assert b.get_stats().backup_pgs == []  # since the last call
    assert b.stats()["pages_present"] == 1
    b.close()


def test_the_pin_book_releases_the_oldest_over_its_bound_and_nothing_twice():
    from tutti._hicache.pins import PinBook

    released = []
    book = PinBook(released.append, ttl_s=60.0, max_pins=2)
    book.add("a", 1)
    book.add("b", 2)
    book.add("a", 3)  # over the bound: pin 1 goes
    assert released == [1] and len(book) == 2
    book.release_run("a")
    assert released == [1, 3]
    book.release_run("a")  # no pin left for that run
    book.release_all()
    assert released == [1, 3, 2] and len(book) == 0
