"""LMCache chunks as tutti blocks: the part both routes share.

A chunk (LMCache's unit: the KV of ``chunk_size`` tokens, an opaque run of bytes here) of
``n`` bytes is stored as ``k = ceil(n / unit)`` tutti blocks of ``unit`` bytes each, under a
geometry of one layer whose K and V objects are the two halves of a unit. Block ``i``'s key is
a 128-bit BLAKE2b of the chunk's whole LMCache key string (model, world size or KV rank, worker
or group id, chunk hash, dtype, tags, salt: every part of it) and ``i``; the last block's key is
marked as last. A chunk is present when every part ``0..k-2`` and the last block ``k-1`` are:
a lookup of the parts' keys counts the leading present run ``h``, and the chunk is complete only
if the last-marked key of block ``h`` is stored too, so a chunk with any block evicted or
never written is a miss, and nothing needs to be remembered across a restart.

:class:`ChunkStore` owns the runtime, the registration of one host memory region (LMCache's
CPU arena for the storage plugin: zero-copy; tutti's own staging memory for the L2 adapter,
which the native-plugin factory gives no L1 arena) and the calls that move blocks. It is used
from one thread at a time (the routes serialise their calls).
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import threading
from array import array
from dataclasses import dataclass
from typing import Sequence

from .._connector import shared
from .._hicache.config import ConfigError
from .._values import packed_hashes, packed_u32
from ..errors import Timeout, TuttiError
from ..runtime import Geometry, Runtime
from .config import LmcacheConfig

log = logging.getLogger("tutti.lmcache")

_PERSON = b"tutti-lmcache"
_MODEL = "lmcache"
# Runtimes of this process that a ChunkStore has registered memory with (in process, one
# registration per runtime: a second store on the same pool would replace the first's).
_held: set[int] = set()
_held_lock = threading.Lock()


def _base(key: str) -> bytes:
    return hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=32, person=_PERSON).digest()


def _part(base: bytes, i: int) -> bytes:
    return hashlib.blake2b(base + i.to_bytes(4, "little") + b"p", digest_size=16).digest()


def _last(base: bytes, i: int) -> bytes:
    return hashlib.blake2b(base + i.to_bytes(4, "little") + b"l", digest_size=16).digest()


def block_keys(key: str, k: int) -> bytes:
    """The ``k`` packed 16-byte tutti keys of a chunk of ``k`` blocks."""
    base = _base(key)
    return b"".join(_part(base, i) for i in range(k - 1)) + _last(base, k - 1)


@dataclass
class Item:
    """One chunk of a batch: its key string, its bytes at ``addr`` (``n`` of them) and, for a
    chunk in the registered region, the block its first unit is (else None: staged)."""

    key: str
    addr: int
    n: int
    block: int | None = None


class ChunkStore:
    """A tutti pool holding LMCache chunks (see the module docstring)."""

    def __init__(self, cfg: LmcacheConfig, *, who: str, unit: int, region: tuple[int, int] | None,
                 keepalive: object = None, name: str = "lmcache"):
        """``region`` (address, bytes) is registered as is (zero-copy); None: ``cfg.staging_bytes``
        of tutti-owned memory are, and chunks are copied through them."""
        self.cfg, self.who, self.unit = cfg, who, unit
        self.geometry = Geometry(1, 1, unit // 2, 1, "i8")
        pool = cfg.pool
        self.model = pool.model or _MODEL
        self._rcfg = pool.runtime_config(self.geometry, self.model)
        self._rank = (0, 0) if pool.daemon == "off" else (id(self) & 0x7FFFFFFF, 0)
        if region is None:
            self._staging = (ctypes.c_ubyte * cfg.staging_bytes)()
            region = (ctypes.addressof(self._staging), cfg.staging_bytes)
            keepalive = self._staging
        else:
            self._staging = None
        self.base, size = region
        self.num_blocks = size // unit
        if self.num_blocks < 1:
            raise ConfigError(f"{who}: the memory to register ({size} bytes) holds no block of {unit} bytes")
        self.staged = self._staging is not None
        self._poisoned: set[int] = set()  # staging blocks a drive may still write (unknown outcome)
        self._known: dict[str, int] = {}  # chunk key -> blocks, for chunks this process saw stored
        try:
            self.rt: Runtime = shared.acquire(self._rcfg, name, rank=self._rank)
        except (TuttiError, ValueError) as e:
            raise ConfigError(f"{who}: opening the pool failed: {e}") from e
        with _held_lock:
            if self._rank == (0, 0) and id(self.rt) in _held:
                shared.release(self._rcfg, self.rt, rank=self._rank)
                raise ConfigError(
                    f"{who}: another tutti.lmcache store of this process holds this pool; close it first, or "
                    "make each a client of tuttid ('daemon_socket', or 'daemon': 'auto' with 'emulated_dir')"
                )
            _held.add(id(self.rt))
        half = unit // 2
        try:
            self.rt.register_kv(
                "strided", self.num_blocks, model=self.model, k_bases=[self.base], v_bases=[self.base + half],
                block_stride=unit, tenant_salt=pool.tenant_salt + b"\0tutti-lmcache:unit=%d" % unit,
                keepalive=keepalive,
            )
        except TuttiError as e:
            self.close()
            raise ConfigError(f"{who}: registering {self.num_blocks} blocks of {unit} bytes at {self.base:#x} failed: {e}") from e
        log.info("%s: %d blocks of %d bytes registered (%s)", who, self.num_blocks, unit,
                 "staged copies" if self.staged else "LMCache's memory, zero-copy")

    # --- queries ------------------------------------------------------------------------

    def blocks_of(self, n: int) -> int:
        return max(1, -(-n // self.unit))

    def present(self, key: str, k: int | None = None) -> int:
        """The chunk's block count when it is stored whole, else 0. ``k`` None: probed
        (up to ``max_chunk_bytes``)."""
        if k is None:
            k = self._known.get(key)
        base = _base(key)
        if k is not None:
            keys = b"".join(_part(base, i) for i in range(k - 1)) + _last(base, k - 1)
            return k if self.rt.lookup(packed_hashes(keys), pin=False).hits == k else 0
        probe = self.blocks_of(self.cfg.max_chunk_bytes)
        parts = b"".join(_part(base, i) for i in range(probe - 1))
        h = self.rt.lookup(packed_hashes(parts), pin=False).hits if probe > 1 else 0
        if self.rt.lookup(packed_hashes(_last(base, h)), pin=False).hits == 1:
            self._known[key] = h + 1
            return h + 1
        return 0

    def pin(self, key: str, k: int) -> int:
        """Pins the chunk's blocks against eviction; the pin id (0: not stored whole)."""
        look = self.rt.lookup(packed_hashes(block_keys(key, k)), pin=True)
        if look.hits != k:
            look.unpin()
            return 0
        return look.pin

    def unpin(self, pin: int) -> None:
        if pin:
            self.rt.unpin(pin)

    # --- moving chunks ------------------------------------------------------------------

    def _groups(self, items: Sequence[Item]):
        """Staged: batches of items whose blocks fit the staging memory (``(item, first block)``);
        direct: one batch with each item's own blocks."""
        if not self.staged:
            yield [(it, it.block) for it in items]
            return
        free = [b for b in range(self.num_blocks) if b not in self._poisoned]
        group, used = [], 0
        for it in items:
            k = self.blocks_of(it.n)
            if k > len(free):
                raise ConfigError(
                    f"{self.who}: a chunk of {it.n} bytes needs {k} blocks of {self.unit} bytes, more than the "
                    f"{len(free)} of the staging memory ('staging_bytes')"
                )
            if used + k > len(free):
                yield group
                group, used = [], 0
            group.append((it, free[used:used + k]))
            used += k
        if group:
            yield group

    def _block_ids(self, it: Item, where) -> list[int]:
        k = self.blocks_of(it.n)
        return list(where) if self.staged else list(range(where, where + k))

    def store(self, items: Sequence[Item]) -> list[bool]:
        """Writes each chunk; True where it is stored whole (now or before)."""
        first: dict[str, int] = {}
        for i, it in enumerate(items):
            first.setdefault(it.key, i)
        unique = [it for i, it in enumerate(items) if first[it.key] == i]
        ok = [False] * len(items)
        index = {id(it): i for i, it in enumerate(items)}
        for group in self._groups(unique):
            keys, ids, spans = [], [], []
            for it, where in group:
                blocks = self._block_ids(it, where)
                if self.staged:
                    self._copy_in(it, blocks)
                keys.append(block_keys(it.key, len(blocks)))
                start = len(ids)
                ids.extend(blocks)
                spans.append((it, start, len(ids)))
            failed = self._store_blocks(b"".join(keys), ids)
            for it, a, b in spans:
                whole = not any(a <= f < b for f in failed)
                ok[index[id(it)]] = whole
                if whole:
                    self._known[it.key] = b - a
        return [ok[first[it.key]] for it in items]

    def load(self, items: Sequence[Item]) -> list[bool]:
        """Reads each chunk into its memory; True where every byte came from the drives. A chunk
        not stored whole, or whose read failed, is False and its memory must not be used."""
        ok = [False] * len(items)
        index = {id(it): i for i, it in enumerate(items)}
        for group in self._groups(items):
            keys, ids, spans, pins = [], [], [], []
            try:
                for it, where in group:
                    blocks = self._block_ids(it, where)
                    pin = self.pin(it.key, len(blocks))
                    if not pin:
                        continue
                    pins.append(pin)
                    keys.append(block_keys(it.key, len(blocks)))
                    start = len(ids)
                    ids.extend(blocks)
                    spans.append((it, start, len(ids), blocks))
                if not ids:
                    continue
                failed, unknown = self._load_blocks(b"".join(keys), ids)
            finally:
                for pin in pins:
                    self.unpin(pin)
            if unknown and self.staged:
                self._poisoned.update(ids[u] for u in unknown)
                log.warning("%s: %d staging blocks had reads of unknown outcome and are no longer used",
                            self.who, len(unknown))
            for it, a, b, blocks in spans:
                if any(a <= f < b for f in failed):
                    continue
                if self.staged:
                    self._copy_out(it, blocks)
                ok[index[id(it)]] = True
        return ok

    def _copy_in(self, it: Item, blocks: list[int]) -> None:
        for j, b in enumerate(blocks):
            n = min(self.unit, it.n - j * self.unit)
            ctypes.memmove(self.base + b * self.unit, it.addr + j * self.unit, n)

    def _copy_out(self, it: Item, blocks: list[int]) -> None:
        for j, b in enumerate(blocks):
            n = min(self.unit, it.n - j * self.unit)
            ctypes.memmove(it.addr + j * self.unit, self.base + b * self.unit, n)

    def _store_blocks(self, keys: bytes, ids: list[int]) -> set[int]:
        """The indices of blocks not stored (all of them when the batch failed)."""
        everything = set(range(len(ids)))
        try:
            with self.rt.begin_store(packed_hashes(keys), packed_u32(array("I", ids))) as session:
                with session.submit() as job:
                    job.wait(self.cfg.timeout_s)
                report = session.commit()
        except (TuttiError, ValueError) as e:
            log.warning("%s: storing %d blocks failed: %s", self.who, len(ids), e)
            return everything
        return set(report.failed_blocks)

    def _load_blocks(self, keys: bytes, ids: list[int]) -> tuple[set[int], set[int]]:
        """(failed, unknown outcome) block indices."""
        everything = set(range(len(ids)))
        try:
            with self.rt.load(packed_hashes(keys), packed_u32(array("I", ids))) as job:
                st = job.wait(self.cfg.timeout_s)
        except Timeout as e:
            st = getattr(e, "job_status", None)
            log.warning("%s: loading %d blocks timed out", self.who, len(ids))
            return everything, set(st.unknown_blocks) if st is not None else everything
        except (TuttiError, ValueError) as e:
            log.warning("%s: loading %d blocks failed: %s", self.who, len(ids), e)
            return everything, set()
        return set(st.failed_blocks), set(st.unknown_blocks)

    # --- lifetime -----------------------------------------------------------------------

    def stats(self):
        return self.rt.stats()

    def close(self) -> None:
        rt = getattr(self, "rt", None)
        if rt is None:
            return
        self.rt = None
        try:
            rt.unregister_kv()
        except TuttiError as e:
            log.debug("%s: unregistering: %s", self.who, e)
        with _held_lock:
            _held.discard(id(rt))
        shared.release(self._rcfg, rt, rank=self._rank)
