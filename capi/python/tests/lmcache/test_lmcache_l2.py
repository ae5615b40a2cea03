"""tutti as the L2 adapter of LMCache 0.5.6's multiprocess cache server (``tutti.lmcache.TuttiL2Client``).

Everything LMCache here is its real code: the ``native_plugin`` adapter config and factory,
``NativeConnectorL2Adapter`` wrapping the client, the server's ``StorageManager`` (L1 and its
store/prefetch controllers) and the server process itself. The scenarios follow LMCache
0.5.6's own tests of that adapter (``tests/v1/distributed/test_native_connector_l2_adapter.py``
of its sdist: event fds, store/lookup/load, one-shot queries, locks, delete) and of prefetching
from L2 (``tests/v1/distributed/test_distributed_storage_manager.py``,
``TestStorageManagerL2Prefetch``), written for tutti: there a mock client, here tutti's pool on
emulated drives, with every byte checked.
"""

from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import sys
import time

import pytest
import torch

from lmcache.v1.distributed.api import GroupedObjectKeys, MemoryLayoutDesc, ObjectKey, PrefetchTaskSpec
from lmcache.v1.distributed.config import EvictionConfig, L1ManagerConfig, L1MemoryManagerConfig, StorageManagerConfig
from lmcache.v1.distributed.l2_adapters.config import L2AdaptersConfig
from lmcache.v1.distributed.l2_adapters.factory import create_l2_adapter_from_registry
from lmcache.v1.distributed.l2_adapters.native_plugin_l2_adapter import NativePluginL2AdapterConfig
from lmcache.v1.distributed.storage_manager import StorageManager
from lmcache.v1.memory_management import MemoryFormat, MemoryObjMetadata, TensorMemoryObj

from tutti.lmcache import ConfigError, TuttiL2Client

DEADLINE_S = 20.0


def native_config(params: dict) -> NativePluginL2AdapterConfig:
    return NativePluginL2AdapterConfig.from_dict(
        {"type": "native_plugin", "module_path": "tutti.lmcache", "class_name": "TuttiL2Client",
         "adapter_params": params}
    )


def okey(i: int, model: str = "m", rank: int = 0, salt: str = "") -> ObjectKey:
    return ObjectKey(chunk_hash=ObjectKey.IntHash2Bytes(i), model_name=model, kv_rank=rank, cache_salt=salt)


def tensor_obj(nbytes: int, seed: int | None) -> TensorMemoryObj:
    """A memory object of ``nbytes`` (random bytes from ``seed``; None: zeros)."""
    raw = torch.zeros(nbytes, dtype=torch.uint8)
    if seed is not None:
        raw.copy_(torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed)))
    md = MemoryObjMetadata(shape=torch.Size([nbytes]), dtype=torch.uint8, address=0, phy_size=nbytes,
                           fmt=MemoryFormat.KV_2LTD, ref_count=1)
    return TensorMemoryObj(raw, md, parent_allocator=None)


def wait_fd(fd: int, timeout: float = DEADLINE_S) -> bool:
    p = select.poll()
    p.register(fd, select.POLLIN)
    if not p.poll(timeout * 1000):
        return False
    try:
        os.eventfd_read(fd)
    except BlockingIOError:
        pass
    return True


def until(get, timeout: float = DEADLINE_S):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = get()
        if v is not None:
            return v
        time.sleep(0.01)
    raise AssertionError(f"nothing within {timeout} s")


def store(adp, keys, objs) -> bool:
    tid = adp.submit_store_task(keys, objs)
    done = until(lambda: adp.pop_completed_store_tasks().get(tid))
    return done.is_successful()


def lookup(adp, keys) -> list[bool]:
    tid = adp.submit_lookup_and_lock_task(keys, {})
    bm = until(lambda: adp.query_lookup_and_lock_result(tid))
    found = set(bm.get_indices_list())
    return [i in found for i in range(len(keys))]


def load(adp, keys, objs) -> list[bool]:
    tid = adp.submit_load_task(keys, objs)
    bm = until(lambda: adp.query_load_result(tid))
    found = set(bm.get_indices_list())
    return [i in found for i in range(len(keys))]


@pytest.fixture
def adapter(pool_params):
    adp = create_l2_adapter_from_registry(native_config(pool_params))
    yield adp
    adp.close()


# --- LMCache's adapter over tutti (the scenarios of test_native_connector_l2_adapter.py) ---------


def test_factory_wraps_the_tutti_client(adapter):
    assert type(adapter).__name__ == "NativeConnectorL2Adapter"
    assert isinstance(adapter._client, TuttiL2Client)
    fds = {adapter.get_store_event_fd(), adapter.get_lookup_and_lock_event_fd(), adapter.get_load_event_fd()}
    assert len(fds) == 3 and adapter.report_status()["is_healthy"]


def test_store_signals_fd_and_ids_are_unique(adapter):
    a = adapter.submit_store_task([okey(1)], [tensor_obj(5000, 1)])
    b = adapter.submit_store_task([okey(2)], [tensor_obj(5000, 2)])
    assert a != b
    assert wait_fd(adapter.get_store_event_fd())
    seen: dict = {}

    def both():
        seen.update(adapter.pop_completed_store_tasks())
        return seen if len(seen) == 2 else None

    done = until(both)
    assert set(done) == {a, b} and all(r.is_successful() for r in done.values())
    assert adapter.pop_completed_store_tasks() == {}  # popped once


def test_store_lookup_load_bytes(adapter):
    """A batch of chunks of several sizes (one, many and a partial last tutti block each)
    comes back byte for byte; a key never stored is a miss in the lookup and the load."""
    sizes = [100, 16384, 16385, 50_000, 200_003]
    keys = [okey(i) for i in range(len(sizes))]
    src = [tensor_obj(n, i) for i, n in enumerate(sizes)]
    assert store(adapter, keys, src)
    assert lookup(adapter, keys + [okey(99)]) == [True] * len(keys) + [False]
    adapter.submit_unlock(keys)
    dst = [tensor_obj(n, None) for n in sizes] + [tensor_obj(1000, None)]
    assert load(adapter, keys + [okey(99)], dst) == [True] * len(keys) + [False]
    for s, d in zip(src, dst):
        assert torch.equal(s.tensor, d.tensor)
    assert not dst[-1].tensor.any()
    assert adapter.query_load_result(0) is None  # unknown or already popped: None


def test_every_part_of_the_key_is_identity(adapter):
    """Model, KV rank, object group and salt each make a different chunk: none hits another's bytes."""
    base = okey(7)
    assert store(adapter, [base], [tensor_obj(3000, 7)])
    others = [okey(7, model="m2"), okey(7, rank=1), okey(7, salt="alice"), okey(8),
              ObjectKey(chunk_hash=base.chunk_hash, model_name="m", kv_rank=0, object_group_id=1)]
    assert lookup(adapter, [base] + others) == [True] + [False] * len(others)
    dst = [tensor_obj(3000, None) for _ in others]
    assert load(adapter, others, dst) == [False] * len(others)


def test_delete_reports_nothing_deleted_and_keeps_the_chunk(adapter):
    assert store(adapter, [okey(1)], [tensor_obj(4000, 1)])
    adapter.delete([okey(1)])  # tutti has no delete: a no-op that completes
    assert lookup(adapter, [okey(1)]) == [True]


def test_close_after_operations(pool_params):
    adp = create_l2_adapter_from_registry(native_config(pool_params))
    assert store(adp, [okey(1)], [tensor_obj(4000, 1)])
    adp.close()
    with pytest.raises(RuntimeError, match="closed"):
        adp._client.submit_batch_exists(["x"])


# --- failures are misses -----------------------------------------------------------------------


def test_failed_read_is_not_loaded(pool_params):
    adp = create_l2_adapter_from_registry(native_config({**pool_params, "io_timeout_ms": 500}))
    try:
        rt = adp._client._store.rt
        keys = [okey(i) for i in range(3)]
        src = [tensor_obj(40_000, i) for i in range(3)]
        assert store(adp, keys, src)
        for d in range(2):
            rt.emulated_fail_next(d, "load", 1)
        dst = [tensor_obj(40_000, None) for _ in keys]
        got = load(adp, keys, dst)
        assert not all(got), "a failed read must fail its chunk"
        for ok, s, d in zip(got, src, dst):
            if ok:
                assert torch.equal(s.tensor, d.tensor)
        # The drives work again: every chunk loads whole.
        dst = [tensor_obj(40_000, None) for _ in keys]
        assert load(adp, keys, dst) == [True] * 3
        assert all(torch.equal(s.tensor, d.tensor) for s, d in zip(src, dst))
    finally:
        adp.close()


def test_failed_write_is_never_visible(pool_params):
    adp = create_l2_adapter_from_registry(native_config(pool_params))
    try:
        rt = adp._client._store.rt
        for d in range(2):
            rt.emulated_fail_next(d, "store", 1)
        keys = [okey(i) for i in range(4)]
        ok = store(adp, keys, [tensor_obj(40_000, i) for i in range(4)])
        assert not ok
        present = lookup(adp, keys)
        assert not all(present), "a chunk with a failed block must not be found"
        dst = [tensor_obj(40_000, None) for _ in keys]
        assert load(adp, keys, dst) == present
    finally:
        adp.close()


def test_restart_finds_chunks(tmp_path, pool_params):
    """Stored chunks are found and loaded by a new client on the same media (no state kept in memory)."""
    params = {**pool_params, "emulated_dir": str(tmp_path / "media")}
    src = [tensor_obj(30_000, i) for i in range(3)]
    keys = [okey(i) for i in range(3)]
    adp = create_l2_adapter_from_registry(native_config(params))
    assert store(adp, keys, src)
    adp.close()
    adp = create_l2_adapter_from_registry(native_config(params))
    try:
        assert lookup(adp, keys + [okey(5)]) == [True, True, True, False]
        dst = [tensor_obj(30_000, None) for _ in keys]
        assert load(adp, keys, dst) == [True] * 3
        assert all(torch.equal(s.tensor, d.tensor) for s, d in zip(src, dst))
    finally:
        adp.close()


@pytest.mark.parametrize("bad, what", [
    ({"emulated_drives": 2, "nonsense": 1}, "nonsense"),
    ({}, "emulated_drives"),
    ({"emulated_drives": 2, "unit_bytes": 5000}, "unit_bytes"),
    ({"emulated_drives": 2, "staging_bytes": 1 << 20, "max_chunk_bytes": 2 << 20}, "max_chunk_bytes"),
    ({"emulated_drives": 2, "executor": "direct"}, "executor"),
])
def test_bad_params_name_the_key(library, bad, what):
    with pytest.raises(ConfigError, match=what) as e:
        TuttiL2Client(**bad)
    assert "l2-adapter adapter_params" in str(e.value)


# --- LMCache's storage manager (the cache server's) with tutti as its L2 ---------------------------


def storage_manager(params: dict) -> StorageManager:
    mem = L1MemoryManagerConfig(size_in_bytes=32 << 20, use_lazy=False, init_size_in_bytes=32 << 20, align_bytes=4096)
    return StorageManager(StorageManagerConfig(
        l1_manager_config=L1ManagerConfig(memory_config=mem, write_ttl_seconds=600, read_ttl_seconds=300),
        eviction_config=EvictionConfig(eviction_policy="LRU"),
        l2_adapter_config=L2AdaptersConfig(adapters=[native_config(params)]),
    ))


def test_storage_manager_store_l1_clear_prefetch_from_tutti(pool_params):
    """Write to L1 → LMCache's store controller pushes to tutti → clear L1 → prefetch from tutti → bytes equal."""
    layout = MemoryLayoutDesc(shapes=[torch.Size([40, 2, 512])], dtypes=[torch.bfloat16])
    sm = storage_manager(pool_params)
    try:
        keys = [okey(i) for i in range(6)]
        written = sm.reserve_write(keys, layout)
        assert len(written) == len(keys)
        expect = {}
        for i, k in enumerate(keys):
            t = written[k].tensor
            t.copy_(torch.randn(t.shape, generator=torch.Generator().manual_seed(i)).to(t.dtype))
            expect[k] = t.clone()
        sm.finish_write(list(written))
        adp = sm._l2_adapters[0]
        until(lambda: True if all(lookup(adp, keys)) else (adp.submit_unlock(keys) or None))
        adp.submit_unlock(keys)
        until(lambda: True if all(sm._l1_manager.is_key_evictable(k) for k in keys) else None)
        sm.clear()
        assert sm._l1_manager.get_memory_usage()[0] == 0
        spec = PrefetchTaskSpec(key_groups=[GroupedObjectKeys(keys=keys + [okey(50)], object_group_id=0,
                                                               layout_desc=layout)])
        handle = sm.submit_prefetch_task(spec)
        res = until(lambda: sm.query_prefetch_status(handle))
        assert res.hit_cells[0].count_leading_ones() == len(keys)
        with sm.read_prefetched_results(keys) as objs:
            assert objs is not None and len(objs) == len(keys)
            for k, o in zip(keys, objs):
                assert torch.equal(o.tensor, expect[k]), f"{k} came back different"
        sm.finish_read_prefetched(keys)
    finally:
        sm.close()


# --- the cache server process ------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_cache_server_starts_with_tutti_l2(tmp_path, pool_params):
    """``python -m lmcache.v1.multiprocess.server --l2-adapter '<json>'`` (bound to 127.0.0.1) builds
    LMCache's native-plugin adapter around TuttiL2Client and serves; bad adapter_params stop it
    with the client's message."""
    env = {**os.environ, "LMCACHE_TRACK_USAGE": "false",
           "PYTHONPATH": os.pathsep.join([str(__import__("pathlib").Path(__file__).parents[2])] +
                                         os.environ.get("PYTHONPATH", "").split(os.pathsep))}

    def start(params: dict, log):
        l2 = json.dumps({"type": "native_plugin", "module_path": "tutti.lmcache", "class_name": "TuttiL2Client",
                         "adapter_params": params})
        return subprocess.Popen(
            [sys.executable, "-m", "lmcache.v1.multiprocess.server", "--host", "127.0.0.1", "--port",
             str(free_port()), "--l1-size-gb", "0.05", "--eviction-policy", "LRU", "--disable-observability",
             "--l2-adapter", l2],
            stdout=log, stderr=subprocess.STDOUT, env=env, cwd=tmp_path)

    logp = tmp_path / "server.log"
    with open(logp, "w") as log:
        proc = start(pool_params, log)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and proc.poll() is None:
            text = logp.read_text(errors="replace")
            if "Created native plugin L2 adapter: tutti.lmcache.TuttiL2Client" in text and "tutti.lmcache" in text:
                break
            time.sleep(0.2)
        text = logp.read_text(errors="replace")
        assert proc.poll() is None, f"the server exited ({proc.returncode}):\n{text[-3000:]}"
        assert "Created native plugin L2 adapter: tutti.lmcache.TuttiL2Client" in text, text[-3000:]
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    badp = tmp_path / "bad.log"
    with open(badp, "w") as log:
        bad = start({"emulated_drives": 2, "nonsense": 1}, log)
    try:
        bad.wait(timeout=90)
    except subprocess.TimeoutExpired:
        bad.kill()
        bad.wait(timeout=10)
        raise AssertionError("the server with a bad adapter_params key kept running")
    assert bad.returncode != 0 and "nonsense" in badp.read_text(errors="replace")


def test_two_clients_share_one_tuttid(tmp_path, pool_params):
    """With ``"daemon": "auto"`` each client is a client of one ``tutti serve`` started for the
    emulated pool: what one stores, the other (another cache server, say) loads, byte for byte."""
    from pathlib import Path

    exe = os.environ.get("TUTTI_BIN") or str(Path(os.environ.get("TUTTI_LIB", "")).parent / "tutti")
    if not os.path.exists(exe):
        why = f"the tutti binary is not at {exe} (cargo build -p tutti-tools, or set TUTTI_BIN)"
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)
    os.environ.setdefault("TUTTI_BIN", exe)
    params = {**pool_params, "emulated_dir": str(tmp_path / "pool"), "daemon": "auto", "daemon_idle_exit_s": 5}
    a = create_l2_adapter_from_registry(native_config(params))
    b = create_l2_adapter_from_registry(native_config(params))
    try:
        assert a._client._store.rt is not b._client._store.rt
        keys = [okey(i) for i in range(3)]
        src = [tensor_obj(30_000, i) for i in range(3)]
        assert store(a, keys, src)
        assert lookup(b, keys) == [True] * 3
        dst = [tensor_obj(30_000, None) for _ in keys]
        assert load(b, keys, dst) == [True] * 3
        assert all(torch.equal(s.tensor, d.tensor) for s, d in zip(src, dst))
    finally:
        a.close()
        b.close()
