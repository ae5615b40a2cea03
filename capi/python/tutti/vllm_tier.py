"""``tutti.vllm_tier.TuttiTierManager``: tutti as a secondary tier under vLLM's CPU offloading.

vLLM's ``OffloadingConnector`` with ``TieringOffloadingSpec`` keeps a primary tier of chunks in
host memory (one shared mmap region it fills from the GPU) and hands chunks down to secondary
tiers (``vllm/v1/kv_offload/tiering``). This module is one of them, registered with vLLM's
``SecondaryTierFactory`` as ``"tutti"`` by the package's ``vllm.general_plugins`` entry point
(:mod:`tutti._vllm_plugin`), so the tier needs no ``module_path``::

    kv_connector_extra_config = {
        "cpu_bytes_to_use": 8 << 30,
        "secondary_tiers": [{"type": "tutti", "emulated_drives": 2, "emulated_dir": "/var/tmp/kv"}],
    }

(keys: :mod:`tutti._tier.config`). What each call of vLLM's ``SecondaryTierManager`` does here:

- construction: the primary tier's whole region is registered once with tutti as host KV
  memory, one tutti block per primary chunk, so the drives DMA straight into and out of it (no
  staging, no copy by a CPU thread); the cache identity is the connector's (model, tenant salt,
  layout) plus vLLM's own chunk identity (:func:`tutti._tier.config.vllm_identity`).
- ``submit_store`` / ``submit_load``: one asynchronous tutti job each, run on the tier's own
  threads (:mod:`tutti._tier.io`); the call only queues it.
- ``get_finished_jobs``: the jobs that ended, per chunk: a load reports exactly the chunks whose
  read succeeded (``successful_keys``), so a failed chunk is never reported loaded, and its
  cached lookup verdict becomes a miss; a store whose chunks were not all stored is a failure
  (vLLM then only releases the primary chunks), and only stored chunks are reported stored.
- ``lookup``: vLLM's own ``AsyncLookupManager`` (the ``fs`` tier's): RETRY the first time, the
  pool's index answers on a background thread, HIT or MISS from the next scheduler step on.
- ``touch``: on a background thread the chunks are looked up in the pool's index with a pin
  released at once (tutti counts only a pinning lookup as a use), which moves them to the
  recent end of tutti's LRU.
- ``take_events``: stored chunks when their store commits; evicted ones when the pool's eviction
  count rises, found by probing the chunks this tier stored, least recently used first.
- backpressure: vLLM's ``BackpressureDetector`` (``"backpressure"`` in the tier's entry) times
  each store from submission to completion, which here is the tutti job's own end.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Collection, Iterable
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

try:
    from vllm.v1.kv_offload.base import (
        Locality,
        LookupResult,
        Medium,
        OffloadingEvent,
        OffloadKey,
        ReqContext,
        RequestOffloadingContext,
        ScheduleEndContext,
    )
    from vllm.v1.kv_offload.tiering.async_lookup import AsyncLookupManager
    from vllm.v1.kv_offload.tiering.base import JobId, JobResult, SecondaryTierManager, TransferJob
except ImportError as e:  # pragma: no cover - only without vLLM
    raise ImportError(
        f"tutti.vllm_tier is a secondary tier of vLLM's tiered KV offloading and needs vLLM >= 0.32 ({e})"
    ) from e

from ._connector import shared
from ._connector.sched import SchedHooks
from ._tier import config as _config
from ._tier.config import TierConfig, TierConfigError
from ._tier.io import IoPool
from .errors import Timeout, TuttiError
from .runtime import Runtime, packed_hashes, packed_u32

if TYPE_CHECKING:
    from vllm.v1.kv_offload.base import OffloadingSpec
    from vllm.v1.kv_offload.tiering.backpressure import BackpressureDetector

__all__ = ["TuttiTierManager", "TierConfigError", "chunk_hash"]

log = logging.getLogger("tutti.vllm_tier")

TIER_TYPE = "tutti"
_PERSON = b"tutti-vllm-tier"
# Keys per index query of a lookup batch, and chunks probed per eviction check.
LOOKUP_WINDOW = 64
EVICTION_PROBE_MIN = 64

# Runtimes a tier of this process has registered with: a second tier on the same pool would
# replace the first one's registration.
_held: set[int] = set()
_held_lock = threading.Lock()


def chunk_hash(key: bytes) -> bytes:
    """The tutti chunk hash of a vLLM ``OffloadKey`` (block hash + group index, which already chains
    the prefix): its BLAKE2b-128."""
    return hashlib.blake2b(bytes(key), digest_size=16, person=_PERSON).digest()


def _hashes(keys: Collection[bytes]) -> Any:
    return packed_hashes(b"".join(chunk_hash(k) for k in keys))


class _Lookups(AsyncLookupManager):
    """vLLM's async lookup state machine; the probe is the pool's index."""

    def __init__(self, tier: "TuttiTierManager"):
        super().__init__(tier_type=tier.tier_type)
        self._tier = tier

    def batch_lookup(self, keys: list[OffloadKey], req_context: ReqContext) -> Iterable[bool]:
        return self._tier.present(keys)


class TuttiTierManager(SecondaryTierManager):
    """A secondary tier on tutti's pool (see the module docstring)."""

    medium: ClassVar[Medium] = Medium.STORAGE

    def __init__(
        self,
        offloading_spec: "OffloadingSpec",
        primary_kv_view: memoryview,
        tier_type: str = TIER_TYPE,
        backpressure_detector: "BackpressureDetector | None" = None,
        **kwargs: Any,
    ):
        super().__init__(offloading_spec, primary_kv_view, tier_type, backpressure_detector)
        locality = kwargs.get("locality")
        self.locality = Locality(locality) if locality is not None else None
        view = primary_kv_view
        if view.ndim < 1 or not view.contiguous or view.readonly:
            raise TierConfigError("tutti tier: the primary tier's KV view must be a writable contiguous buffer")
        self.num_chunks = int(view.shape[0])
        self.cfg: TierConfig = _config.parse(kwargs, offloading_spec, self.block_size_bytes)
        self.events: list[OffloadingEvent] | None = None
        if self.cfg.enable_kv_events:
            if offloading_spec.kv_events_config.enable_kv_cache_events:
                self.events = []
            else:
                log.warning("tutti tier: enable_kv_events is set but vLLM's KV cache events are off; no events")
        self._events_lock = threading.Lock()
        # Chunks this tier stored (when events are on), least recently used first: the eviction probe.
        self._stored: OrderedDict[OffloadKey, None] = OrderedDict()
        self._evictions_seen = 0
        self._load_keys: dict[JobId, list[OffloadKey]] = {}
        self.counters = {"chunks_stored": 0, "chunks_present": 0, "chunks_loaded": 0, "store_failed": 0,
                         "load_failed": 0, "unknown_outcome": 0}
        self._counters_lock = threading.Lock()
        self.rt: Runtime | None = None
        self._open(view)
        self._pool = IoPool(self.cfg.n_read_threads, self.cfg.n_write_threads, self._failed_result)
        self._touches: list[list[OffloadKey]] = []
        self._bg_cv = threading.Condition()
        self._bg_stop = False
        self._bg = threading.Thread(target=self._background, name="tutti_tier_touch", daemon=True)
        self._bg.start()
        self._lookups = _Lookups(self)

    # --- the pool and the registration ---------------------------------------------------

    def _open(self, view: memoryview) -> None:
        cfg, g = self.cfg, self.cfg.geometry
        arr = np.asarray(view)
        base = int(arr.ctypes.data)
        del arr  # no export of the view outlives this call: vLLM releases it at shutdown
        rt = shared.acquire(cfg.pool, shared.client_name("tier"), rank=(cfg.rank, 0))
        with _held_lock:
            held = id(rt) in _held
            _held.add(id(rt))
        if held:
            shared.release(cfg.pool, rt, rank=(cfg.rank, 0))
            raise TierConfigError(
                "tutti tier: another tutti tier of this process holds this pool; shut it down first, "
                "or share the pool through tuttid ('daemon_socket' or \"daemon\": \"auto\")"
            )
        try:
            SchedHooks.configure(rt, cfg.pool)
            obj = g.object_bytes
            k = [base + 2 * layer * obj for layer in range(g.layers)]
            v = [base + (2 * layer + 1) * obj for layer in range(g.layers)]
            rt.register_kv("strided", self.num_chunks, model=cfg.pool.model, k_bases=k, v_bases=v,
                           block_stride=self.block_size_bytes, tenant_salt=cfg.salt, keepalive=view)
        except (TuttiError, ValueError) as e:
            self._release(rt)
            raise TierConfigError(
                f"tutti tier: registering vLLM's primary tier ({self.num_chunks} chunks of {self.block_size_bytes} "
                f"bytes) with the pool ({shared.describe_pool(cfg.pool)}) failed: {e}"
            ) from e
        self.rt = rt
        self._evictions_seen = rt.stats().evictions
        log.info("tutti tier: %d primary chunks of %d bytes registered (model %r, %s)", self.num_chunks,
                 self.block_size_bytes, cfg.pool.model, g)

    def _ready(self) -> Runtime:
        if self.rt is None:
            raise RuntimeError("tutti tier: used after shutdown")
        return self.rt

    def present(self, keys: list[OffloadKey], touch: bool = True) -> list[bool]:
        """Per key, whether the pool holds its chunk (one index query per run of hits or misses,
        at most :data:`LOOKUP_WINDOW` keys each). With ``touch`` a hit counts as a use (a pinning
        lookup moves it to the recent end of tutti's LRU; the pin is released at once); without,
        the query leaves the LRU as it is (``tutti_kv_contains_identity``)."""
        rt = self._ready()
        hashes = [chunk_hash(k) for k in keys]
        out: list[bool] = []
        i = 0
        while i < len(hashes):
            window = hashes[i:i + LOOKUP_WINDOW]
            packed = packed_hashes(b"".join(window))
            if touch:
                # Only a pinning lookup counts as a use in tutti (an unpinned one is a query):
                # pin, then release at once.
                found = rt.lookup(packed, pin=True)
                hits = found.hits
                found.unpin()
            else:
                hits = rt.contains_identity(packed, model=self.cfg.pool.model, kind="strided",
                                            tenant_salt=self.cfg.salt)
            out += [True] * hits
            i += hits
            if hits < len(window):
                out.append(False)
                i += 1
        return out

    # --- SecondaryTierManager ------------------------------------------------------------

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        found = self._lookups.lookup(key, req_context)
        if found is None:
            return LookupResult.RETRY
        return LookupResult.HIT if found else LookupResult.MISS

    def _chunk_ids(self, job: TransferJob) -> list[int] | None:
        ids = [int(c) for c in np.asarray(job.chunk_ids).reshape(-1)]
        if len(ids) != len(job.keys) or any(not 0 <= c < self.num_chunks for c in ids):
            log.error("tutti tier: job %s has %d keys and chunk ids %s outside 0..%d or of another count",
                      job.job_id, len(job.keys), ids[:8], self.num_chunks - 1)
            return None
        return ids

    def submit_store(self, job_metadata: TransferJob) -> None:
        job = job_metadata
        keys = list(job.keys)
        ids = self._chunk_ids(job)
        self._pool.store(job.job_id, lambda: self._store(job.job_id, keys, ids))

    def submit_load(self, job_metadata: TransferJob) -> None:
        job = job_metadata
        keys = list(job.keys)
        ids = self._chunk_ids(job)
        self._load_keys[job.job_id] = keys
        self._pool.load(job.job_id, lambda: self._load(job.job_id, keys, ids))

    def get_finished_jobs(self) -> Iterable[JobResult]:
        results = []
        for res, failed in self._pool.finished():
            keys = self._load_keys.pop(res.job_id, None)
            if keys is not None and failed:
                self._lookups.mark_miss(failed)
            results.append(res)
        return results

    def has_pending_work(self) -> bool:
        return self._pool.pending()

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        if not keys:
            return
        with self._bg_cv:
            self._touches.append(list(keys))
            self._bg_cv.notify()

    def take_events(self) -> Iterable[OffloadingEvent]:
        if self.events is None:
            return ()
        with self._events_lock:
            out, self.events = self.events, []
        return out

    def on_request_finished(self, req_context: ReqContext) -> None:
        self._lookups.cleanup(req_context.req_id)

    def on_schedule_end(self, context: ScheduleEndContext) -> None:
        self._lookups.flush()

    def drain_jobs(self) -> None:
        # Each job ends by its own deadline (timeout_ms, then the executor recovers the drive),
        # so this wait is bounded; the margin covers jobs queued behind the running ones.
        bound = self.cfg.timeout_s * (1 + self._pool.in_flight)
        if not self._pool.wait_idle(bound):
            raise TimeoutError(f"tutti tier: jobs still running after {bound:.0f} s")

    def shutdown(self) -> None:
        if self.rt is None:
            return
        idle = self._pool.shutdown(self.cfg.timeout_s * (1 + self._pool.in_flight))
        with self._bg_cv:
            self._bg_stop = True
            self._bg_cv.notify()
        self._bg.join(timeout=self.cfg.timeout_s)
        self._lookups.shutdown()
        rt, self.rt = self.rt, None
        if not idle:
            # A job still holds primary memory: keep the registration (and its mappings) rather
            # than let the drives write into memory vLLM is about to unmap.
            log.error("tutti tier: jobs did not finish by shutdown; the pool stays open")
            return
        try:
            rt.unregister_kv()
        except TuttiError as e:
            log.warning("tutti tier: unregistering the primary tier: %s", e)
        self._release(rt)

    def _release(self, rt: Runtime) -> None:
        with _held_lock:
            _held.discard(id(rt))
        shared.release(self.cfg.pool, rt, rank=(self.cfg.rank, 0))

    # --- the jobs (on the I/O threads) ---------------------------------------------------

    def _failed_result(self, job_id: JobId, e: BaseException):
        keys = self._load_keys.get(job_id)
        return JobResult(job_id=job_id, success=False), list(keys or ())

    def _wait(self, job, what: str, n: int):
        try:
            return job.wait(self.cfg.timeout_s)
        except Timeout:
            log.warning("tutti tier: %s of %d chunks took over %.1f s; cancelled, every chunk failed", what, n,
                        self.cfg.timeout_s)
            job.cancel()
            return None

    def _count(self, **deltas: int) -> None:
        with self._counters_lock:
            for k, v in deltas.items():
                self.counters[k] += v

    def _store(self, job_id: JobId, keys: list[OffloadKey], ids: list[int] | None):
        t0 = time.monotonic()
        n = len(keys)
        if ids is None:
            return JobResult(job_id=job_id, success=False), []
        if n == 0:
            return JobResult(job_id=job_id, success=True, transfer_time=0.0, transfer_bytes=0), []
        rt = self._ready()
        ok = [False] * n
        present = 0
        try:
            with rt.begin_store(_hashes(keys), packed_u32(np.asarray(ids, dtype=np.uint32))) as st:
                with st.submit() as job:
                    status = self._wait(job, "store", n)
                if status is not None:
                    report = st.commit()
                    present = report.present
                    ok = [True] * n
                    for i in (*status.failed_blocks, *report.failed_blocks):
                        ok[i] = False
        except TuttiError as e:
            log.warning("tutti tier: storing %d chunks failed (not stored): %s", n, e)
        stored = [k for k, good in zip(keys, ok) if good]
        self._count(chunks_stored=len(stored) - present, chunks_present=present, store_failed=n - len(stored))
        if self.events is not None and stored:
            # Reported here, on the I/O thread, so a stored event always precedes the chunk's removal.
            self._emit(stored, removed=False)
            with self._events_lock:
                for k in stored:
                    self._stored[k] = None
                    self._stored.move_to_end(k)
            self._check_evictions()
        dt = time.monotonic() - t0
        res = JobResult(job_id=job_id, success=len(stored) == n, transfer_time=dt,
                        transfer_bytes=len(stored) * self.block_size_bytes)
        return res, []

    def _load(self, job_id: JobId, keys: list[OffloadKey], ids: list[int] | None):
        t0 = time.monotonic()
        n = len(keys)
        if ids is None:
            return JobResult(job_id=job_id, success=False), list(keys)
        if n == 0:
            return JobResult(job_id=job_id, success=True, transfer_time=0.0, transfer_bytes=0), []
        rt = self._ready()
        ok = [False] * n
        try:
            with rt.load(_hashes(keys), packed_u32(np.asarray(ids, dtype=np.uint32))) as job:
                status = self._wait(job, "load", n)
            if status is not None:
                ok = [True] * n
                for i in status.failed_blocks:
                    ok[i] = False
                if status.unknown_blocks:
                    self._count(unknown_outcome=len(status.unknown_blocks))
                    log.error("tutti tier: %d of %d chunks read with an unknown outcome (a command timed out and "
                              "the drive could not be recovered); they are failed, and the drive may still write "
                              "those primary chunks until the pool is reopened", len(status.unknown_blocks), n)
        except TuttiError as e:
            log.warning("tutti tier: loading %d chunks failed (misses): %s", n, e)
        good = [k for k, g in zip(keys, ok) if g]
        failed = [k for k, g in zip(keys, ok) if not g]
        self._count(chunks_loaded=len(good), load_failed=len(failed))
        dt = time.monotonic() - t0
        res = JobResult(job_id=job_id, success=not failed,
                        successful_keys=tuple(good) if failed and good else None,
                        transfer_time=dt, transfer_bytes=len(good) * self.block_size_bytes)
        return res, failed

    # --- LRU touches and eviction events (background thread) ------------------------------

    def _background(self) -> None:
        while True:
            with self._bg_cv:
                while not self._touches and not self._bg_stop:
                    self._bg_cv.wait()
                if self._bg_stop:
                    return
                batches, self._touches = self._touches, []
            for keys in batches:
                try:
                    self.present(keys)  # a pinning lookup moves a hit to the recent end of the LRU
                except (TuttiError, RuntimeError) as e:
                    log.warning("tutti tier: touching %d chunks failed: %s", len(keys), e)
                if self.events is not None:
                    with self._events_lock:
                        for k in keys:
                            if k in self._stored:
                                self._stored.move_to_end(k)

    def _check_evictions(self) -> None:
        """After a store: when the pool evicted chunks since the last check, probe the chunks this
        tier stored, least recently used first, and report the missing ones removed."""
        rt = self._ready()
        try:
            evictions = rt.stats().evictions
        except TuttiError:
            return
        with self._events_lock:
            new = evictions - self._evictions_seen
            self._evictions_seen = evictions
            if new <= 0 or not self._stored:
                return
            budget = max(EVICTION_PROBE_MIN, 4 * new)
            probe = [k for k, _ in zip(self._stored, range(budget))]
        try:
            found = self.present(probe, touch=False)  # probing must not reorder the LRU it probes
        except TuttiError:
            return
        gone = [k for k, f in zip(probe, found) if not f]
        if not gone:
            return
        with self._events_lock:
            for k in gone:
                self._stored.pop(k, None)
        self._emit(gone, removed=True)

    def _emit(self, keys: list[OffloadKey], removed: bool) -> None:
        with self._events_lock:
            if self.events is not None:
                self.events.append(OffloadingEvent(keys=list(keys), medium=self.medium, removed=removed,
                                                   locality=self.locality))

    def stats(self) -> dict:
        with self._counters_lock:
            out = dict(self.counters)
        if self.rt is not None:
            try:
                out["runtime"] = vars(self.rt.stats())
            except TuttiError:
                pass
        return out
