"""The host executor's mode through the Python binding and the connector: inline (lanes on the
calling threads, no executor thread) is the default with one lane block; every mode moves the
same bytes; inline runtimes serve several threads at once (a wait on any thread drives the lanes
of every job), as the connector's hooks, saves and vLLM's async scheduling may."""

from __future__ import annotations

import os
import random
import threading
import time

import pytest

import tutti
from tutti._connector.config import ConfigError, from_vllm
from tutti.runtime import HOST_EXEC_MODE_DEFAULT
from conftest import GEOMETRY, NUM_BLOCKS, block_bytes, fill_block, vllm_layers
from vllm_standins import EXTRA, vllm_config


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _open(mode, **kw):
    return tutti.Runtime(GEOMETRY, emulated_drives=2, emulated_capacity_bytes=8 << 20, open_mode="create",
                         exec_mode=mode, **kw)


def _idle_threads(mode, **kw) -> int:
    """Threads of this process while a runtime of ``mode`` is open and idle, less those before
    (the least of three tries: another thread of the test process may come or go meanwhile)."""
    seen = []
    for _ in range(3):
        before = _threads()
        rt = _open(mode, **kw)
        try:
            time.sleep(0.05)  # a launch's lanes are gone by now; a persistent kernel's thread is not
            seen.append(_threads() - before)
        finally:
            rt.close()
    return min(seen)


def test_the_default_with_one_lane_block_is_inline(library):
    from tutti.runtime import _exec_mode

    assert HOST_EXEC_MODE_DEFAULT == "inline"
    assert [_exec_mode("gio", None, n) for n in (0, 1, 2)] == ["inline", "inline", None]
    assert _exec_mode("gio_cuda", None, 0) is None and _exec_mode("gio", "launch", 0) == "launch"
    inline, default, persistent = _idle_threads("inline"), _idle_threads(None), _idle_threads("persistent")
    assert default == inline  # no executor thread: the emulated controllers' threads only
    assert persistent > inline  # the persistent kernel's block runs on a thread of its own
    # More lane blocks than one: libtutti's default (launch), which inline could not honour.
    rt = _open(None, host_lane_blocks=2)
    rt.close()
    with pytest.raises(tutti.InvalidArgument, match="exec_mode"):
        _open("inline", host_lane_blocks=2)


@pytest.mark.parametrize("mode", ["inline", "persistent", "launch"])
def test_every_mode_moves_the_same_bytes(library, mode):
    rt = _open(mode)
    try:
        layers = vllm_layers(GEOMETRY)
        rt.register_kv("vllm_per_layer", NUM_BLOCKS, model="m", k_bases=[t.data_ptr() for t in layers],
                       keepalive=layers)
        want = [fill_block(GEOMETRY, layers, NUM_BLOCKS, b, seed=b) for b in range(4)]
        hashes = tutti.chain_hashes(list(range(4 * GEOMETRY.tokens_per_block)), GEOMETRY.tokens_per_block)
        with rt.begin_store(hashes, [0, 1, 2, 3]) as st:
            with st.submit() as job:
                job.wait()
            assert st.commit().stored == 4
        with rt.load(hashes, [10, 11, 12, 13]) as job:
            for layer in range(GEOMETRY.layers):
                job.wait_layer(layer)
            assert job.wait().failed == 0
        for i in range(4):
            assert block_bytes(GEOMETRY, layers, NUM_BLOCKS, 10 + i) == want[i]
    finally:
        rt.close()


def test_an_inline_runtime_serves_several_threads_at_once(library):
    """Three threads load, wait layer by layer and store on one inline runtime, bounded in time;
    every byte is checked."""
    g = GEOMETRY
    rt = _open("inline")
    try:
        layers = vllm_layers(g, 48)
        rt.register_kv("vllm_per_layer", 48, model="m", k_bases=[t.data_ptr() for t in layers], keepalive=layers)
        B = g.tokens_per_block
        hashes = tutti.chain_hashes(list(range(6 * B)), B)
        want = [fill_block(g, layers, 48, b, seed=100 + b) for b in range(6)]
        with rt.begin_store(hashes, list(range(6))) as st:
            with st.submit() as job:
                job.wait()
            st.commit()
        errors: list[BaseException] = []
        deadline = time.monotonic() + 60

        def loader(first: int) -> None:
            try:
                for _ in range(15):
                    if time.monotonic() > deadline:
                        raise TimeoutError("loader ran past its deadline")
                    dest = list(range(first, first + 6))
                    with rt.load(hashes, dest) as job:
                        for layer in range(g.layers):
                            job.wait_layer(layer, timeout=20)
                        assert job.wait(timeout=20).failed == 0
                    for i, b in enumerate(dest):
                        assert block_bytes(g, layers, 48, b) == want[i]
            except BaseException as e:  # noqa: BLE001 - reported by the main thread
                errors.append(e)

        def storer() -> None:
            try:
                rnd = random.Random(5)
                for k in range(15):
                    if time.monotonic() > deadline:
                        raise TimeoutError("storer ran past its deadline")
                    toks = [rnd.randrange(1 << 30) for _ in range(2 * B)]
                    hs = tutti.chain_hashes(toks, B)
                    for b in (40, 41):
                        fill_block(g, layers, 48, b, seed=1000 + k * 2 + b)
                    with rt.begin_store(hs, [40, 41]) as st:
                        with st.submit() as job:
                            job.wait(timeout=20)
                        st.commit()
            except BaseException as e:  # noqa: BLE001
                errors.append(e)

        threads = [threading.Thread(target=loader, args=(10,)), threading.Thread(target=loader, args=(20,)),
                   threading.Thread(target=storer)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=90)
        assert not any(t.is_alive() for t in threads), "a thread hung"
        assert not errors, errors
    finally:
        rt.close()


def test_connector_host_mode_key(library, geometry):
    cfg = from_vllm(vllm_config(geometry, dict(EXTRA)))
    assert cfg.host_mode == "inline" and cfg.io_kwargs()["exec_mode"] == "inline"
    assert from_vllm(vllm_config(geometry, dict(EXTRA, host_mode="persistent"))).io_kwargs()["exec_mode"] == "persistent"
    # Several executor threads asked for, no mode: launch (inline runs on the caller's thread).
    assert from_vllm(vllm_config(geometry, dict(EXTRA, host_threads=2))).host_mode == "launch"
    with pytest.raises(ConfigError, match="host_threads"):
        from_vllm(vllm_config(geometry, dict(EXTRA, host_threads=2, host_mode="inline")))
    with pytest.raises(ConfigError, match="host_mode"):
        from_vllm(vllm_config(geometry, dict(EXTRA, host_mode="sqpoll")))
    assert "exec_mode" not in from_vllm(vllm_config(geometry, dict(EXTRA, executor="direct"))).io_kwargs()
    assert (from_vllm(vllm_config(geometry, dict(EXTRA, host_mode="launch"))).pool_key()
            != cfg.pool_key())
