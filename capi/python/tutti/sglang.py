"""``tutti.sglang.TuttiHiCacheStorage``: an SGLang HiCache storage backend (L3) on tutti.

SGLang's hierarchical cache keeps KV on the GPU (L1), in a host-memory pool (L2) and in a
storage backend (L3). This backend keeps L3 on NVMe drives (or emulated ones) through
libtutti: the host pool is registered with tutti once, with its real layout, and pages
move between it and the drives by DMA, one call per batch, with no staging copy.

Load it with SGLang's ``dynamic`` factory::

    python -m sglang.launch_server ... --enable-hierarchical-cache \\
        --hicache-mem-layout page_first --hicache-storage-backend dynamic \\
        --hicache-storage-backend-extra-config '{"backend_name": "tutti",
            "module_path": "tutti.sglang", "class_name": "TuttiHiCacheStorage",
            "interface_v1": 1, "emulated_drives": 2, "emulated_dir": "/tmp/tutti-sglang"}'

(keys: :mod:`tutti._hicache.config`). What each call does:

- ``register_mem_pool_host(pool)``: derives the pool's registration (:mod:`tutti._hicache.layout`;
  MHA in ``layer_first``, ``page_first``, ``page_first_direct``, ``page_head``; MLA in
  ``layer_first``, ``page_first``, ``page_first_direct``, :mod:`tutti._hicache.mla`), opens the
  pool (in this process, or as a client of tuttid) and registers the pool's memory under a
  cache identity of model name, SGLang layout, dtype, TP/PP/CP rank and tenant salt, so no
  rank or layout ever reads another's bytes. An MLA pool's latents are the same on every TP
  rank: its identity leaves the TP rank out, SGLang's controller writes from its one storage
  writer (TP rank 0), a store of a page already stored (or being stored) by another rank is a
  counted no-op (``pages_present``), and every rank loads. Registering the same host pool again
  keeps the runtime, and so everything stored (a RAM pool's pages too).
- ``batch_exists(keys)``: the leading run of keys stored; the run is pinned until the get
  that follows it (:mod:`tutti._hicache.pins`). Under the break-even rule (``load_policy``,
  :mod:`tutti._connector.breakeven`) only the part of the run expected to load faster than
  SGLang recomputes it is reported: load time from the reads this backend timed (and the reads
  and writes in flight), recompute time from ``prefill_s_per_token`` or ``slack_table`` — a
  storage backend sees no forward pass, so nothing here learns SGLang's prefill rate, and
  without either key every hit is reported.
- ``batch_get_v1`` / ``batch_set_v1(keys, host_indices)``: one tutti load job, or one store
  session, for the whole batch; ``host_indices[i * page_size]`` is page ``i``.
- ``get``/``batch_get``/``set``/``batch_set`` (SGLang's generic path, page tensors): borrow free
  pages of the host pool, go through the zero-copy path, copy the page tensors in or out.

Failures are misses, never stale bytes: a page whose read failed, timed out or was not
found is ``False`` (SGLang uses the leading run of ``True`` and recomputes the rest); a page
whose write failed is ``False`` and never becomes visible. A drive that times out is
recovered by the gio executor before the job ends (the ``direct`` executor, which cannot,
is refused). Keys that are not strings, host indices that are not whole pages of the pool,
and pools tutti cannot address raise errors that say so. So do what tutti does not do:
SGLang's head split across TP sizes (``tp_lcm_size`` with ``page_head``, refused when the
backend is built) and ``set``/``get`` by raw host address (``target_location`` with
``target_sizes``, refused at the call, :class:`UnsupportedCall`).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, List, Optional

try:
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorage, HiCacheStorageConfig
except ImportError as e:  # pragma: no cover - only without SGLang
    raise ImportError(
        f"tutti.sglang is an SGLang HiCache storage backend and needs the sglang package ({e}); "
        "scripts/setup-sglang installs the tested version"
    ) from e

from ._connector import shared
from ._connector.breakeven import BreakEven, Observations, slack_prior
from ._hicache import config as _config
from ._hicache.config import ConfigError
from ._hicache.keys import KeyTypeError, key_hashes
from ._hicache.layout import PageIndexError, PoolLayout, UnsupportedPool, from_host_pool, is_mla_pool
from ._hicache.mla import from_mla_host_pool
from ._hicache.pins import PinBook
from .errors import PoolError, Timeout, TuttiError
from .runtime import Runtime, packed_hashes

__all__ = [
    "TuttiHiCacheStorage",
    "ConfigError",
    "KeyTypeError",
    "PageIndexError",
    "UnsupportedPool",
    "UnsupportedCall",
    "NotRegisteredError",
]

log = logging.getLogger("tutti.sglang")


class NotRegisteredError(RuntimeError):
    """A data call came before ``register_mem_pool_host``."""


class UnsupportedCall(TypeError):
    """A call form this backend does not serve (``set``/``get`` by raw host address)."""


RAW_ADDRESS_HINT = (
    "pass page tensors (HostKVCache.get_data_page(i, flat=True)) or set 'interface_v1': 1 for the zero-copy "
    "batch_get_v1/batch_set_v1, which take host pool indices"
)


def _refuse_raw(call: str, locations, sizes) -> None:
    """Host pointers with byte counts (Mooncake-style ``target_location``/``target_sizes``) are refused."""
    items = list(locations) if isinstance(locations, (list, tuple)) else [locations]
    if sizes is not None or any(t is not None and not hasattr(t, "data_ptr") for t in items):
        raise UnsupportedCall(
            f"tutti.sglang: {call} by raw host address (target_location(s) {locations!r:.80} with target_sizes "
            f"{sizes!r:.80}) is not supported; {RAW_ADDRESS_HINT}"
        )


class _PerToken:
    """A fixed prefill cost per token (``prefill_s_per_token``) as the break-even rule's recompute estimate."""

    def __init__(self, s_per_token: float):
        self.s_per_token = s_per_token

    def recompute_s(self, tokens: int, before: int, after: int) -> float:
        return tokens * self.s_per_token


@dataclass
class _Counters:
    pages_set: int = 0
    pages_present: int = 0
    pages_got: int = 0
    set_failed: int = 0
    get_failed: int = 0
    bytes_set: int = 0
    bytes_got: int = 0
    lookups: int = 0
    lookup_hits: int = 0
    unknown_outcome: int = 0
    borrow_failed: int = 0
    # SGLang's StorageMetrics since the last get_stats(): pages per call and GB/s per call
    # (kept only with --enable-storage-metrics, when SGLang collects them; at most METRICS_CAP).
    prefetch_pgs: list = field(default_factory=list)
    backup_pgs: list = field(default_factory=list)
    prefetch_bandwidth: list = field(default_factory=list)
    backup_bandwidth: list = field(default_factory=list)


# Runtimes registered by a backend of this process: a second backend on the same pool and
# rank would replace the first one's registration under it.
_held: set[int] = set()
_held_lock = threading.Lock()
# Entries of each StorageMetrics list kept between two get_stats() calls.
METRICS_CAP = 10_000


class TuttiHiCacheStorage(HiCacheStorage):
    """SGLang HiCache L3 on tutti (see the module docstring)."""

    def __init__(self, storage_config: HiCacheStorageConfig, kwargs: Optional[dict] = None):
        self.storage_config = storage_config
        sc = storage_config
        self.cfg = _config.parse(sc.extra_config, tp_size=int(sc.tp_size), pp_size=int(sc.pp_size))
        if getattr(sc, "should_split_heads", False):
            raise ConfigError(
                f"tutti.sglang: SGLang asks for pages split by head group (tp_lcm_size={sc.tp_lcm_size} with "
                f"--hicache-mem-layout page_head at TP {sc.tp_size}) so that other TP sizes share them; tutti does "
                "not split pages: it keys each rank's pages under its own TP size. Drop 'tp_lcm_size' from "
                f"{_config.WHERE} (pages are then shared only at the same TP size)"
            )
        # SGLang's "rank replicated" KV (MLA): the same bytes on every TP rank.
        self.replicated = bool(sc.is_mla_model)
        self.model = self.cfg.model or sc.model_name
        if not self.model:
            raise ConfigError(
                f"tutti.sglang: SGLang gave no model name for the cache identity; set {_config.WHERE}['model']"
            )
        self.ranks = {
            "tp": f"{sc.tp_rank}/{sc.tp_size}",
            "pp": f"{sc.pp_rank}/{sc.pp_size}",
            "cp": f"{sc.attn_cp_rank}/{sc.attn_cp_size}",
        }
        self.rank = (int(sc.tp_rank), int(sc.pp_rank))
        # Through tuttid every backend instance is a client of its own (its own registration);
        # in process, backends share the runtime of a pool, so one per pool and rank.
        self._client_key = self.rank + ((id(self),) if self.cfg.daemon != "off" else ())
        self.rt: Optional[Runtime] = None
        self.layout: Optional[PoolLayout] = None
        self.mem_pool_host = None
        self._runtime_cfg = None
        self._pins: Optional[PinBook] = None
        self._lock = threading.Lock()
        self.counters = _Counters()
        self._metrics = bool(getattr(sc, "enable_storage_metrics", False))
        self._counters_lock = threading.Lock()
        # The break-even rule (made at registration, when a page's size is known), and the bytes
        # being read and written now: the backlog a new read waits behind.
        self.rule: Optional[BreakEven] = None
        self._rule_lock = threading.Lock()
        self._in_flight = 0

    # --- registration ---------------------------------------------------------------------

    def register_mem_pool_host(self, mem_pool_host) -> None:
        layout = from_mla_host_pool(mem_pool_host) if is_mla_pool(mem_pool_host) else from_host_pool(mem_pool_host)
        if layout.latent != self.replicated:
            log.warning("tutti.sglang: SGLang says is_mla_model=%s but the host pool is %s; the pool decides",
                        self.replicated, "MLA" if layout.latent else "MHA")
        salt = _config.identity_salt(self.cfg, layout.name, layout.torch_dtype, self.ranks, latent=layout.latent)
        rcfg = self.cfg.runtime_config(layout.geometry, self.model)
        with self._lock:
            if self.rt is not None and rcfg == self._runtime_cfg:
                # The same pool again (SGLang re-attaching): keep the runtime, and with it every
                # page stored (a RAM pool's too); only the registration is made anew.
                rt = self._unregister_locked()
            else:
                self._close_locked()
                rt = self._open(rcfg, layout)
            try:
                rt.register_kv(
                    "strided", layout.num_blocks, model=self.model, k_bases=layout.k_bases,
                    v_bases=layout.v_bases, block_stride=layout.block_stride, tenant_salt=salt,
                    keepalive=mem_pool_host.kv_buffer,
                )
            except TuttiError as e:
                self._release(rcfg, rt)
                raise UnsupportedPool(f"tutti.sglang: registering SGLang's host pool ({layout.describe()}) failed: {e}") from e
            self.rt, self.layout, self._runtime_cfg = rt, layout, rcfg
            self._pins = PinBook(rt.unpin, self.cfg.pin_ttl_s)
            prior = (_PerToken(self.cfg.prefill_s_per_token) if self.cfg.prefill_s_per_token > 0
                     else slack_prior(self.cfg.slack_table, layout.geometry.layers))
            self.rule = BreakEven(self.cfg.load_policy, layout.page_bytes, layout.page_size, prior=prior)
            if self.cfg.load_policy == "breakeven" and prior is None:
                log.info("tutti.sglang: no 'prefill_s_per_token' or 'slack_table': the break-even rule has no "
                         "recompute estimate and every hit is reported")
        super().register_mem_pool_host(mem_pool_host)
        log.info("tutti.sglang: rank %s registered %s (model %r)", self.ranks, layout.describe(), self.model)

    def _open(self, rcfg, layout: PoolLayout) -> Runtime:
        name = f"sglang-tp{self.rank[0]}-pp{self.rank[1]}"
        try:
            rt = shared.acquire(rcfg, name, rank=self._client_key)
        except (TuttiError, ValueError) as e:
            g = layout.geometry
            hint = ""
            if isinstance(e, PoolError) and "geometry" in str(e):
                hint = (
                    " A pool (or tuttid) formatted for another geometry refuses this one; a tuttid for this pool is "
                    f"`tutti serve ... --layers {g.layers} --kv-heads {g.kv_heads} --head-dim {g.head_dim} "
                    f"--block-tokens {g.tokens_per_block} --dtype {g.dtype}`"
                )
            raise ConfigError(
                f"tutti.sglang: opening the pool for SGLang's host pool ({layout.describe()}) failed: {e}.{hint}"
            ) from e
        with _held_lock:
            if id(rt) in _held:
                shared.release(rcfg, rt, rank=self._client_key)
                raise ConfigError(
                    f"tutti.sglang: another TuttiHiCacheStorage of this process holds this pool for rank {self.ranks}; "
                    "close it first, or let each be a client of tuttid ('daemon': 'auto' or 'daemon_socket')"
                )
            _held.add(id(rt))
        return rt

    def _release(self, rcfg, rt: Runtime) -> None:
        with _held_lock:
            _held.discard(id(rt))
        shared.release(rcfg, rt, rank=self._client_key)

    def _unregister_locked(self) -> Runtime:
        """Drops pins and the registration; the runtime (and the pool it holds) stays open."""
        rt, pins = self.rt, self._pins
        assert rt is not None
        self.rt, self._pins = None, None
        if pins is not None:
            pins.release_all()
        try:
            rt.unregister_kv()
        except TuttiError as e:
            log.warning("tutti.sglang: unregistering the host pool: %s", e)
        return rt

    def _close_locked(self) -> None:
        if self.rt is None:
            return
        rcfg = self._runtime_cfg
        self._release(rcfg, self._unregister_locked())

    def close(self) -> None:
        """Releases pins, the registration and this rank's runtime (SGLang calls it at detach)."""
        with self._lock:
            self._close_locked()

    def _ready(self) -> tuple[Runtime, PoolLayout, PinBook]:
        rt, layout, pins = self.rt, self.layout, self._pins
        if rt is None or layout is None or pins is None:
            raise NotRegisteredError(
                "tutti.sglang: no host pool registered; SGLang calls register_mem_pool_host before any data call"
            )
        return rt, layout, pins

    # --- lookups --------------------------------------------------------------------------

    def batch_exists(self, keys: List[str], extra_info: Any = None) -> int:
        """The number of leading ``keys`` stored, pinned until the get of the same run."""
        hashes = key_hashes(keys)
        if not hashes:
            return 0
        rt, _, pins = self._ready()
        try:
            hit = rt.lookup(packed_hashes(hashes), pin=True)
        except TuttiError as e:
            log.warning("tutti.sglang: lookup of %d keys failed (a miss): %s", len(keys), e)
            return 0
        reported = hit.hits
        if reported and self.rule is not None:
            with self._rule_lock:
                reported = self.rule.decide(0, hit.hits, hit.hits * self.rule.B, self._in_flight)
        if reported:
            pins.add(keys[0], hit.pin)
        elif hit.pin:
            hit.unpin()
        with self._counters_lock:
            self.counters.lookups += 1
            self.counters.lookup_hits += hit.hits
        return reported

    def _moving(self, nbytes: int) -> None:
        with self._rule_lock:
            self._in_flight += nbytes

    def exists(self, key: str) -> bool:
        hashes = key_hashes([key])
        rt, _, _ = self._ready()
        try:
            return rt.lookup(packed_hashes(hashes), pin=False).hits == 1
        except TuttiError as e:
            log.warning("tutti.sglang: lookup failed (a miss): %s", e)
            return False

    # --- the zero-copy path ---------------------------------------------------------------

    def batch_get_v1(self, keys: List[str], host_indices, extra_info: Any = None) -> List[bool]:
        """Reads page ``keys[i]`` into the host pool at ``host_indices[i * page_size]``; one load job."""
        hashes = key_hashes(keys)
        n = len(keys)
        if n == 0:
            return []
        rt, layout, pins = self._ready()
        ids = layout.block_ids(host_indices, n)
        t0 = time.perf_counter()
        ok = [False] * n
        self._moving(n * layout.page_bytes)
        try:
            with rt.load(packed_hashes(hashes), ids) as job:
                status = self._wait(job, "read", n)
            if status is not None:
                ok = [True] * n
                for i in status.failed_blocks:
                    ok[i] = False
                if status.unknown_blocks:
                    self._unknown(status.unknown_blocks, n)
        except TuttiError as e:
            log.warning("tutti.sglang: reading %d pages failed (misses): %s", n, e)
        finally:
            self._moving(-n * layout.page_bytes)
            pins.release_run(keys[0])
        secs = time.perf_counter() - t0
        if all(ok) and self.rule is not None:
            with self._rule_lock:
                self.rule.observe(Observations(loads=[(n * layout.page_bytes, secs, True)]))
        self._count("get", ok, layout, secs)
        return ok

    def batch_set_v1(self, keys: List[str], host_indices, extra_info: Any = None) -> List[bool]:
        """Writes the host pool's pages at ``host_indices[i * page_size]`` as ``keys[i]``; one store
        session, visible to lookups once durable. Pages already stored count as written."""
        hashes = key_hashes(keys)
        n = len(keys)
        if n == 0:
            return []
        rt, layout, _ = self._ready()
        ids = layout.block_ids(host_indices, n)
        t0 = time.perf_counter()
        ok = [False] * n
        present = 0
        self._moving(n * layout.page_bytes)
        try:
            with rt.begin_store(packed_hashes(hashes), ids) as st:
                with st.submit() as job:
                    status = self._wait(job, "write", n)
                if status is not None:
                    report = st.commit()
                    present = report.present
                    ok = [True] * n
                    for i in (*status.failed_blocks, *report.failed_blocks):
                        ok[i] = False
        except TuttiError as e:
            log.warning("tutti.sglang: writing %d pages failed (not stored): %s", n, e)
        finally:
            self._moving(-n * layout.page_bytes)
        with self._counters_lock:
            self.counters.pages_present += present
        self._count("set", ok, layout, time.perf_counter() - t0)
        return ok

    def _wait(self, job, what: str, n: int):
        """The job's final status, or None when it did not finish in time (every page a miss)."""
        try:
            return job.wait(self.cfg.timeout_s)
        except Timeout:
            log.warning(
                "tutti.sglang: %s of %d pages took over %.1f s; cancelled, every page of the batch is a miss",
                what, n, self.cfg.timeout_s,
            )
            job.cancel()
            return None

    def _unknown(self, blocks: list[int], n: int) -> None:
        with self._counters_lock:
            self.counters.unknown_outcome += len(blocks)
        log.error(
            "tutti.sglang: %d of %d pages read with an unknown outcome (a command timed out and the drive could not "
            "be recovered): the drive may still write those host pages until the pool is reopened", len(blocks), n,
        )

    def _count(self, op: str, ok: list[bool], layout: PoolLayout, secs: float) -> None:
        good = sum(ok)
        nbytes = good * layout.page_bytes
        with self._counters_lock:
            c = self.counters
            if op == "get":
                c.pages_got += good
                c.get_failed += len(ok) - good
                c.bytes_got += nbytes
                pgs, bw = c.prefetch_pgs, c.prefetch_bandwidth
            else:
                c.pages_set += good
                c.set_failed += len(ok) - good
                c.bytes_set += nbytes
                pgs, bw = c.backup_pgs, c.backup_bandwidth
            if self._metrics and len(pgs) < METRICS_CAP:
                pgs.append(len(ok))
                bw.append(nbytes / secs / 1e9 if secs > 0 else 0.0)

    # --- SGLang's generic path: page tensors -----------------------------------------------

    def _borrow(self, n: int):
        """``n`` free pages of the host pool (their token indices) to move page tensors through."""
        pool, layout = self.mem_pool_host, self._ready()[1]
        idx = pool.alloc(n * layout.page_size)
        if idx is None:
            with self._counters_lock:
                self.counters.borrow_failed += 1
            log.warning(
                "tutti.sglang: no %d free host pages to move page tensors through; the call is a miss "
                "(interface_v1 avoids this)", n,
            )
        return idx

    def _check_page_tensor(self, i: int, t) -> None:
        layout = self._ready()[1]
        nbytes = t.numel() * t.element_size() if hasattr(t, "numel") else None
        if nbytes != layout.page_bytes or str(getattr(t, "dtype", None)) != layout.torch_dtype:
            raise PageIndexError(
                f"tutti.sglang: page tensor {i} is {getattr(t, 'dtype', type(t).__name__)} of {nbytes} bytes; a page "
                f"of this pool is {layout.torch_dtype} of {layout.page_bytes} bytes (its flat data page)"
            )

    def batch_set(self, keys: List[str], values: Optional[Any] = None, target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None) -> bool:
        """Stores flat data pages (``HostKVCache.get_data_page(i, flat=True)``) under ``keys``."""
        if target_locations is not None or target_sizes is not None:
            _refuse_raw("batch_set", target_locations, target_sizes)
        key_hashes(keys)
        values = list(values or [])
        if len(values) != len(keys):
            raise PageIndexError(f"tutti.sglang: {len(keys)} keys but {len(values)} page tensors")
        if not keys:
            return True
        for i, v in enumerate(values):
            self._check_page_tensor(i, v)
        pool, ps = self.mem_pool_host, self._ready()[1].page_size
        idx = self._borrow(len(keys))
        if idx is None:
            return False
        try:
            for i, v in enumerate(values):
                pool.set_from_flat_data_page(int(idx[i * ps]), v)
            return all(self.batch_set_v1(keys, idx))
        finally:
            pool.free(idx)

    def set(self, key: str, value: Optional[Any] = None, target_location: Optional[Any] = None,
            target_sizes: Optional[Any] = None) -> bool:
        if target_location is not None or target_sizes is not None:
            _refuse_raw("set", target_location, target_sizes)
        return self.batch_set([key], [value])

    def batch_get(self, keys: List[str], target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None) -> List[Any]:
        """Flat data pages of ``keys`` (``None`` for a miss), into ``target_locations[i]`` when given."""
        if target_locations is not None or target_sizes is not None:
            _refuse_raw("batch_get", target_locations, target_sizes)
        key_hashes(keys)
        n = len(keys)
        targets = list(target_locations) if target_locations is not None else [None] * n
        if len(targets) != n:
            raise PageIndexError(f"tutti.sglang: {n} keys but {len(targets)} target tensors")
        if n == 0:
            return []
        for i, t in enumerate(targets):
            if t is not None:
                self._check_page_tensor(i, t)
        pool, ps = self.mem_pool_host, self._ready()[1].page_size
        idx = self._borrow(n)
        if idx is None:
            return [None] * n
        try:
            ok = self.batch_get_v1(keys, idx)
            out: list = []
            for i in range(n):
                if not ok[i]:
                    out.append(None)
                    continue
                page = pool.get_data_page(int(idx[i * ps]), flat=True)
                if targets[i] is None:
                    out.append(page.clone())
                else:
                    targets[i].view(-1).copy_(page.view(-1))
                    out.append(targets[i])
            return out
        finally:
            pool.free(idx)

    def get(self, key: str, target_location: Optional[Any] = None, target_sizes: Optional[Any] = None):
        if target_sizes is not None:
            _refuse_raw("get", target_location, target_sizes)
        return self.batch_get([key], [target_location])[0]

    # --- housekeeping ---------------------------------------------------------------------

    def clear(self) -> None:
        """Releases this backend's pins. tutti's C ABI has no delete: stored pages stay in the pool
        (still valid under their identity) until evicted for space."""
        pins = self._pins
        if pins is not None:
            pins.release_all()
        log.warning("tutti.sglang: clear() released pins; stored pages stay in the pool until evicted")

    def pins_held(self) -> int:
        return len(self._pins) if self._pins is not None else 0

    def stats(self) -> dict:
        """This backend's counters and tutti's runtime counters."""
        with self._counters_lock:
            c = {k: v for k, v in vars(self.counters).items() if not isinstance(v, list)}
        c["pins_held"] = self.pins_held()
        c["pins_expired"] = self._pins.expired if self._pins is not None else 0
        if self.rule is not None:
            with self._rule_lock:
                c.update(self.rule.counters)  # since registration (the break-even rule's match_*)
                c.update(self.rule.gauges)
        if self.rt is not None:
            try:
                c["runtime"] = vars(self.rt.stats())
            except TuttiError:
                pass
        return c

    def get_stats(self):
        """SGLang's ``StorageMetrics`` since the last call (pages per call, GB/s per call; collected only
        when SGLang runs with ``--enable-storage-metrics``, the only time it asks)."""
        try:
            from sglang.srt.observability.metrics_collector import StorageMetrics
        except ImportError:
            return None
        with self._counters_lock:
            c = self.counters
            m = StorageMetrics(
                prefetch_pgs=c.prefetch_pgs, backup_pgs=c.backup_pgs,
                prefetch_bandwidth=c.prefetch_bandwidth, backup_bandwidth=c.backup_bandwidth,
            )
            c.prefetch_pgs, c.backup_pgs, c.prefetch_bandwidth, c.backup_bandwidth = [], [], [], []
        return m
