"""tutti as an LMCache 0.5.6 storage plugin (``tutti.lmcache.TuttiStoragePlugin``).

LMCache's real code throughout: its config (``storage_plugins`` and ``extra_config``), its
``StorageManager`` (which launches the plugin through ``storage_plugin_launcher`` next to its
``LocalCPUBackend``), its CPU allocator (whose arena the plugin registers with tutti). The
scenarios follow LMCache 0.5.6's own plugin test (``tests/v1/storage_backend/test_storage_plugin.py``
of its sdist: the plugin is loaded, contains/get/remove/batched_contains reach it through the
storage manager, no plugin without ``storage_plugins``), written for tutti: there a mock
plugin keeps objects in a dict, here the bytes go to tutti's pool and back, checked. The cache
engine test replaces only LMCache's GPU connector (there is no GPU) with a stand-in that
copies to and from a CPU tensor.
"""

from __future__ import annotations

import time

import pytest
import torch

from lmcache.utils import CacheEngineKey
from lmcache.v1.config import LMCacheEngineConfig
from lmcache.v1.event_manager import EventManager
from lmcache.v1.metadata import LMCacheMetadata
from lmcache.v1.storage_backend.storage_manager import StorageManager

from tutti.lmcache import ConfigError, TuttiStoragePlugin

NAME = "tutti"
KV_SHAPE = (4, 2, 64, 2, 64)  # layers, K/V, chunk tokens, heads, head dim: 128 KiB in bf16


def engine_config(params: dict, plugins=(NAME,)) -> LMCacheEngineConfig:
    cfg = LMCacheEngineConfig.from_defaults(chunk_size=KV_SHAPE[2], local_cpu=True, max_local_cpu_size=0.05,
                                            lmcache_instance_id="tutti-plugin-test")
    extra = {f"storage_plugin.{NAME}.module_path": "tutti.lmcache",
             f"storage_plugin.{NAME}.class_name": "TuttiStoragePlugin"}
    extra.update({f"storage_plugin.{NAME}.{k}": v for k, v in params.items()})
    cfg.extra_config = extra
    cfg.storage_plugins = list(plugins) or None
    return cfg


def metadata(model="test_model", world_size=1, worker_id=0) -> LMCacheMetadata:
    return LMCacheMetadata(model_name=model, world_size=world_size, local_world_size=world_size,
                           worker_id=worker_id, local_worker_id=worker_id, kv_dtype=torch.bfloat16,
                           kv_shape=KV_SHAPE)


def key(i: int, model="test_model", world_size=1, worker_id=0) -> CacheEngineKey:
    return CacheEngineKey(model_name=model, world_size=world_size, worker_id=worker_id, chunk_hash=i,
                          dtype=torch.bfloat16)


@pytest.fixture
def plugin_params(library):
    return {"emulated_drives": 2, "emulated_capacity_bytes": 32 << 20}


@pytest.fixture
def manager(plugin_params):
    sm = StorageManager(config=engine_config(plugin_params), metadata=metadata(), event_manager=EventManager())
    yield sm
    sm.close()


def put_chunks(sm: StorageManager, keys, tokens=KV_SHAPE[2]) -> dict:
    """Stores random chunks through the storage manager; waits until the plugin has them all."""
    shape = torch.Size([KV_SHAPE[0], 2, tokens, KV_SHAPE[3] * KV_SHAPE[4]])
    objs, expect = [], {}
    for i, k in enumerate(keys):
        obj = sm.allocate(shape, torch.bfloat16)
        assert obj is not None
        obj.tensor.copy_(torch.randn(shape, generator=torch.Generator().manual_seed(i)).to(torch.bfloat16))
        expect[k] = obj.tensor.clone()
        objs.append(obj)
    sm.batched_put(keys, objs)
    plugin = sm.storage_backends[NAME]
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not all(plugin.contains(k) for k in keys):
        time.sleep(0.01)
    assert all(plugin.contains(k) for k in keys), "the plugin did not store every chunk in 20 s"
    assert not any(plugin.exists_in_put_tasks(k) for k in keys)
    return expect


def test_plugin_is_loaded_and_registers_lmcache_arena(manager):
    plugin = manager.storage_backends.get(NAME)
    assert isinstance(plugin, TuttiStoragePlugin), list(manager.storage_backends)
    assert plugin.get_allocator_backend() is manager.storage_backends["LocalCPUBackend"]
    arena = plugin.local_cpu_backend.memory_allocator.buffer
    assert plugin.chunks.base == arena.data_ptr() and not plugin.chunks.staged
    assert plugin.chunks.rt.data_path().mode == "direct"


def test_put_then_get_from_tutti_bytes_equal(manager):
    """A put reaches tutti; a get through the plugin alone (LMCache's CPU copy removed) returns the
    same bytes, read by the drives into LMCache's own arena."""
    keys = [key(i) for i in range(4)]
    expect = put_chunks(manager, keys)
    cpu = manager.storage_backends["LocalCPUBackend"]
    for k in keys:
        cpu.remove(k, force=True)
        assert manager.contains(k) == NAME
        got = manager.get(k, location=NAME)
        assert got is not None and torch.equal(got.tensor, expect[k]), f"{k} came back different"
        got.ref_count_down()
    assert manager.storage_backends[NAME].batched_contains(keys + [key(99)]) == 4


def test_partial_last_chunk(manager):
    keys = [key(1)]
    expect = put_chunks(manager, keys, tokens=37)
    manager.storage_backends["LocalCPUBackend"].remove(keys[0], force=True)
    got = manager.get(keys[0], location=NAME)
    assert got is not None and got.tensor.shape == expect[keys[0]].shape and torch.equal(got.tensor, expect[keys[0]])
    got.ref_count_down()


def test_miss_pin_unpin_remove(manager):
    plugin = manager.storage_backends[NAME]
    assert not plugin.contains(key(5)) and plugin.get_blocking(key(5)) is None and manager.contains(key(5)) is None
    put_chunks(manager, [key(5)])
    assert plugin.pin(key(5)) and plugin.unpin(key(5)) and not plugin.unpin(key(5))
    assert plugin.remove(key(5)) and not plugin.contains(key(5)) and plugin.get_blocking(key(5)) is None


def test_every_part_of_the_key_is_identity(manager):
    plugin = manager.storage_backends[NAME]
    put_chunks(manager, [key(3)])
    for other in (key(3, model="other"), key(3, world_size=2), key(3, worker_id=1), key(4)):
        assert not plugin.contains(other) and plugin.get_blocking(other) is None


def test_failed_read_is_a_miss(plugin_params):
    sm = StorageManager(config=engine_config({**plugin_params, "io_timeout_ms": 500}), metadata=metadata(),
                        event_manager=EventManager())
    try:
        plugin = sm.storage_backends[NAME]
        expect = put_chunks(sm, [key(1)])
        for d in range(2):
            plugin.chunks.rt.emulated_fail_next(d, "load", 1)
        assert plugin.get_blocking(key(1)) is None
        got = plugin.get_blocking(key(1))  # the drives work again
        assert got is not None and torch.equal(got.tensor, expect[key(1)])
        got.ref_count_down()
    finally:
        sm.close()


def test_failed_write_is_not_stored(plugin_params):
    sm = StorageManager(config=engine_config(plugin_params), metadata=metadata(), event_manager=EventManager())
    try:
        plugin = sm.storage_backends[NAME]
        for d in range(2):
            plugin.chunks.rt.emulated_fail_next(d, "store", 1)
        shape = torch.Size([KV_SHAPE[0], 2, KV_SHAPE[2], KV_SHAPE[3] * KV_SHAPE[4]])
        obj = sm.allocate(shape, torch.bfloat16)
        futures = plugin.batched_submit_put_task([key(1)], [obj])
        assert futures is not None and futures[0].result(timeout=20) is False
        obj.ref_count_down()
        assert not plugin.contains(key(1)) and plugin.get_blocking(key(1)) is None
    finally:
        sm.close()


def test_no_plugin_without_storage_plugins(plugin_params):
    sm = StorageManager(config=engine_config(plugin_params, plugins=()), metadata=metadata(),
                        event_manager=EventManager())
    try:
        assert NAME not in sm.storage_backends
    finally:
        sm.close()


def test_bad_key_names_the_key(plugin_params):
    """LMCache's launcher logs and drops a plugin that fails; built directly, the error names the key."""
    cfg = engine_config({**plugin_params, "nonsense": 1})
    with pytest.raises(ConfigError, match=r"storage_plugin\.tutti\.\*.*nonsense"):
        TuttiStoragePlugin(config=cfg, metadata=metadata(), local_cpu_backend=None)


# --- LMCache's cache engine with the plugin --------------------------------------------------------


class CpuKvConnector:
    """A stand-in for LMCache's GPU connector (no GPU here): the "GPU" KV cache is one CPU tensor
    ``[layers, 2, tokens, heads, head_dim]`` passed as ``kvcaches``, and chunks are copied
    between its token range and LMCache's memory objects. LMCache's engine, token database,
    storage manager and CPU backend are real."""

    def __new__(cls, kv_shape):
        from lmcache.v1.gpu_connector.mock_gpu_connector import MockGPUConnector

        class _Conn(MockGPUConnector):
            def from_gpu(self, memory_obj, start, end, **kw):
                memory_obj.tensor.copy_(kw["kvcaches"][:, :, start:end].reshape(memory_obj.tensor.shape))

            def to_gpu(self, memory_obj, start, end, **kw):
                dst = kw["kvcaches"][:, :, start:end]
                dst.copy_(memory_obj.tensor.reshape(dst.shape))

            def batched_from_gpu(self, memory_objs, starts, ends, **kw):
                for m, s, e in zip(memory_objs, starts, ends):
                    self.from_gpu(m, s, e, **kw)

            def batched_to_gpu(self, memory_objs, starts, ends, **kw):
                for m, s, e in zip(memory_objs, starts, ends):
                    self.to_gpu(m, s, e, **kw)

        return _Conn(kv_shape)


def test_cache_engine_store_then_retrieve_from_tutti(plugin_params):
    """LMCacheEngine.store → the plugin stores every chunk; LMCache's CPU copies dropped;
    LMCacheEngine.retrieve → every token's KV comes back from tutti, equal."""
    from lmcache.v1.cache_engine import LMCacheEngineBuilder

    tokens_n = KV_SHAPE[2] * 3 + 20  # three full chunks and a partial one
    shape = (KV_SHAPE[0], 2, tokens_n, KV_SHAPE[3], KV_SHAPE[4])
    cfg = engine_config(plugin_params)
    cfg.save_unfull_chunk = True
    engine = LMCacheEngineBuilder.get_or_create("tutti-engine-test", cfg, metadata(), CpuKvConnector(KV_SHAPE),
                                                lambda t, r: None, lambda o, r: o)
    try:
        engine.post_init()  # vLLM's connector calls this once its KV caches exist
        tokens = torch.randint(0, 30000, (tokens_n,))
        src = torch.randn(shape, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
        engine.store(tokens=tokens, kvcaches=src)
        plugin = engine.storage_manager.storage_backends[NAME]
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and len(plugin._meta) < 4:
            time.sleep(0.02)
        assert len(plugin._meta) == 4, f"the plugin holds {len(plugin._meta)} of 4 chunks"
        cpu = engine.storage_manager.storage_backends["LocalCPUBackend"]
        cpu.clear()
        before = plugin.chunks.stats().bytes_loaded
        dst = torch.zeros(shape, dtype=torch.bfloat16)
        mask = engine.retrieve(tokens, kvcaches=dst)
        assert int(mask.sum()) == tokens_n
        assert torch.equal(dst, src)
        assert plugin.chunks.stats().bytes_loaded - before >= src.numel() * 2, "the bytes did not come from tutti"
    finally:
        LMCacheEngineBuilder.destroy("tutti-engine-test")
