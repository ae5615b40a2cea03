"""SGLang's own test kit for storage backends (``sglang.test.kits.unified_radix_cache``), pointed at
``tutti.sglang``.

The kit drives a real ``UnifiedRadixCache`` with HiCache: a producer tree inserts a sequence,
backs it up to host memory and writes it to L3; a consumer tree prefetches it from L3 and loads
it back to the "device", and the KV must equal what the producer had. Its scenarios hard-code
SGLang's ``file`` backend; here the kit's own ``_init_hicache`` runs with ``"file"`` turned into
``"dynamic"`` and the extra config naming ``tutti.sglang`` (each tree its own client of one
tuttid per storage directory, started on demand).

What is not SGLang's own code here, because this machine has no GPU: SGLang moves KV between
the device pool and the host pool (L1 <-> L2) with CUDA kernels (``sgl_kernel``); those two
methods of ``MHATokenToKVPoolHost`` are replaced by torch index copies on the CPU, the kit's
``get_device()`` answers ``"cpu"``, and host pools are built unpinned (the kit's own corruption
fixtures do the same). Everything between the host pool and L3 is SGLang's and ours. The kit
imports SGLang's benchmark module, which imports HuggingFace ``datasets`` (not installed): a
stand-in module is put in its place when it is missing.
"""

from __future__ import annotations

import sys
import types
import unittest
from unittest import mock

import torch

import sglang_env as E

try:  # the kit -> sglang.test.test_utils -> sglang.benchmark -> datasets (unused here)
    import datasets  # noqa: F401
except ImportError:
    _stub = types.ModuleType("datasets")
    _stub.load_dataset = None
    sys.modules["datasets"] = _stub

import sglang.srt.mem_cache.hybrid_cache.hybrid_pool_assembler as assembler  # noqa: E402
import sglang.test.kits.unified_radix_cache.fixtures as kit_fixtures  # noqa: E402
import sglang.test.kits.unified_radix_cache.mixins as kit_mixins  # noqa: E402
from sglang.srt.mem_cache.base_prefix_cache import CacheRequestHandle  # noqa: E402
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost  # noqa: E402
from sglang.srt.server_args import ServerArgs  # noqa: E402
from sglang.test.kits.unified_radix_cache.config import CacheConfig  # noqa: E402
from sglang.test.kits.unified_radix_cache.fixtures import match_prefix  # noqa: E402
from sglang.test.kits.unified_radix_cache.storage import UnifiedRadixCacheStorageFixtures  # noqa: E402

from tutti.sglang import TuttiHiCacheStorage  # noqa: E402


def _backup_on_cpu(self, device_pool, host_indices, device_indices, io_backend):
    for layer in range(self.layer_num):
        self.k_data_refs[layer][host_indices] = device_pool.k_buffer[layer][device_indices]
        self.v_data_refs[layer][host_indices] = device_pool.v_buffer[layer][device_indices]


def _load_on_cpu(self, device_pool, host_indices, device_indices, layer_id, io_backend, *, is_draft=False):
    device_pool.k_buffer[layer_id][device_indices] = self.k_data_refs[layer_id][host_indices]
    device_pool.v_buffer[layer_id][device_indices] = self.v_data_refs[layer_id][host_indices]


def _unpinned(get_cls):
    def wrapped(device_pool):
        cls = get_cls(device_pool)

        def make(*args, **kwargs):
            kwargs["pin_memory"] = False
            return cls(*args, **kwargs)

        return make

    return wrapped


def _dynamic_server_args(**kwargs):
    if kwargs.get("hicache_storage_backend") == "file":
        kwargs["hicache_storage_backend"] = "dynamic"
    return ServerArgs(**kwargs)


class _TuttiKit(UnifiedRadixCacheStorageFixtures):
    """The kit's storage fixtures with L3 on tutti."""

    def setUp(self):
        patches = [
            mock.patch.object(kit_fixtures, "get_device", return_value="cpu"),
            mock.patch.object(assembler, "get_mha_host_pool_cls", _unpinned(assembler.get_mha_host_pool_cls)),
            mock.patch.object(MHATokenToKVPoolHost, "backup_from_device_all_layer", _backup_on_cpu),
            mock.patch.object(MHATokenToKVPoolHost, "load_to_device_per_layer", _load_on_cpu),
            mock.patch.object(kit_mixins, "ServerArgs", _dynamic_server_args),
        ]
        for p in patches:
            p.start()
            self.addCleanup(p.stop)

    def _init_hicache(self, cache, *, storage_backend=None, storage_dir=None, storage_extra=None, **kw):
        if storage_backend == "file":
            storage_extra = dict(
                E.BACKEND, interface_v1=1, emulated_drives=2, emulated_dir=storage_dir, daemon="auto",
                daemon_idle_exit_s=2, emulated_capacity_bytes=32 << 20, model="kit-model", **(storage_extra or {}),
            )
        super()._init_hicache(cache, storage_backend=storage_backend, storage_dir=storage_dir,
                              storage_extra=storage_extra, **kw)
        if storage_backend is not None:
            assert isinstance(cache.cache_controller.storage_backend, TuttiHiCacheStorage)

    def test_produce_to_l3_then_prefetch_and_load_back(self):
        d = self._make_storage_dir()
        seq = self._make_seq(1, 4)
        expected = self._l3_produce(d, seq, marker=5)
        cons, alloc, _ = self._l3_consumer(d)
        backend = cons.cache_controller.storage_backend
        hashes = E.hashes_for(seq, self.cfg.page_size)
        self.assertEqual(self._storage_exists_count(cons, hashes), len(hashes))
        backend.clear()  # that count pinned the run; the prefetch below pins its own
        self._consume_prefetch(cons, seq, CacheRequestHandle("kit", 0))
        m = match_prefix(cons, seq)
        self.assertEqual(m.host_hit_length, len(seq))
        self._load_back_node(cons, m.last_host_node)
        got = self._snapshot_full_kv(alloc, cons.path_device_indices(match_prefix(cons, seq).last_device_node))
        self.assertTrue(torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1]))
        self.assertEqual(backend.stats()["pages_got"], len(hashes))
        self.assertEqual(backend.pins_held(), 0)

    def test_buffer_mode_staged_prefetch_with_a_sibling_head(self):
        # The kit's own buffer-mode scenario (host_memory_mode="buffer_only"): a staged prefetch
        # whose head a sibling publishes meanwhile is trimmed and spliced; KV compared inside.
        self._assert_sibling_head_is_trimmed(self._make_storage_dir(), self._buffer_swa_seq(), window_sized=False)


def _config_class(page_size: int, **kw):
    cfg = CacheConfig(page_size=page_size, **kw)
    name = f"TestKitFullPage{page_size}"
    return type(name, (_TuttiKit, unittest.TestCase), {"cfg": cfg, "__module__": __name__})


TestKitFullPage1 = _config_class(1)
TestKitFullPage16 = _config_class(16)
TestKitFullPage64 = _config_class(64, kv_size=1024, max_context_len=1024)
