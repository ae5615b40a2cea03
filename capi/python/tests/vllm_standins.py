"""Small stand-ins for the vLLM objects the connector sees, and a miniature engine step loop.

What vLLM's own objects show is tested with them: test_vllm_real_scheduler.py drives the
connector with vLLM's real ``Scheduler``, ``KVCacheManager``, ``Request`` and ``SchedulerOutput``.
The stand-ins stay for what those cannot show: the tests that run where vLLM is not importable
(the binding's first pytest run, with the system Python), that hand the worker a plan vLLM's
scheduler would never build (a chunk that is missing, a metadata override, a block table chosen
by the test), that put KV in stand-in CUDA memory, or that time steps by hand for the break-even
rule. Their shapes are vLLM 0.32's, and test_vllm_real_scheduler.py checks that every field
here exists, with the same name, in vLLM's own classes: ``Request`` (request_id,
prompt_token_ids, all_token_ids, num_tokens, num_computed_tokens, and the identity the keys mix:
cache_salt, lora_request, mm_features, prompt_embeds), ``KVCacheBlocks.get_block_ids()`` → one
list per KV-cache group, ``SchedulerOutput`` with ``scheduled_new_reqs`` (``NewRequestData``),
column-wise ``scheduled_cached_reqs`` (``CachedRequestData``, whose ``resumed_req_ids`` names
the requests whose table is given anew), ``num_scheduled_tokens`` and ``finished_req_ids``.

``MiniEngine`` drives the two connector instances the way vLLM's scheduler
and GPU model runner do, and plays the model: "computing" a layer writes KV
bytes that are a pure function of the token prefix, so KV that arrives by a
load can be checked against what computing it would have produced.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from types import SimpleNamespace

import tutti
from tutti.vllm import KVConnectorRole, TuttiConnector


class ModelConfig:
    def __init__(self, g: tutti.Geometry, model="tiny/llama-test", dtype="torch.float16"):
        self.g, self.model, self.dtype = g, model, dtype

    def get_num_layers(self, parallel_config):
        return self.g.layers

    def get_num_kv_heads(self, parallel_config):
        return self.g.kv_heads

    def get_head_size(self):
        return self.g.head_dim


def vllm_config(g: tutti.Geometry, extra: dict, tp: int = 1, cache_dtype="auto", dtype="torch.float16"):
    return SimpleNamespace(
        model_config=ModelConfig(g, dtype=dtype),
        parallel_config=SimpleNamespace(tensor_parallel_size=tp, pipeline_parallel_size=1),
        cache_config=SimpleNamespace(block_size=g.tokens_per_block, cache_dtype=cache_dtype),
        kv_transfer_config=SimpleNamespace(
            kv_connector="TuttiConnector",
            kv_connector_module_path="tutti.vllm",
            kv_role="kv_both",
            kv_connector_extra_config=extra,
        ),
    )


@dataclass
class Request:
    request_id: str
    prompt_token_ids: list[int]
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    cache_salt: str | None = None
    lora_request: object = None
    mm_features: list = field(default_factory=list)
    prompt_embeds: object = None

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)


class KVCacheBlocks:
    def __init__(self, ids):
        self.ids = list(ids)

    def get_block_ids(self):
        return (list(self.ids),)


@dataclass
class NewRequestData:
    req_id: str
    prompt_token_ids: list[int]
    block_ids: tuple
    num_computed_tokens: int


@dataclass
class CachedRequestData:
    req_ids: list[str] = field(default_factory=list)
    resumed_req_ids: set[str] = field(default_factory=set)
    new_token_ids: list[list[int]] = field(default_factory=list)
    new_block_ids: list = field(default_factory=list)
    num_computed_tokens: list[int] = field(default_factory=list)


@dataclass
class SchedulerOutput:
    scheduled_new_reqs: list[NewRequestData] = field(default_factory=list)
    scheduled_cached_reqs: CachedRequestData = field(default_factory=CachedRequestData)
    num_scheduled_tokens: dict[str, int] = field(default_factory=dict)
    finished_req_ids: set[str] = field(default_factory=set)
    kv_connector_metadata: object = None


def layer_name(i: int) -> str:
    return f"model.layers.{i}.self_attn.attn"


def kv_bytes(prefix_tokens: tuple, layer: int, kv: int, n: int) -> bytes:
    """What 'computing' K or V of the block ending ``prefix_tokens`` in ``layer`` yields."""
    return random.Random(repr((prefix_tokens, layer, kv))).randbytes(n)


@dataclass
class StepResult:
    meta: object
    matched: dict[str, int]
    load_errors: set[int]
    finished: tuple


class MiniEngine:
    """vLLM's schedule → execute_model → update loop, reduced to what the connector sees."""

    def __init__(self, g: tutti.Geometry, extra: dict, num_blocks: int = 32, local_prefix_cache=None,
                 tensor=tutti.HostTensor, feedback: bool = False, compute_s_per_token: float = 0.0):
        """``tensor(shape, element_size)`` makes each layer's KV tensor (default host memory).

        ``feedback``: hand the worker's metadata of each step to the scheduler side, as vLLM >= 0.32
        does (the break-even rule learns from it; without it the rule reports every hit).
        ``compute_s_per_token``: "computing" a token of a step takes this long (spread over the
        layers), so that recomputing has a cost the rule can weigh."""
        self.g = g
        self.feedback = feedback
        self.compute_s_per_token = compute_s_per_token
        self.B = g.tokens_per_block
        self.num_blocks = num_blocks
        cfg = vllm_config(g, extra)
        self.scheduler = TuttiConnector(cfg, KVConnectorRole.SCHEDULER)
        self.worker = TuttiConnector(cfg, KVConnectorRole.WORKER)
        self.kv = {
            layer_name(i): tensor((2, num_blocks, self.B, g.kv_heads, g.head_dim), g.element_size)
            for i in range(g.layers)
        }
        self.worker.register_kv_caches(self.kv)
        self.free = list(range(num_blocks))
        self.used: set[int] = set()
        self.blocks: dict[str, list[int]] = {}
        self.running: dict[str, Request] = {}
        self.finished_last_step: set[str] = set()
        self.held: dict[str, list[int]] = {}  # finished requests whose blocks the connector holds
        self.computed_writes: set[tuple[int, int]] = set()  # (block, layer) written by compute

    def close(self):
        self.worker.shutdown()
        self.scheduler.shutdown()

    # --- memory -----------------------------------------------------------------------------

    def offset(self, kv: int, block: int) -> int:
        return (kv * self.num_blocks + block) * self.g.object_bytes

    def block_kv(self, block: int, layer: int) -> tuple[bytes, bytes]:
        t = self.kv[layer_name(layer)]
        n = self.g.object_bytes
        return t.read(self.offset(0, block), n), t.read(self.offset(1, block), n)

    def expected(self, tokens: list[int], index: int, layer: int) -> tuple[bytes, bytes]:
        prefix = tuple(tokens[: (index + 1) * self.B])
        n = self.g.object_bytes
        return kv_bytes(prefix, layer, 0, n), kv_bytes(prefix, layer, 1, n)

    def _alloc(self, n: int) -> list[int]:
        """Free blocks in order. A block's first owner finds junk in it (GPU memory is not zeroed),
        so nothing but a real load can make it hold the right KV; a reused block keeps its previous
        owner's bytes, as in vLLM, where memory is written only by loads and forward passes."""
        if n > len(self.free):
            raise RuntimeError("out of blocks")
        ids, self.free = self.free[:n], self.free[n:]
        fresh = [b for b in ids if b not in self.used]
        self.used.update(fresh)
        self._junk(fresh)
        return ids

    def _junk(self, blocks: list[int]) -> None:
        junk = b"\xee" * self.g.object_bytes
        for b in blocks:
            for t in self.kv.values():
                t.write(self.offset(0, b), junk)
                t.write(self.offset(1, b), junk)

    # --- one step ---------------------------------------------------------------------------

    def step(self, new: list[Request] = (), cont: dict[str, int] | None = None, new_chunk: dict | None = None,
             meta_override=None) -> StepResult:
        """Schedules ``new`` requests (whole prompt unless ``new_chunk[req_id]`` limits it) and
        continues running ones by ``cont[req_id]`` tokens, then runs the forward pass."""
        out = SchedulerOutput(finished_req_ids=set(self.finished_last_step))
        self.finished_last_step = set()
        matched = {}
        for req in new:
            ext, async_load = self.scheduler.get_num_new_matched_tokens(req, 0)
            assert async_load is False
            matched[req.request_id] = ext
            todo = req.num_tokens - ext
            if new_chunk and req.request_id in new_chunk:
                todo = min(todo, new_chunk[req.request_id])
            ids = self._alloc(-(-(ext + todo) // self.B))
            self.blocks[req.request_id] = ids
            self.scheduler.update_state_after_alloc(req, KVCacheBlocks(ids), ext)
            out.scheduled_new_reqs.append(NewRequestData(req.request_id, req.prompt_token_ids, (list(ids),), ext))
            out.num_scheduled_tokens[req.request_id] = todo
            req.num_computed_tokens = ext
            self.running[req.request_id] = req
        for req_id, n in (cont or {}).items():
            req = self.running[req_id]
            have = len(self.blocks[req_id])
            need = -(-(req.num_computed_tokens + n) // self.B)
            added = self._alloc(max(0, need - have))
            self.blocks[req_id] += added
            c = out.scheduled_cached_reqs
            c.req_ids.append(req_id)
            c.new_token_ids.append([])
            c.new_block_ids.append((added,) if added else None)
            c.num_computed_tokens.append(req.num_computed_tokens)
            out.num_scheduled_tokens[req_id] = n
        meta = self.scheduler.build_connector_meta(out)
        out.kv_connector_metadata = meta
        # An override replaces what the forward pass's workers are given.
        given = meta_override if meta_override is not None and out.num_scheduled_tokens else meta
        load_errors, finished = self._run_workers(out, given)
        for req_id in finished[0] or ():
            # vLLM frees a held request's blocks when a worker reports it; anything else is a bug.
            assert req_id in self.held, f"{req_id} reported finished but its blocks were not held"
            self.free += self.held.pop(req_id)
        for req_id, n in out.num_scheduled_tokens.items():
            self.running[req_id].num_computed_tokens += n
        return StepResult(meta, matched, load_errors, finished)

    def _run_workers(self, out: SchedulerOutput, meta) -> tuple[set[int], tuple]:
        """The model runner's part of a step: (blocks with load errors, ``get_finished``)."""
        if out.num_scheduled_tokens:
            self._execute(out, meta)
        else:
            # vLLM's step without tokens (kv_connector_no_forward): start_load_kv and get_finished only.
            self.worker.bind_connector_metadata(meta)
            self.worker.start_load_kv(None)
        load_errors = self.worker.get_block_ids_with_load_errors()
        finished = self.worker.get_finished(out.finished_req_ids)
        worker_meta = self.worker.build_connector_worker_meta()
        self.worker.clear_connector_metadata()
        if self.feedback and worker_meta is not None:
            self.scheduler.update_connector_output(SimpleNamespace(kv_connector_worker_meta=worker_meta))
        return load_errors, finished

    def _execute(self, out: SchedulerOutput, meta) -> None:
        w = self.worker
        w.bind_connector_metadata(meta)
        w.start_load_kv(SimpleNamespace(attn_metadata=None, no_compile_layers={}, virtual_engine=0))
        for layer in range(self.g.layers):
            name = layer_name(layer)
            w.wait_for_layer_load(name)
            self._compute_layer(out, layer)
            w.save_kv_layer(name, self.kv[name], None)
        w.wait_for_save()

    def _compute_layer(self, out: SchedulerOutput, layer: int) -> None:
        """Writes K and V of every block touched by the scheduled tokens (whole blocks, for simplicity)."""
        t = self.kv[layer_name(layer)]
        if self.compute_s_per_token:
            time.sleep(self.compute_s_per_token * sum(out.num_scheduled_tokens.values()) / self.g.layers)
        for req_id, count in out.num_scheduled_tokens.items():
            req = self.running[req_id]
            start, end = req.num_computed_tokens, req.num_computed_tokens + count
            toks = req.all_token_ids
            for index in range(start // self.B, -(-end // self.B)):
                block = self.blocks[req_id][index]
                k, v = self.expected(toks, index, layer)
                t.write(self.offset(0, block), k)
                t.write(self.offset(1, block), v)
                self.computed_writes.add((block, layer))

    def preempt(self, req: Request) -> None:
        """vLLM frees a preempted request's blocks at once (the connector is not told) and
        hands them out first; the request waits to be resumed from scratch."""
        self.free = self.blocks.pop(req.request_id) + self.free
        del self.running[req.request_id]
        req.num_computed_tokens = 0

    def finish(self, req: Request) -> tuple:
        ret = self.scheduler.request_finished(req, self.blocks[req.request_id])
        if ret[0]:
            self.held[req.request_id] = self.blocks.pop(req.request_id)
        else:
            self.free += self.blocks.pop(req.request_id)
        del self.running[req.request_id]
        self.finished_last_step.add(req.request_id)
        return ret


EXTRA = {"emulated_drives": 2, "emulated_capacity_bytes": 8 << 20, "open_mode": "create"}


def prompt(prefix_seed: int, n: int, tail: list[int] = ()) -> list[int]:
    return [(prefix_seed * 7919 + i * 31) % 32000 for i in range(n)] + list(tail)


def assert_blocks_hold(engine, req: Request, blocks: range):
    """Every layer's K and V of the request's blocks ``blocks`` equal what computing them gives."""
    for index in blocks:
        block = engine.blocks[req.request_id][index]
        for layer in range(engine.g.layers):
            assert engine.block_kv(block, layer) == engine.expected(req.all_token_ids, index, layer), (
                f"request {req.request_id} block #{index} (id {block}) layer {layer}"
            )
