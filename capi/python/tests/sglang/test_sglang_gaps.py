"""What ``tutti.sglang`` does not do is refused clearly, and what it keeps it keeps, with the real
sglang package's pools and storage config (issue 39's SGLang items):

- SGLang's head split across TP sizes (``tp_lcm_size`` with ``page_head``, which SGLang's
  controller turns into ``should_split_heads``): refused when the backend is built;
- ``set``/``get``/``batch_set``/``batch_get`` by raw host address (``target_location(s)`` with
  ``target_sizes``): refused at the call, naming the form and what to use instead;
- registering the same host pool again keeps every page stored, in a RAM pool too;
- ``emulated_capacity_bytes`` under libtutti's minimum: refused by the config parser naming
  the minimum, and no "formatted for another geometry" hint on errors that are not that.
"""

from __future__ import annotations

import pytest
import torch

import sglang_env as E
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

from tutti.sglang import ConfigError, UnsupportedCall

PAGE = 4


def test_should_split_heads_is_refused_when_the_backend_is_built(library, pool_extra):
    dev = E.device_pool()
    host = E.host_pool(dev, "page_head")
    cfg = E.storage_config(dict(E.BACKEND, **pool_extra), tp_size=1, tp_lcm_size=2, should_split_heads=True)
    with pytest.raises(ConfigError, match=r"tp_lcm_size=2.*page_head.*does not split pages.*Drop 'tp_lcm_size'"):
        StorageBackendFactory.create_backend("dynamic", cfg, host)


def test_sglangs_controller_with_tp_lcm_size_on_page_head_is_refused(library, pool_extra):
    """SGLang's own controller decides should_split_heads (tp_lcm_size > tp_size on page_head) and
    builds the backend: the refusal reaches the caller, not a silent per-TP key."""
    dev = E.device_pool()
    host = E.host_pool(dev, "page_head")
    with pytest.raises(Exception) as info:
        ctl = E.controller(dev, host, dict(pool_extra, tp_lcm_size=2))
        E.stop(ctl)
    assert "does not split pages" in str(info.value) or "does not split pages" in repr(info.value.__cause__)


def test_tp_lcm_size_on_another_layout_is_not_a_split_and_is_accepted(library, pool_extra):
    dev = E.device_pool()
    host = E.host_pool(dev, "page_first")
    b = E.make_backend(host, pool_extra, tp_lcm_size=2, should_split_heads=False)
    try:
        assert b.batch_exists(E.hashes_for(E.tokens_for(1, PAGE), PAGE)) == 0
    finally:
        b.close()


@pytest.fixture
def backend(library, pool_extra):
    dev = E.device_pool()
    host = E.host_pool(dev, "page_first")
    b = E.make_backend(host, pool_extra)
    yield b, host
    b.close()


def test_raw_address_set_and_get_are_refused_naming_the_form(backend):
    b, host = backend
    key = E.hashes_for(E.tokens_for(1, PAGE), PAGE)[0]
    ptr, size = host.kv_buffer.data_ptr(), b.layout.page_bytes
    for call in (
        lambda: b.set(key, None, target_location=ptr, target_sizes=size),
        lambda: b.get(key, target_location=ptr, target_sizes=size),
        lambda: b.batch_set([key], target_locations=[ptr], target_sizes=[size]),
        lambda: b.batch_get([key], target_locations=[ptr], target_sizes=[size]),
        lambda: b.get(key, target_location=ptr),
    ):
        with pytest.raises(UnsupportedCall, match=r"by raw host address .*interface_v1"):
            call()
    # Nothing was stored by the refused calls; page tensors still work.
    assert b.batch_exists([key]) == 0
    page = host.get_data_page(0, flat=True).clone()
    assert b.set(key, page) is True
    assert torch.equal(b.get(key), page)


def test_a_second_registration_of_the_same_pool_keeps_what_is_stored(backend):
    """RAM drives (no emulated_dir): a reopened runtime would have lost every page."""
    b, host = backend
    E.fill_random(host, 4)
    n = 3
    idx = host.alloc(n * PAGE)
    keys = E.hashes_for(E.tokens_for(n, PAGE, start=7), PAGE)
    want = [E.page_bytes(host, int(idx[i * PAGE])) for i in range(n)]
    assert b.batch_set_v1(keys, idx) == [True] * n
    rt = b.rt
    b.register_mem_pool_host(host)
    assert b.rt is rt, "the runtime (and the pool it holds) was kept"
    assert b.batch_exists(keys) == n
    host.kv_buffer.view(-1).view(torch.uint8).fill_(0)
    dst = host.alloc(n * PAGE)
    assert b.batch_get_v1(keys, dst) == [True] * n
    assert [E.page_bytes(host, int(dst[i * PAGE])) for i in range(n)] == want


def test_a_second_registration_of_another_pool_of_the_same_shape_keeps_the_pool(library, pool_extra):
    dev = E.device_pool()
    h1, h2 = E.host_pool(dev, "page_first"), E.host_pool(dev, "page_first")
    b = E.make_backend(h1, pool_extra)
    try:
        E.fill_random(h1, 8)
        keys = E.hashes_for(E.tokens_for(2, PAGE, start=3), PAGE)
        idx = h1.alloc(2 * PAGE)
        want = [E.page_bytes(h1, int(idx[i * PAGE])) for i in range(2)]
        assert b.batch_set_v1(keys, idx) == [True, True]
        b.register_mem_pool_host(h2)
        assert b.mem_pool_host is h2
        dst = h2.alloc(2 * PAGE)
        assert b.batch_get_v1(keys, dst) == [True, True]
        assert [E.page_bytes(h2, int(dst[i * PAGE])) for i in range(2)] == want
    finally:
        b.close()


@pytest.mark.parametrize("capacity", [1, 4096, (4 << 20) - 512])
def test_emulated_capacity_under_the_minimum_is_refused_naming_it(library, pool_extra, capacity):
    dev = E.device_pool()
    host = E.host_pool(dev, "page_first")
    with pytest.raises(ConfigError, match=r"emulated_capacity_bytes'\] = \d+ is under the minimum of 4194304 bytes"):
        E.make_backend(host, dict(pool_extra, emulated_capacity_bytes=capacity))


def test_emulated_capacity_not_whole_blocks_is_refused(library, pool_extra):
    dev = E.device_pool()
    host = E.host_pool(dev, "page_first")
    with pytest.raises(ConfigError, match="whole number of 512-byte blocks"):
        E.make_backend(host, dict(pool_extra, emulated_capacity_bytes=(8 << 20) + 100))


def test_the_minimum_capacity_itself_opens(library, pool_extra):
    dev = E.device_pool()
    host = E.host_pool(dev, "page_first")
    b = E.make_backend(host, dict(pool_extra, emulated_capacity_bytes=4 << 20))
    b.close()


def test_an_open_failure_that_is_not_a_geometry_mismatch_gets_no_geometry_hint(library, tmp_path):
    """Opening with open_mode 'open' on blank drives fails for want of a pool, not for its geometry."""
    dev = E.device_pool()
    host = E.host_pool(dev, "page_first")
    extra = {"interface_v1": 1, "emulated_drives": 2, "emulated_capacity_bytes": 16 << 20,
             "emulated_dir": str(tmp_path), "open_mode": "open"}
    with pytest.raises(ConfigError) as info:
        E.make_backend(host, extra)
    msg = str(info.value)
    assert "opening the pool" in msg and "geometry" not in str(info.value.__cause__), msg
    assert "formatted for another geometry" not in msg, msg


def test_a_geometry_mismatch_keeps_the_hint_with_the_serve_flags(library, tmp_path):
    extra = {"interface_v1": 1, "emulated_drives": 2, "emulated_capacity_bytes": 16 << 20,
             "emulated_dir": str(tmp_path)}
    first = E.make_backend(E.host_pool(E.device_pool(), "page_first"), extra)
    first.close()
    other = E.host_pool(E.device_pool(heads=4), "page_first")
    with pytest.raises(ConfigError, match=r"formatted for another geometry.*tutti serve .*--kv-heads 12"):
        E.make_backend(other, extra)
