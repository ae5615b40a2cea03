"""tutti as LMCache's SSD tier: a storage plugin and a native L2 adapter client (LMCache 0.5.6).

**Storage plugin** (LMCache's cache engine and ``StorageManager``, in the engine's process)::

    storage_plugins: ["tutti"]
    extra_config:
      storage_plugin.tutti.module_path: tutti.lmcache
      storage_plugin.tutti.class_name: TuttiStoragePlugin
      storage_plugin.tutti.emulated_drives: 2          # or vfio_drives, or daemon_socket
      storage_plugin.tutti.emulated_dir: /var/lib/tutti

LMCache's CPU arena (its ``MixedMemoryAllocator`` buffer, pinned) is registered with tutti once,
in blocks of the allocator's alignment (4096 bytes by default): the drives DMA chunks straight
between it and the pool, with no copy. A chunk's shape, dtype and format are kept in this
process for the allocation a get needs, so after a restart the plugin reports no chunk it has
not stored since (a miss, never wrong bytes).

**L2 adapter** of LMCache's multiprocess cache server::

    python -m lmcache.v1.multiprocess.server ... --l2-adapter '{"type": "native_plugin",
        "module_path": "tutti.lmcache", "class_name": "TuttiL2Client",
        "adapter_params": {"emulated_drives": 2, "emulated_dir": "/var/lib/tutti"}}'

LMCache's ``NativeConnectorL2Adapter`` calls :class:`TuttiL2Client` with key strings and byte
views of its L1 objects. The native-plugin factory hands the client no description of the L1
arena, so chunks are copied once through ``staging_bytes`` of host memory registered with
tutti (one ``memmove`` per chunk each way); the drives DMA between that and the pool. Chunks
stored this way are found again after a restart (:mod:`tutti._lmcache.chunks`).

Keys: every part of LMCache's key string (model, world size or KV rank, worker or object group,
chunk hash, dtype, tags, salt) goes into each block's tutti key. Failures are misses: a chunk
not stored whole (a block evicted, a write failed) is not reported present, a chunk whose read
failed or timed out is reported not loaded, and a store that failed is reported failed and
never becomes visible. Pool settings: :mod:`tutti._lmcache.config`.
"""

from __future__ import annotations

import ctypes
import logging
import os
import queue
import threading
from concurrent.futures import Future
from typing import Any, Callable, List, Optional, Sequence

try:
    import torch
    from lmcache.v1.storage_backend.abstract_backend import StoragePluginInterface
except ImportError as e:  # pragma: no cover - only without LMCache
    raise ImportError(
        f"tutti.lmcache is an LMCache storage plugin and L2 adapter and needs the lmcache package ({e}); "
        "scripts/setup-lmcache installs the tested version"
    ) from e

from ._lmcache.chunks import ChunkStore, Item
from ._lmcache.config import L2_WHERE, ConfigError, parse, plugin_params

__all__ = ["TuttiL2Client", "TuttiStoragePlugin", "ConfigError"]

log = logging.getLogger("tutti.lmcache")


def _address(view: Any, writable: bool) -> tuple[int, int]:
    """(address, bytes) of a contiguous buffer."""
    mv = memoryview(view)
    if not mv.contiguous:
        raise ValueError("tutti.lmcache: a buffer is not contiguous")
    mv = mv.cast("B") if mv.format != "B" or mv.ndim != 1 else mv
    if mv.readonly:
        if writable:
            raise ValueError("tutti.lmcache: a buffer to load into is read-only")
        import numpy as np

        return int(np.frombuffer(mv, dtype=np.uint8).ctypes.data), mv.nbytes
    if mv.nbytes == 0:
        return 0, 0
    return ctypes.addressof(ctypes.c_char.from_buffer(mv)), mv.nbytes


class TuttiL2Client:
    """The native client LMCache's ``native_plugin`` L2 adapter wraps (see the module docstring).

    Every ``submit_batch_*`` returns a future id at once; one worker thread runs the batches in
    order on tutti and posts ``(future_id, ok, error, per_key_results)`` for
    :meth:`drain_completions`, signalling :meth:`event_fd` (an ``eventfd``) for each.
    """

    WHO = "tutti.lmcache L2 adapter"

    def __init__(self, **adapter_params: Any):
        self.cfg = parse(adapter_params, who=self.WHO, where=L2_WHERE)
        self._store = ChunkStore(self.cfg, who=self.WHO, unit=self.cfg.unit_bytes, region=None, name="lmcache-l2")
        self._efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._lock = threading.Lock()
        self._done: list[tuple[int, bool, str, Optional[list[bool]]]] = []
        self._next = 1
        self._queue: "queue.Queue[Optional[tuple]]" = queue.Queue()
        self._closed = False
        self._thread = threading.Thread(target=self._run, daemon=True, name="tutti-lmcache-l2")
        self._thread.start()

    # --- LMCache's native client interface ----------------------------------------------

    def event_fd(self) -> int:
        return self._efd

    def submit_batch_set(self, keys: Sequence[str], views: Sequence[Any]) -> int:
        return self._submit("set", keys, views)

    def submit_batch_get(self, keys: Sequence[str], views: Sequence[Any]) -> int:
        return self._submit("get", keys, views)

    def submit_batch_exists(self, keys: Sequence[str]) -> int:
        return self._submit("exists", keys, None)

    def submit_batch_delete(self, keys: Sequence[str]) -> int:
        """tutti has no delete: its pool evicts least recently used chunks itself. Every key is
        reported not deleted (LMCache's accounting keeps it; leave ``max_capacity_gb`` at 0)."""
        return self._submit("delete", keys, None)

    def drain_completions(self) -> list[tuple[int, bool, str, Optional[list[bool]]]]:
        try:
            os.eventfd_read(self._efd)
        except BlockingIOError:
            pass
        with self._lock:
            done, self._done = self._done, []
        return done

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._queue.put(None)
        self._thread.join(timeout=self.cfg.timeout_s + 5)
        if self._thread.is_alive():
            log.warning("%s: the worker did not stop within %.0f s; the pool stays open", self.WHO,
                        self.cfg.timeout_s + 5)
            return
        self._store.close()
        os.close(self._efd)

    # --- the worker ---------------------------------------------------------------------

    def _submit(self, op: str, keys: Sequence[str], views: Optional[Sequence[Any]]) -> int:
        keys = list(keys)
        bad = next((k for k in keys if not isinstance(k, str)), None)
        if bad is not None:
            raise TypeError(f"{self.WHO}: keys are strings; got {type(bad).__name__}")
        items = [Item(k, 0, 0) for k in keys]
        held = None
        if views is not None:
            views = list(views)
            if len(views) != len(keys):
                raise ValueError(f"{self.WHO}: {len(keys)} keys but {len(views)} buffers")
            for it, v in zip(items, views):
                it.addr, it.n = _address(v, writable=(op == "get"))
                if it.n == 0:
                    raise ValueError(f"{self.WHO}: the buffer of {it.key!r} is empty")
            held = views  # the buffers stay referenced until the batch is done
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{self.WHO}: closed")
            fid = self._next
            self._next += 1
        self._queue.put((fid, op, items, held))
        return fid

    def _run(self) -> None:
        while True:
            task = self._queue.get()
            if task is None:
                break
            fid, op, items, _held = task
            try:
                ok, error, results = self._do(op, items)
            except Exception as e:  # a completion must come whatever failed
                log.warning("%s: %s of %d chunks failed: %s", self.WHO, op, len(items), e)
                ok, error, results = False, f"{type(e).__name__}: {e}", [False] * len(items)
            with self._lock:
                self._done.append((fid, ok, error, results))
            os.eventfd_write(self._efd, 1)
        # Batches submitted after close() began complete as failed.
        while True:
            try:
                task = self._queue.get_nowait()
            except queue.Empty:
                break
            if task is not None:
                with self._lock:
                    self._done.append((task[0], False, "closed", [False] * len(task[2])))

    def _do(self, op: str, items: list[Item]) -> tuple[bool, str, list[bool]]:
        if not items:
            return True, "", []
        if op == "set":
            res = self._store.store(items)
            return all(res), "" if all(res) else f"{res.count(False)} of {len(res)} chunks not stored", res
        if op == "get":
            res = self._store.load(items)
            return all(res), "" if all(res) else f"{res.count(False)} of {len(res)} chunks not loaded", res
        if op == "exists":
            return True, "", [self._store.present(it.key) > 0 for it in items]
        return True, "tutti evicts by LRU and has no delete", [False] * len(items)


class TuttiStoragePlugin(StoragePluginInterface):
    """LMCache storage plugin on tutti (see the module docstring)."""

    def __init__(self, dst_device: str = "cpu", config=None, metadata=None, local_cpu_backend=None, loop=None):
        super().__init__(dst_device=dst_device, config=config, metadata=metadata,
                         local_cpu_backend=local_cpu_backend, loop=loop)
        name = self._own_name(config)
        self.who = f"tutti.lmcache storage plugin {name!r}"
        where = f"extra_config['storage_plugin.{name}.*']"
        self.cfg = parse(plugin_params(getattr(config, "extra_config", None), name), who=self.who, where=where)
        if local_cpu_backend is None:
            raise ConfigError(f"{self.who}: LMCache gave no local CPU backend, whose memory chunks are loaded into")
        alloc = getattr(local_cpu_backend, "memory_allocator", None)
        arena = getattr(alloc, "buffer", None)
        if not isinstance(arena, torch.Tensor) or arena.device.type != "cpu" or arena.numel() == 0:
            raise ConfigError(
                f"{self.who}: LMCache's CPU allocator ({type(alloc).__name__}) has no host arena tutti can "
                "register (the plugin needs the default MixedMemoryAllocator)"
            )
        unit = int(getattr(alloc, "align_bytes", 4096))
        if unit % 4096:
            raise ConfigError(f"{self.who}: LMCache's allocator aligns to {unit} bytes; tutti needs a multiple of 4096")
        self.arena = arena
        self.chunks = ChunkStore(self.cfg, who=self.who, unit=unit,
                                 region=(arena.data_ptr(), arena.numel() * arena.element_size()),
                                 keepalive=arena, name="lmcache-plugin")
        self._io = threading.Lock()  # one tutti call at a time
        self._meta: dict[str, tuple] = {}  # key string -> (shapes, dtypes, fmt, bytes)
        self._meta_lock = threading.Lock()
        self._putting: set[str] = set()
        self._pins: dict[str, list[int]] = {}
        self._worker = threading.Thread(target=self._put_loop, daemon=True, name="tutti-lmcache-put")
        self._puts: "queue.Queue[Optional[tuple]]" = queue.Queue()
        self._worker.start()

    @staticmethod
    def _own_name(config) -> str:
        """The name LMCache lists this plugin under (its class and module in ``extra_config``)."""
        extra = getattr(config, "extra_config", None) or {}
        mine = [n for n in (getattr(config, "storage_plugins", None) or [])
                if extra.get(f"storage_plugin.{n}.class_name") == TuttiStoragePlugin.__name__
                and extra.get(f"storage_plugin.{n}.module_path") == __name__]
        if len(mine) != 1:
            raise ConfigError(
                f"tutti.lmcache: storage_plugins must list exactly one plugin whose extra_config "
                f"module_path is {__name__!r} and class_name {TuttiStoragePlugin.__name__!r}; found {mine}"
            )
        return mine[0]

    def __str__(self) -> str:
        return "TuttiStoragePlugin"

    # --- helpers ------------------------------------------------------------------------

    def _item(self, key_s: str, obj) -> Optional[Item]:
        """The chunk's blocks in the arena, or None when the object is not in it whole."""
        addr, n = int(obj.data_ptr), int(obj.get_size())
        off = addr - self.chunks.base
        k = self.chunks.blocks_of(n)
        if (n == 0 or off < 0 or off % self.chunks.unit or off // self.chunks.unit + k > self.chunks.num_blocks
                or obj.get_physical_size() < k * self.chunks.unit):
            return None
        return Item(key_s, addr, n, off // self.chunks.unit)

    # --- puts ---------------------------------------------------------------------------

    def exists_in_put_tasks(self, key) -> bool:
        with self._meta_lock:
            return key.to_string() in self._putting

    def batched_submit_put_task(self, keys, objs, transfer_spec=None,
                                on_complete_callback: Optional[Callable] = None) -> Optional[List[Future]]:
        batch, futures = [], []
        for key, obj in zip(keys, objs):
            ks = key.to_string()
            item = self._item(ks, obj)
            if item is None:
                log.debug("%s: %s is not in LMCache's CPU arena whole; not stored", self.who, ks)
                continue
            with self._meta_lock:
                if ks in self._putting:
                    continue
                self._putting.add(ks)
            obj.ref_count_up()
            fut: Future = Future()
            futures.append(fut)
            batch.append((key, ks, obj, item, fut))
        if not batch:
            return None
        self._puts.put((batch, on_complete_callback))
        return futures

    def _put_loop(self) -> None:
        while True:
            task = self._puts.get()
            if task is None:
                return
            batch, callback = task
            try:
                with self._io:
                    ok = self.chunks.store([b[3] for b in batch])
            except Exception as e:
                log.warning("%s: storing %d chunks failed: %s", self.who, len(batch), e)
                ok = [False] * len(batch)
            for (key, ks, obj, item, fut), stored in zip(batch, ok):
                if stored:
                    with self._meta_lock:
                        md = obj.metadata
                        self._meta[ks] = (md.shapes or md.shape, md.dtypes or md.dtype, md.fmt, item.n)
                with self._meta_lock:
                    self._putting.discard(ks)
                obj.ref_count_down()
                fut.set_result(stored)
                if stored and callback is not None:
                    try:
                        callback(key)
                    except Exception:
                        log.exception("%s: LMCache's put callback failed", self.who)

    # --- lookups and gets ---------------------------------------------------------------

    def contains(self, key, pin: bool = False) -> bool:
        ks = key.to_string()
        with self._meta_lock:
            meta = self._meta.get(ks)
        if meta is None:
            return False
        k = self.chunks.blocks_of(meta[3])
        with self._io:
            if not pin:
                return self.chunks.present(ks, k) == k
            pid = self.chunks.pin(ks, k)
        if not pid:
            return False
        with self._meta_lock:
            self._pins.setdefault(ks, []).append(pid)
        return True

    def pin(self, key) -> bool:
        return self.contains(key, pin=True)

    def unpin(self, key) -> bool:
        ks = key.to_string()
        with self._meta_lock:
            pins = self._pins.get(ks)
            pid = pins.pop() if pins else 0
            if pins is not None and not pins:
                del self._pins[ks]
        if not pid:
            return False
        with self._io:
            self.chunks.unpin(pid)
        return True

    def get_blocking(self, key):
        return self.batched_get_blocking([key])[0]

    def batched_get_blocking(self, keys) -> list:
        out: list = [None] * len(keys)
        want = []
        for i, key in enumerate(keys):
            ks = key.to_string()
            with self._meta_lock:
                meta = self._meta.get(ks)
            if meta is None:
                continue
            shapes, dtypes, fmt, n = meta
            obj = self.local_cpu_backend.allocate(shapes, dtypes, fmt)
            if obj is None:
                log.warning("%s: LMCache's CPU allocator has no room for %s", self.who, ks)
                continue
            item = self._item(ks, obj)
            if item is None or item.n != n:
                obj.ref_count_down()
                continue
            want.append((i, obj, item))
        if want:
            try:
                with self._io:
                    ok = self.chunks.load([w[2] for w in want])
            except Exception as e:
                log.warning("%s: loading %d chunks failed: %s", self.who, len(want), e)
                ok = [False] * len(want)
            for (i, obj, _), loaded in zip(want, ok):
                if loaded:
                    out[i] = obj
                else:
                    obj.ref_count_down()
        return out

    def remove(self, key, force: bool = True) -> bool:
        """Forgets the chunk here (tutti has no delete; its pool evicts by LRU); True if it was known."""
        with self._meta_lock:
            return self._meta.pop(key.to_string(), None) is not None

    def get_allocator_backend(self):
        return self.local_cpu_backend

    def close(self) -> None:
        worker = getattr(self, "_worker", None)
        if worker is None:
            return
        self._worker = None
        self._puts.put(None)
        worker.join(timeout=self.cfg.timeout_s + 5)
        with self._io:
            for pins in self._pins.values():
                for pid in pins:
                    self.chunks.unpin(pid)
            self._pins.clear()
            self.chunks.close()
