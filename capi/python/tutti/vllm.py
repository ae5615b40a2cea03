"""``tutti.vllm.TuttiConnector``: vLLM's KV connector (v1 interface) backed by tutti.

Enable it with::

    --kv-transfer-config '{"kv_connector": "TuttiConnector",
                           "kv_role": "kv_both",
                           "kv_connector_extra_config": {"vfio_drives": ["0000:01:00.0"]}}'

(the installed package registers the name with vLLM's connector factory through vLLM's
``vllm.general_plugins`` entry point, :mod:`tutti._vllm_plugin`; with the package only on
``PYTHONPATH`` add ``"kv_connector_module_path": "tutti.vllm"``). The connector logs to
``vllm.tutti``, a child of vLLM's logger, so vLLM's log shows it: one line per connector at
start-up (where the pool is, its geometry, the data path) and one per load (its hit tokens).
(keys of ``kv_connector_extra_config``: :mod:`tutti._connector.config`).

When vLLM is importable the class derives from vLLM's ``KVConnectorBase_V1``
and vLLM's own ``KVConnectorRole`` / ``KVConnectorMetadata`` are used. When
it is not (as on machines without a GPU, where this package is tested), the
class derives from a small stand-in base with the same constructor and the
same metadata bind/clear methods, so the connector's logic runs unchanged
against stand-in request, block and scheduler-output objects.

vLLM builds one instance with ``role=SCHEDULER`` (in the scheduler) and one
with ``role=WORKER`` (next to the GPU); the scheduler's plan reaches the
worker as ``TuttiConnectorMetadata`` inside the scheduler output.

Where the pool lives:

* in this process (the default with vLLM's in-process executor: ``VLLM_ENABLE_V1_MULTIPROCESSING=0``
  and ``distributed_executor_backend="uni"``): the scheduler-side and worker-side connectors
  share one runtime (``_connector/shared.py``);
* in tuttid (``tutti serve``), for vLLM's multiprocess executor and TP/PP > 1: every connector
  instance, in whatever process, is a client of the daemon — ``daemon_socket`` names a running
  one, ``daemon: "auto"`` (the default there when ``emulated_dir`` is set) starts one per pool
  directory. Each rank stores and loads its own shard under its own cache identity (the rank
  layout is part of it); the workers hand their identities to the scheduler through vLLM's
  connector handshake, and the scheduler reports the prefix every rank holds
  (``tutti_kv_contains_identity``, the minimum over ranks). A chunk evicted before a worker loads it
  is a load error (recomputed), never wrong bytes.

The in-process mode refuses the multiprocess executor and TP×PP > 1 at start-up with a message
naming both ways out.

The connector supports vLLM's hybrid memory allocator (it is a ``SupportsHMA``, so vLLM keeps HMA
on with it): a model with full-attention and sliding-window layers has several KV-cache groups,
each stored and loaded under its own keys, a sliding-window group only inside its window
(:mod:`tutti._connector.groups`). A group tutti cannot serve (Mamba/SSM state, among others) is
refused when the connector is built, naming the group and its kind.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import logging
import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from . import cluster
from ._connector import shared
from .errors import TuttiError
from ._connector.config import (
    SINGLE_PROCESS_HINT as _SINGLE_PROCESS_STEPS,
    ConfigError,
    ConnectorConfig,
    executor_name,
    from_vllm,
    is_multiprocess,
)
from ._connector import breakeven, groups as kv_groups, keys
from ._connector.metadata import LoadSpec, SaveSpec, StepPlan
from ._connector.profile import StepProfiler
from ._connector.sched import SchedHooks
from ._connector.scheduler import SchedulerSide
from ._connector.worker import WorkerSide

log = logging.getLogger("vllm.tutti")

if TYPE_CHECKING:  # vLLM's types, for readers and type checkers only: no import of vLLM at run time
    import torch
    from vllm.config import KVTransferConfig, VllmConfig
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorHandshakeMetadata
    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorPromMetrics
    from vllm.forward_context import ForwardContext
    from vllm.v1.attention.backend import AttentionMetadata
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request

try:  # pragma: no cover - exercised only where vLLM is installed
    from vllm.distributed.kv_transfer.kv_connector.v1.base import (
        KVConnectorBase_V1,
        KVConnectorMetadata,
        KVConnectorRole,
    )

    VLLM_AVAILABLE = True
except ImportError:
    VLLM_AVAILABLE = False

    class KVConnectorRole(enum.Enum):  # type: ignore[no-redef]
        """Stand-in for vLLM's enum (same member names and values)."""

        SCHEDULER = 0
        WORKER = 1

    class KVConnectorMetadata:  # type: ignore[no-redef]
        """Stand-in for vLLM's abstract metadata base."""

    class KVConnectorBase_V1:  # type: ignore[no-redef]
        """Stand-in for vLLM's base: the constructor and the metadata binding the model runner uses."""

        def __init__(self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig | None = None):
            if vllm_config.kv_transfer_config is None:
                raise ValueError("kv_transfer_config must be set for KVConnectorBase_V1")
            self._vllm_config = vllm_config
            self._kv_transfer_config = vllm_config.kv_transfer_config
            self._kv_cache_config = kv_cache_config
            self._role = role
            self._connector_metadata = None

        @property
        def role(self):
            return self._role

        def bind_connector_metadata(self, connector_metadata) -> None:
            self._connector_metadata = connector_metadata

        def clear_connector_metadata(self) -> None:
            self._connector_metadata = None

        def _get_connector_metadata(self):
            assert self._connector_metadata is not None
            return self._connector_metadata

        def has_connector_metadata(self) -> bool:
            return self._connector_metadata is not None


try:  # pragma: no cover - exercised only where vLLM is installed
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorTransferResults
except ImportError:
    KVConnectorTransferResults = None  # type: ignore[assignment,misc]

try:  # pragma: no cover - exercised only where vLLM is installed
    from vllm.distributed.kv_transfer.kv_connector.v1.base import SupportsHMA
except ImportError:

    class SupportsHMA:  # type: ignore[no-redef]
        """Stand-in for vLLM's marker of connectors that serve its hybrid memory allocator."""


try:  # pragma: no cover - exercised only where vLLM is installed
    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats
except ImportError:

    @dataclass
    class KVConnectorStats:  # type: ignore[no-redef]
        """Stand-in for vLLM's stats container (a ``data`` dict)."""

        data: dict = field(default_factory=dict)

        def to_dict(self) -> dict:
            return self.data


STAT_KEYS = (
    "bytes_loaded", "bytes_stored", "hit_tokens", "load_s", "save_s", "failed_blocks", "loads", "saves",
)
# The cluster tier's (tutti.cluster: Mooncake): the scheduler side reports remote_lookups and
# remote_hit_blocks, the worker side the rest; all zero without a tier.
STAT_KEYS += cluster.STAT_KEYS
_SCHEDULER_TIER_KEYS = ("remote_lookups", "remote_hit_blocks")
# The break-even rule's (scheduler side): counters, then gauges (the rates its latest decision
# used; aggregating keeps the latest, never a sum).
STAT_KEYS += breakeven.STAT_COUNTERS + breakeven.STAT_GAUGES
GAUGE_KEYS = frozenset(breakeven.STAT_GAUGES)


@dataclass
class TuttiConnectorStats(KVConnectorStats):
    """tutti's counters for one stats interval, through vLLM's connector-stats hooks.

    ``bytes_loaded``/``bytes_stored``: KV bytes moved by the drives; ``hit_tokens``: tokens
    the scheduler-side connector reported as loadable; ``load_s``/``save_s``: wall time the
    worker spent waiting for loads and completing saves; ``failed_blocks``: engine blocks
    whose load failed (handed to vLLM); ``loads``/``saves``: requests loaded / stored.
    ``remote_*``: the Mooncake tier's lookups, blocks found, blocks and bytes loaded, failed
    calls, objects that did not verify, blocks and bytes published, publications dropped.
    ``match_*``: the break-even rule's tokens hit (held by tutti beyond vLLM's own cache),
    reported, declined as slower to load than to compute (and the requests concerned), requests
    reported while the rule was still learning, and probes; ``est_*``: the read rate, load
    latency, prefill cost per token and backlog its latest decision used (gauges).
    """

    def __post_init__(self):
        for k in STAT_KEYS:
            self.data.setdefault(k, 0)

    def reset(self):
        self.data = {k: 0 for k in STAT_KEYS}

    def aggregate(self, other: "KVConnectorStats") -> "TuttiConnectorStats":
        for k, v in (other.data or {}).items():
            if k in GAUGE_KEYS:
                self.data[k] = v if v else self.data.get(k, 0)
            else:
                self.data[k] = self.data.get(k, 0) + v
        return self

    def reduce(self) -> dict[str, int | float]:
        return {k: self.data.get(k, 0) for k in STAT_KEYS}

    def is_empty(self) -> bool:
        return not any(self.data.get(k, 0) for k in STAT_KEYS)


SINGLE_PROCESS_HINT = (
    "the pool lives in this process (no daemon configured), so vLLM's scheduler and its worker must "
    "share it: " + _SINGLE_PROCESS_STEPS + "; or give kv_connector_extra_config 'daemon_socket' (a running "
    "`tutti serve`) or \"daemon\": \"auto\" with 'emulated_dir' to share the pool through tuttid"
)


def _is_real_vllm_config(vllm_config: VllmConfig) -> bool:
    return VLLM_AVAILABLE and type(vllm_config).__module__.startswith("vllm.")


def check_single_process(vllm_config: VllmConfig, config: ConnectorConfig | None = None) -> None:
    """Refuses, at start-up, executors that put the scheduler and the worker in different processes
    when the pool lives in this process (no daemon).

    With them the scheduler-side connector would never see the KV the worker registers and
    would report no cached prefix forever: silent misses, never an error. vLLM resolves
    ``distributed_executor_backend`` before any connector is built: ``"uni"`` (and
    ``"external_launcher"``, one engine per process) keep both halves in one process;
    ``"mp"``, ``"ray"`` or an executor class do not. Through a daemon all of them work.
    """
    if config is not None and config.uses_daemon:
        return
    if not is_multiprocess(vllm_config):
        return
    name = executor_name(vllm_config)
    env = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
    raise ConfigError(
        f"TuttiConnector: vLLM's executor is distributed_executor_backend={name!r} "
        f"(VLLM_ENABLE_V1_MULTIPROCESSING={env if env is not None else 'unset (1)'}), which runs the scheduler "
        f"and the workers in different processes; {SINGLE_PROCESS_HINT}"
    )


def _rank() -> tuple[int, int]:
    """(tp_rank, pp_rank) of this worker, from vLLM's process groups; (0, 0) without them."""
    try:  # pragma: no cover - exercised only where vLLM is installed
        from vllm.distributed.parallel_state import get_pp_group, get_tp_group

        return int(get_tp_group().rank_in_group), int(get_pp_group().rank_in_group)
    except Exception:  # noqa: BLE001 - no vLLM, or its groups are not set up (one rank)
        return 0, 0


try:  # pragma: no cover - exercised only where vLLM is installed
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorWorkerMetadata
except ImportError:

    class KVConnectorWorkerMetadata:  # type: ignore[no-redef]
        """Stand-in for vLLM's (>= 0.32) worker-to-scheduler metadata base."""

        def aggregate(self, other):
            raise NotImplementedError


class TuttiWorkerMeta(KVConnectorWorkerMetadata):
    """One step's timings from the workers (:class:`breakeven.Observations`), for the scheduler
    side's break-even rule; vLLM aggregates the ranks' before handing them over."""

    def __init__(self, obs: breakeven.Observations):
        self.obs = obs

    def aggregate(self, other: "KVConnectorWorkerMetadata") -> "TuttiWorkerMeta":
        if isinstance(other, TuttiWorkerMeta):
            self.obs.merge(other.obs)
        return self


try:  # pragma: no cover - exercised only where vLLM is installed
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorHandshakeMetadata
except ImportError:

    class KVConnectorHandshakeMetadata:  # type: ignore[no-redef]
        """Stand-in for vLLM's (empty) handshake metadata base."""


@dataclass
class TuttiHandshake(KVConnectorHandshakeMetadata):
    """One worker rank's cache identity, handed to the scheduler-side connector by vLLM after
    the workers registered their KV (``get_handshake_metadata`` → ``set_xfer_handshake_metadata``)."""

    tp_rank: int
    pp_rank: int
    model: str
    tenant_salt: bytes
    kind: str


class TuttiConnectorMetadata(KVConnectorMetadata, StepPlan):
    """One step's plan: loads (hit chunks → new blocks) and saves (computed blocks → chunks)."""

    def __init__(self, loads: list[LoadSpec] | None = None, saves: list[SaveSpec] | None = None, **shape: int):
        StepPlan.__init__(self, loads or [], saves or [], **shape)


def _base_init(self, vllm_config, role, kv_cache_config) -> None:
    # vLLM 0.10 takes (vllm_config, role); 0.11 added kv_cache_config.
    params = inspect.signature(KVConnectorBase_V1.__init__).parameters
    if "kv_cache_config" in params:
        KVConnectorBase_V1.__init__(self, vllm_config, role, kv_cache_config)
    else:
        KVConnectorBase_V1.__init__(self, vllm_config, role)


def _vllm_layout_facts(
    vllm_config: VllmConfig, kv_caches: dict[str, torch.Tensor]
) -> tuple[dict[str, str], str | None]:
    """(layer name -> attention backend name, vLLM's resolved KV cache layout name), where vLLM has them."""
    backends: dict[str, str] = {}
    ctx = getattr(getattr(vllm_config, "compilation_config", None), "static_forward_context", None) or {}
    for name in kv_caches:
        layer = ctx.get(name)
        backend = getattr(layer, "attn_backend", None)
        try:
            backends[name] = backend.get_name() if backend is not None else type(layer).__name__
        except Exception:  # a backend without get_name(): the class name will do for messages
            backends[name] = getattr(backend, "__name__", type(backend).__name__)
    layout = getattr(getattr(vllm_config, "cache_config", None), "kv_cache_layout", None)
    layout = getattr(layout, "name", layout)
    return backends, (str(layout) if layout else None)


def _check_vllm_fields() -> None:
    """Refuses, at start-up, an installed vLLM whose scheduler objects lack a field the connector
    reads (:data:`._connector.keys.READS`), naming it: read as absent, a renamed field would
    silently key or place KV wrongly."""
    missing = keys.missing_vllm_fields()
    if missing:
        import vllm

        raise ConfigError(
            f"TuttiConnector: the installed vLLM ({getattr(vllm, '__version__', '?')}) lacks what the connector "
            f"reads from its scheduler objects: {', '.join(missing)}; this tutti was written against vLLM 0.32"
        )


def _is_scheduler(role: KVConnectorRole) -> bool:
    return getattr(role, "name", str(role)) == "SCHEDULER"


def _hybrid_groups(config: ConnectorConfig, kv_cache_config: KVCacheConfig | None
                   ) -> tuple[ConnectorConfig, kv_groups.Groups | None]:
    """vLLM's KV-cache groups when there are several (None: one group, the path unchanged), and
    the config with the pool's layers set to the groups' shared tensors. Refuses, naming it, a
    group tutti cannot serve, and the cluster tier with several groups."""
    if not VLLM_AVAILABLE or kv_cache_config is None:
        return config, None
    try:
        groups = kv_groups.from_kv_cache_config(kv_cache_config)
    except kv_groups.UnservableGroup as e:
        raise ConfigError(f"TuttiConnector: {e}") from None
    if groups is None:
        return config, None
    if config.mooncake is not None:
        raise ConfigError(
            f"TuttiConnector: the cluster tier ('mooncake') serves a KV cache of one group; vLLM's hybrid allocator "
            f"gave this model {len(groups.groups)} ({groups.describe()})"
        )
    geometry = dataclasses.replace(config.geometry, layers=groups.slots)
    return dataclasses.replace(config, geometry=geometry), groups


class TuttiConnector(KVConnectorBase_V1, SupportsHMA):
    """vLLM KV connector storing KV blocks on NVMe through tutti (see the module docs)."""

    def __init__(self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig | None = None):
        _base_init(self, vllm_config, role, kv_cache_config)
        if VLLM_AVAILABLE:
            _check_vllm_fields()
        self.config: ConnectorConfig = from_vllm(vllm_config)
        self.config, self.groups = _hybrid_groups(self.config, kv_cache_config)
        check_single_process(vllm_config, self.config)
        scheduler = _is_scheduler(role)
        self.tp_rank, self.pp_rank = (0, 0) if scheduler else _rank()
        name = shared.client_name("scheduler" if scheduler else "worker", self.tp_rank, self.pp_rank)
        self.runtime = shared.acquire(self.config, name, (self.tp_rank, self.pp_rank), control=scheduler)
        self._stats = TuttiConnectorStats()
        self.reported = TuttiConnectorStats()  # everything handed to vLLM's stats hook so far
        self._last_rt = self.runtime.stats()
        self._scheduler: SchedulerSide | None = None
        self._worker: WorkerSide | None = None
        self._profiler: StepProfiler | None = None
        self._sched: SchedHooks | None = None
        self._clock = breakeven.StepClock()
        # Scheduler side with a daemon: each rank's identity, from vLLM's handshake.
        self._rank_identities: dict[tuple[int, int], tuple[str, bytes, str]] = {}
        c = self.config
        # The cluster tier (Mooncake), one per node process, when kv_connector_extra_config names one.
        self.tier: cluster.MooncakeTier | None = (
            cluster.acquire(c.mooncake, c.geometry, c.pool_key()) if c.mooncake is not None else None
        )
        self._last_tier = self.tier.snapshot() if self.tier is not None else {}
        if scheduler:
            if not c.uses_daemon and _is_real_vllm_config(vllm_config) and self.runtime._registered is None:
                # vLLM builds the workers (which register their KV) before the scheduler; in one
                # process the pool has KV by now. It has none when the worker is elsewhere.
                shared.release(self.config, self.runtime, (self.tp_rank, self.pp_rank))
                self.runtime = None
                if self.tier is not None:
                    cluster.release(self.tier)
                    self.tier = None
                raise ConfigError(
                    f"TuttiConnector: the scheduler-side connector (pid {os.getpid()}) finds no KV memory "
                    f"registered by a worker in its process, so the worker runs in another process; "
                    f"{SINGLE_PROCESS_HINT}"
                )
            identities = self._identities if c.uses_daemon else None
            g = c.geometry
            rule = breakeven.BreakEven(c.load_policy, 2 * g.layers * g.object_bytes, g.tokens_per_block,
                                       prior=breakeven.slack_prior(c.sched_slack_table, g.layers))
            self._scheduler = SchedulerSide(self.runtime, c.geometry.tokens_per_block, c.deferred_saves,
                                            identities=identities, ranks=c.tp_size * c.pp_size,
                                            remote=self._remote_contains if self.tier is not None else None,
                                            rule=rule, groups=self.groups)
            log.info("tutti: scheduler side: pool %s; geometry %s; looks up and plans loads (moves no bytes)%s",
                     shared.describe_pool(c, self.runtime), shared.geometry_text(c.geometry),
                     f"; vLLM's hybrid KV cache: {self.groups.describe()}" if self.groups is not None else "")
        else:
            self._worker = WorkerSide(
                self.runtime, c.geometry, c.model, c.rank_salt(self.tp_rank, self.pp_rank), c.layer_timeout_s,
                c.deferred_saves, tier=self.tier, store_local=c.mooncake.store_local if c.mooncake else True,
                groups=self.groups,
            )
            if c.profile:
                self._profiler = StepProfiler(self.runtime)
            self._sched = SchedHooks.configure(self.runtime, c)

    def _identities(self) -> list[tuple[str, bytes, str]]:
        """The cache identity of every rank: from vLLM's handshake, else those registered by
        worker-side connectors of this process."""
        found = self._rank_identities or shared.local_identities(self.config)
        return list(found.values())

    def _remote_contains(self, hashes: list[bytes]) -> int:
        """Leading ``hashes`` the cluster tier holds for every rank (0 until every rank's identity is known)."""
        ids = self._identities()
        if self.tier is None or len(ids) < self.config.tp_size * self.config.pp_size:
            return 0
        return self.tier.contains(ids, hashes)

    def _w(self) -> WorkerSide:
        if self._worker is None:
            raise RuntimeError("a worker-side method was called on the scheduler-side TuttiConnector")
        return self._worker

    def _s(self) -> SchedulerSide:
        if self._scheduler is None:
            raise RuntimeError("a scheduler-side method was called on the worker-side TuttiConnector")
        return self._scheduler

    def _plan(self) -> StepPlan | None:
        meta = self._connector_metadata
        return meta if isinstance(meta, StepPlan) else None

    # ==============================
    # Worker side
    # ==============================

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        """Registers vLLM's per-layer KV tensors (their memory is what the drives read and write).

        The layout is recognised from the tensors' shapes and strides, cross-checked with the
        layout vLLM resolved (``cache_config.kv_cache_layout``); the attention backend's name
        goes into any error.
        """
        backends, resolved = _vllm_layout_facts(self._vllm_config, kv_caches)
        w = self._w()
        w.register(kv_caches, backends, resolved)
        path = self.runtime.data_path()
        log.info("tutti: worker tp%d/pp%d: pool %s; geometry %s; %s data path%s", self.tp_rank, self.pp_rank,
                 shared.describe_pool(self.config, self.runtime), shared.geometry_text(self.config.geometry),
                 path.mode, f" ({path.p2p_missing})" if path.p2p_missing else "")
        if w.identity is not None:
            shared.note_identity(self.config, (self.tp_rank, self.pp_rank), w.identity)
        if self._profiler is not None and self._w().on_gpu:
            import torch  # GPU tensors come from torch

            self._profiler.use_cuda(torch)

    def get_handshake_metadata(self) -> TuttiHandshake | None:
        """This rank's cache identity, for the scheduler-side connector (which has no KV memory of
        its own and asks the pool under every rank's identity)."""
        if self._worker is None or self._worker.identity is None:
            return None
        model, salt, kind = self._worker.identity
        return TuttiHandshake(self.tp_rank, self.pp_rank, model, salt, kind)

    def set_xfer_handshake_metadata_pp_aware(
        self, metadata: dict[tuple[int, int], KVConnectorHandshakeMetadata]
    ) -> None:
        """Every rank's identity, keyed by (pp_rank, tp_rank) (vLLM calls this on the scheduler side)."""
        for (pp, tp), m in (metadata or {}).items():
            if isinstance(m, TuttiHandshake):
                self._rank_identities[(m.tp_rank, m.pp_rank)] = (m.model, bytes(m.tenant_salt), m.kind)
            else:
                log.warning("tutti: handshake metadata of rank tp%s/pp%s is not tutti's: %r", tp, pp, m)

    def set_xfer_handshake_metadata(self, metadata: dict[int, KVConnectorHandshakeMetadata]) -> None:
        self.set_xfer_handshake_metadata_pp_aware({(0, tp): m for tp, m in (metadata or {}).items()})

    @classmethod
    def supports_sleep_mode(cls, kv_transfer_config: KVTransferConfig | None = None) -> bool:
        """False: tutti's tables hold the raw addresses of the registered KV memory, which sleep
        mode frees and remaps (vLLM >= 0.33 asks this before sleeping)."""
        return False

    def handle_preemptions(self, kv_connector_metadata: KVConnectorMetadata) -> None:
        """vLLM calls this at the start of every step, before it zeroes or rewrites blocks it
        reallocated (a preempted request's, among others): deferred saves still reading such
        blocks are completed here, so they store the KV the blocks held, never zeroes."""
        if self._worker is None:
            return
        t0 = time.monotonic()
        self._worker.drain()
        self._stats.data["save_s"] += time.monotonic() - t0

    def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata) -> None:
        """vLLM hands the worker each step's plan here, before the forward pass: the step begins
        (deferred saves of the last step complete, the timing hooks start). vLLM >= 0.32 calls
        ``start_load_kv`` after the forward pass when the step has no loads, so the step cannot
        begin there."""
        super().bind_connector_metadata(connector_metadata)
        if self._worker is not None and isinstance(connector_metadata, StepPlan):
            plan = connector_metadata
            self._clock.begin(plan.step, plan.scheduled_tokens, plan.prefill_tokens)
            if self._profiler is not None:
                self._profiler.begin_step(plan.prefill_tokens, plan.prefix_tokens, plan.decode_context_tokens)
            if self._sched is not None:
                self._sched.begin_step(plan.prefill_tokens, plan.prefix_tokens, plan.decode_context_tokens)
            t0 = time.monotonic()
            self._worker.begin_step(plan)
            dt = time.monotonic() - t0
            self._stats.data["save_s"] += dt
            self._clock.in_hook(dt)

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        """Submits this step's loads for every layer; attention layers then wait for their own."""
        plan = self._plan()
        if plan is None:
            return
        w = self._w()
        t0 = time.monotonic()
        w.start_loads(plan)
        self._clock.loads_submitted(w.loading_bytes(), t0)
        self._clock.in_hook(time.monotonic() - t0)
        # Requests, not specs: with several KV-cache groups a request has one spec per group.
        self._stats.data["loads"] += len({ld.req_id for ld in plan.loads if ld.hashes or ld.remote_hashes})
        self._stats.data["saves"] += len({sv.req_id for sv in plan.saves if sv.hashes})

    def wait_for_layer_load(self, layer_name: str) -> None:
        """Blocks until layer ``layer_name`` of every load of this step has landed (or failed)."""
        w = self._w()
        t0 = time.monotonic()
        w.wait_layer(layer_name)
        t1 = time.monotonic()
        if self._clock.waiting_for_loads and w.loads_complete():
            self._clock.loads_seen_done(t0, t1)
        dt = time.monotonic() - t0
        self._stats.data["load_s"] += dt
        self._clock.in_hook(dt)
        layer = w.layer_of(layer_name)
        if self._profiler is not None and layer is not None:
            self._profiler.layer_begins(layer)
        if self._sched is not None and layer is not None:
            self._sched.layer_begins(layer)

    def save_kv_layer(
        self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: AttentionMetadata, **kwargs: Any
    ) -> None:
        """Submits the writes of this layer of this step's new blocks (its KV was just computed)."""
        plan = self._plan()
        if plan is None:
            return
        t0 = time.monotonic()
        layer = self._w().layer_of(layer_name)
        if self._profiler is not None and layer is not None:
            self._profiler.layer_ends(layer)
        if self._sched is not None and layer is not None:
            self._sched.layer_ends(layer)
        self._w().save_layer(plan, layer_name, kv_layer)
        self._clock.in_hook(time.monotonic() - t0)

    def wait_for_save(self) -> None:
        """Ends the step's I/O: loads finished, saves written and committed (visible to lookups)."""
        w = self._w()
        self._clock.end_forward()
        if self._profiler is not None:
            self._profiler.end_step()
        if self._sched is not None:
            self._sched.end_step()
        t0 = time.monotonic()
        w.finish_loads()
        t1 = time.monotonic()
        if self._clock.waiting_for_loads:
            self._clock.loads_seen_done(t0, t1)
        self._clock.end_loads(failed=w.has_load_errors)
        w.finish_saves(self._plan())
        self._stats.data["load_s"] += t1 - t0
        self._stats.data["save_s"] += time.monotonic() - t1

    def build_connector_worker_meta(self) -> TuttiWorkerMeta | None:
        """This step's timings (loads, the forward pass), for the scheduler side's break-even rule."""
        if self._worker is None or self.config.load_policy == "always":
            return None
        obs = self._clock.take(self._worker.pending_write_bytes())
        return TuttiWorkerMeta(obs) if obs is not None else None

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        """(finished requests whose deferred saves are done, requests whose asynchronous loads are
        done): loads always finish in their step, and only a hybrid KV cache's are asynchronous.

        Without deferred saves and a hybrid KV cache this is (None, None).
        """
        done = self._w().finished_saving(finished_req_ids)
        recving, _ = self._w().take_recving()
        return (done or None), (recving or None)

    def get_transfer_results(self, finished_req_ids: set[str]):
        """vLLM >= 0.32: what ``get_finished`` says, and the asynchronous loads that failed (vLLM
        recomputes those requests; with several KV-cache groups a failed block id could not be
        mapped back to its request)."""
        if KVConnectorTransferResults is None:  # a vLLM before 0.32 asks get_finished only
            return self.get_finished(finished_req_ids)
        done = self._w().finished_saving(finished_req_ids)
        recving, failed = self._w().take_recving()
        if failed:
            log.warning("tutti: requests %s: a block did not load; vLLM recomputes them", sorted(failed))
        return KVConnectorTransferResults(finished_sending=set(done), finished_recving=set(recving),
                                          failed_recving=set(failed))

    def get_block_ids_with_load_errors(self) -> set[int]:
        """Blocks whose load failed since the last call. What vLLM does with them depends on
        ``kv_load_failure_policy`` (see the package README): ``"recompute"`` recomputes them,
        ``"fail"`` (vLLM's default) ends the affected requests with an error.

        Blocks whose load failed with an unknown outcome (a timed-out read the drive may
        still execute) are among them; a warning names those, since the drive may write
        them until the pool is reopened.
        """
        errors = self._w().take_load_errors()
        self._stats.data["failed_blocks"] += len(errors)
        return errors

    def _collect_stats(self) -> TuttiConnectorStats | None:
        if self.runtime is None:
            return None
        now = self.runtime.stats()
        if self._worker is not None:
            self._stats.data["bytes_loaded"] += now.bytes_loaded - self._last_rt.bytes_loaded
            self._stats.data["bytes_stored"] += now.bytes_stored - self._last_rt.bytes_stored
        self._last_rt = now
        if self.tier is not None:
            tier = self.tier.snapshot()
            mine = _SCHEDULER_TIER_KEYS if self._scheduler is not None else tuple(
                k for k in cluster.STAT_KEYS if k not in _SCHEDULER_TIER_KEYS)
            for k in mine:
                self._stats.data[k] += tier[k] - self._last_tier.get(k, 0)
            self._last_tier = tier
        if self._scheduler is not None and self._scheduler.rule is not None:
            rule = self._scheduler.rule.take_stats()
            if any(rule[k] for k in breakeven.STAT_COUNTERS):  # gauges only with a decision
                for k, v in rule.items():
                    self._stats.data[k] = v if k in GAUGE_KEYS else self._stats.data[k] + v
        if self._stats.is_empty():
            return None
        out, self._stats = self._stats, TuttiConnectorStats()
        self.reported.aggregate(out)
        return out

    def get_kv_connector_stats(self) -> TuttiConnectorStats | None:
        """This interval's counters (then reset); vLLM aggregates them into its stats loggers.
        The worker side reports bytes, times, loads, saves and failed blocks; the scheduler
        side the hit tokens."""
        return self._collect_stats()

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> TuttiConnectorStats:
        return TuttiConnectorStats(data=dict(data or {}))

    @classmethod
    def build_prom_metrics(cls, vllm_config: VllmConfig, metric_types: dict, labelnames: list[str],
                           per_engine_labelvalues: dict[int, list[object]]) -> KVConnectorPromMetrics:
        """tutti's counters on vLLM's Prometheus metrics (``vllm:tutti_*``; see
        :mod:`tutti._connector.prom`)."""
        from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorPromMetrics

        from ._connector import prom

        counters = tuple(k for k in STAT_KEYS if k not in GAUGE_KEYS)
        return prom.build(KVConnectorPromMetrics, vllm_config, metric_types, labelnames, per_engine_labelvalues,
                          counters, GAUGE_KEYS)

    # ==============================
    # Scheduler side
    # ==============================

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int, bool]:
        """Tokens beyond ``num_computed_tokens`` tutti can load (whole blocks, never the last token)
        and, under the break-even rule, expects to load faster than vLLM computes them."""
        return self._s().matched(request, num_computed_tokens)

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        """The workers' output of a step: their timings feed the break-even rule."""
        meta = getattr(connector_output, "kv_connector_worker_meta", None)
        if isinstance(meta, TuttiWorkerMeta) and self._scheduler is not None:
            self._scheduler.observe(meta.obs)
        failed = getattr(connector_output, "failed_recving", None)
        if failed and self._scheduler is not None:
            self._scheduler.loads_failed(set(failed))

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int) -> None:
        """vLLM found blocks for the request: plan loading the hit chunks into them."""
        self._s().allocated(request, blocks, num_external_tokens)
        if num_external_tokens > 0:
            self._stats.data["hit_tokens"] += num_external_tokens
            log.info("tutti: request %s: %d tokens (%d blocks) hit in the pool, loading them",
                     getattr(request, "request_id", "?"), num_external_tokens,
                     num_external_tokens // self.config.geometry.tokens_per_block)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> TuttiConnectorMetadata:
        """This step's loads and the prompt blocks it completes (to be stored)."""
        p = self._s().plan(scheduler_output)
        return TuttiConnectorMetadata(
            p.loads, p.saves, prefill_tokens=p.prefill_tokens, prefix_tokens=p.prefix_tokens,
            decode_context_tokens=p.decode_context_tokens, scheduled_tokens=p.scheduled_tokens, step=p.step,
        )

    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, dict | None]:
        """Releases the request's pins. True (hold the blocks) only with deferred saves, when the
        request's last step stored blocks; the worker reports it from ``get_finished`` a step later."""
        return self._s().finished(request)

    def request_finished_all_groups(self, request: Request,
                                    block_ids: tuple[list[int], ...]) -> tuple[bool, dict | None]:
        """vLLM's hybrid allocator asks this instead of ``request_finished`` (once, for every
        group): the same answer, since deferred saves hold every group's blocks alike."""
        return self._s().finished(request)

    def save_slack_table(self, path: str | None = None) -> None:
        """Fits the profiled layer timings into a slack table and saves it (for ``tutti simulate``)."""
        c = self.config
        target = path or c.slack_table
        if target is None:
            raise ValueError("no path: pass one or set kv_connector_extra_config['slack_table']")
        self.runtime.save_slack_table(target, c.profile_gpu, c.profile_io_sms, c.profile_iocbs_per_sm_per_us)

    def shutdown(self) -> None:
        if self._profiler is not None and self.config.slack_table and self.runtime is not None:
            try:
                self.save_slack_table()
            except TuttiError as e:
                log.warning("tutti: slack table not saved: %s", e)
        if self._worker is not None:
            self._worker.close()
        if self._scheduler is not None:
            self._scheduler.close()
        if self.tier is not None:
            cluster.release(self.tier)
            self.tier = None
        if self.runtime is not None:
            shared.release(self.config, self.runtime, (self.tp_rank, self.pp_rank))
            self.runtime = None


__all__ = [
    "TuttiConnector",
    "TuttiConnectorMetadata",
    "KVConnectorRole",
    "KVConnectorBase_V1",
    "VLLM_AVAILABLE",
    "TuttiConnectorStats",
    "check_single_process",
    "TuttiHandshake",
    "TuttiWorkerMeta",
]
