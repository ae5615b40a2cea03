"""The values that cross the C ABI beside the handles: the model geometry, chained chunk hashes
and the C arrays of hashes and block ids a load or store passes, and the records the runtime
reports (pool info, table sizes, stats, data path). ``tutti.runtime`` re-exports them.
"""

from __future__ import annotations

import ctypes
from ctypes import byref, c_size_t, c_uint32
from dataclasses import dataclass
from typing import Sequence

from . import _lib
from ._lib import lib

HASH_BYTES = 16


@dataclass(frozen=True)
class Geometry:
    """The KV-cache shape of one model (per tensor-parallel rank)."""

    layers: int
    kv_heads: int
    head_dim: int
    tokens_per_block: int
    dtype: str = "bf16"

    def __post_init__(self):
        if self.dtype not in _lib.DTYPE:
            raise ValueError(f"dtype {self.dtype!r} is not one of {', '.join(_lib.DTYPE)}")

    @property
    def element_size(self) -> int:
        return _lib.DTYPE_BYTES[self.dtype]

    @property
    def object_bytes(self) -> int:
        """One K or V slice of one block in one layer."""
        return self.tokens_per_block * self.kv_heads * self.head_dim * self.element_size

    def to_c(self) -> _lib.Geometry:
        return _lib.Geometry(
            self.layers, self.kv_heads, self.head_dim, self.tokens_per_block, _lib.DTYPE[self.dtype]
        )

    @staticmethod
    def from_c(g: _lib.Geometry) -> "Geometry":
        names = {v: k for k, v in _lib.DTYPE.items()}
        return Geometry(g.layers, g.kv_heads, g.head_dim, g.tokens_per_block, names.get(g.dtype, "bf16"))


def packed_hashes(data: bytes) -> "ctypes.Array":
    """``len(data) // 16`` chunk hashes laid end to end, as the array every call taking
    ``hashes`` accepts as is: one copy, no per-hash Python work (engines with many keys
    per call pack them once, e.g. :mod:`tutti.sglang`)."""
    if len(data) % HASH_BYTES:
        raise ValueError(f"{len(data)} bytes of packed hashes is not a multiple of {HASH_BYTES}")
    return (_lib.Hash * (len(data) // HASH_BYTES)).from_buffer_copy(data)


def packed_u32(values) -> "ctypes.Array":
    """A buffer of native-endian uint32 values (``array('I')``, a numpy or torch ``uint32``/``int32``
    buffer's bytes) as the array ``block_ids`` accepts as is."""
    data = memoryview(values).cast("B")
    if len(data) % 4:
        raise ValueError(f"{len(data)} bytes of packed uint32 values is not a multiple of 4")
    return (c_uint32 * (len(data) // 4)).from_buffer_copy(data)


def _hash_array(hashes: Sequence[bytes]):
    if isinstance(hashes, ctypes.Array) and hashes._type_ is _lib.Hash:
        return hashes  # packed_hashes()
    arr = (_lib.Hash * max(len(hashes), 1))()
    for i, h in enumerate(hashes):
        b = bytes(h)
        if len(b) != HASH_BYTES:
            raise ValueError(f"hash {i} is {len(b)} bytes; chunk hashes are {HASH_BYTES} bytes")
        ctypes.memmove(arr[i].bytes, b, HASH_BYTES)
    return arr


def _u32_array(values: Sequence[int], what: str):
    if isinstance(values, ctypes.Array) and values._type_ is c_uint32:
        return values  # packed_u32()
    arr = (c_uint32 * max(len(values), 1))()
    for i, v in enumerate(values):
        v = int(v)
        if not 0 <= v < 1 << 32:
            raise ValueError(f"{what}[{i}] = {v} does not fit in 32 bits")
        arr[i] = v
    return arr


def _blocks(hashes: Sequence[bytes], block_ids: Sequence[int]):
    """The C arrays of a load or store of chunk ``hashes[i]`` in engine block ``block_ids[i]``
    (NULL when empty)."""
    arr = _hash_array(hashes)
    ids = _u32_array(block_ids, "block_ids")
    if len(hashes) != len(block_ids):
        raise ValueError(f"{len(hashes)} hashes but {len(block_ids)} block ids")
    return (arr if hashes else None), (ids if block_ids else None)


def chain_hashes(tokens: Sequence[int], tokens_per_block: int, parent: bytes | None = None) -> list[bytes]:
    """Chained 128-bit hashes of every *full* chunk of ``tokens`` (libtutti's scheme, see tutti.h).

    Chunk ``i``'s hash folds in chunk ``i-1``'s, so a hit on chunk ``i`` means
    the whole prefix matched. ``parent`` continues a chain (default: the root).
    """
    L = lib()
    n = len(tokens)
    toks = _u32_array(tokens, "tokens")
    cap = n // tokens_per_block if tokens_per_block > 0 else 0
    out = (_lib.Hash * max(cap, 1))()
    count = c_size_t(0)
    par = _hash_array([parent]) if parent is not None else None
    L.call(
        "tutti_hash_chain",
        toks if n else None,
        n,
        tokens_per_block,
        par,
        out if cap else None,
        cap,
        byref(count),
    )
    return [bytes(out[i].bytes) for i in range(count.value)]


@dataclass
class TableSizes:
    tables: int
    descriptors: int
    sgl_bytes: int
    prp_entry_bytes: int
    prp_page_bytes: int
    prp_lists: int


@dataclass
class RuntimeInfo:
    drives: int
    files: int
    chunks: int
    object_bytes: int
    file_bytes: int
    geometry: Geometry
    formatted_now: bool
    executor: str
    pool_id: bytes


def _struct_dict(s) -> dict:
    return {name: getattr(s, name) for name, _ in s._fields_ if name != "struct_size"}


@dataclass
class Stats:
    """Counters since the runtime opened, and current queue depths."""

    files: int = 0
    files_valid: int = 0
    files_free: int = 0
    files_pinned: int = 0
    files_busy: int = 0
    bytes_loaded: int = 0
    bytes_stored: int = 0
    lookups: int = 0
    lookup_hits: int = 0
    lookup_misses: int = 0
    evictions: int = 0
    jobs: int = 0
    layers: int = 0
    commands: int = 0
    failed_blocks: int = 0
    files_committed: int = 0
    jobs_in_flight: int = 0
    layers_in_flight: int = 0
    stores_open: int = 0
    # ABI 1.1: the host's work on the control path.
    host_calls: int = 0
    host_built: int = 0
    host_pairs: int = 0
    pairs_registered: int = 0
    setup_ns: int = 0
    submit_ns: int = 0
    # ABI 1.2: files out of service because a write into them has an unknown
    # outcome (the drive may still execute it); back only after the pool is reopened.
    quarantined_files: int = 0
    # ABI 1.11, a client of tuttid: reconnects to a daemon that came back (the same pool),
    # attempts (failed ones too), time disconnected (ns, the current outage included), and
    # 1 while disconnected.
    reconnects: int = 0
    reconnect_attempts: int = 0
    disconnected_ns: int = 0
    disconnected: int = 0


@dataclass
class DataPath:
    """How the registered KV memory moves (``Runtime.data_path``).

    ``mode`` is ``"none"`` (nothing registered), ``"direct"`` (the drives DMA into the KV
    memory), ``"p2p"`` (the drives DMA into another device's memory, probed at registration)
    or ``"staged"`` (through pinned host staging slots the executor copies);
    ``p2p_missing`` says, when staged, what direct DMA lacks; ``provider`` names who maps
    device KV memory for the drives.
    """

    mode: str
    memory: str | None
    p2p_missing: str
    provider: str = ""
    staging_slots: int = 0
    staging_slot_bytes: int = 0
    staging_waits: int = 0
    staging_withheld: int = 0
    staged_bytes: int = 0
