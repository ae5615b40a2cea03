"""The connector's configuration: vLLM's ``kv_connector_extra_config`` plus the model's KV shape.

Pool geometry comes from vLLM's model and cache configs (layers, KV heads and
head size per tensor-parallel rank, block size, cache dtype); any of it can be
overridden in the extra config. Keys of ``kv_connector_extra_config``:

==========================  ===========================================================
``emulated_drives``         number of emulated NVMe drives (no hardware; tests, demos)
``emulated_capacity_bytes`` bytes per emulated drive (default 256 MiB)
``emulated_dir``            keep emulated media in files here (survives restarts)
``vfio_drives``             list of PCI addresses of NVMe drives bound to vfio-pci
``vfio_noiommu``            use vfio's no-IOMMU mode (machines without an IOMMU)
``executor``                ``"gio"`` (gio_uring on host lanes, default), ``"gio_cuda"``
                            (gio_uring's CUDA executor: needed for KV caches on the GPU,
                            which move on the staged data path) or ``"direct"`` (CPU baseline)
``host_threads``            ``"gio"``: OS threads of the host executor, each running 32 lanes
                            as fibers (default 0: libtutti's 1, which leaves an engine
                            serving on the CPU its other cores; at most 64)
``host_mode``               ``"gio"``: how the host executor runs its lanes: ``"inline"``
                            (on the threads calling tutti, no executor thread; needs
                            ``host_threads`` <= 1), ``"persistent"`` (executor threads poll
                            the ring from open to close) or ``"launch"`` (lanes started per
                            issue: libtutti's default). Default: ``"inline"`` (the fastest
                            measured for CPU serving), ``"launch"`` when ``host_threads`` > 1
``cuda_device``             ``"gio_cuda"``: the CUDA device ordinal (default 0)
``cuda_sm_count``           ``"gio_cuda"``: SMs of the I/O green context (default 0: all)
``cuda_driver``             ``"gio_cuda"``: the CUDA driver library to load (default: libcuda.so
                            from the loader path)
``cuda_block_threads``      ``"gio_cuda"``: threads per block of the I/O kernels (default 0: 512)
``cuda_mode``               ``"gio_cuda"``: ``"launch"`` (default: a kernel per issue) or
                            ``"persistent"`` (one kernel polls the ring; needs
                            ``cuda_sm_count``, whose SMs it holds while the engine runs)
``staging_slots``           pinned staging slots of the staged data path (default 256)
``emulated_read_bytes_per_sec``, ``emulated_write_bytes_per_sec``: pace each emulated drive's
                            reads / writes (default 0: unpaced; with ``"daemon": "auto"`` at
                            least 1 MB/s, ``tutti serve --emu-read-gbps``)
``emulated_latency_us``, ``emulated_read_latency_us``, ``emulated_write_latency_us``: latency
                            of each emulated command, and extra per direction (default 0)
``load_policy``             ``"breakeven"`` (default: report a hit only when loading it is
                            expected to be faster than recomputing it, see ``breakeven.py``)
                            or ``"always"`` (report every hit)
``open_mode``               ``"open_or_create"`` (default), ``"open"`` or ``"create"``
``io_timeout_ms``           per NVMe command deadline (default: libtutti's 2000)
``layer_timeout_ms``        how long a layer load or a step's saves may take (default 30000)
``model``                   the cache identity's model name (default: vLLM's model)
``tenant_salt``             string mixed into the cache identity (tenant isolation)
``layers``, ``kv_heads``,   override the geometry read from vLLM's configs
``head_dim``, ``dtype``
``lib``                     path to libtutti.so (else ``$TUTTI_LIB`` or the usual search)
``deferred_saves``          finish a step's saves at the start of the next step (see worker.py)
``profile``                 feed layer timings to tutti's profiler (see ``profile.py``)
``slack_table``             save the fitted slack table here at shutdown (implies ``profile``)
``profile_gpu``             GPU name recorded in the slack table (default ``"unknown"``)
``profile_io_sms``          SMs reserved for I/O, for the table's IOCB budgets (default 4)
``profile_iocbs_per_sm_per_us`` IOCBs one I/O SM issues per µs (default 1.0)
``sched_mode``              how loads and stores are scheduled (see ``sched.py``):
                            ``"arbitrate"`` (default: never reads and writes on one drive
                            at once, reads first), ``"slack"``, ``"slack_online"`` (writes only
                            into the slack of each layer and decode step, from
                            ``sched_slack_table``) or ``"pass"`` (no scheduling)
``sched_slack_table``       the slack table (``tutti profile``) the slack modes read
``sched_backlog_bytes``     KV bytes unwritten stores may hold (default: libtutti's 1 GiB)
``sched_idle_ms``           no timing hook for this long: the engine is idle and deferred
                            writes go regardless of slack (default: libtutti's 200 ms)
``sched_backlog_full``      ``"backpressure"`` (default: a store over the bound waits for
                            the backlog to drain) or ``"drop"`` (it is not stored: a miss)
``daemon_socket``           connect to the tuttid (``tutti serve``) listening here; every
                            connector instance (scheduler, each worker rank) is its client:
                            each worker moves its own bytes with its own executor (with
                            ``"gio_cuda"`` its own I/O kernels on its own GPU), the scheduler
                            only looks up (a control-only client: no queue pairs, no GPU)
``daemon``                  ``"auto"``: start ``tutti serve`` on demand for the emulated
                            pool in ``emulated_dir`` (one per directory; it exits
                            ``daemon_idle_exit_s`` after its last client left), or ``"off"``
                            (the pool in this process). Default: ``"auto"`` when vLLM runs
                            its multiprocess executor or TP×PP > 1, ``"off"`` otherwise
``daemon_idle_exit_s``      the idle exit of a daemon started by ``"auto"`` (default 30)
``daemon_start_timeout_s``  how long to wait for the daemon's socket (default 60)
``daemon_reconnect_backoff_ms`` a client whose tuttid went away reconnects on its next calls
                            (queue pairs, KV registration, executor back); between attempts
                            calls fail at once (loads miss, stores are dropped), the wait
                            doubling from 10 ms to this ceiling (default 1000)
``daemon_reconnect_deadline_s`` how long after the daemon went away to go on trying (default
                            600); 0 turns reconnecting off
``mooncake``                Mooncake Store as the cluster tier above this node's pool: a dict
                            with ``master`` (host:port) and ``metadata_server``
                            (http://host:port/metadata), see :func:`tutti.cluster.parse_config`
==========================  ===========================================================

With a daemon, every rank stores and loads its own shard: the cache identity of a rank
includes the rank layout (``tp_size``, ``pp_size``, ``tp_rank``, ``pp_rank``) when
TP×PP > 1, so no rank ever loads another rank's bytes, and a pool entry stored by a
TP=1 engine never serves a TP=2 one.

MLA models (DeepSeek-V2/V3/R1, Kimi K2: vLLM's ``use_mla``) are the exception: every TP rank
holds the same latent (``kv_lora_rank + qk_rope_head_dim`` per token and layer), vLLM hands
each layer as ``[num_blocks, block_size, latent]``, and the pool keeps a block's latent run as
two objects, its byte-exact halves (geometry KV heads 1, head dim latent / 2). The identity
says "MLA latent" and leaves the TP rank out (the PP rank stays): the first rank to store a
block writes it, the other ranks' stores of it are counted no-ops (``present``), every rank
loads it, and a pool written at one TP size serves any other with the same latent, block size
and dtype (another dtype, e.g. ``kv_cache_dtype="fp8"``, is another geometry: not shared).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..runtime import Geometry, default_exec_mode

if TYPE_CHECKING:  # vLLM's types, for type checkers only: no import of vLLM at run time
    from vllm.config import VllmConfig

_TORCH_DTYPES = {
    "torch.float32": "f32",
    "torch.float": "f32",
    "torch.float16": "f16",
    "torch.half": "f16",
    "torch.bfloat16": "bf16",
    "float32": "f32",
    "float16": "f16",
    "half": "f16",
    "bfloat16": "bf16",
    "fp8": "fp8_e4m3",
    "fp8_e4m3": "fp8_e4m3",
    "fp8_e5m2": "fp8_e5m2",
    "int8": "i8",
}

# The keys every engine's config takes: where the pool and its drives come from, the daemon,
# the executor, the model identity, the load policy. Each engine adds its own.
POOL_KEYS = frozenset({
    "emulated_drives",
    "emulated_capacity_bytes",
    "emulated_dir",
    "vfio_drives",
    "vfio_noiommu",
    "executor",
    "host_threads",
    "host_mode",
    "load_policy",
    "open_mode",
    "io_timeout_ms",
    "model",
    "tenant_salt",
    "lib",
    "slack_table",
    "daemon_socket",
    "daemon",
    "daemon_idle_exit_s",
    "daemon_start_timeout_s",
})

KNOWN_KEYS = POOL_KEYS | {
    "daemon_reconnect_backoff_ms",
    "daemon_reconnect_deadline_s",
    "cuda_device",
    "cuda_sm_count",
    "cuda_driver",
    "cuda_block_threads",
    "cuda_mode",
    "staging_slots",
    "emulated_read_bytes_per_sec",
    "emulated_write_bytes_per_sec",
    "emulated_latency_us",
    "emulated_read_latency_us",
    "emulated_write_latency_us",
    "layer_timeout_ms",
    "layers",
    "kv_heads",
    "head_dim",
    "dtype",
    "deferred_saves",
    "profile",
    "profile_gpu",
    "profile_io_sms",
    "profile_iocbs_per_sm_per_us",
    "sched_mode",
    "sched_slack_table",
    "sched_backlog_bytes",
    "sched_backlog_full",
    "sched_idle_ms",
    "mooncake",
}

DAEMON_SOCKET_NAME = "tuttid.sock"

HOST_MODES = ("inline", "persistent", "launch")
EMULATED_PACING = ("emulated_read_bytes_per_sec", "emulated_write_bytes_per_sec", "emulated_latency_us",
                   "emulated_read_latency_us", "emulated_write_latency_us")
# libtutti's (and tutti serve's) most latency per emulated command, in µs.
MAX_EMULATED_LATENCY_US = 10_000_000


class ConfigError(ValueError):
    """The connector's configuration is wrong; the message names the key."""


@dataclass(frozen=True)
class ConnectorConfig:
    geometry: Geometry
    model: str
    tenant_salt: bytes
    emulated_drives: int
    emulated_capacity_bytes: int
    emulated_dir: str | None
    vfio_drives: tuple[str, ...]
    vfio_noiommu: bool
    executor: str
    open_mode: str
    io_timeout_ms: int
    layer_timeout_s: float
    deferred_saves: bool = False
    profile: bool = False
    slack_table: str | None = None
    profile_gpu: str = "unknown"
    profile_io_sms: int = 4
    profile_iocbs_per_sm_per_us: float = 1.0
    sched_mode: str = "arbitrate"
    sched_slack_table: str | None = None
    sched_backlog_bytes: int = 0
    sched_backlog_full: str = "backpressure"
    sched_idle_ms: int = 0
    # "off" (the pool in this process), "connect" (a tuttid at daemon_socket) or "auto"
    # (start tuttid for the emulated pool in emulated_dir when none is running).
    daemon: str = "off"
    daemon_socket: str | None = None
    daemon_idle_exit_s: int = 30
    daemon_start_timeout_s: float = 60.0
    # Reconnecting to a tuttid that went away (libtutti's defaults: 1000 ms, 600 s); a deadline
    # of 0 turns it off.
    daemon_reconnect_backoff_ms: int = 0
    daemon_reconnect_deadline_s: int | None = None
    tp_size: int = 1
    pp_size: int = 1
    multiprocess: bool = False
    host_threads: int = 0
    cuda_device: int = 0
    cuda_sm_count: int = 0
    cuda_driver: str | None = None
    cuda_block_threads: int = 0
    cuda_mode: str = "launch"
    # None: the binding's default (tutti.runtime: inline with one lane block); from_vllm resolves it.
    host_mode: str | None = None
    staging_slots: int = 0
    # The emulated drives' pacing: EMULATED_PACING's keys, all 0 = unpaced.
    emulated_read_bytes_per_sec: int = 0
    emulated_write_bytes_per_sec: int = 0
    emulated_latency_us: int = 0
    emulated_read_latency_us: int = 0
    emulated_write_latency_us: int = 0
    load_policy: str = "breakeven"
    # The cluster tier (tutti.cluster.ClusterConfig), when 'mooncake' is set.
    mooncake: Any = None
    # An MLA model: one latent per layer and token, the same on every TP rank.
    latent: bool = False

    @property
    def uses_daemon(self) -> bool:
        return self.daemon != "off"

    def rank_salt(self, tp_rank: int, pp_rank: int) -> bytes:
        """The tenant salt of one rank's cache identity: with TP×PP > 1 the rank layout is part
        of it, so each rank's shard is its own and never another layout's (TP=1 keeps the plain
        salt, so pools stored before ranks existed keep hitting). An MLA model's latents are the
        same on every TP rank: its identity names them and leaves the TP rank out."""
        if self.latent:
            pp = f",pp{pp_rank}/{self.pp_size}" if self.pp_size > 1 else ""
            return self.tenant_salt + f"\0tutti-mla-latent{pp}".encode()
        if self.tp_size * self.pp_size == 1:
            return self.tenant_salt
        return self.tenant_salt + (
            f"\0tutti-ranks:tp{tp_rank}/{self.tp_size},pp{pp_rank}/{self.pp_size}".encode()
        )

    def pool_key(self) -> tuple:
        """Connectors with equal keys in one process share one runtime (one pool)."""
        return (
            self.geometry,
            self.emulated_drives,
            self.emulated_capacity_bytes,
            self.emulated_dir,
            self.vfio_drives,
            self.vfio_noiommu,
            self.executor,
            self.open_mode,
            self.io_timeout_ms,
            self.daemon,
            self.daemon_socket,
            self.host_threads,
            self.cuda_device,
            self.cuda_sm_count,
            self.cuda_driver,
            self.cuda_block_threads,
            self.cuda_mode,
            self.host_mode,
            self.staging_slots,
            self.pacing(),
        )

    def pacing(self) -> tuple[int, ...]:
        return tuple(getattr(self, k) for k in EMULATED_PACING)

    def io_kwargs(self) -> dict:
        """How this process moves its bytes: the keywords :class:`Runtime` and
        :meth:`Runtime.connect` share."""
        kw: dict[str, Any] = dict(executor=self.executor, io_timeout_ms=self.io_timeout_ms)
        if self.host_threads:
            kw.update(host_lane_blocks=self.host_threads)
        if self.staging_slots:
            kw.update(staging_slots=self.staging_slots)
        if self.executor == "gio_cuda":
            kw.update(cuda_device=self.cuda_device, cuda_sm_count=self.cuda_sm_count, cuda_driver=self.cuda_driver,
                      cuda_block_threads=self.cuda_block_threads, exec_mode=self.cuda_mode)
        elif self.executor == "gio" and self.host_mode is not None:
            kw.update(exec_mode=self.host_mode)
        return kw

    def reconnect_kwargs(self) -> dict:
        """How a client of tuttid reconnects: the keywords of :meth:`Runtime.connect`."""
        kw: dict[str, Any] = {}
        if self.daemon_reconnect_backoff_ms:
            kw.update(reconnect_backoff_ms=self.daemon_reconnect_backoff_ms)
        if self.daemon_reconnect_deadline_s == 0:
            kw.update(reconnect="off")
        elif self.daemon_reconnect_deadline_s is not None:
            kw.update(reconnect_deadline_ms=min(self.daemon_reconnect_deadline_s * 1000, 2**32 - 1))
        return kw

    def runtime_kwargs(self) -> dict:
        kw = self.io_kwargs()
        kw.update(open_mode=self.open_mode)
        if self.vfio_drives:
            kw.update(vfio=self.vfio_drives, vfio_noiommu=self.vfio_noiommu)
        else:
            kw.update(
                emulated_drives=self.emulated_drives,
                emulated_capacity_bytes=self.emulated_capacity_bytes,
                emulated_dir=self.emulated_dir,
            )
            kw.update({k: getattr(self, k) for k in EMULATED_PACING if getattr(self, k)})
        return kw


def _int(extra: dict, key: str, default: int, lo: int = 0) -> int:
    v = extra.get(key, default)
    try:
        iv = int(v)
    except (TypeError, ValueError):
        raise ConfigError(f"kv_connector_extra_config[{key!r}] = {v!r} is not an integer") from None
    if iv < lo or isinstance(v, bool) or (isinstance(v, float) and v != iv):
        raise ConfigError(f"kv_connector_extra_config[{key!r}] = {v!r} must be an integer >= {lo}")
    return iv


# libtutti's limit on host_lane_blocks (capi/src/config.rs MAX_LANE_BLOCKS).
MAX_HOST_THREADS = 64


def _host_threads(extra: dict) -> int:
    n = _int(extra, "host_threads", 0)
    if n > MAX_HOST_THREADS:
        raise ConfigError(
            f"kv_connector_extra_config['host_threads'] = {n} is more than {MAX_HOST_THREADS}"
        )
    return n


def _dtype(name: Any) -> str:
    key = str(name).lower()
    if key not in _TORCH_DTYPES:
        raise ConfigError(f"KV cache dtype {name!r} is not one tutti stores (f32, f16, bf16, fp8, int8)")
    return _TORCH_DTYPES[key]


def uses_mla(vllm_config: VllmConfig) -> bool:
    """vLLM serves this model with MLA (a latent KV cache)."""
    return bool(getattr(getattr(vllm_config, "model_config", None), "use_mla", False))


def geometry_from_vllm(vllm_config: VllmConfig, extra: dict) -> Geometry:
    """Layers, KV heads, head size and dtype of this rank's KV cache, from vLLM's configs."""
    model = vllm_config.model_config
    parallel = vllm_config.parallel_config
    cache = vllm_config.cache_config
    layers = extra.get("layers") or model.get_num_layers(parallel)
    kv_heads = extra.get("kv_heads") or model.get_num_kv_heads(parallel)
    head_dim = extra.get("head_dim") or model.get_head_size()
    if uses_mla(vllm_config) and not extra.get("head_dim"):
        # One latent of get_head_size() elements per token (kv_lora_rank + qk_rope_head_dim), kept
        # as two objects of half of it (the worker's split of vLLM's [blocks, block_size, latent]).
        latent = int(head_dim)
        if latent % 2 or int(kv_heads) != 1:
            raise ConfigError(
                f"MLA model with a latent of {latent} elements and {kv_heads} KV heads: tutti stores one "
                "latent per token in two byte-exact halves, which needs an even latent and one KV head"
            )
        head_dim = latent // 2
    if extra.get("dtype"):
        dtype = _dtype(extra["dtype"])
    elif getattr(cache, "cache_dtype", "auto") not in (None, "auto"):
        dtype = _dtype(cache.cache_dtype)
    else:
        dtype = _dtype(model.dtype)
    try:
        return Geometry(int(layers), int(kv_heads), int(head_dim), int(cache.block_size), dtype)
    except ValueError as e:
        raise ConfigError(str(e)) from None


SINGLE_PROCESS_HINT = (
    "set VLLM_ENABLE_V1_MULTIPROCESSING=0 in the environment "
    "(vLLM's CPU build otherwise switches to the 'mp' executor) and distributed_executor_backend=\"uni\" "
    "(LLM(..., distributed_executor_backend=\"uni\") or --distributed-executor-backend uni), with "
    "tensor_parallel_size=1 and pipeline_parallel_size=1"
)


def executor_name(vllm_config: VllmConfig) -> str | None:
    backend = getattr(getattr(vllm_config, "parallel_config", None), "distributed_executor_backend", None)
    if backend is None or isinstance(backend, str):
        return backend
    return getattr(backend, "__name__", repr(backend))


def is_multiprocess(vllm_config: VllmConfig) -> bool:
    """vLLM's executor puts the scheduler and the workers in different processes (``"mp"``,
    ``"ray"``, an executor class); ``"uni"`` and ``"external_launcher"`` keep them together."""
    return executor_name(vllm_config) not in (None, "uni", "external_launcher")


def drive_source_problem(where: str, daemon: str, emulated: Any, vfio: Any) -> str | None:
    """What is wrong with where the drives come from (None when nothing is): tuttid (``daemon``
    "connect"), or else exactly one of emulated drives and VFIO ones. ``where`` names the
    engine's config; each engine raises its own ``ConfigError`` with the message."""
    if daemon == "connect":
        if emulated or vfio:
            return (
                f"{where}: with 'daemon_socket' the daemon owns the drives; drop "
                "'emulated_drives'/'vfio_drives', or add \"daemon\": \"auto\" to start tuttid for an emulated pool"
            )
    elif bool(emulated) == bool(vfio):
        return (
            f"{where} needs exactly one of 'emulated_drives' (a count), 'vfio_drives' (PCI addresses "
            "of NVMe drives bound to vfio-pci) or 'daemon_socket' (a running tuttid)"
        )
    return None


def from_vllm(vllm_config: VllmConfig) -> ConnectorConfig:
    """Reads the connector's configuration from vLLM's ``VllmConfig``."""
    ktc = vllm_config.kv_transfer_config
    extra = dict(getattr(ktc, "kv_connector_extra_config", None) or {})
    unknown = set(extra) - KNOWN_KEYS
    if unknown:
        raise ConfigError(
            f"unknown kv_connector_extra_config keys {sorted(unknown)}; known: {sorted(KNOWN_KEYS)}"
        )
    parallel = vllm_config.parallel_config
    tp = int(getattr(parallel, "tensor_parallel_size", 1) or 1)
    pp = int(getattr(parallel, "pipeline_parallel_size", 1) or 1)
    multiprocess = is_multiprocess(vllm_config)
    if extra.get("lib"):
        os.environ.setdefault("TUTTI_LIB", str(extra["lib"]))
    emulated = _int(extra, "emulated_drives", 0)
    vfio = extra.get("vfio_drives") or ()
    if isinstance(vfio, str):
        vfio = [v for v in vfio.split(",") if v]
    socket = str(extra["daemon_socket"]) if extra.get("daemon_socket") else None
    daemon = extra.get("daemon")
    if daemon is None:
        if socket is not None and not emulated and not vfio:
            daemon = "connect"
        elif multiprocess or tp * pp > 1:
            daemon = "auto" if emulated and extra.get("emulated_dir") else ("connect" if socket else "off")
        else:
            daemon = "connect" if socket else "off"
    elif daemon == "auto":
        pass
    elif daemon == "off":
        if socket is not None:
            raise ConfigError(
                "kv_connector_extra_config: 'daemon_socket' names a tuttid but 'daemon' is 'off'; drop one"
            )
    else:
        raise ConfigError(f"kv_connector_extra_config['daemon'] = {daemon!r}: use 'auto' or 'off'")
    problem = drive_source_problem("kv_connector_extra_config", daemon, emulated, vfio)
    if problem:
        raise ConfigError(problem)
    if daemon == "auto":
        if vfio or not extra.get("emulated_dir"):
            raise ConfigError(
                "kv_connector_extra_config['daemon'] = 'auto' starts tuttid for an emulated pool kept in "
                "'emulated_dir' (one daemon per directory); set 'emulated_dir', or run `tutti serve` "
                "yourself and pass its socket as 'daemon_socket'"
            )
        if _int(extra, "emulated_capacity_bytes", 256 << 20, 1) % (1 << 20):
            raise ConfigError(
                "kv_connector_extra_config['emulated_capacity_bytes'] must be a whole number of MiB "
                "with 'daemon': 'auto' (tutti serve --capacity-mib)"
            )
        if socket is None:
            socket = os.path.join(str(extra["emulated_dir"]), DAEMON_SOCKET_NAME)
    if daemon == "off" and (multiprocess or tp * pp > 1):
        why = []
        if multiprocess:
            env = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
            why.append(
                f"distributed_executor_backend={executor_name(vllm_config)!r} "
                f"(VLLM_ENABLE_V1_MULTIPROCESSING={env if env is not None else 'unset (1)'})"
            )
        if tp * pp > 1:
            why.append(f"tensor_parallel_size × pipeline_parallel_size = {tp * pp}")
        raise ConfigError(
            f"TuttiConnector: vLLM runs {' and '.join(why)}, so the scheduler and the workers live in "
            "different processes and can share the pool only through tuttid. Set kv_connector_extra_config "
            "'daemon_socket' (a running `tutti serve`) or \"daemon\": \"auto\" with 'emulated_dir' (tuttid "
            f"started on demand); or, for one process, {SINGLE_PROCESS_HINT}"
        )
    executor = str(extra.get("executor", "gio"))
    if executor not in ("gio", "gio_cuda", "direct"):
        raise ConfigError(
            f"kv_connector_extra_config['executor'] = {executor!r}: use 'gio', 'gio_cuda' or 'direct'"
        )
    cuda_mode = str(extra.get("cuda_mode", "launch"))
    if cuda_mode not in ("launch", "persistent"):
        raise ConfigError(
            f"kv_connector_extra_config['cuda_mode'] = {cuda_mode!r}: use 'launch' or 'persistent'"
        )
    if cuda_mode == "persistent" and not extra.get("cuda_sm_count"):
        raise ConfigError(
            "kv_connector_extra_config['cuda_mode'] = 'persistent' holds its SMs for as long as the engine "
            "runs: set 'cuda_sm_count' (the SMs of its green context), or use 'launch'"
        )
    # Unset: the binding's default (inline with one executor thread, else libtutti's launch).
    host_mode = str(extra.get("host_mode", default_exec_mode("gio", _host_threads(extra)) or "launch"))
    if host_mode not in HOST_MODES:
        raise ConfigError(
            f"kv_connector_extra_config['host_mode'] = {host_mode!r}: use 'inline', 'persistent' or 'launch'"
        )
    if host_mode == "inline" and _host_threads(extra) > 1:
        raise ConfigError(
            f"kv_connector_extra_config['host_mode'] = 'inline' runs one block of lanes on the calling "
            f"thread; 'host_threads' = {_host_threads(extra)} needs 'persistent' or 'launch'"
        )
    load_policy = str(extra.get("load_policy", "breakeven"))
    if load_policy not in ("breakeven", "always"):
        raise ConfigError(
            f"kv_connector_extra_config['load_policy'] = {load_policy!r}: use 'breakeven' or 'always'"
        )
    pacing = {k: _int(extra, k, 0) for k in EMULATED_PACING}
    for k in EMULATED_PACING:
        if k.endswith("_us") and pacing[k] > MAX_EMULATED_LATENCY_US:
            raise ConfigError(f"kv_connector_extra_config[{k!r}] = {pacing[k]} is more than 10 s")
    if any(pacing.values()) and not emulated:
        raise ConfigError(
            f"kv_connector_extra_config: {sorted(k for k in pacing if pacing[k])} pace emulated drives; "
            "set 'emulated_drives' (with 'daemon_socket' the daemon's own flags pace its drives)"
        )
    if daemon == "auto":
        for k in ("emulated_read_bytes_per_sec", "emulated_write_bytes_per_sec"):
            if 0 < pacing[k] < 1_000_000:
                raise ConfigError(
                    f"kv_connector_extra_config[{k!r}] = {pacing[k]}: with 'daemon': 'auto' tuttid paces "
                    "drives at 1 MB/s or more (tutti serve --emu-read-gbps / --emu-write-gbps >= 0.001)"
                )
    open_mode = str(extra.get("open_mode", "open_or_create"))
    if open_mode not in ("open", "create", "open_or_create"):
        raise ConfigError(
            f"kv_connector_extra_config['open_mode'] = {open_mode!r}: use 'open', 'create' or 'open_or_create'"
        )
    salt = extra.get("tenant_salt", "")
    try:
        iocbs = float(extra.get("profile_iocbs_per_sm_per_us", 1.0))
    except (TypeError, ValueError):
        iocbs = -1.0
    if not iocbs > 0:
        raise ConfigError(
            f"kv_connector_extra_config['profile_iocbs_per_sm_per_us'] = "
            f"{extra.get('profile_iocbs_per_sm_per_us')!r} must be a positive number"
        )
    mooncake = None
    if extra.get("mooncake") is not None:
        from ..cluster import ClusterError, parse_config

        try:
            mooncake = parse_config(extra["mooncake"])
        except ClusterError as e:
            raise ConfigError(f"kv_connector_extra_config['mooncake']: {e}") from None
    sched_mode = str(extra.get("sched_mode", "arbitrate"))
    if sched_mode not in ("pass", "arbitrate", "slack", "slack_online"):
        raise ConfigError(
            f"kv_connector_extra_config['sched_mode'] = {sched_mode!r}: use 'arbitrate', 'slack', "
            "'slack_online' or 'pass'"
        )
    sched_table = str(extra["sched_slack_table"]) if extra.get("sched_slack_table") else None
    if sched_mode.startswith("slack") and sched_table is None:
        raise ConfigError(
            f"kv_connector_extra_config['sched_mode'] = {sched_mode!r} needs 'sched_slack_table' "
            "(a slack table from `tutti profile`, or from this connector's 'slack_table')"
        )
    sched_full = str(extra.get("sched_backlog_full", "backpressure"))
    if sched_full not in ("backpressure", "drop"):
        raise ConfigError(
            f"kv_connector_extra_config['sched_backlog_full'] = {sched_full!r}: use 'backpressure' or 'drop'"
        )
    return ConnectorConfig(
        geometry=geometry_from_vllm(vllm_config, extra),
        latent=uses_mla(vllm_config),
        model=str(extra.get("model") or vllm_config.model_config.model),
        tenant_salt=salt.encode() if isinstance(salt, str) else bytes(salt),
        emulated_drives=emulated,
        emulated_capacity_bytes=_int(extra, "emulated_capacity_bytes", 256 << 20, 1),
        emulated_dir=extra.get("emulated_dir") or None,
        vfio_drives=tuple(str(v) for v in vfio),
        vfio_noiommu=bool(extra.get("vfio_noiommu", False)),
        executor=executor,
        open_mode=open_mode,
        io_timeout_ms=_int(extra, "io_timeout_ms", 0),
        layer_timeout_s=_int(extra, "layer_timeout_ms", 30_000, 1) / 1000.0,
        deferred_saves=bool(extra.get("deferred_saves", False)),
        profile=bool(extra.get("profile", False) or extra.get("slack_table")),
        slack_table=str(extra["slack_table"]) if extra.get("slack_table") else None,
        profile_gpu=str(extra.get("profile_gpu", "unknown")),
        profile_io_sms=_int(extra, "profile_io_sms", 4, 1),
        profile_iocbs_per_sm_per_us=iocbs,
        sched_mode=sched_mode,
        sched_slack_table=sched_table,
        sched_backlog_bytes=_int(extra, "sched_backlog_bytes", 0),
        sched_backlog_full=sched_full,
        sched_idle_ms=_int(extra, "sched_idle_ms", 0),
        daemon=daemon,
        daemon_socket=socket,
        daemon_idle_exit_s=_int(extra, "daemon_idle_exit_s", 30, 1),
        daemon_start_timeout_s=float(_int(extra, "daemon_start_timeout_s", 60, 1)),
        daemon_reconnect_backoff_ms=_int(extra, "daemon_reconnect_backoff_ms", 0),
        daemon_reconnect_deadline_s=(_int(extra, "daemon_reconnect_deadline_s", 600)
                                     if "daemon_reconnect_deadline_s" in extra else None),
        tp_size=tp,
        pp_size=pp,
        multiprocess=multiprocess,
        host_threads=_host_threads(extra),
        cuda_device=_int(extra, "cuda_device", 0),
        cuda_sm_count=_int(extra, "cuda_sm_count", 0),
        cuda_block_threads=_int(extra, "cuda_block_threads", 0),
        cuda_driver=str(extra["cuda_driver"]) if extra.get("cuda_driver") else None,
        cuda_mode=cuda_mode,
        host_mode=host_mode,
        staging_slots=_int(extra, "staging_slots", 0),
        load_policy=load_policy,
        **pacing,
        mooncake=mooncake,
    )
