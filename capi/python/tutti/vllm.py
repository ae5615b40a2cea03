"""``tutti.vllm.TuttiConnector``: vLLM's KV connector (v1 interface) backed by tutti.

Enable it with::

    --kv-transfer-config '{"kv_connector": "TuttiConnector",
                           "kv_connector_module_path": "tutti.vllm",
                           "kv_role": "kv_both",
                           "kv_connector_extra_config": {"vfio_drives": ["0000:01:00.0"]}}'

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
"""

from __future__ import annotations

import enum
import inspect
import logging
from typing import Any

from ._connector import shared
from .errors import TuttiError
from ._connector.config import ConnectorConfig, from_vllm
from ._connector.metadata import LoadSpec, SaveSpec, StepPlan
from ._connector.profile import StepProfiler
from ._connector.scheduler import SchedulerSide
from ._connector.worker import WorkerSide

log = logging.getLogger("tutti.vllm")

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

        def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None):
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


def _is_scheduler(role: Any) -> bool:
    return getattr(role, "name", str(role)) == "SCHEDULER"


class TuttiConnector(KVConnectorBase_V1):
    """vLLM KV connector storing KV blocks on NVMe through tutti (see the module docs)."""

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None):
        _base_init(self, vllm_config, role, kv_cache_config)
        self.config: ConnectorConfig = from_vllm(vllm_config)
        self.runtime = shared.acquire(self.config)
        self._scheduler: SchedulerSide | None = None
        self._worker: WorkerSide | None = None
        self._profiler: StepProfiler | None = None
        if _is_scheduler(role):
            c = self.config
            self._scheduler = SchedulerSide(self.runtime, c.geometry.tokens_per_block, c.deferred_saves)
        else:
            c = self.config
            self._worker = WorkerSide(
                self.runtime, c.geometry, c.model, c.tenant_salt, c.layer_timeout_s, c.deferred_saves
            )
            if c.profile:
                self._profiler = StepProfiler(self.runtime)

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

    def register_kv_caches(self, kv_caches: dict[str, Any]) -> None:
        """Registers vLLM's per-layer KV tensors (their memory is what the drives read and write)."""
        self._w().register(kv_caches)
        if self._profiler is not None and self._w().on_gpu:
            import torch  # GPU tensors come from torch

            self._profiler.use_cuda(torch)

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        """Submits this step's loads for every layer; attention layers then wait for their own."""
        plan = self._plan()
        if plan is None:
            return
        if self._profiler is not None:
            self._profiler.begin_step(plan.prefill_tokens, plan.prefix_tokens, plan.decode_context_tokens)
        self._w().begin_step(plan)
        self._w().start_loads(plan)

    def wait_for_layer_load(self, layer_name: str) -> None:
        """Blocks until layer ``layer_name`` of every load of this step has landed (or failed)."""
        w = self._w()
        w.wait_layer(layer_name)
        layer = w.layer_of(layer_name)
        if self._profiler is not None and layer is not None:
            self._profiler.layer_begins(layer)

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any) -> None:
        """Submits the writes of this layer of this step's new blocks (its KV was just computed)."""
        plan = self._plan()
        if plan is None:
            return
        layer = self._w().layer_of(layer_name)
        if self._profiler is not None and layer is not None:
            self._profiler.layer_ends(layer)
        self._w().save_layer(plan, layer_name, kv_layer)

    def wait_for_save(self) -> None:
        """Ends the step's I/O: loads finished, saves written and committed (visible to lookups)."""
        w = self._w()
        if self._profiler is not None:
            self._profiler.end_step()
        w.finish_loads()
        w.finish_saves(self._plan())

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        """(finished requests whose deferred saves are done, None): loads always finish in their step.

        Without deferred saves nothing is held, and this is (None, None).
        """
        done = self._w().finished_saving(finished_req_ids)
        return (done or None), None

    def get_block_ids_with_load_errors(self) -> set[int]:
        """Blocks whose load failed since the last call; vLLM recomputes them.

        Blocks whose load failed with an unknown outcome (a timed-out read the drive may
        still execute) are among them; a warning names those, since the drive may write
        them until the pool is reopened.
        """
        return self._w().take_load_errors()

    # ==============================
    # Scheduler side
    # ==============================

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int, bool]:
        """Tokens beyond ``num_computed_tokens`` tutti can load (whole blocks, never the last token)."""
        return self._s().matched(request, num_computed_tokens)

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        """vLLM found blocks for the request: plan loading the hit chunks into them."""
        self._s().allocated(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output: Any) -> TuttiConnectorMetadata:
        """This step's loads and the prompt blocks it completes (to be stored)."""
        p = self._s().plan(scheduler_output)
        return TuttiConnectorMetadata(
            p.loads, p.saves, prefill_tokens=p.prefill_tokens, prefix_tokens=p.prefix_tokens,
            decode_context_tokens=p.decode_context_tokens,
        )

    def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, dict | None]:
        """Releases the request's pins. True (hold the blocks) only with deferred saves, when the
        request's last step stored blocks; the worker reports it from ``get_finished`` a step later."""
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
        if self.runtime is not None:
            shared.release(self.config, self.runtime)
            self.runtime = None


__all__ = [
    "TuttiConnector",
    "TuttiConnectorMetadata",
    "KVConnectorRole",
    "KVConnectorBase_V1",
    "VLLM_AVAILABLE",
]
