"""Pythonic wrappers over libtutti: a runtime, its jobs and store sessions.

A :class:`Runtime` owns a pool on NVMe (or emulated) drives. The engine
registers its paged KV memory once (:meth:`Runtime.register_kv`), then per
request: :meth:`Runtime.lookup` the request's chained chunk hashes (the hit
prefix comes back pinned), :meth:`Runtime.load` the hit chunks into engine
blocks over a range of layers and wait layer by layer, unpin; new blocks go
out through a :class:`Store` session (``begin_store`` → ``submit`` per layer
range → ``commit``). Every handle is a context manager and is released when
closed; closing twice is harmless.
"""

from __future__ import annotations

import ctypes
import os
from ctypes import byref, c_char_p, c_size_t, c_uint8, c_uint64, c_void_p
from dataclasses import dataclass, field
from typing import Sequence

from . import _lib
from ._lib import lib, sized
from ._handle import _Handle, layer_range
from ._values import (  # re-exported: tutti.runtime.Geometry and the rest stay where they were
    DataPath,
    Geometry,
    RuntimeInfo,
    Stats,
    TableSizes,
    _blocks,
    _hash_array,
    _struct_dict,
    chain_hashes,
    packed_hashes,
    packed_u32,
)
from .jobs import DEFAULT_TIMEOUT_S, Job, JobStatus, Store, StoreReport

__all__ = [
    "HOST_EXEC_MODE_DEFAULT", "default_exec_mode", "Geometry", "Runtime", "RuntimeInfo", "Stats", "TableSizes", "Lookup", "chain_hashes", "clock_ns",
    "abi_version", "Job", "JobStatus", "Store", "StoreReport", "DEFAULT_TIMEOUT_S", "packed_hashes", "packed_u32",
]

@dataclass
class Lookup:
    """A lookup result: ``hits`` leading chunks are stored; ``pin`` holds them against eviction."""

    hits: int
    pin: int
    runtime: "Runtime" = field(repr=False, default=None)

    def unpin(self) -> None:
        if self.pin and self.runtime is not None:
            pin, self.pin = self.pin, 0
            self.runtime.unpin(pin)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.unpin()


def _check_exec_mode(mode: str | None) -> None:
    if mode not in _lib.EXEC_MODE:
        names = ", ".join(repr(m) for m in _lib.EXEC_MODE if m is not None)
        raise ValueError(f"exec_mode {mode!r} is not one of {names} or None (the executor's default)")


# The host executor's mode when none is given, with one executor thread (inline runs none): the
# fastest measured for CPU serving (docs/perf/breakeven.md). C callers keep libtutti's default
# (TUTTI_EXEC_MODE_DEFAULT: launch), whose lanes progress between the caller's calls.
HOST_EXEC_MODE_DEFAULT = "inline"


def default_exec_mode(executor: str, host_lane_blocks: int) -> str | None:
    """The mode a runtime gets when none is given: inline for the host executor with one lane
    block, else None (libtutti's default: launch)."""
    return HOST_EXEC_MODE_DEFAULT if executor == "gio" and host_lane_blocks <= 1 else None


def _exec_mode(executor: str, mode: str | None, host_lane_blocks: int) -> str | None:
    _check_exec_mode(mode)
    return mode if mode is not None else default_exec_mode(executor, host_lane_blocks)


class Runtime(_Handle):
    """An open pool on drives (emulated or VFIO) with one I/O executor."""

    _destroy = "tutti_runtime_destroy"

    def __init__(
        self,
        geometry: Geometry,
        *,
        emulated_drives: int = 0,
        emulated_capacity_bytes: int = 64 << 20,
        emulated_lba_size: int = 0,
        emulated_dir: str | None = None,
        vfio: Sequence[str] = (),
        vfio_noiommu: bool = False,
        executor: str = "gio",
        open_mode: str = "open_or_create",
        io_timeout_ms: int = 0,
        host_lane_blocks: int = 0,
        cuda_device: int = 0,
        cuda_sm_count: int = 0,
        cuda_driver: str | None = None,
        staging_slots: int = 0,
        cuda_block_threads: int = 0,
        emulated_read_bytes_per_sec: int = 0,
        emulated_write_bytes_per_sec: int = 0,
        emulated_latency_us: int = 0,
        emulated_read_latency_us: int = 0,
        emulated_write_latency_us: int = 0,
        emulated_mixed_efficiency: float = 0.0,
        emulated_mixed_read_share: float = 0.0,
        exec_mode: str | None = None,
    ):
        """``exec_mode`` (``"launch"``, ``"persistent"`` or ``"inline"``) says how a gio executor
        runs its kernels: launched per issue, one persistent kernel polling the ring (a CUDA
        executor then needs ``cuda_sm_count``), or (host executor only) lanes run on the
        calling threads with no executor thread. None: ``"inline"`` for the host executor with
        one lane block (``host_lane_blocks`` 0 or 1; the fastest measured for CPU serving,
        docs/perf/breakeven.md), else libtutti's default, launch (as for C callers, whose
        ``exec_mode`` 0 keeps meaning launch).

        ``executor="gio_cuda"`` runs the I/O kernels on CUDA device ``cuda_device`` (on
        ``cuda_sm_count`` SMs of a green context; 0: all SMs); on a machine without a CUDA
        driver opening fails with :class:`~tutti.errors.Unsupported`; ``cuda_driver`` loads
        that driver library instead of ``libcuda.so`` and ``cuda_block_threads`` (0: 512) sets
        the kernels' block size. ``staging_slots`` (0: 256) bounds the staged data path of KV
        memory the drives cannot reach.

        Emulated drives can stand in for slower ones (all 0: no cost):
        ``emulated_read_bytes_per_sec`` / ``emulated_write_bytes_per_sec`` pace reads and
        writes on separate channels, ``emulated_latency_us`` delays every command and
        ``emulated_read_latency_us`` / ``emulated_write_latency_us`` add to it per direction;
        with ``emulated_mixed_efficiency`` in (0, 1] a drive with reads and writes in flight
        keeps that fraction of its faster direction's bandwidth (0.4: a 60% collapse), of
        which reads get ``emulated_mixed_read_share`` (0: 0.5) and writes the rest. Bad values
        raise :class:`~tutti.errors.InvalidArgument` naming the field."""
        if bool(emulated_drives) == bool(vfio):
            raise ValueError("give either emulated_drives (a count) or vfio (PCI addresses), not both or neither")
        if executor not in _lib.EXECUTOR or executor == "control":
            names = ", ".join(e for e in _lib.EXECUTOR if e != "control")
            raise ValueError(f"executor {executor!r} is not one of {names} (\"control\" is for Runtime.connect)")
        exec_mode = _exec_mode(executor, exec_mode, host_lane_blocks)
        if open_mode not in _lib.OPEN_MODE:
            raise ValueError(f"open_mode {open_mode!r} is not one of {', '.join(_lib.OPEN_MODE)}")
        self._keep = []  # buffers the config points into, alive across the call
        bdfs = None
        if vfio:
            bdfs = (c_char_p * len(vfio))(*[b.encode() for b in vfio])
            self._keep.append(bdfs)
        cfg = sized(
            _lib.RuntimeConfig,
            drives=_lib.DRIVES_VFIO if vfio else _lib.DRIVES_EMULATED,
            emulated_count=emulated_drives,
            emulated_lba_size=emulated_lba_size,
            emulated_capacity_bytes=emulated_capacity_bytes if emulated_drives else 0,
            emulated_dir=emulated_dir.encode() if emulated_dir else None,
            vfio_bdfs=bdfs,
            vfio_count=len(vfio),
            vfio_noiommu=int(vfio_noiommu),
            executor=_lib.EXECUTOR[executor],
            open_mode=_lib.OPEN_MODE[open_mode],
            geometry=geometry.to_c(),
            io_timeout_ms=io_timeout_ms,
            host_lane_blocks=host_lane_blocks,
            cuda_device=cuda_device,
            cuda_sm_count=cuda_sm_count,
            cuda_driver=cuda_driver.encode() if cuda_driver is not None else None,
            staging_slots=staging_slots,
            cuda_block_threads=cuda_block_threads,
            emulated_read_bytes_per_sec=emulated_read_bytes_per_sec,
            emulated_write_bytes_per_sec=emulated_write_bytes_per_sec,
            emulated_latency_us=emulated_latency_us,
            emulated_read_latency_us=emulated_read_latency_us,
            emulated_write_latency_us=emulated_write_latency_us,
            emulated_mixed_efficiency=emulated_mixed_efficiency,
            emulated_mixed_read_share=emulated_mixed_read_share,
            exec_mode=_lib.EXEC_MODE[exec_mode],
        )
        out = c_void_p()
        lib().call("tutti_runtime_open", byref(cfg), byref(out))
        super().__init__(out)
        self._keep.clear()
        self.geometry = geometry
        self._registered: object | None = None

    @classmethod
    def connect(
        cls,
        socket: str,
        geometry: Geometry,
        *,
        executor: str = "gio",
        client_name: str | None = None,
        control_timeout_ms: int = 0,
        io_timeout_ms: int = 0,
        host_lane_blocks: int = 0,
        exec_mode: str | None = None,
        cuda_device: int = 0,
        cuda_sm_count: int = 0,
        cuda_driver: str | None = None,
        cuda_block_threads: int = 0,
        staging_slots: int = 0,
        reconnect: str = "auto",
        reconnect_backoff_ms: int = 0,
        reconnect_deadline_ms: int = 0,
    ) -> "Runtime":
        """A runtime that is a client of the tuttid listening at ``socket`` (``tutti serve``).

        The daemon owns the drives and the pool; this process leases its own queue pairs and
        moves its own bytes with its own executor: ``"gio"`` (host lanes), ``"gio_cuda"`` (its
        own I/O kernels on CUDA device ``cuda_device``, with its own staging slots for CUDA KV
        memory; the other keywords as for an in-process :class:`Runtime`) or ``"direct"``.
        Every method works as on a runtime opened in-process. ``executor="control"`` leases
        nothing and moves no bytes (an engine's scheduler process): lookups, ``contains``,
        pins and stats work; ``register_kv`` raises :class:`~tutti.errors.Unsupported`.
        ``exec_mode`` None picks as for an in-process :class:`Runtime` (inline for ``"gio"``
        with one lane block).

        When the daemon goes away and comes back on the same socket and media, the runtime
        reconnects by itself on its next call (``reconnect="auto"``; ``"off"`` keeps it
        disconnected): its KV memory registered again, its queue pairs leased again. Until then
        calls raise :class:`~tutti.errors.IoError` at once; attempts are spaced by a backoff
        doubling from 10 ms up to ``reconnect_backoff_ms`` (0 = 1000), and stop
        ``reconnect_deadline_ms`` after the outage was seen (0 = 600000). A daemon back with
        another geometry or pool is refused. :meth:`stats` counts ``reconnects``.
        """
        if executor not in _lib.EXECUTOR:
            raise ValueError(f"executor {executor!r} is not one of {', '.join(_lib.EXECUTOR)}")
        if reconnect not in _lib.RECONNECT:
            raise ValueError(f"reconnect {reconnect!r} is not one of {', '.join(_lib.RECONNECT)}")
        exec_mode = _exec_mode(executor, exec_mode, host_lane_blocks)
        cfg = sized(
            _lib.ClientConfig,
            executor=_lib.EXECUTOR[executor],
            socket=socket.encode(),
            client_name=client_name.encode() if client_name else None,
            control_timeout_ms=control_timeout_ms,
            io_timeout_ms=io_timeout_ms,
            host_lane_blocks=host_lane_blocks,
            geometry=geometry.to_c(),
            exec_mode=_lib.EXEC_MODE[exec_mode],
            cuda_device=cuda_device,
            cuda_sm_count=cuda_sm_count,
            cuda_block_threads=cuda_block_threads,
            cuda_driver=cuda_driver.encode() if cuda_driver is not None else None,
            staging_slots=staging_slots,
            reconnect=_lib.RECONNECT[reconnect],
            reconnect_backoff_ms=reconnect_backoff_ms,
            reconnect_deadline_ms=reconnect_deadline_ms,
        )
        out = c_void_p()
        lib().call("tutti_runtime_connect", byref(cfg), byref(out))
        rt = cls.__new__(cls)
        _Handle.__init__(rt, out)
        rt._keep = []
        rt.geometry = geometry
        rt._registered = None
        return rt

    # --- pool -----------------------------------------------------------------------------

    def info(self) -> RuntimeInfo:
        out = sized(_lib.RuntimeInfo)
        lib().call("tutti_runtime_info", self._p(), byref(out))
        names = {v: k for k, v in _lib.EXECUTOR.items()}
        return RuntimeInfo(
            drives=out.drives,
            files=out.files,
            chunks=out.chunks,
            object_bytes=out.object_bytes,
            file_bytes=out.file_bytes,
            geometry=Geometry.from_c(out.geometry),
            formatted_now=bool(out.formatted_now),
            executor=names.get(out.executor, str(out.executor)),
            pool_id=bytes(out.pool_id),
        )

    def data_path(self) -> DataPath:
        """Direct or staged, for the current registration (``mode="none"`` without one)."""
        out = sized(_lib.DataPath)
        lib().call("tutti_runtime_data_path", self._p(), byref(out))
        memories = {v: k for k, v in _lib.MEMORY.items()}
        return DataPath(
            mode=_lib.DATA_PATH.get(out.mode, str(out.mode)),
            memory=memories.get(out.memory) if out.memory else None,
            p2p_missing=out.p2p_missing.decode(errors="replace"),
            provider=out.p2p_provider.decode(errors="replace"),
            staging_slots=out.staging_slots,
            staging_slot_bytes=out.staging_slot_bytes,
            staging_waits=out.staging_waits,
            staging_withheld=out.staging_withheld,
            staged_bytes=out.staged_bytes,
        )

    def stats(self) -> Stats:
        out = sized(_lib.Stats)
        lib().call("tutti_runtime_stats", self._p(), byref(out))
        return Stats(**_struct_dict(out))

    # --- KV memory ------------------------------------------------------------------------

    def register_kv(
        self,
        kind: str,
        num_blocks: int,
        *,
        model: str,
        k_bases: Sequence[int] = (),
        v_bases: Sequence[int] = (),
        base: int = 0,
        block_stride: int = 0,
        memory: str = "host",
        tenant_salt: bytes = b"",
        keepalive: object = None,
    ) -> TableSizes:
        """Registers the engine's KV memory (see tutti.h ``tutti_kv_layout_t`` for each kind).

        ``keepalive`` is held by the runtime until the memory is unregistered:
        pass the tensors whose addresses are registered. ``memory`` is ``"host"`` (the
        drives DMA into it), ``"cuda"`` (device memory of the runtime's GPU; staged, needs
        ``executor="gio_cuda"``) or ``"host_staged"`` (host memory kept from the drives:
        the staged path without a GPU). :meth:`data_path` says which path is in force.
        """
        if kind not in _lib.LAYOUT:
            raise ValueError(f"layout kind {kind!r} is not one of {', '.join(_lib.LAYOUT)}")
        if memory not in _lib.MEMORY:
            raise ValueError(f"memory {memory!r} is not one of {', '.join(_lib.MEMORY)}")
        k = (c_uint64 * len(k_bases))(*k_bases) if k_bases else None
        v = (c_uint64 * len(v_bases))(*v_bases) if v_bases else None
        salt = (c_uint8 * len(tenant_salt)).from_buffer_copy(tenant_salt) if tenant_salt else None
        layout = sized(
            _lib.KvLayout,
            kind=_lib.LAYOUT[kind],
            num_blocks=num_blocks,
            num_layers=len(k_bases),
            k_bases=k,
            v_bases=v,
            base=base,
            block_stride=block_stride,
            memory=_lib.MEMORY[memory],
            model=model.encode(),
            tenant_salt=salt,
            tenant_salt_len=len(tenant_salt),
        )
        sizes = sized(_lib.TableSizes)
        lib().call("tutti_kv_register", self._p(), byref(layout), byref(sizes))
        self._registered = keepalive
        return TableSizes(**_struct_dict(sizes))

    def unregister_kv(self) -> None:
        lib().call("tutti_kv_unregister", self._p())
        self._registered = None

    # --- index ----------------------------------------------------------------------------

    def lookup(self, hashes: Sequence[bytes], pin: bool = True) -> Lookup:
        """The number of leading ``hashes`` stored; with ``pin`` they are held until unpinned."""
        arr = _hash_array(hashes)
        hits = c_size_t(0)
        pin_id = c_uint64(0)
        lib().call(
            "tutti_kv_lookup",
            self._p(),
            arr if hashes else None,
            len(hashes),
            _lib.LOOKUP_PIN if pin else 0,
            byref(hits),
            byref(pin_id) if pin else None,
        )
        return Lookup(hits.value, pin_id.value, self)

    def unpin(self, pin: int) -> None:
        lib().call("tutti_kv_unpin", self._p(), pin)

    def contains_identity(
        self, hashes: Sequence[bytes], *, model: str, kind: str, tenant_salt: bytes = b""
    ) -> int:
        """The number of leading ``hashes`` stored under the cache identity (``model``,
        ``tenant_salt``, layout ``kind``, this runtime's geometry) given here rather than
        the registered one: no registration needed, nothing pinned (ABI 1.3)."""
        if kind not in _lib.LAYOUT:
            raise ValueError(f"layout kind {kind!r} is not one of {', '.join(_lib.LAYOUT)}")
        arr = _hash_array(hashes)
        salt = (c_uint8 * len(tenant_salt)).from_buffer_copy(tenant_salt) if tenant_salt else None
        hits = c_size_t(0)
        lib().call(
            "tutti_kv_contains_identity",
            self._p(),
            model.encode(),
            salt,
            len(tenant_salt),
            _lib.LAYOUT[kind],
            arr if hashes else None,
            len(hashes),
            byref(hits),
        )
        return hits.value

    # --- I/O ------------------------------------------------------------------------------

    def _layers(self, layers: range | None) -> range:
        return layer_range(layers, self.geometry.layers)

    def load(self, hashes: Sequence[bytes], block_ids: Sequence[int], layers: range | None = None) -> Job:
        """Loads chunk ``hashes[i]`` into engine block ``block_ids[i]`` for ``layers`` (default all)."""
        layers = self._layers(layers)
        arr, ids = _blocks(hashes, block_ids)
        out = c_void_p()
        lib().call("tutti_load_submit", self._p(), arr, ids, len(hashes), layers.start, len(layers), byref(out))
        return Job(out, "load", len(hashes), layers, self)

    def begin_store(self, hashes: Sequence[bytes], block_ids: Sequence[int]) -> Store:
        """Opens a store session for chunk ``hashes[i]`` held in engine block ``block_ids[i]``."""
        arr, ids = _blocks(hashes, block_ids)
        out = c_void_p()
        lib().call("tutti_store_begin", self._p(), arr, ids, len(hashes), byref(out))
        return Store(out, self, len(hashes))

    # --- fault injection (emulated drives only) -------------------------------------------

    def _emulated_fault(self, call: str, drive: int, direction: str, value: int) -> None:
        L = lib()
        if not L.has(call):
            raise NotImplementedError(
                f"{L.path} has no {call}: fault injection is built only with the fault-injection "
                "cargo feature (cargo build -p tutti-capi --features fault-injection)"
            )
        d = _lib.DIR_LOAD if direction == "load" else _lib.DIR_STORE
        L.call(call, self._p(), drive, d, value)

    def emulated_fail_next(self, drive: int, direction: str, count: int = 1) -> None:
        """Makes the next ``count`` reads or writes on emulated drive ``drive`` fail (tests)."""
        self._emulated_fault("tutti_emulated_fail_next", drive, direction, count)

    def emulated_delay_next(self, drive: int, direction: str, delay_ms: int) -> None:
        """Makes the next read or write on emulated drive ``drive`` execute ``delay_ms`` later (tests).

        Past the runtime's ``io_timeout_ms`` the host gives up first: the block fails with an
        unknown outcome (``JobStatus.unknown_blocks``), and the drive moves the data anyway.
        """
        self._emulated_fault("tutti_emulated_delay_next", drive, direction, delay_ms)

    # --- the scheduler in the job path (ABI 1.6) -------------------------------------------

    def configure_scheduler(
        self,
        mode: str = "arbitrate",
        slack_table: str | None = None,
        backlog_bytes: int = 0,
        backlog_full: str = "backpressure",
        read_bytes_per_sec: int = 0,
        write_bytes_per_sec: int = 0,
        latency_ns: int = 0,
        iocb_bytes: int = 0,
        write_guard: float = 0.0,
        idle_ms: int = 0,
    ) -> None:
        """Sets how every load and store layer is scheduled (only while no job is unfinished).

        ``mode``: ``pass`` (no arbitration), ``arbitrate`` (the default: never reads and writes
        on one drive at once, reads first), ``slack`` (and writes only into the slack of the
        compute windows announced with :meth:`sched_layer_start` / :meth:`sched_decode_start`,
        from ``slack_table``), ``slack_online`` (the table corrected from observed windows).
        ``backlog_full``: ``backpressure`` (a store over ``backlog_bytes`` raises ``BusyError``)
        or ``drop`` (it is not stored; its blocks are later misses). 0 means the default.
        """
        if mode not in _lib.SCHED_MODE:
            raise ValueError(f"mode {mode!r} is not one of {sorted(_lib.SCHED_MODE)}")
        if backlog_full not in _lib.BACKLOG_FULL:
            raise ValueError(f"backlog_full {backlog_full!r} is not one of {sorted(_lib.BACKLOG_FULL)}")
        cfg = _lib.sized(
            _lib.SchedConfig,
            mode=_lib.SCHED_MODE[mode],
            backlog_full=_lib.BACKLOG_FULL[backlog_full],
            idle_ms=idle_ms,
            backlog_bytes=backlog_bytes,
            read_bytes_per_sec=read_bytes_per_sec,
            write_bytes_per_sec=write_bytes_per_sec,
            latency_ns=latency_ns,
            iocb_bytes=iocb_bytes,
            write_guard=write_guard,
            slack_table=os.fsencode(slack_table) if slack_table is not None else None,
        )
        lib().call("tutti_sched_configure", self._p(), ctypes.byref(cfg))

    def sched_layer_start(self, input_tokens: int, prefix_tokens: int, layer: int) -> None:
        """The engine starts computing ``layer`` of a prefill (a window for writes)."""
        lib().call("tutti_sched_layer_start", self._p(), input_tokens, prefix_tokens, layer)

    def sched_layer_end(self, layer: int) -> None:
        lib().call("tutti_sched_layer_end", self._p(), layer)

    def sched_decode_start(self, context_tokens: int) -> None:
        """A decode step starts: deferred writes fill its slack."""
        lib().call("tutti_sched_decode_start", self._p(), context_tokens)

    def sched_decode_end(self) -> None:
        lib().call("tutti_sched_decode_end", self._p())

    def sched_stats(self) -> dict:
        """The scheduler's state and counters; ``policy_off`` says why writes are not held for
        slack (``None`` when they are; ``"no_timings"`` when the engine gives none)."""
        out = _lib.sized(_lib.SchedStats)
        lib().call("tutti_sched_stats", self._p(), ctypes.byref(out))
        d = {name: getattr(out, name) for name, _ in _lib.SchedStats._fields_ if name != "struct_size"}
        d["mode"] = {v: k for k, v in _lib.SCHED_MODE.items()}.get(out.mode, out.mode)
        d["slack_active"] = bool(out.slack_active)
        d["policy_off"] = _lib.SCHED_POLICY_OFF.get(out.policy_off, out.policy_off)
        return d

    # --- profiler timing hooks ------------------------------------------------------------

    def profile_request_begin(self, request_id: int, input_tokens: int, prefix_tokens: int) -> None:
        lib().call("tutti_profile_request_begin", self._p(), request_id, input_tokens, prefix_tokens)

    def profile_layer_start(self, request_id: int, layer: int) -> None:
        lib().call("tutti_profile_layer_start", self._p(), request_id, layer)

    def profile_layer_end(self, request_id: int, layer: int) -> None:
        lib().call("tutti_profile_layer_end", self._p(), request_id, layer)

    def profile_layer(self, request_id: int, layer: int, start_ns: int, end_ns: int) -> None:
        lib().call("tutti_profile_layer", self._p(), request_id, layer, start_ns, end_ns)

    def profile_decode_step(self, request_id: int, context_tokens: int, start_ns: int, end_ns: int) -> None:
        lib().call("tutti_profile_decode_step", self._p(), request_id, context_tokens, start_ns, end_ns)

    def save_slack_table(
        self, path: str, gpu: str, io_sms: int, iocbs_per_sm_per_us: float, model: str | None = None
    ) -> None:
        lib().call(
            "tutti_profile_save_slack_table",
            self._p(),
            path.encode(),
            model.encode() if model else None,
            gpu.encode(),
            io_sms,
            iocbs_per_sm_per_us,
        )


def clock_ns() -> int:
    """libtutti's clock (CLOCK_MONOTONIC), the one the profile hooks use."""
    return lib().tutti_clock_ns()


def abi_version() -> int:
    return lib().tutti_abi_version()
