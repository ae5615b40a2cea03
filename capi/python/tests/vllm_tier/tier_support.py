"""vLLM's real tiered-offloading objects around the tutti tier, for tests/vllm_tier.

:func:`build` makes vLLM's own ``TieringOffloadingSpec`` from an ``OffloadingConfig`` (the
normalised config vLLM's ``OffloadingConnector`` builds from ``kv_connector_extra_config``) and
asks it for its manager: vLLM allocates the primary tier (a ``SharedOffloadRegion`` mmap in
/dev/shm), resolves each ``secondary_tiers`` entry through ``SecondaryTierFactory`` and wires
them into ``TieringOffloadingManager``. Nothing of vLLM is mocked; vLLM's worker side (the GPU
copies) is the only part not run, because ``CPUOffloadingSpec.get_worker`` refuses a platform
that is not CUDA-alike or XPU, as vLLM's CPU build is.
"""

from __future__ import annotations

import gc
import itertools
import os
import time
from dataclasses import dataclass

import numpy as np
from vllm.v1.kv_offload.base import LookupResult, ReqContext, ScheduleEndContext, make_offload_key
from vllm.v1.kv_offload.config import (
    OffloadingCacheConfig,
    OffloadingConfig,
    OffloadingGroupConfig,
    OffloadingModelConfig,
    OffloadingParallelConfig,
)
from vllm.v1.kv_offload.factory import OffloadingSpecFactory
from vllm.v1.kv_offload.tiering.base import TransferJob
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

CHUNK_BYTES = 16 << 10  # four pages: one chunk of the primary tier
CTX = ReqContext(req_id="test")
_engines = itertools.count()
END = ScheduleEndContext(new_req_ids=(), preempted_req_ids=())


def offloading_config(tiers: list[dict], *, num_chunks: int = 16, chunk_bytes: int = CHUNK_BYTES,
                      events: bool = False, model: str = "test-model", tp_size: int = 1, rank: int = 0,
                      **extra) -> OffloadingConfig:
    return OffloadingConfig(
        groups=(OffloadingGroupConfig(tokens_per_block=16, layer_names=("model.layers.0.self_attn",), group_id=0),),
        worker_kv_bytes_per_block=chunk_bytes // tp_size,
        enable_kv_cache_events=events,
        extra_config={"spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": num_chunks * chunk_bytes,
                      "secondary_tiers": tiers, **extra},
        engine_id=f"tutti-tier-test-{os.getpid()}-{next(_engines)}",
        model=OffloadingModelConfig(name=model, dtype="float16"),
        cache=OffloadingCacheConfig(tokens_per_hash=16, blocks_per_chunk=1),
        parallel=OffloadingParallelConfig(
            rank=rank, world_size=tp_size, tp_size=tp_size, pp_size=1, pcp_size=1, dcp_size=1,
            data_parallel_index=0, data_parallel_size=1, data_parallel_rank_local=None,
            is_parallelism_agnostic=False,
        ),
    )


@dataclass
class Stack:
    """vLLM's manager with its primary tier and secondary tiers; ``chunks`` is the primary region
    as a numpy array (num_chunks × chunk bytes) over vLLM's own mmap."""

    spec: TieringOffloadingSpec
    manager: object
    chunks: np.ndarray | None

    @property
    def tier(self):
        return self.manager.secondary_tiers[0]

    def close(self) -> None:
        # vLLM releases its memoryview at shutdown; no export of it may be alive then.
        self.chunks = None
        gc.collect()
        self.manager.shutdown()


def build(tiers: list[dict], **kw) -> Stack:
    """The spec as vLLM's ``OffloadingConnector`` makes it (``OffloadingSpecFactory`` from the
    extra config's ``spec_name``), then its manager."""
    spec = OffloadingSpecFactory.create_spec(offloading_config(tiers, **kw))
    assert isinstance(spec, TieringOffloadingSpec)
    manager = spec.get_manager()
    chunks = np.asarray(manager.primary_tier.get_kv_memoryview()).view(np.uint8)
    return Stack(spec, manager, chunks)


def key(n: int, group: int = 0) -> bytes:
    return make_offload_key(n.to_bytes(8, "big"), group)


def job(job_id: int, keys: list, chunk_ids: list[int], promotion: bool = False) -> TransferJob:
    return TransferJob(job_id=job_id, keys=keys, chunk_ids=np.array(chunk_ids, dtype=np.int64),
                       is_promotion=promotion, req_context=CTX)


def fill(chunks: np.ndarray, ids: list[int], seed: int) -> dict[int, bytes]:
    """Random bytes in primary chunks ``ids``; returns {chunk id: its bytes}."""
    rng = np.random.default_rng(seed)
    out = {}
    for c in ids:
        chunks[c] = rng.integers(0, 256, chunks.shape[1], dtype=np.uint8)
        out[c] = chunks[c].tobytes()
    return out


def drain(tier, timeout: float = 30.0) -> list:
    """Waits for every submitted job (vLLM's drain_jobs) and returns the results."""
    tier.drain_jobs()
    results = list(tier.get_finished_jobs())
    deadline = time.monotonic() + timeout
    while tier.has_pending_work() and time.monotonic() < deadline:
        results += list(tier.get_finished_jobs())
        time.sleep(0.005)
    return results


_reqs = itertools.count()


def lookup_and_wait(tier, keys: list, timeout: float = 10.0) -> tuple[list, list]:
    """vLLM's lookup cycle for a new request: ask (RETRY while unanswered), end the step (the
    batch goes to the lookup thread), ask again until answered; then the request finishes (which
    drops its cached verdicts). Returns (first answers, final answers)."""
    ctx = ReqContext(req_id=f"lookup-{next(_reqs)}")
    first = [tier.lookup(k, ctx) for k in keys]
    tier.on_schedule_end(END)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            res = [tier.lookup(k, ctx) for k in keys]
            if LookupResult.RETRY not in res:
                return first, res
            tier.on_schedule_end(END)
            time.sleep(0.005)
        raise AssertionError(f"lookups still RETRY after {timeout} s (first answers {first})")
    finally:
        tier.on_request_finished(ctx)


def lookups(tier, keys: list) -> list:
    return lookup_and_wait(tier, keys)[1]
