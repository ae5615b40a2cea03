"""Loading libtutti.so and declaring its C ABI for ctypes.

The declarations mirror ``capi/include/tutti.h`` (ABI version 1.9); the test
suite compiles a C program against that header and checks every struct's
size and field offsets against the ones here, so the two cannot drift apart
unnoticed.

Where the library is looked for, first match wins:

1. ``$TUTTI_LIB`` — a path to the shared library;
2. ``libtutti.so`` next to this package (where ``pip install`` puts the one it builds);
3. ``$CARGO_TARGET_DIR/{release,debug}`` and ``<repo>/target/{release,debug}``
   for a source checkout, where ``<repo>`` is found by walking up from here
   (in each target dir the more recently built of the two first);
4. the dynamic loader's own search (``LD_LIBRARY_PATH``, ldconfig).
"""

from __future__ import annotations

import ctypes
import os
import threading
from ctypes import (
    POINTER,
    Structure,
    c_char,
    c_char_p,
    c_double,
    c_int32,
    c_size_t,
    c_uint8,
    c_uint32,
    c_uint64,
    c_void_p,
)
from pathlib import Path

from .errors import OK, IN_PROGRESS, AbiMismatch, LibraryNotFound, exception_class

ABI_VERSION = 1
# The structs here are those of ABI 1.11 (1.1: the host-work counters; 1.2:
# quarantined files and unknown-outcome blocks; 1.3: clients of tuttid; 1.4:
# the staged data path, the CUDA executor; 1.5: the emulated cost model; 1.6:
# the scheduler in the job path; 1.7: arbitration across tuttid's clients;
# 1.8: every executor for tuttid clients, control-only clients, the executor
# mode; 1.9: the names of one rule, the old ones kept as aliases; 1.10: the P2P data path;
# 1.11: reconnecting clients of tuttid); a library of an older minor would refuse their sizes or lack the calls.
ABI_MINOR = 11
LIB_NAME = "libtutti.so"

# Constants of tutti.h.
DTYPE = {"f32": 1, "f16": 2, "bf16": 3, "fp8_e4m3": 4, "fp8_e5m2": 5, "i8": 6}
DTYPE_BYTES = {"f32": 4, "f16": 2, "bf16": 2, "fp8_e4m3": 1, "fp8_e5m2": 1, "i8": 1}
DRIVES_EMULATED = 1
DRIVES_VFIO = 2
EXECUTOR = {"gio": 1, "direct": 2, "gio_cuda": 3, "control": 4}
# exec_mode=...: how a gio executor runs its kernels (ABI 1.8); None = the executor's default.
EXEC_MODE = {None: 0, "launch": 1, "persistent": 2, "inline": 3}
OPEN_MODE = {"create": 1, "open": 2, "open_or_create": 3}
LAYOUT = {"vllm_per_layer": 1, "contiguous": 2, "strided": 3}
MEMORY_HOST = 1
MEMORY_CUDA = 2
MEMORY_HOST_STAGED = 3
MEMORY_DEVICE_P2P = 4
# register_kv(memory=...): host memory the drives map (direct), CUDA device
# memory (staged; needs executor "gio_cuda"), host memory kept from the drives (staged),
# another device's memory this process mapped (P2P when the probe passes, ABI 1.10).
MEMORY = {
    "host": MEMORY_HOST,
    "cuda": MEMORY_CUDA,
    "host_staged": MEMORY_HOST_STAGED,
    "device_p2p": MEMORY_DEVICE_P2P,
}
DATA_PATH = {0: "none", 1: "direct", 2: "staged", 3: "p2p"}
DATA_PATH_REASON_BYTES = 256
DATA_PATH_PROVIDER_BYTES = 64
DIR_LOAD = 1
DIR_STORE = 2
LOOKUP_PIN = 1


class Hash(Structure):
    _fields_ = [("bytes", c_uint8 * 16)]


class Geometry(Structure):
    _fields_ = [
        ("layers", c_uint32),
        ("kv_heads", c_uint32),
        ("head_dim", c_uint32),
        ("tokens_per_block", c_uint32),
        ("dtype", c_uint32),
    ]


class RuntimeConfig(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("drives", c_uint32),
        ("emulated_count", c_uint32),
        ("emulated_lba_size", c_uint32),
        ("emulated_capacity_bytes", c_uint64),
        ("emulated_dir", c_char_p),
        ("vfio_bdfs", POINTER(c_char_p)),
        ("vfio_count", c_uint32),
        ("vfio_noiommu", c_uint32),
        ("executor", c_uint32),
        ("open_mode", c_uint32),
        ("geometry", Geometry),
        ("io_timeout_ms", c_uint32),
        ("host_lane_blocks", c_uint32),
        # ABI 1.4 (rsvd0 was the 1.3 struct's tail padding)
        ("rsvd0", c_uint32),
        ("cuda_device", c_uint32),
        ("cuda_sm_count", c_uint32),
        ("cuda_driver", c_char_p),
        ("staging_slots", c_uint32),
        ("cuda_block_threads", c_uint32),
        # ABI 1.5: the emulated drives' bandwidth and latency model
        ("emulated_read_bytes_per_sec", c_uint64),
        ("emulated_write_bytes_per_sec", c_uint64),
        ("emulated_latency_us", c_uint32),
        ("emulated_read_latency_us", c_uint32),
        ("emulated_write_latency_us", c_uint32),
        ("rsvd1", c_uint32),
        ("emulated_mixed_efficiency", c_double),
        ("emulated_mixed_read_share", c_double),
        # ABI 1.8: the executor mode
        ("exec_mode", c_uint32),
        ("rsvd2", c_uint32),
    ]


class DataPath(Structure):
    """tutti_data_path_t (ABI 1.10): direct, p2p or staged, what direct DMA lacks, the P2P provider."""

    _fields_ = [
        ("struct_size", c_uint32),
        ("mode", c_uint32),
        ("memory", c_uint32),
        ("staging_slots", c_uint32),
        ("staging_slot_bytes", c_uint64),
        ("staging_waits", c_uint64),
        ("staging_withheld", c_uint64),
        ("staged_bytes", c_uint64),
        ("p2p_missing", c_char * DATA_PATH_REASON_BYTES),
        ("p2p_provider", c_char * DATA_PATH_PROVIDER_BYTES),
    ]


class ClientConfig(Structure):
    """tutti_client_config_t (ABI 1.3, 1.8, 1.11): how to connect to tuttid."""

    _fields_ = [
        ("struct_size", c_uint32),
        ("executor", c_uint32),
        ("socket", c_char_p),
        ("client_name", c_char_p),
        ("control_timeout_ms", c_uint32),
        ("io_timeout_ms", c_uint32),
        ("host_lane_blocks", c_uint32),
        ("geometry", Geometry),
        # ABI 1.8: the executor's mode, the CUDA executor and staging
        ("exec_mode", c_uint32),
        ("cuda_device", c_uint32),
        ("cuda_sm_count", c_uint32),
        ("cuda_block_threads", c_uint32),
        ("cuda_driver", c_char_p),
        ("staging_slots", c_uint32),
        ("rsvd0", c_uint32),
        # ABI 1.11: reconnecting after the daemon went away
        ("reconnect", c_uint32),
        ("reconnect_backoff_ms", c_uint32),
        ("reconnect_deadline_ms", c_uint32),
        ("rsvd1", c_uint32),
    ]


# tutti_client_config_t.reconnect (ABI 1.11)
RECONNECT = {"auto": 0, "off": 1}


class KvLayout(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("kind", c_uint32),
        ("num_blocks", c_uint32),
        ("num_layers", c_uint32),
        ("k_bases", POINTER(c_uint64)),
        ("v_bases", POINTER(c_uint64)),
        ("base", c_uint64),
        ("block_stride", c_uint64),
        ("memory", c_uint32),
        ("model", c_char_p),
        ("tenant_salt", POINTER(c_uint8)),
        ("tenant_salt_len", c_size_t),
    ]


class TableSizes(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("tables", c_uint32),
        ("descriptors", c_uint64),
        ("sgl_bytes", c_uint64),
        ("prp_entry_bytes", c_uint64),
        ("prp_page_bytes", c_uint64),
        ("prp_lists", c_uint64),
    ]


class RuntimeInfo(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("drives", c_uint32),
        ("files", c_uint32),
        ("chunks", c_uint32),
        ("object_bytes", c_uint64),
        ("file_bytes", c_uint64),
        ("geometry", Geometry),
        ("formatted_now", c_uint32),
        ("executor", c_uint32),
        ("pool_id", c_uint8 * 16),
    ]


class JobStatus(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("direction", c_uint32),
        ("done", c_uint32),
        ("cancelled", c_uint32),
        ("first_layer", c_uint32),
        ("num_layers", c_uint32),
        ("layers_done", c_uint32),
        ("blocks", c_uint32),
        ("failed", c_uint32),
        ("failed_bitmap_words", c_uint32),
        ("failed_bitmap", POINTER(c_uint64)),
        ("commands", c_uint64),
        ("bytes", c_uint64),
        # ABI 1.1
        ("host_calls", c_uint64),
        ("host_built", c_uint64),
        ("host_pairs", c_uint64),
        ("setup_ns", c_uint64),
        ("submit_ns", c_uint64),
        ("pairs_registered", c_uint32),
        ("layer_submit_ns_len", c_uint32),
        ("layer_submit_ns", POINTER(c_uint64)),
        # ABI 1.2
        ("unknown", c_uint32),
        ("unknown_bitmap_words", c_uint32),
        ("unknown_bitmap", POINTER(c_uint64)),
    ]


class StoreReport(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("stored", c_uint32),
        ("present", c_uint32),
        ("failed", c_uint32),
        ("failed_bitmap", POINTER(c_uint64)),
        ("failed_bitmap_words", c_uint32),
    ]


class Stats(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("files", c_uint32),
        ("files_valid", c_uint32),
        ("files_free", c_uint32),
        ("files_pinned", c_uint32),
        ("files_busy", c_uint32),
        ("bytes_loaded", c_uint64),
        ("bytes_stored", c_uint64),
        ("lookups", c_uint64),
        ("lookup_hits", c_uint64),
        ("lookup_misses", c_uint64),
        ("evictions", c_uint64),
        ("jobs", c_uint64),
        ("layers", c_uint64),
        ("commands", c_uint64),
        ("failed_blocks", c_uint64),
        ("files_committed", c_uint64),
        ("jobs_in_flight", c_uint64),
        ("layers_in_flight", c_uint64),
        ("stores_open", c_uint64),
        # ABI 1.1
        ("host_calls", c_uint64),
        ("host_built", c_uint64),
        ("host_pairs", c_uint64),
        ("pairs_registered", c_uint64),
        ("setup_ns", c_uint64),
        ("submit_ns", c_uint64),
        # ABI 1.2
        ("quarantined_files", c_uint64),
        # ABI 1.11: a client of tuttid reconnecting
        ("reconnects", c_uint64),
        ("reconnect_attempts", c_uint64),
        ("disconnected_ns", c_uint64),
        ("disconnected", c_uint64),
    ]


# ABI 1.6: the scheduler in the job path.
SCHED_MODE = {"pass": 1, "arbitrate": 2, "slack": 3, "slack_online": 4}
BACKLOG_FULL = {"backpressure": 1, "drop": 2}
# tutti_sched_stats_t.policy_off
SCHED_POLICY_OFF = {0: None, 1: "mode", 2: "no_timings", 3: "idle"}


class SchedConfig(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("mode", c_uint32),
        ("backlog_full", c_uint32),
        ("idle_ms", c_uint32),
        ("backlog_bytes", c_uint64),
        ("read_bytes_per_sec", c_uint64),
        ("write_bytes_per_sec", c_uint64),
        ("latency_ns", c_uint64),
        ("iocb_bytes", c_uint64),
        ("write_guard", c_double),
        ("slack_table", c_char_p),
    ]


class SchedStats(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("mode", c_uint32),
        ("slack_active", c_uint32),
        ("policy_off", c_uint32),
        ("reads_issued", c_uint64),
        ("writes_issued", c_uint64),
        ("read_bytes", c_uint64),
        ("write_bytes", c_uint64),
        ("read_waits", c_uint64),
        ("write_waits_for_reads", c_uint64),
        ("write_waits_for_slack", c_uint64),
        ("writes_in_decode", c_uint64),
        ("writes_urgent_or_idle", c_uint64),
        ("mixed_issues", c_uint64),
        ("backlog_bytes", c_uint64),
        ("backlog_peak_bytes", c_uint64),
        ("backlog_capacity", c_uint64),
        ("stores_refused", c_uint64),
        ("stores_dropped", c_uint64),
        ("bytes_dropped", c_uint64),
        ("prefill_windows", c_uint64),
        ("decode_windows", c_uint64),
        # ABI 1.7: arbitration across the clients of one tuttid.
        ("xproc_active", c_uint64),
        ("xproc_waits", c_uint64),
        ("xproc_stale_words", c_uint64),
        ("xproc_invalid_words", c_uint64),
    ]


# Every size-prefixed struct, by its C name (the ABI layout test walks this).
SIZED_STRUCTS = {
    "tutti_runtime_config_t": RuntimeConfig,
    "tutti_client_config_t": ClientConfig,
    "tutti_kv_layout_t": KvLayout,
    "tutti_table_sizes_t": TableSizes,
    "tutti_runtime_info_t": RuntimeInfo,
    "tutti_job_status_t": JobStatus,
    "tutti_store_report_t": StoreReport,
    "tutti_stats_t": Stats,
    "tutti_data_path_t": DataPath,
    "tutti_sched_config_t": SchedConfig,
    "tutti_sched_stats_t": SchedStats,
}
PLAIN_STRUCTS = {"tutti_hash_t": Hash, "tutti_geometry_t": Geometry}


def sized(cls: type[Structure], **fields) -> Structure:
    """A size-prefixed struct with ``struct_size`` filled in."""
    return cls(struct_size=ctypes.sizeof(cls), **fields)


_rt = c_void_p  # tutti_runtime_t *
_job = c_void_p  # tutti_job_t *
_store = c_void_p  # tutti_store_t *
_i32 = c_int32

# name: (restype, argtypes); status-returning calls have restype int32.
_PROTOTYPES = {
    "tutti_abi_version": (c_uint32, []),
    "tutti_abi_minor": (c_uint32, []),
    "tutti_status_name": (c_char_p, [c_int32]),
    "tutti_last_error": (c_char_p, []),
    "tutti_last_error_copy": (_i32, [POINTER(c_char), c_size_t, POINTER(c_size_t)]),
    "tutti_clock_ns": (c_uint64, []),
    "tutti_runtime_open": (_i32, [POINTER(RuntimeConfig), POINTER(_rt)]),
    "tutti_runtime_connect": (_i32, [POINTER(ClientConfig), POINTER(_rt)]),
    "tutti_runtime_destroy": (_i32, [_rt]),
    "tutti_runtime_info": (_i32, [_rt, POINTER(RuntimeInfo)]),
    "tutti_runtime_data_path": (_i32, [_rt, POINTER(DataPath)]),
    "tutti_runtime_stats": (_i32, [_rt, POINTER(Stats)]),
    "tutti_kv_register": (_i32, [_rt, POINTER(KvLayout), POINTER(TableSizes)]),
    "tutti_kv_unregister": (_i32, [_rt]),
    "tutti_hash_chain": (
        _i32,
        [POINTER(c_uint32), c_size_t, c_uint32, POINTER(Hash), POINTER(Hash), c_size_t, POINTER(c_size_t)],
    ),
    "tutti_kv_lookup": (
        _i32,
        [_rt, POINTER(Hash), c_size_t, c_uint32, POINTER(c_size_t), POINTER(c_uint64)],
    ),
    "tutti_kv_unpin": (_i32, [_rt, c_uint64]),
    "tutti_kv_contains_identity": (
        _i32,
        [_rt, c_char_p, POINTER(c_uint8), c_size_t, c_uint32, POINTER(Hash), c_size_t, POINTER(c_size_t)],
    ),
    "tutti_load_submit": (
        _i32,
        [_rt, POINTER(Hash), POINTER(c_uint32), c_size_t, c_uint32, c_uint32, POINTER(_job)],
    ),
    "tutti_store_begin": (_i32, [_rt, POINTER(Hash), POINTER(c_uint32), c_size_t, POINTER(_store)]),
    "tutti_store_submit": (_i32, [_store, c_uint32, c_uint32, POINTER(_job)]),
    "tutti_store_commit": (_i32, [_store, POINTER(StoreReport)]),
    "tutti_store_destroy": (_i32, [_store]),
    "tutti_job_poll": (_i32, [_job, POINTER(JobStatus)]),
    "tutti_job_wait": (_i32, [_job, c_uint64, POINTER(JobStatus)]),
    "tutti_job_layer_done": (_i32, [_job, c_uint32]),
    "tutti_job_wait_layer": (_i32, [_job, c_uint32, c_uint64, POINTER(JobStatus)]),
    "tutti_job_cancel": (_i32, [_job]),
    "tutti_job_error": (_i32, [_job, POINTER(c_char), c_size_t, POINTER(c_size_t)]),
    "tutti_job_destroy": (_i32, [_job]),
    "tutti_profile_request_begin": (_i32, [_rt, c_uint64, c_uint32, c_uint32]),
    "tutti_profile_layer_start": (_i32, [_rt, c_uint64, c_uint32]),
    "tutti_profile_layer_end": (_i32, [_rt, c_uint64, c_uint32]),
    "tutti_profile_layer": (_i32, [_rt, c_uint64, c_uint32, c_uint64, c_uint64]),
    "tutti_profile_decode_step": (_i32, [_rt, c_uint64, c_uint32, c_uint64, c_uint64]),
    "tutti_sched_configure": (_i32, [_rt, POINTER(SchedConfig)]),
    "tutti_sched_layer_start": (_i32, [_rt, c_uint32, c_uint32, c_uint32]),
    "tutti_sched_layer_end": (_i32, [_rt, c_uint32]),
    "tutti_sched_decode_start": (_i32, [_rt, c_uint32]),
    "tutti_sched_decode_end": (_i32, [_rt]),
    "tutti_sched_stats": (_i32, [_rt, POINTER(SchedStats)]),
    "tutti_profile_save_slack_table": (
        _i32,
        [_rt, c_char_p, c_char_p, c_char_p, c_uint32, c_double],
    ),
}

# The old names of ABI 1.0 to 1.8 (exported aliases of the new ones, same code): declared too,
# for callers of ``lib()`` that still use them; this package calls the new names.
ALIASES = {
    "tutti_submit_load": "tutti_load_submit",
    "tutti_register_kv": "tutti_kv_register",
    "tutti_unregister_kv": "tutti_kv_unregister",
    "tutti_lookup": "tutti_kv_lookup",
    "tutti_unpin": "tutti_kv_unpin",
    "tutti_contains_identity": "tutti_kv_contains_identity",
    "tutti_chain_hashes": "tutti_hash_chain",
    "tutti_get_stats": "tutti_runtime_stats",
    "tutti_data_path": "tutti_runtime_data_path",
    "tutti_runtime_close": "tutti_runtime_destroy",
}
for _old, _new in ALIASES.items():
    _PROTOTYPES[_old] = _PROTOTYPES[_new]

# Calls this package can live without (newer additions); the rest must be present.
# Libraries of ABI 1.0 lack tutti_abi_minor: they are refused by the minor check, naming it.
OPTIONAL = {"tutti_emulated_fail_next", "tutti_emulated_delay_next", "tutti_abi_minor"}
_PROTOTYPES["tutti_emulated_fail_next"] = (_i32, [_rt, c_uint32, c_uint32, c_uint32])
_PROTOTYPES["tutti_emulated_delay_next"] = (_i32, [_rt, c_uint32, c_uint32, c_uint32])


def _candidates() -> list[str]:
    out = []
    env = os.environ.get("TUTTI_LIB")
    if env:
        return [env]
    here = Path(__file__).resolve().parent
    out.append(str(here / LIB_NAME))
    target_dirs = []
    if os.environ.get("CARGO_TARGET_DIR"):
        target_dirs.append(Path(os.environ["CARGO_TARGET_DIR"]))
    for parent in here.parents:
        if (parent / "Cargo.toml").is_file() and (parent / "capi").is_dir():
            target_dirs.append(parent / "target")
            break
    for t in target_dirs:
        # The newer of the release and debug builds: a stale one must not shadow a fresh one.
        builds = [t / "release" / LIB_NAME, t / "debug" / LIB_NAME]
        builds.sort(key=lambda p: p.stat().st_mtime if p.exists() else 0, reverse=True)
        out += [str(p) for p in builds]
    return out


class Library:
    """libtutti loaded, its prototypes declared and its ABI version checked."""

    def __init__(self, path: str | None = None):
        tried = []
        paths = [path] if path else _candidates()
        self.cdll = None
        for p in paths:
            if not os.path.exists(p):
                tried.append(f"{p} (no such file)")
                continue
            try:
                self.cdll = ctypes.CDLL(p)
                self.path = p
                break
            except OSError as e:
                tried.append(f"{p} ({e})")
        if self.cdll is None and not path and not os.environ.get("TUTTI_LIB"):
            try:
                self.cdll = ctypes.CDLL(LIB_NAME)
                self.path = LIB_NAME
            except OSError as e:
                tried.append(f"{LIB_NAME} via the dynamic loader ({e})")
        if self.cdll is None:
            raise LibraryNotFound(
                "libtutti.so not found; install the package (`pip install .` at the repository root builds it), "
                "build it with `cargo build -p tutti-capi --release`, or set TUTTI_LIB to its path. Tried: "
                + "; ".join(tried)
            )
        self.missing = []
        for name, (restype, argtypes) in _PROTOTYPES.items():
            try:
                fn = getattr(self.cdll, name)
            except AttributeError:
                if name in OPTIONAL:
                    continue
                self.missing.append(name)
                continue
            fn.restype = restype
            fn.argtypes = argtypes
            setattr(self, name, fn)
        if self.missing:
            raise AbiMismatch(f"{self.path} lacks {', '.join(self.missing)}: not a libtutti of ABI {ABI_VERSION}")
        version = self.tutti_abi_version()
        if version != ABI_VERSION:
            raise AbiMismatch(
                f"{self.path} speaks tutti ABI {version}; this Python package needs ABI {ABI_VERSION}"
            )
        minor = self.tutti_abi_minor() if self.has("tutti_abi_minor") else 0
        if minor < ABI_MINOR:
            raise AbiMismatch(
                f"{self.path} speaks tutti ABI {version}.{minor}; this Python package needs ABI "
                f"{ABI_VERSION}.{ABI_MINOR} or a later minor"
            )

    def has(self, name: str) -> bool:
        return hasattr(self, name)

    def status_name(self, status: int) -> str:
        name = self.tutti_status_name(status)
        return name.decode() if name else f"status {status}"

    def last_error(self) -> str:
        msg = self.tutti_last_error()
        return msg.decode("utf-8", "replace") if msg else ""

    def check(self, status: int, call: str) -> int:
        """Returns ``status`` if it is OK or IN_PROGRESS; raises the matching exception otherwise.

        Must run on the thread that made the call, right after it: the message is thread-local.
        """
        if status in (OK, IN_PROGRESS):
            return status
        raise exception_class(status)(status, self.status_name(status), self.last_error(), call)

    def call(self, name: str, *args) -> int:
        """Calls a status-returning function and raises on a negative status."""
        return self.check(getattr(self, name)(*args), name)


_lock = threading.Lock()
_library: Library | None = None


def lib() -> Library:
    """The process-wide library, loaded on first use."""
    global _library
    with _lock:
        if _library is None:
            _library = Library()
        return _library
