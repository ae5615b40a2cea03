"""SGLang's own HiCacheController driving ``tutti.sglang`` as in production: its backup thread
(``write_storage`` -> ``batch_set_v1``, or ``batch_set`` with page tensors without
``interface_v1``) and its prefetch threads (``prefetch`` -> ``batch_exists`` -> ``batch_get_v1``
or ``batch_get``), every page compared byte for byte; and failures on the drives, which must
read as misses."""

from __future__ import annotations

import pytest
import torch

import sglang_env as E

PAGE = 4


def _pages(host, idx, n):
    return [E.page_bytes(host, int(idx[i * PAGE])) for i in range(n)]


@pytest.fixture
def ctl(library):
    made = []

    def make(layout="page_first", extra=None, **dev_kw):
        dev = E.device_pool(**dev_kw)
        host = E.host_pool(dev, layout)
        c = E.controller(dev, host, dict({"emulated_drives": 2, "emulated_capacity_bytes": 16 << 20}, **(extra or {})))
        made.append(c)
        return c, host

    yield make
    for c in made:
        E.stop(c)


@pytest.mark.parametrize("v1", [1, 0], ids=["zero-copy", "page-tensors"])
@pytest.mark.parametrize("layout", E.LAYOUTS)
def test_backup_then_prefetch_round_trips_every_page(ctl, layout, v1):
    c, host = ctl(layout, {"interface_v1": v1})
    assert c.page_get_func.__name__ == ("_page_get_zero_copy" if v1 else "_generic_page_get")
    E.fill_random(host, 21)
    n = 7
    idx = host.alloc(n * PAGE)
    toks = E.tokens_for(n, PAGE)
    want = _pages(host, idx, n)
    assert E.backup(c, idx, toks) == n * PAGE
    host.free(idx)
    host.kv_buffer.view(-1).view(torch.uint8).fill_(0x5A)
    hit, done, got = E.prefetch(c, toks)
    assert (hit, done) == (n * PAGE, n * PAGE)
    assert _pages(host, got, n) == want
    b = c.storage_backend
    assert b.stats()["pins_held"] == 0
    if v1:
        assert b.stats()["borrow_failed"] == 0 and b.stats()["pages_got"] == n


def test_a_prefix_stored_is_a_prefix_hit(ctl):
    c, host = ctl("page_first_direct", {"interface_v1": 1})
    E.fill_random(host, 4)
    n = 6
    idx = host.alloc(n * PAGE)
    toks = E.tokens_for(n, PAGE)
    want = _pages(host, idx, n)
    assert E.backup(c, idx[: 3 * PAGE], toks[: 3 * PAGE]) == 3 * PAGE
    host.free(idx)
    hit, done, got = E.prefetch(c, toks + E.tokens_for(2, PAGE, start=99_000))
    assert (hit, done) == (3 * PAGE, 3 * PAGE)
    assert _pages(host, got, 3) == want[:3]
    hit, _, _ = E.prefetch(c, E.tokens_for(3, PAGE, start=7), rid="miss")
    assert hit == 0


def test_batches_above_sglangs_storage_batch_size(ctl):
    # 300 pages: SGLang cuts them in batches of STORAGE_BATCH_SIZE (128) on both paths.
    from sglang.srt.mem_cache.hicache_storage import STORAGE_BATCH_SIZE

    c, host = ctl("page_first", {"interface_v1": 1}, tokens=1200)
    n = 300
    assert n > 2 * STORAGE_BATCH_SIZE
    E.fill_random(host, 8)
    idx = host.alloc(n * PAGE)
    toks = E.tokens_for(n, PAGE)
    want = _pages(host, idx, n)
    assert E.backup(c, idx, toks) == n * PAGE
    host.free(idx)
    host.kv_buffer.zero_()
    hit, done, got = E.prefetch(c, toks)
    assert (hit, done) == (n * PAGE, n * PAGE)
    assert _pages(host, got, n) == want
    b = c.storage_backend
    assert b.stats()["runtime"]["jobs"] == 6  # 3 store jobs + 3 load jobs: one per batch, none per page
    assert b.stats()["pins_held"] == 0


def test_a_failed_read_is_a_miss_and_sglang_keeps_only_the_pages_before_it(ctl):
    c, host = ctl("layer_first", {"interface_v1": 1})
    b = c.storage_backend
    E.fill_random(host, 13)
    n = 6
    idx = host.alloc(n * PAGE)
    toks = E.tokens_for(n, PAGE)
    want = _pages(host, idx, n)
    assert E.backup(c, idx, toks) == n * PAGE
    keys = E.hashes_for(toks, PAGE)
    host.free(idx)
    # Directly: one read fails on each drive; those pages are False, the others True and exact.
    dst = host.alloc(n * PAGE)
    host.kv_buffer.zero_()
    for d in range(b.rt.info().drives):
        b.rt.emulated_fail_next(d, "load", 1)
    ok = b.batch_get_v1(keys, dst)
    assert 1 <= ok.count(False) <= 2, ok
    got = _pages(host, dst, n)
    for i in range(n):
        if ok[i]:
            assert got[i] == want[i]
    assert b.stats()["get_failed"] == ok.count(False)
    host.free(dst)
    # Through the controller: the prefetch completes the pages before the first failure only.
    b.rt.emulated_fail_next(0, "load", 1)
    hit, done, got_idx = E.prefetch(c, toks, rid="faulty")
    assert hit == n * PAGE and done < n * PAGE and done % PAGE == 0
    k = done // PAGE
    assert _pages(host, got_idx, k) == want[:k]
    # And the next prefetch, without a fault, gets everything.
    host.free(got_idx)
    hit, done, got_idx = E.prefetch(c, toks, rid="clean")
    assert done == n * PAGE and _pages(host, got_idx, n) == want


def test_a_failed_write_is_never_visible(ctl):
    c, host = ctl("page_first", {"interface_v1": 1})
    b = c.storage_backend
    E.fill_random(host, 3)
    n = 4
    idx = host.alloc(n * PAGE)
    keys = E.hashes_for(E.tokens_for(n, PAGE), PAGE)
    for d in range(b.rt.info().drives):
        b.rt.emulated_fail_next(d, "store", 1)
    ok = b.batch_set_v1(keys, idx)
    assert ok.count(False) >= 1
    for i, k in enumerate(keys):
        assert b.exists(k) == ok[i]
    # SGLang's backup of the same pages (with the drives healthy) stores them all.
    assert E.backup(c, idx, E.tokens_for(n, PAGE)) == n * PAGE
    assert b.batch_exists(keys) == n


def test_a_read_past_its_deadline_is_a_miss_never_stale_bytes(ctl):
    # Commands time out after 300 ms; one read is held 1.5 s on the drive.
    c, host = ctl("page_first", {"interface_v1": 1, "io_timeout_ms": 300})
    b = c.storage_backend
    E.fill_random(host, 17)
    n = 4
    idx = host.alloc(n * PAGE)
    keys = E.hashes_for(E.tokens_for(n, PAGE), PAGE)
    want = _pages(host, idx, n)
    assert b.batch_set_v1(keys, idx) == [True] * n
    dst = host.alloc(n * PAGE)
    host.kv_buffer.zero_()
    b.rt.emulated_delay_next(0, "load", 1500)
    ok = b.batch_get_v1(keys, dst)
    assert False in ok
    assert b.stats()["unknown_outcome"] == 0  # the gio executor recovered the drive
    got = _pages(host, dst, n)
    for i in range(n):
        if ok[i]:
            assert got[i] == want[i]
    host.kv_buffer.zero_()
    assert b.batch_get_v1(keys, dst) == [True] * n
    assert _pages(host, dst, n) == want


def test_a_batch_past_the_backends_timeout_is_all_misses(ctl):
    c, host = ctl("page_first", {"interface_v1": 1, "timeout_ms": 200, "io_timeout_ms": 5000})
    b = c.storage_backend
    n = 3
    idx = host.alloc(n * PAGE)
    keys = E.hashes_for(E.tokens_for(n, PAGE), PAGE)
    assert b.batch_set_v1(keys, idx) == [True] * n
    b.rt.emulated_delay_next(0, "load", 1000)
    assert b.batch_get_v1(keys, idx) == [False] * n
    assert b.batch_get_v1(keys, idx) == [True] * n
