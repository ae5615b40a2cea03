"""The scheduler-side half: which prefix tutti can supply, and each step's load/save plan.

Per request, from the first time vLLM asks about it until it finishes:

* ``matched`` — the keys of the request's full blocks (its tokens chained under
  its identity: cache salt, LoRA adapter, multimodal items, prompt embeddings;
  :mod:`.keys`) are looked up once (and pinned, so the chunks survive until
  they are loaded); repeated questions while the request waits for memory
  return the same answer without pinning again, and a request asked about
  after it was scheduled (preempted, to be resumed) is looked up afresh. The answer never covers the last prompt token
  (vLLM must compute at least one token to get logits), and is counted in
  whole blocks. The break-even rule (``breakeven.py``) then keeps only the
  longest part of the hit that is expected to load faster than it computes.
* ``allocated`` — once vLLM found blocks for the request, the hit blocks
  beyond vLLM's own prefix cache are planned for loading into them.
* ``plan`` — each step: the planned loads, and for every scheduled request
  the prompt blocks completed by this step that tutti does not hold yet.
* ``finished`` — the pin is released.

With vLLM's hybrid allocator (several KV-cache groups, :mod:`.groups`) each group has its own
keys and block table, and every step above is done per group: a hit of ``n`` blocks needs the
first ``n`` blocks of every full-attention group and, of every sliding-window group, the blocks
its window needs at ``n`` (the longest such ``n`` is reported, and the break-even rule's answer
is lowered to one); loads and saves name their group, and move only the blocks vLLM holds (a
sliding-window group's table has vLLM's null block where the window has passed). vLLM maps a
failed block id back to its request only with one group, so hybrid loads are vLLM's asynchronous
ones: the request waits outside the batch until the worker reports its loads done (within the
step they are planned in), or failed — vLLM then recomputes it and tutti reports no hit for it
again.

Saves finish inside the step that scheduled them (the worker waits for them
in ``wait_for_save``), so vLLM may free a finished request's blocks at once —
unless saves are deferred: then the saves of a step finish at the start of
the next step, and a request that finishes with saves in the latest step is
held (``request_finished`` returns True) until the worker reports it from
``get_finished`` one step later.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from ..errors import NotRegistered, TuttiError
from ..runtime import Runtime
from .breakeven import BreakEven, Observations
from .groups import NULL_BLOCK, SLIDING, Groups
from .keys import Unkeyable, request_hashes
from .metadata import LoadSpec, SaveSpec, StepPlan

if TYPE_CHECKING:  # vLLM's types, for type checkers only: no import of vLLM at run time
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.request import Request

log = logging.getLogger("vllm.tutti")


@dataclass
class RequestState:
    req_id: str
    hashes: list[bytes]  # chained hashes of the request's full blocks when first looked up
    tokens: int  # tokens the request had then (the prompt, or more after a preemption)
    hits: int = 0  # leading blocks tutti holds
    pin: int = 0
    local_tokens: int = 0  # tokens vLLM's own prefix cache supplied
    block_ids: list[int] = field(default_factory=list)
    saved_blocks: int = 0  # leading blocks stored or planned for storing
    pending_load: LoadSpec | None = None
    remote_from: int | None = None  # blocks from this index on come from the cluster tier
    decided: tuple[int, int] | None = None  # (blocks vLLM's cache held, blocks reported) of the decision
    scheduled: bool = False  # vLLM has scheduled it: asked again, it was preempted and waits to resume
    # Hybrid KV cache (several groups) only: each group's keys and block table (``hashes`` and
    # ``block_ids`` are group 0's), pins past the first, and which keys of each sliding-window
    # group the pool holds (by block index, up to the full groups' hit).
    keys: list[list[bytes]] = field(default_factory=list)
    tables: list[list[int]] = field(default_factory=list)
    more_pins: list[int] = field(default_factory=list)
    present: dict[int, list[bool]] = field(default_factory=dict)
    pending_loads: list[LoadSpec] = field(default_factory=list)


def _token_ids(request: Request) -> list[int]:
    toks = getattr(request, "all_token_ids", None)
    if toks is None:
        toks = request.prompt_token_ids
    return list(toks)


def _first_group(block_ids: Any) -> list[int]:
    """vLLM gives block ids per KV-cache group (a tuple of lists); with one group, its list."""
    if block_ids is None:
        return []
    if len(block_ids) and isinstance(block_ids[0], (list, tuple)):
        return list(block_ids[0])
    return list(block_ids)


def _per_group(block_ids: Any, groups: int) -> list[list[int]]:
    """vLLM's block ids of every KV-cache group (a tuple of lists, or None: no new blocks)."""
    if block_ids is None:
        return [[] for _ in range(groups)]
    if len(block_ids) != groups:
        raise ValueError(f"vLLM gave block ids of {len(block_ids)} KV-cache groups; the config has {groups}")
    return [list(ids) for ids in block_ids]


class SchedulerSide:
    """``identities`` (with a daemon): returns every rank's (model, salt, layout kind); the answer
    is then the prefix all ``ranks`` hold, asked under each identity without pinning — each
    worker pins what it loads, and reports a chunk evicted in between as a load error.

    ``remote`` (the cluster tier): given the hashes past the local hit, returns how many leading
    ones the tier holds; those extend the hit and are loaded from the tier (the break-even rule
    counts them at the local drives' rates).

    ``rule``: the break-even rule (None reports every hit)."""

    def __init__(self, runtime: Runtime, tokens_per_block: int, deferred_saves: bool = False,
                 identities: Callable[[], list[tuple[str, bytes, str]]] | None = None, ranks: int = 1,
                 remote: Callable[[list[bytes]], int] | None = None, rule: BreakEven | None = None,
                 groups: Groups | None = None):
        """``groups``: the KV-cache groups of a hybrid model (None: one group, every block)."""
        if groups is not None and remote is not None:
            raise ValueError("the cluster tier serves one KV-cache group; this KV cache has several")
        self.groups = groups
        self.rt = runtime
        self.rule = rule
        self.step = 0  # plans built so far; each plan carries its number to the workers
        self._pass_bytes = 0  # loads granted since the last plan: they share the next step's reads
        self._unacked: list[tuple[int, int]] = []  # (plan, load bytes) of steps no worker reported yet
        self.remote = remote
        self.identities = identities
        self.ranks = ranks
        self._warned_ranks = False
        self.B = tokens_per_block
        self.deferred = deferred_saves
        self._saved_last_step: set[str] = set()
        self.requests: dict[str, RequestState] = {}
        self._warned_unregistered = False

    def _unpin(self, st: RequestState) -> None:
        pins = ([st.pin] if st.pin else []) + [p for p in st.more_pins if p]
        st.pin, st.more_pins = 0, []
        for pin in pins:
            try:
                self.rt.unpin(pin)
            except TuttiError as e:
                log.warning("tutti: unpinning request %s's chunks failed: %s", st.req_id, e)

    # --- get_num_new_matched_tokens ------------------------------------------------------

    def matched(self, request: Request, num_computed_tokens: int) -> tuple[int, bool]:
        req_id = request.request_id
        st = self.requests.get(req_id)
        tokens = _token_ids(request)
        if st is None or st.tokens != len(tokens) or st.scheduled:
            table: list[int] = []
            if st is not None:
                # Preempted (vLLM freed its blocks) and asked about again, perhaps with more tokens:
                # look up afresh; what it stored before it was preempted may now be hits. The block
                # table follows the scheduler output alone, where a resumed request's is given anew.
                self._unpin(st)
                table = st.block_ids
            if self.groups is not None:
                st = self._hybrid_state(request, tokens, st)
            else:
                st = RequestState(req_id, self._keys(request, tokens), len(tokens), block_ids=table)
            self.requests[req_id] = st
            # Never all tokens: the last one must be computed for its logits.
            usable = (len(tokens) - 1) // self.B
            try:
                if self.groups is not None:
                    st.hits = self._hybrid_hits(st, usable)
                elif self.identities is not None:
                    st.hits = self._all_ranks_hold(st.hashes[:usable])
                else:
                    found = self.rt.lookup(st.hashes[:usable], pin=True)
                    st.hits, st.pin = found.hits, found.pin
            except NotRegistered:
                if not self._warned_unregistered:
                    log.warning("tutti: no KV memory registered yet; reporting no cached prefix")
                    self._warned_unregistered = True
            except TuttiError as e:
                log.warning("tutti: lookup for request %s failed, treating as a miss: %s", req_id, e)
            if self.remote is not None and st.hits < usable:
                st.remote_from = st.hits
                st.hits += max(0, min(usable - st.hits, self.remote(st.hashes[st.hits:usable])))
            st.saved_blocks = st.hits
        st.local_tokens = num_computed_tokens
        if num_computed_tokens % self.B:
            return 0, False
        first = num_computed_tokens // self.B
        if st.decided is None or st.decided[0] != first:
            reported = st.hits
            if self.rule is not None and st.hits > first:
                reported = self.rule.decide(first, st.hits, st.tokens, self._backlog_bytes())
                while self.groups is not None and reported > first and not self._window_held(st, reported):
                    reported -= 1  # a hit must end where every sliding window's blocks are held
            st.decided = (first, reported)
        tokens = max(0, st.decided[1] * self.B - num_computed_tokens)
        return tokens, self.groups is not None and tokens > 0

    def _keys(self, request: Request, tokens: list[int], group: tuple | None = None) -> list[bytes]:
        """The request's block keys under its identity (:mod:`.keys`) and, with several KV-cache
        groups, the group's facts; none (no lookup, no store) when a fact of its identity cannot be
        encoded."""
        try:
            return request_hashes(request, tokens, self.B, group)
        except Unkeyable as e:
            log.warning("tutti: request %s is not cached by tutti (no lookup, no store): its identity holds "
                        "a %s, which tutti cannot key deterministically", request.request_id, e)
            return []

    # --- hybrid KV caches (several groups) ---------------------------------------------------

    def _hybrid_state(self, request: Request, tokens: list[int], old: RequestState | None) -> RequestState:
        assert self.groups is not None
        keys = [self._keys(request, tokens, g.facts()) for g in self.groups.groups]
        if not all(keys):
            keys = [[] for _ in keys]  # unkeyable (warned once per group): nothing is looked up or stored
        tables = old.tables if old is not None else [[] for _ in keys]
        return RequestState(request.request_id, keys[0], len(tokens), block_ids=tables[0], keys=keys, tables=tables)

    def _leading(self, st: RequestState, hashes: list[bytes]) -> int:
        """How many leading ``hashes`` the pool holds (for every rank, with a daemon); pinned
        until the request is done with them, without a daemon."""
        if not hashes:
            return 0
        if self.identities is not None:
            return self._all_ranks_hold(hashes)
        found = self.rt.lookup(hashes, pin=True)
        if st.pin:
            st.more_pins.append(found.pin)
        else:
            st.pin = found.pin
        return found.hits

    def _hybrid_hits(self, st: RequestState, usable: int) -> int:
        """The longest hit of at most ``usable`` blocks every group can serve: the full-attention
        groups' leading blocks, and each sliding-window group's blocks inside its window."""
        assert self.groups is not None
        n = min(usable, len(st.hashes))
        for g in self.groups.groups:
            if g.kind != SLIDING:
                n = min(n, self._leading(st, st.keys[g.index][:n]))
        for g in self.groups.groups:
            if g.kind == SLIDING:
                st.present[g.index] = self._held(st, st.keys[g.index][:n])
        while n > 0 and not self._window_held(st, n):
            n -= 1
        return n

    def _held(self, st: RequestState, hashes: list[bytes]) -> list[bool]:
        """Which of ``hashes`` the pool holds, each: runs of leading lookups, one per missing key."""
        held = [False] * len(hashes)
        i = 0
        while i < len(hashes):
            run = self._leading(st, hashes[i:])
            held[i:i + run] = [True] * run
            i += run + 1
        return held

    def _window_held(self, st: RequestState, n: int) -> bool:
        """A hit of ``n`` blocks finds, in every sliding-window group, the blocks its window needs."""
        assert self.groups is not None
        for g in self.groups.groups:
            if g.kind == SLIDING:
                held = st.present.get(g.index, [])
                if len(held) < n or not all(held[g.window_start(n, self.B):n]):
                    return False
        return True

    def _hybrid_loads(self, st: RequestState, blocks: Any, first: int, last: int) -> list[LoadSpec]:
        """Per group, the hit blocks past vLLM's own cache that vLLM holds: a sliding-window group's
        table has the null block below its window, and every block from the window on."""
        assert self.groups is not None
        loads = []
        tables = _per_group(blocks, len(self.groups.groups))
        for g in self.groups.groups:
            ids = tables[g.index]
            if len(ids) < last:
                raise ValueError(
                    f"request {st.req_id}: {len(ids)} blocks allocated in KV-cache group {g.index}, "
                    f"the loaded prefix needs {last}"
                )
            need = max(first, g.window_start(last, self.B))
            nulls = [i for i in range(need, last) if ids[i] == NULL_BLOCK]
            if nulls:
                raise ValueError(
                    f"request {st.req_id}: vLLM gave KV-cache group {g.index} ({g.kind}) its null block at block "
                    f"indices {nulls[:8]}, which the hit of {last} blocks needs"
                )
            keep = [i for i in range(first, last) if ids[i] != NULL_BLOCK]
            loads.append(LoadSpec(st.req_id, [st.keys[g.index][i] for i in keep], [ids[i] for i in keep],
                                  group=g.index, notify=True))
        return loads

    def loads_failed(self, req_ids: set[str]) -> None:
        """The workers could not load these requests (vLLM recomputes them): no hit is reported
        for them again, and what they compute is stored anew."""
        for req_id in req_ids:
            st = self.requests.get(req_id)
            if st is None:
                continue
            log.warning("tutti: request %s: its load failed; vLLM recomputes it, and tutti reports no hit for it",
                        req_id)
            self._unpin(st)
            st.hits = st.saved_blocks = 0
            st.decided = None
            st.present = {}

    def _hybrid_saves(self, st: RequestState, start: int, end: int) -> list[SaveSpec]:
        """Blocks ``start``..``end`` of every group that vLLM holds (not its null block)."""
        assert self.groups is not None
        saves = []
        for g in self.groups.groups:
            ids, keys = st.tables[g.index], st.keys[g.index]
            keep = [i for i in range(start, end) if ids[i] != NULL_BLOCK]
            if keep:
                saves.append(SaveSpec(st.req_id, [keys[i] for i in keep], [ids[i] for i in keep], group=g.index))
        return saves

    def _backlog_bytes(self) -> int:
        """Reads the drives owe before a load granted now: loads granted in this pass, and those of
        plans no worker has reported done (with vLLM's async scheduling; counted only once workers
        report at all)."""
        owed = self._pass_bytes
        if self.rule is not None and self.rule.fed:
            owed += sum(b for _, b in self._unacked)
        return owed

    def observe(self, obs: Observations) -> None:
        """A step's timings from the workers (vLLM's worker metadata)."""
        self._unacked = [(s, b) for s, b in self._unacked if s > obs.step]
        if self.rule is not None:
            self.rule.observe(obs)

    def _all_ranks_hold(self, hashes: list[bytes]) -> int:
        ids = self.identities() if self.identities is not None else []
        if len(ids) < self.ranks:
            if not self._warned_ranks:
                log.warning("tutti: cache identities of %d of %d ranks known; reporting no cached prefix",
                            len(ids), self.ranks)
                self._warned_ranks = True
            return 0
        hits = len(hashes)
        for model, salt, kind in ids:
            if hits == 0:
                break
            hits = min(hits, self.rt.contains_identity(hashes[:hits], model=model, kind=kind, tenant_salt=salt))
        return hits

    # --- update_state_after_alloc --------------------------------------------------------

    def allocated(self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int) -> None:
        st = self.requests.get(request.request_id)
        if st is None:
            return
        if num_external_tokens <= 0:
            self._unpin(st)
            return
        if num_external_tokens % self.B or st.local_tokens % self.B:
            raise ValueError(
                f"request {st.req_id}: {num_external_tokens} external tokens after {st.local_tokens} local ones "
                f"are not whole {self.B}-token blocks, which is all tutti reports"
            )
        first = st.local_tokens // self.B
        last = first + num_external_tokens // self.B
        if last > st.hits:
            raise ValueError(
                f"request {st.req_id}: vLLM allocated {num_external_tokens} external tokens but tutti "
                f"holds only {st.hits} blocks ({st.hits * self.B} tokens)"
            )
        raw = blocks.get_block_ids() if hasattr(blocks, "get_block_ids") else blocks
        if self.groups is not None:
            st.pending_loads = self._hybrid_loads(st, raw, first, last)
            if self.rule is not None:
                self._pass_bytes += sum(len(ld.hashes) for ld in st.pending_loads) * self.rule.block_bytes
            return
        ids = _first_group(raw)
        if len(ids) < last:
            raise ValueError(
                f"request {st.req_id}: {len(ids)} blocks allocated, the loaded prefix needs {last}"
            )
        split = last if st.remote_from is None else max(first, min(last, st.remote_from))
        if self.rule is not None:
            self._pass_bytes += (last - first) * self.rule.block_bytes
        st.pending_load = LoadSpec(st.req_id, st.hashes[first:split], ids[first:split],
                                   st.hashes[split:last], ids[split:last])

    # --- build_connector_meta ------------------------------------------------------------

    def plan(self, scheduler_output: SchedulerOutput) -> StepPlan:
        self.step += 1
        plan = StepPlan(step=self.step)
        # At most two plans in flight (vLLM's async scheduling runs one step ahead).
        self._unacked = (self._unacked + [(self.step, self._pass_bytes)])[-2:]
        self._pass_bytes = 0
        for st in self.requests.values():
            if st.pending_load is not None:
                plan.loads.append(st.pending_load)
                st.pending_load = None
            # Every request vLLM waits for gets at least one spec: the worker reports it done.
            plan.loads += [ld for ld in st.pending_loads if ld.hashes] or st.pending_loads[:1]
            st.pending_loads = []
        num_scheduled = scheduler_output.num_scheduled_tokens or {}
        plan.scheduled_tokens = sum(num_scheduled.values())
        for req_id, block_ids, computed, resumed in _scheduled(scheduler_output):
            st = self.requests.get(req_id)
            if st is None:
                continue
            st.scheduled = True
            if self.groups is not None:
                new = _per_group(block_ids, len(self.groups.groups))
                st.tables = new if resumed else [t + n for t, n in zip(st.tables, new)]
                st.block_ids = st.tables[0]
            elif resumed:  # a new request's table, or one given anew after a preemption
                st.block_ids = _first_group(block_ids)
            else:
                st.block_ids += _first_group(block_ids)
            scheduled = num_scheduled.get(req_id, 0)
            if computed < st.tokens:
                plan.prefill_tokens += scheduled
                plan.prefix_tokens += computed
            else:
                plan.decode_context_tokens += computed + scheduled
            done_tokens = min(computed + scheduled, st.tokens)
            full = min(done_tokens // self.B, len(st.hashes), len(st.block_ids))
            if self.groups is not None:
                full = min([full] + [len(t) for t in st.tables])
                if full > st.saved_blocks:
                    plan.saves += self._hybrid_saves(st, st.saved_blocks, full)
                    st.saved_blocks = full
                continue
            if full > st.saved_blocks:
                s = st.saved_blocks
                plan.saves.append(SaveSpec(req_id, st.hashes[s:full], st.block_ids[s:full]))
                st.saved_blocks = full
        self._saved_last_step = {s.req_id for s in plan.saves}
        return plan

    # --- request_finished ----------------------------------------------------------------

    def finished(self, request: Request) -> tuple[bool, dict | None]:
        st = self.requests.pop(request.request_id, None)
        if st is not None:
            self._unpin(st)
        return self.deferred and request.request_id in self._saved_last_step, None

    def close(self) -> None:
        for st in self.requests.values():
            self._unpin(st)
        self.requests.clear()


def _scheduled(out: SchedulerOutput):
    """(req_id, new block ids, computed tokens before this step, table given anew) for every
    scheduled request.

    New requests carry their whole block table; running ones only the blocks added this step,
    except those in ``resumed_req_ids`` (resumed after a preemption), whose table is given anew
    (vLLM 0.32's ``CachedRequestData``; the connector checks at start-up that the installed vLLM
    has the field, :data:`.keys.READS`).
    """
    for r in out.scheduled_new_reqs:
        yield r.req_id, r.block_ids, r.num_computed_tokens, True
    cached = out.scheduled_cached_reqs
    resumed = cached.resumed_req_ids
    for i, req_id in enumerate(cached.req_ids):
        yield req_id, cached.new_block_ids[i], cached.num_computed_tokens[i], req_id in resumed
