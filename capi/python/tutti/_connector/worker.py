"""The worker-side half: registering vLLM's KV tensors, and moving each step's blocks.

Loads are submitted for all layers when the forward pass starts; each
attention layer waits for its own layer only (``wait_for_layer_load``), so
layer ``l + 1`` streams in while layer ``l`` computes. Saves are submitted one
layer at a time as each layer's KV is written (``save_kv_layer``) and
committed once every layer is on the drives — a chunk becomes visible to
lookups only then, complete. By default that happens at the end of the step
(``wait_for_save``). With deferred saves the writes run on past the step and
are completed at the start of the next one, before anything can rewrite a
block; vLLM holds a finished request's blocks until ``get_finished`` says
its saves are done.

Blocks whose load failed (a device error, a chunk gone, a timeout) are
collected and handed to vLLM by ``get_block_ids_with_load_errors``; vLLM then
recomputes them. A failed save only costs a future cache miss and is logged.
A load block whose failure has an unknown outcome (its NVMe command timed
out: the drive may still write that block until the pool is reopened) is
reported the same way, with a warning naming it; ``unknown_load_blocks``
keeps every such block id for the life of the worker.

With vLLM's hybrid allocator (several KV-cache groups, :mod:`.groups`) the registered layers are
the groups' overlaid tensors: slot ``j`` is the ``j``-th layer of every group, which vLLM places
at one address. Every load and save belongs to one group (its block ids are that group's); a
layer waits for its own group's loads only, and a group's save of slot ``j`` is written once that
group's ``j``-th layer is computed. vLLM takes failed block ids from one group only, so these
loads are vLLM's asynchronous ones (``LoadSpec.notify``): their requests wait outside the batch,
no layer waits for them, and once the step's loads are done each request is reported finished
loading (``take_recving``), a request with a block that did not load as failed.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import Timeout, TuttiError, Unsupported
from ..jobs import JobStatus
from ..runtime import Geometry, Job, Runtime, Store
from ..tensors import mark_written, view
from .groups import Groups
from .metadata import LoadSpec, SaveSpec, StepPlan

if TYPE_CHECKING:  # vLLM's types, for type checkers only: no import of vLLM at run time
    import torch

log = logging.getLogger("vllm.tutti")


class LayoutError(ValueError):
    """vLLM's KV tensors are not shaped the way tutti can address them."""


def _dense(shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """The dims cover one contiguous run of elements, in any order (NHD or HND inside a block)."""
    expect = 1
    for stride, dim in sorted(zip(strides, shape)):
        if dim == 1:
            continue
        if stride != expect:
            return False
        expect *= dim
    return True


def layer_index_map(names: list[str]) -> dict[str, int]:
    """Layer name → layer index: the one integer in each name (``model.layers.7.self_attn.attn``)
    when every name has exactly one and together they are 0..n-1; registration order otherwise."""
    found = {}
    for n in names:
        nums = re.findall(r"(?:^|\.)(\d+)(?=\.|$)", n)
        if len(nums) != 1:
            break
        found[n] = int(nums[0])
    if len(found) == len(names) and sorted(found.values()) == list(range(len(names))):
        return found
    return {n: i for i, n in enumerate(names)}


@dataclass(frozen=True)
class LayerLayout:
    """Where one layer's blocks live, as tutti registers them.

    ``kind`` is the C ABI's layout kind; for ``strided`` block ``b``'s "K" object is at
    ``k_base + b * block_stride`` and its "V" object at ``v_base + b * block_stride``.
    ``tag`` names the byte order inside a block; it is mixed into the cache identity,
    so chunks stored under one order are never loaded into another.
    """

    kind: str
    blocks: int
    k_base: int
    v_base: int
    block_stride: int  # bytes; 0 for vllm_per_layer
    tag: str


def _where(name: str, shape, strides, backend: str | None) -> str:
    return f"layer {name!r} (shape {tuple(shape)}, strides {tuple(strides)}, backend {backend or 'unknown'})"


def describe_vllm_layer(name: str, t: torch.Tensor, g: Geometry, backend: str | None = None,
                        vllm_layout: str | None = None) -> LayerLayout:
    """How tutti addresses one layer's KV tensor, recognised from the shapes vLLM builds; never guessed.

    vLLM >= 0.32 (CPU attention, FlashAttention and FlashInfer alike) hands each layer a
    4-D view ``[num_blocks, kv_heads, block_size, 2 * head_size]``: K and V of a token are
    packed in the last dimension, and the physical order of the first three dims is one of
    vLLM's ``KVCacheLayout`` stride orders (``LBHNC`` = HND, ``LBNHC`` = NHD, and the
    cross-layer ``BLHNC``/``BLNHC``). tutti needs one layer's block to be one dense run
    (``[H, N, C]`` or ``[N, H, C]``); it stores the run's first half as the block's "K"
    object and its second half as "V" (a byte-exact split, tagged with the order).
    ``LHBNC`` and ``BHLNC`` (a head's blocks, or a block's layers, interleaved) are refused.

    vLLM <= 0.31 handed 5-D tensors: flash-attn's ``[2, num_blocks, B, H, D]`` (K and V as
    two halves) and FlashInfer's ``[num_blocks, 2, B, H, D]``, the three inner dims possibly
    permuted (HND). Which dim is K/V is read from the strides, not from a dim being 2 (a
    model may have 2 KV heads, or a cache 2 blocks).

    MLA models (vLLM's ``use_mla``: DeepSeek-V2/V3, Kimi K2) hand each layer as a 3-D
    ``[num_blocks, block_size, latent]`` tensor (every MLA backend's ``get_kv_cache_shape``,
    ``CPU_MLA`` included): one latent of ``kv_lora_rank + qk_rope_head_dim`` elements per token,
    no K/V pair. A block is one dense run, stored as its two halves (the pool's geometry has one
    KV head of ``latent / 2``), tagged ``vllm-mla-latent``.
    """
    v = view(t)
    shape, strides = tuple(v.shape), tuple(v.strides)
    where = _where(name, shape, strides, backend)
    if v.element_size != g.element_size:
        raise LayoutError(f"{where}: {v.element_size}-byte elements; the pool stores {g.dtype}")
    obj = g.tokens_per_block * g.kv_heads * g.head_dim  # elements of one K (or V) object
    es = v.element_size
    if len(shape) == 3:
        return _describe_latent(where, v, g, obj)
    if len(shape) == 4:
        blocks, heads, tokens, content = shape
        want = (g.kv_heads, g.tokens_per_block, 2 * g.head_dim)
        if (heads, tokens, content) != want:
            raise LayoutError(
                f"{where}: [kv_heads, block_size, 2*head_size] = {(heads, tokens, content)}; the pool's "
                f"geometry needs {want} (vLLM's packed-K|V layer view [num_blocks, H, N, 2*D])"
            )
        s_b, s_h, s_n, s_c = strides
        if s_c != 1:
            raise LayoutError(f"{where}: the K|V dimension is not innermost (stride {s_c}); not a vLLM layout")
        if heads == 1 or s_h == s_n * tokens:
            order = "HNC"  # LBHNC / BLHNC (with one head both orders are the same bytes)
            dense = tokens == 1 or s_n == content
        elif tokens == 1 or s_n == s_h * heads:
            order = "NHC"  # LBNHC / BLNHC
            dense = s_h == content
        else:
            order, dense = "?", False
        run = heads * tokens * content
        if not dense:
            raise LayoutError(
                f"{where}: one block's [kv_heads, block_size, 2*head_size] is not one dense run of memory "
                f"(vLLM layouts LHBNC and BHLNC interleave blocks or layers inside it); tutti can store "
                f"vLLM's LBHNC, LBNHC, BLHNC and BLNHC layouts (resolved layout here: {vllm_layout or 'unknown'})"
            )
        if blocks > 1 and s_b < run:
            raise LayoutError(f"{where}: blocks overlap (block stride {s_b} < {run} elements per block)")
        if vllm_layout and vllm_layout[2:] in ("HNC", "NHC") and heads > 1 and tokens > 1 and vllm_layout[2:] != order:
            raise LayoutError(
                f"{where}: the strides say {order} inside a block but vLLM resolved layout {vllm_layout}"
            )
        return LayerLayout("strided", blocks, v.addr, v.addr + obj * es, s_b * es, f"vllm-packed-{order}")
    if len(shape) != 5:
        raise LayoutError(
            f"{where}: {len(shape)} dims; tutti knows vLLM's 3-D MLA latent [num_blocks, N, latent], the 4-D "
            f"packed-K|V layer view [num_blocks, H, N, 2*D] and the 5-D [2, num_blocks, N, H, D] / "
            f"[num_blocks, 2, N, H, D]"
        )
    inner = (g.tokens_per_block, g.kv_heads, g.head_dim)
    if tuple(shape[2:]) != inner:
        raise LayoutError(
            f"{where}: [block_size, kv_heads, head_size] = {tuple(shape[2:])}; the pool's geometry is {inner}"
        )
    if not _dense(shape[2:], strides[2:]):
        raise LayoutError(f"{where}: one block's K (or V) is not contiguous")
    hnd = g.kv_heads > 1 and g.tokens_per_block > 1 and strides[3] > strides[2]
    tag = "" if not hnd else "vllm-split-HND"  # NHD (the first layout tutti stored) keeps the plain identity
    # flash-attn: K/V outermost, blocks next; FlashInfer: blocks outermost, K/V next. With two
    # blocks the two are the same shape and strides over different bytes: the backend decides.
    if shape[0] == 2 and shape[1] == 2:
        if not backend:
            raise LayoutError(
                f"{where}: [2, 2, ...] is flash-attn's [K/V, blocks] or FlashInfer's [blocks, K/V] alike, "
                f"and the attention backend is unknown; refusing to guess"
            )
        if "FLASHINFER" in backend.upper():
            return LayerLayout("strided", 2, v.addr, v.addr + obj * es, 2 * obj * es, tag)
    if shape[0] == 2 and strides[0] == obj * shape[1] and strides[1] == obj:
        return LayerLayout("vllm_per_layer", shape[1], v.addr, v.addr + strides[0] * es, 0, tag)
    if shape[1] == 2 and strides[1] == obj and strides[0] == 2 * obj:
        return LayerLayout("strided", shape[0], v.addr, v.addr + obj * es, 2 * obj * es, tag)
    raise LayoutError(
        f"{where}: neither [2, num_blocks, ...] with K and V as packed halves nor [num_blocks, 2, ...] "
        f"with packed blocks; register a packed KV cache"
    )


def _describe_latent(where: str, v, g: Geometry, obj: int) -> LayerLayout:
    """An MLA layer ``[num_blocks, block_size, latent]``: each block's latent run as two halves."""
    blocks, tokens, content = v.shape
    want = (g.tokens_per_block, 2 * g.head_dim)
    if g.kv_heads != 1 or (tokens, content) != want:
        raise LayoutError(
            f"{where}: an MLA latent layer [num_blocks, block_size, latent] with (block_size, latent) = "
            f"{(tokens, content)}; the pool's geometry needs one KV head and {want} (latent = 2 × head_dim: "
            f"the geometry has {g.kv_heads} KV heads of {g.head_dim}; an MLA model's geometry comes from vLLM's "
            "use_mla, and 'kv_heads'/'head_dim' overrides must say the same)"
        )
    s_b, s_n, s_c = v.strides
    if s_c != 1 or (tokens > 1 and s_n != content):
        raise LayoutError(f"{where}: one block's [block_size, latent] is not one dense run of memory")
    run = tokens * content
    if blocks > 1 and s_b < run:
        raise LayoutError(f"{where}: blocks overlap (block stride {s_b} < {run} elements per block)")
    es = v.element_size
    return LayerLayout("strided", blocks, v.addr, v.addr + obj * es, s_b * es, "vllm-mla-latent")


def _span(t: torch.Tensor) -> tuple[int, int]:
    """(address, bytes) of the memory a tensor's elements cover."""
    v = view(t)
    last = sum((d - 1) * s for d, s in zip(v.shape, v.strides) if d > 0)
    return v.addr, (last + 1) * v.element_size


def _runs(layers: list[int]) -> list[range]:
    """Sorted layer numbers as contiguous ranges: [0, 1, 3] → [range(0, 2), range(3, 4)]."""
    out: list[range] = []
    for l in layers:
        if out and out[-1].stop == l:
            out[-1] = range(out[-1].start, l + 1)
        else:
            out.append(range(l, l + 1))
    return out


@dataclass
class _Load:
    spec: LoadSpec
    job: Job | None
    waited: set[int] = field(default_factory=set)
    # Engine block ids already reported with an unknown outcome (warned once).
    unknown: set[int] = field(default_factory=set)


@dataclass
class _Save:
    spec: SaveSpec
    store: Store
    jobs: list[Job] = field(default_factory=list)
    layers: set[int] = field(default_factory=set)


class WorkerSide:
    def __init__(
        self,
        runtime: Runtime,
        geometry: Geometry,
        model: str,
        tenant_salt: bytes,
        timeout_s: float,
        deferred_saves: bool = False,
        tier: Any = None,
        store_local: bool = True,
        groups: Groups | None = None,
    ):
        if groups is not None and tier is not None:
            raise ValueError("the cluster tier serves one KV-cache group; this KV cache has several")
        self.groups = groups
        self._group_of: dict[str, int] = {}  # layer name → KV-cache group (empty: one group)
        self.rt = runtime
        # The cluster tier (tutti.cluster.MooncakeTier): remote loads, and publication of saves.
        self.tier = tier
        self.store_local = store_local
        self._remote_done: list[tuple[LoadSpec, list[int]]] = []  # verified remote loads to keep locally
        self._layouts: list[LayerLayout] = []
        self.g = geometry
        self.model = model
        self.salt = tenant_salt
        self.timeout_s = timeout_s
        self.layers: dict[str, int] = {}
        self.num_blocks = 0
        self.on_gpu = False
        self._loads: list[_Load] = []
        self._saves: list[_Save] = []
        self._saves_begun = False
        self._written: list[tuple[int, int, Any]] = []  # (group, layer) computed, waiting for its kernels
        self.deferred = deferred_saves
        self._pending: list[_Save] = []
        self._cur_save_ids: set[str] = set()
        self._prev_save_ids: set[str] = set()
        self._load_errors: set[int] = set()
        # Asynchronous loads (LoadSpec.notify): requests loading, done, and done with a failure.
        self._recving: set[str] = set()
        self._recved: set[str] = set()
        self._recv_failed: set[str] = set()
        # Engine blocks a drive may still write (loads of unknown outcome), until the pool is reopened.
        self.unknown_load_blocks: set[int] = set()
        self.layout_tag = ""
        self.kv_caches: dict[str, torch.Tensor] = {}
        # (model, tenant salt, layout kind) of the registration: the chunks' cache identity.
        self.identity: tuple[str, bytes, str] | None = None

    # --- register_kv_caches --------------------------------------------------------------

    def register(self, kv_caches: dict[str, torch.Tensor], backends: dict[str, str] | None = None,
                 vllm_layout: str | None = None) -> None:
        names = list(kv_caches)
        if self.groups is not None:
            index, by_layer, on_gpu = self._describe_groups(kv_caches, backends, vllm_layout)
            self._register(kv_caches, names, index, by_layer, on_gpu)
            return
        if len(names) != self.g.layers:
            raise LayoutError(f"vLLM registered {len(names)} KV layers; the pool's geometry has {self.g.layers}")
        index = layer_index_map(names)
        by_layer: list[LayerLayout | None] = [None] * self.g.layers
        on_gpu = False
        for name in names:
            by_layer[index[name]] = describe_vllm_layer(
                name, kv_caches[name], self.g, (backends or {}).get(name), vllm_layout
            )
            on_gpu |= view(kv_caches[name]).on_gpu
        self._register(kv_caches, names, index, by_layer, on_gpu)

    def _describe_groups(self, kv_caches: dict[str, torch.Tensor], backends: dict[str, str] | None,
                         vllm_layout: str | None) -> tuple[dict[str, int], list[LayerLayout], bool]:
        """Each slot's layout, from the layers vLLM overlays there (they must be one tensor)."""
        assert self.groups is not None
        where = self.groups.slot_of()
        missing = sorted(set(where) - set(kv_caches))
        extra = sorted(set(kv_caches) - set(where))
        if missing or extra:
            raise LayoutError(
                f"vLLM registered KV layers that do not match its KV-cache groups ({self.groups.describe()}): "
                f"missing {missing[:4]}, not in any group {extra[:4]}"
            )
        by_slot: list[LayerLayout | None] = [None] * self.g.layers
        first: list[str] = [""] * self.g.layers
        on_gpu = False
        for name, (group, slot) in sorted(where.items(), key=lambda kv: kv[1]):
            d = describe_vllm_layer(name, kv_caches[name], self.g, (backends or {}).get(name), vllm_layout)
            on_gpu |= view(kv_caches[name]).on_gpu
            if by_slot[slot] is None:
                by_slot[slot], first[slot] = d, name
            elif by_slot[slot] != d:
                raise LayoutError(
                    f"layer {name!r} (KV-cache group {group}) and layer {first[slot]!r} are layer {slot} of their "
                    f"groups but not the same memory ({d} vs {by_slot[slot]}); tutti serves vLLM's hybrid "
                    "allocator where the groups overlay one KV tensor per layer position"
                )
        self._group_of = {name: group for name, (group, _) in where.items()}
        return {name: slot for name, (_, slot) in where.items()}, by_slot, on_gpu

    def _register(self, kv_caches: dict[str, torch.Tensor], names: list[str], index: dict[str, int],
                  by_layer: list[LayerLayout], on_gpu: bool) -> None:
        shapes = {(d.kind, d.blocks, d.block_stride, d.tag) for d in by_layer}
        if len(shapes) != 1:
            raise LayoutError(f"layers disagree on layout (kind, blocks, block stride, order): {sorted(shapes)}")
        kind, num_blocks, block_stride, tag = shapes.pop()
        memory = "cuda" if on_gpu else "host"
        salt = self.salt + (b"\0tutti-kv-order:" + tag.encode() if tag else b"")
        k = [d.k_base for d in by_layer]
        try:
            if kind == "vllm_per_layer":
                self.rt.register_kv(
                    kind, num_blocks, model=self.model, k_bases=k, memory=memory, tenant_salt=salt,
                    keepalive=kv_caches,
                )
            else:
                self.rt.register_kv(
                    kind, num_blocks, model=self.model, k_bases=k, v_bases=[d.v_base for d in by_layer],
                    block_stride=block_stride, memory=memory, tenant_salt=salt, keepalive=kv_caches,
                )
        except Unsupported as e:
            if not on_gpu:
                raise
            raise LayoutError(
                f"vLLM's KV cache is on the GPU and this tutti runtime cannot move CUDA memory ({e}); set "
                "kv_connector_extra_config['executor'] = 'gio_cuda' (the CUDA executor, staged data path)"
            ) from e
        self.layers = index
        self.num_blocks = num_blocks
        self.on_gpu = on_gpu
        self.layout_tag = tag
        self.kv_caches = kv_caches
        self.identity = (self.model, salt, kind)
        self._layouts = list(by_layer)
        if self.tier is not None:
            if on_gpu:
                log.warning("tutti: the KV cache is on the GPU; the Mooncake tier (the non-CUDA build) moves "
                            "host memory only, so it is not used")
                self.tier = None
            else:
                self.tier.register_memory([_span(kv_caches[n]) for n in names])
        if self.groups is not None:
            log.info("tutti: vLLM's hybrid KV cache: %s; the pool's %d layers are the groups' shared tensors",
                     self.groups.describe(), self.g.layers)
        path = self.rt.data_path() if hasattr(self.rt, "data_path") else None
        detail = ""
        if path and path.p2p_missing:
            detail = f": {path.p2p_missing}"
        elif path and getattr(path, "provider", ""):
            detail = f" through {path.provider}"
        log.info("tutti: registered %d layers × %d blocks (%s %s, %s memory, %s data path%s)", len(names),
                 num_blocks, kind, tag or "NHD", memory, path.mode if path else "?", detail)

    def block_segments(self, block_id: int) -> list[tuple[int, int]]:
        """(address, bytes) runs of one engine block, every layer's K then V (adjacent runs merged):
        what the cluster tier moves as one object."""
        obj = self.g.object_bytes
        out: list[tuple[int, int]] = []
        for d in self._layouts:
            if d.kind == "vllm_per_layer":
                runs = [(d.k_base + block_id * obj, obj), (d.v_base + block_id * obj, obj)]
            else:
                runs = [(d.k_base + block_id * d.block_stride, obj), (d.v_base + block_id * d.block_stride, obj)]
            for addr, n in runs:
                if out and out[-1][0] + out[-1][1] == addr:
                    out[-1] = (out[-1][0], out[-1][1] + n)
                else:
                    out.append((addr, n))
        return out

    def layer_of(self, layer_name: str) -> int | None:
        return self.layers.get(layer_name)

    def group_of(self, layer_name: str) -> int:
        return self._group_of.get(layer_name, 0)

    # --- loads ---------------------------------------------------------------------------

    def _failed(self, spec: LoadSpec, blocks) -> None:
        """Blocks of ``spec`` did not load: handed to vLLM by id, or (asynchronous) its request."""
        blocks = list(blocks)
        if spec.notify:
            if blocks:
                self._recv_failed.add(spec.req_id)
        else:
            self._load_errors.update(blocks)

    def start_loads(self, plan: StepPlan) -> None:
        for spec in plan.loads:
            if spec.notify:
                self._recving.add(spec.req_id)
            if spec.remote_hashes:
                self._load_remote(spec)
            if not spec.hashes:
                continue
            try:
                job = self.rt.load(spec.hashes, spec.block_ids)
            except TuttiError as e:
                log.warning("tutti: loading %d blocks of request %s failed: %s", len(spec.block_ids), spec.req_id, e)
                self._failed(spec, spec.block_ids)
                continue
            self._loads.append(_Load(spec, job))

    def _load_remote(self, spec: LoadSpec) -> None:
        """Reads the request's blocks held by the cluster tier straight into its engine blocks,
        verified; a block that fails (gone, corrupt, Mooncake down or late) is a load error."""
        ids = spec.remote_block_ids
        if self.tier is None or self.identity is None or len(ids) != len(spec.remote_hashes):
            log.warning("tutti: request %s: %d blocks planned from Mooncake, but no tier here; recomputing",
                        spec.req_id, len(ids))
            self._load_errors.update(ids)
            return
        bad = [b for b in ids if not 0 <= b < self.num_blocks]
        if bad:
            log.warning("tutti: request %s: block ids %s outside the KV cache; recomputing", spec.req_id, bad)
            self._load_errors.update(ids)
            return
        res = self.tier.load(self.identity, spec.remote_hashes, [self.block_segments(b) for b in ids])
        self._load_errors.update(ids[i] for i in res.failed)
        late = sorted(ids[i] for i in res.unknown)
        if late:
            self.unknown_load_blocks.update(late)
            log.warning(
                "tutti: loading blocks %s of request %s from Mooncake passed its deadline: Mooncake may still "
                "write them; they are reported as load errors, but their memory is not safe to reuse", late,
                spec.req_id,
            )
        ok = [i for i in range(len(ids)) if i not in res.failed]
        if ok and self.store_local:
            self._remote_done.append((spec, ok))

    def _store_remote_locally(self) -> None:
        """Verified remote blocks go into the local pool too, so the next hit is local."""
        done, self._remote_done = self._remote_done, []
        for spec, ok in done:
            hashes = [spec.remote_hashes[i] for i in ok]
            blocks = [spec.remote_block_ids[i] for i in ok]
            try:
                with self.rt.begin_store(hashes, blocks) as st:
                    with st.submit() as job:
                        job.wait(self.timeout_s)
                    st.commit()
            except TuttiError as e:
                log.info("tutti: keeping request %s's Mooncake blocks locally failed: %s", spec.req_id, e)

    def _absorb(self, ld: _Load, st: JobStatus) -> None:
        self._failed(ld.spec, (ld.spec.block_ids[i] for i in st.failed_blocks))
        if ld.spec.notify and st.unknown_blocks:
            self._recv_failed.add(ld.spec.req_id)
        new = sorted({ld.spec.block_ids[i] for i in st.unknown_blocks} - ld.unknown)
        if new:
            ld.unknown.update(new)
            self.unknown_load_blocks.update(new)
            log.warning(
                "tutti: loading blocks %s of request %s failed with an unknown outcome (a command timed out): "
                "the drive may still write them until the pool is reopened; they are reported as load errors, "
                "but their memory is not safe to reuse before then",
                new, ld.spec.req_id,
            )

    def _abandon(self, ld: _Load, why: Exception) -> None:
        """The load cannot be trusted any more: every block of it is reported failed."""
        log.warning("tutti: load of request %s abandoned: %s", ld.spec.req_id, why)
        self._failed(ld.spec, ld.spec.block_ids)
        job, ld.job = ld.job, None
        if job is None:
            return
        for step in (job.cancel, job.close):  # close even if cancel fails
            try:
                step()
            except TuttiError as e:
                log.warning("tutti: releasing the abandoned load of request %s: %s", ld.spec.req_id, e)

    def wait_layer(self, layer_name: str) -> None:
        layer = self.layer_of(layer_name)
        if layer is None:
            return
        group = self.group_of(layer_name)
        for ld in self._loads:
            if ld.job is None or layer in ld.waited or ld.spec.group != group or ld.spec.notify:
                continue
            try:
                st = ld.job.wait_layer(layer, self.timeout_s)
            except TuttiError as e:
                self._abandon(ld, e)
                continue
            ld.waited.add(layer)
            self._absorb(ld, st)

    def finish_loads(self) -> None:
        for ld in self._loads:
            if ld.job is None:
                continue
            try:
                st = ld.job.wait(self.timeout_s)
            except TuttiError as e:
                self._abandon(ld, e)
                continue
            self._absorb(ld, st)
            ld.job.close()
            ld.job = None
        self._loads.clear()
        self._recved |= self._recving
        self._recving = set()
        if self._remote_done:
            self._store_remote_locally()

    def take_recving(self) -> tuple[set[str], set[str]]:
        """(requests whose asynchronous loads are done, those of them with a block that did not
        load) since the last call."""
        done, failed = self._recved, self._recv_failed & self._recved
        self._recved, self._recv_failed = set(), self._recv_failed - done
        return done, failed

    def loads_complete(self) -> bool:
        """Every load of the step has landed (its last layer is in), or there is none."""
        for ld in self._loads:
            if ld.job is None:
                continue
            try:
                if not ld.job.layer_done(ld.job.layers[-1]):
                    return False
            except TuttiError:
                return False
        return True

    def loading_bytes(self) -> int:
        """KV bytes the step's submitted loads move (this rank's shard)."""
        return sum(len(ld.spec.block_ids) for ld in self._loads if ld.job is not None) * self.block_bytes

    def pending_write_bytes(self) -> int:
        """KV bytes of saves submitted but not completed (deferred ones)."""
        return sum(len(sv.spec.block_ids) for sv in self._pending) * self.block_bytes

    @property
    def has_load_errors(self) -> bool:
        return bool(self._load_errors)

    @property
    def block_bytes(self) -> int:
        return 2 * self.g.layers * self.g.object_bytes

    def take_load_errors(self) -> set[int]:
        errors, self._load_errors = self._load_errors, set()
        return errors

    # --- saves ---------------------------------------------------------------------------

    def _begin_saves(self, plan: StepPlan) -> None:
        self._saves_begun = True
        for spec in plan.saves:
            if not spec.hashes:
                continue
            try:
                self._saves.append(_Save(spec, self.rt.begin_store(spec.hashes, spec.block_ids)))
            except TuttiError as e:
                log.warning("tutti: cannot store request %s's blocks: %s", spec.req_id, e)

    def _submit(self, sv: _Save, layers: range) -> None:
        try:
            sv.jobs.append(sv.store.submit(layers))
            sv.layers.update(layers)
        except TuttiError as e:
            log.warning("tutti: storing layers %s of request %s failed: %s", layers, sv.spec.req_id, e)
            sv.layers.update(layers)  # not retried; the commit leaves these blocks out

    def save_layer(self, plan: StepPlan, layer_name: str, kv_layer: torch.Tensor) -> None:
        """Layer ``layer_name`` has been computed: its writes go out once its kernels are done.

        A GPU layer is not waited for here (that would stall the stream every
        layer): it is queued with a marker and submitted by a later hook that
        finds the marker done, or at the end of the step.
        """
        if not self._saves_begun:
            self._begin_saves(plan)
        layer = self.layer_of(layer_name)
        if layer is None or not self._saves:
            return
        self._written.append((self.group_of(layer_name), layer, mark_written(kv_layer)))
        self._submit_written(wait=False)

    def _submit_written(self, wait: bool) -> None:
        while self._written:
            group, layer, marker = self._written[0]
            if marker is not None and not marker.done():
                if not wait:
                    return
                marker.wait()
            self._written.pop(0)
            for sv in self._saves:
                if sv.spec.group == group and layer not in sv.layers:
                    self._submit(sv, range(layer, layer + 1))

    def finish_saves(self, plan: StepPlan | None) -> None:
        """End of the step's forward pass: every layer of every save is submitted; then the saves
        are completed now, or (deferred) at the start of the next step."""
        if plan is not None and not self._saves_begun:
            self._begin_saves(plan)
        self._submit_written(wait=True)
        for sv in self._saves:
            # Layers vLLM never reported (no per-layer hook ran) are written now.
            missing = [l for l in range(self.g.layers) if l not in sv.layers]
            for run in _runs(missing):
                self._submit(sv, run)
        saves, self._saves = self._saves, []
        self._saves_begun = False
        if self.deferred:
            self._pending += saves
        else:
            self._complete(saves)

    def begin_step(self, plan: StepPlan) -> None:
        """Start of a step, before anything writes KV memory: the previous step's deferred saves
        finish here, because blocks vLLM freed since (a preempted request's) may be rewritten now."""
        self.drain()
        self._prev_save_ids = self._cur_save_ids
        self._cur_save_ids = {s.req_id for s in plan.saves}

    def drain(self) -> None:
        pending, self._pending = self._pending, []
        self._complete(pending)

    def finished_saving(self, finished_req_ids: set[str]) -> set[str]:
        """Finished requests whose blocks vLLM held for the saves of the step before this one
        (all complete now: ``begin_step`` drained them)."""
        return set(finished_req_ids) & self._prev_save_ids if self.deferred else set()

    def _complete(self, saves: list[_Save]) -> None:
        for sv in saves:
            for job in sv.jobs:
                try:
                    job.wait(self.timeout_s)
                except Timeout as e:
                    log.warning("tutti: a store job of request %s timed out: %s", sv.spec.req_id, e)
                    job.cancel()
                except TuttiError as e:
                    log.warning("tutti: a store job of request %s failed: %s", sv.spec.req_id, e)
                job.close()
            try:
                report = sv.store.commit()
                if report.failed:
                    log.info("tutti: request %s: %d of %d blocks not stored", sv.spec.req_id, report.failed,
                             len(sv.spec.block_ids))
            except TuttiError as e:
                log.warning("tutti: committing request %s's blocks failed: %s", sv.spec.req_id, e)
            sv.store.close()
            if self.tier is not None and self.identity is not None:
                # Still the step's KV (nothing rewrote these blocks yet): digested now, sent later.
                self.tier.publish(self.identity, sv.spec.hashes, [self.block_segments(b) for b in sv.spec.block_ids])

    def close(self) -> None:
        self.finish_loads()
        self.finish_saves(None)
        self.drain()
