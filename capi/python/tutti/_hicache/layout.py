"""Where SGLang's host KV pool keeps each page, as one tutti registration.

SGLang's MHA host pool (``MHATokenToKVPoolHost``) is one tensor ``kv_buffer`` whose
first dimension is K/V. Zero-copy storage backends are told where a page lives by
``get_page_buffer_meta(indices)``: per page either one K and one V region (``page_first``,
``page_first_direct``, ``page_head``: the page's K for every layer is one contiguous run)
or one K and one V region per layer (``layer_first``). In every layout SGLang has, a page's
regions sit at a fixed offset from page 0's plus ``page × stride``: exactly tutti's
``strided`` registration (per-layer K and V bases, one block stride), with tutti's block
= SGLang's page.

- ``layer_first`` registers tutti's geometry as it is (layers L, KV heads H, head dim D,
  tokens per block = page size): one object per layer per K/V.
- the page-major layouts register one object per K/V for the whole page: geometry
  (layers 1, KV heads L·H, head dim D, page size). Fewer, larger NVMe commands; a page
  moves as two objects.

The registration is derived from the layout, then checked against what
``get_page_buffer_meta`` reports for the first, second and last pages (and every byte
against ``kv_buffer``'s extent): a pool whose pages are not where SGLang says is refused,
never registered. Layouts not in :data:`SUPPORTED` are refused with :class:`UnsupportedPool`.
SGLang's MLA host pool (one latent vector per token, no K/V pair) has its own rules in
:mod:`tutti._hicache.mla`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..runtime import Geometry, packed_u32

SUPPORTED = ("layer_first", "page_first", "page_first_direct", "page_head")
# The smallest logical block of a drive (512 B; 4 KiB drives need objects of whole 4 KiB, which
# libtutti checks when it opens the pool).
MIN_LBA_BYTES = 512

# torch dtype (its str) -> tutti dtype name. SGLang keeps fp8 KV in uint8 host buffers.
_DTYPES = {
    "torch.float32": "f32",
    "torch.float16": "f16",
    "torch.bfloat16": "bf16",
    "torch.float8_e4m3fn": "fp8_e4m3",
    "torch.float8_e5m2": "fp8_e5m2",
    "torch.uint8": "i8",
    "torch.int8": "i8",
}


class UnsupportedPool(ValueError):
    """SGLang's host pool is one tutti cannot address; the message says what and why."""


class PageIndexError(ValueError):
    """``host_indices`` do not describe whole pages of the registered pool."""


@dataclass(frozen=True)
class PoolLayout:
    """One tutti registration of an SGLang host pool."""

    name: str  # SGLang's layout name
    geometry: Geometry
    num_blocks: int  # pages in the pool (tutti blocks)
    page_size: int  # tokens per page
    k_bases: tuple[int, ...]
    v_bases: tuple[int, ...]
    block_stride: int
    torch_dtype: str
    # MLA: each registered region is one latent run held as two objects (its halves), not K and V.
    latent: bool = False

    @property
    def page_bytes(self) -> int:
        """One page, every layer: K and V (MHA), or the latent run's two halves (MLA)."""
        return 2 * self.geometry.layers * self.geometry.object_bytes

    def describe(self) -> str:
        g = self.geometry
        return (
            f"{'MLA ' if self.latent else ''}{self.name}: {self.num_blocks} pages of {self.page_size} tokens, {self.page_bytes} bytes each, "
            f"as tutti geometry layers={g.layers} kv_heads={g.kv_heads} head_dim={g.head_dim} "
            f"tokens_per_block={g.tokens_per_block} dtype={g.dtype}, block stride {self.block_stride}"
        )

    def block_ids(self, host_indices: Any, pages: int):
        """SGLang's token indices of ``pages`` whole pages -> tutti block ids (a packed uint32 array).

        ``host_indices[i * page_size]`` is page ``i``'s first token; every page must be whole
        (its ``page_size`` indices consecutive from a multiple of ``page_size``) and inside the
        pool. Checked with a few tensor operations, not per page.
        """
        import torch

        ps = self.page_size
        if not isinstance(host_indices, torch.Tensor):
            raise PageIndexError(f"tutti.sglang: host_indices must be a torch tensor, got {type(host_indices).__name__}")
        idx = host_indices.detach().reshape(-1)
        if idx.numel() != pages * ps:
            raise PageIndexError(
                f"tutti.sglang: {pages} keys need {pages} pages of {ps} tokens = {pages * ps} host indices, "
                f"got {idx.numel()} (the pool's page size is {ps})"
            )
        if idx.dtype.is_floating_point or idx.dtype == torch.bool:
            raise PageIndexError(f"tutti.sglang: host_indices must be integers, got {idx.dtype}")
        idx = idx.to(device="cpu", dtype=torch.int64).view(pages, ps)
        first = idx[:, 0]
        if ps > 1 and not bool((idx - first[:, None] == torch.arange(ps)).all()):
            raise PageIndexError(
                f"tutti.sglang: host_indices are not whole pages: each page's {ps} indices must be consecutive"
            )
        if bool((first % ps != 0).any()):
            bad = int(first[first % ps != 0][0])
            raise PageIndexError(
                f"tutti.sglang: host index {bad} starts a page but is not a multiple of the page size {ps}"
            )
        if bool((first < 0).any()) or bool((first >= self.num_blocks * ps).any()):
            raise PageIndexError(
                f"tutti.sglang: host indices outside the registered pool (0..{self.num_blocks * ps}): "
                f"{int(first.min())}..{int(first.max()) + ps}"
            )
        return packed_u32((first // ps).to(torch.int32).numpy())


def _attr(pool: Any, name: str):
    if not hasattr(pool, name):
        raise UnsupportedPool(
            f"tutti.sglang: host pool {type(pool).__name__} has no {name!r}; tutti addresses SGLang's MHA host "
            f"pool (MHATokenToKVPoolHost) in the layouts {', '.join(SUPPORTED)}"
        )
    return getattr(pool, name)


def is_mla_pool(pool: Any) -> bool:
    """SGLang's MLA host pool (or one shaped like it: a latent of ``kv_lora_rank + qk_rope_head_dim``)."""
    try:
        from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost
    except ImportError:  # another SGLang layout; the attribute checks still decide
        MLATokenToKVPoolHost = ()
    return bool(MLATokenToKVPoolHost and isinstance(pool, MLATokenToKVPoolHost)) or hasattr(pool, "kv_lora_rank")


def from_host_pool(pool: Any) -> PoolLayout:
    """The registration of ``pool`` (an SGLang MHA ``HostKVCache``), checked against its own page
    metadata. An MLA pool (:func:`is_mla_pool`) has its own rules: ``mla.from_mla_host_pool``."""
    name = _attr(pool, "layout")
    if name not in SUPPORTED:
        raise UnsupportedPool(
            f"tutti.sglang: host pool layout {name!r} is not one tutti can address; use "
            f"--hicache-mem-layout {' or '.join(SUPPORTED)}"
        )
    kv = _attr(pool, "kv_buffer")
    L, H, D = int(_attr(pool, "layer_num")), int(_attr(pool, "head_num")), int(_attr(pool, "head_dim"))
    ps, size = int(_attr(pool, "page_size")), int(_attr(pool, "size"))
    v_dim = int(getattr(pool, "v_head_dim", D) or D)
    if v_dim != D:
        raise UnsupportedPool(f"tutti.sglang: K head dim {D} and V head dim {v_dim} differ; tutti's K and V objects are one size")
    if getattr(pool, "dcp_size", 1) != 1:
        raise UnsupportedPool("tutti.sglang: decode context parallelism (dcp_size > 1) is not supported")
    dt = str(kv.dtype)
    if dt not in _DTYPES:
        raise UnsupportedPool(f"tutti.sglang: KV dtype {dt} is not one tutti stores ({', '.join(sorted(_DTYPES))})")
    if str(kv.device) != "cpu" or not kv.is_contiguous():
        raise UnsupportedPool(f"tutti.sglang: kv_buffer must be contiguous host memory, is on {kv.device}, "
                              f"contiguous={kv.is_contiguous()}")
    if ps < 1 or size < ps or size % ps:
        raise UnsupportedPool(f"tutti.sglang: a pool of {size} tokens is not whole pages of {ps} tokens")
    e = kv.element_size()
    token = H * D * e
    if kv.numel() * e != 2 * L * size * token:
        raise UnsupportedPool(
            f"tutti.sglang: kv_buffer is {kv.numel() * e} bytes; 2 × {L} layers × {size} tokens × {H} heads × {D} × "
            f"{e} bytes is {2 * L * size * token}: not the pool SGLang describes"
        )
    pages = size // ps
    base = kv.data_ptr()
    v_off = L * size * token
    if name == "layer_first":
        geometry = Geometry(L, H, D, ps, _DTYPES[dt])
        k_bases = tuple(base + l * size * token for l in range(L))
        stride = ps * token
    else:
        geometry = Geometry(1, L * H, D, ps, _DTYPES[dt])
        k_bases = (base,)
        stride = ps * L * token
    check_object_fits(geometry, name, f"page size {ps} × {geometry.kv_heads} KV heads × head dim {D} × {e} bytes")
    layout = PoolLayout(
        name=name, geometry=geometry, num_blocks=pages, page_size=ps, k_bases=k_bases,
        v_bases=tuple(k + v_off for k in k_bases), block_stride=stride, torch_dtype=dt,
    )
    check_against_meta(pool, layout, base, kv.numel() * e)
    return layout


def check_object_fits(geometry: Geometry, name: str, what: str) -> None:
    """Refuses a page size whose objects are not whole logical blocks, naming the page size that fits."""
    obj, ps = geometry.object_bytes, geometry.tokens_per_block
    if obj % MIN_LBA_BYTES == 0:
        return
    per_token = obj // ps
    fit = next(p for p in range(ps + 1, ps * MIN_LBA_BYTES + 1) if p * per_token % MIN_LBA_BYTES == 0)
    raise UnsupportedPool(
        f"tutti.sglang: page size {ps} does not fit the pool's geometry: in layout {name!r} one tutti object "
        f"({what}) is {obj} bytes, and the drives store objects in whole {MIN_LBA_BYTES}-byte logical blocks; "
        f"use --page-size {fit} (or a multiple)"
        + ("" if name != "layer_first" else ", or a page-major --hicache-mem-layout (one object per page)")
    )


def expected_regions(layout: PoolLayout, page: int) -> tuple[list[int], list[int]]:
    """The regions ``get_page_buffer_meta`` must report for ``page``: K and V per registered layer
    (MHA), or one latent run per registered layer, both its halves (MLA)."""
    obj, off = layout.geometry.object_bytes, page * layout.block_stride
    ptrs: list[int] = []
    sizes: list[int] = []
    for k, v in zip(layout.k_bases, layout.v_bases):
        if layout.latent:
            ptrs.append(k + off)
            sizes.append(2 * obj)
        else:
            ptrs += [k + off, v + off]
            sizes += [obj, obj]
    return ptrs, sizes


def check_against_meta(pool: Any, layout: PoolLayout, base: int, nbytes: int) -> None:
    """Every region ``get_page_buffer_meta`` reports for a few pages must be the registered one."""
    import torch

    ps, n = layout.page_size, layout.num_blocks
    sample = sorted({0, min(1, n - 1), n - 1})
    indices = torch.cat([torch.arange(p * ps, (p + 1) * ps, dtype=torch.int64) for p in sample])
    try:
        ptrs, sizes = pool.get_page_buffer_meta(indices)
    except Exception as e:  # noqa: BLE001 - SGLang's own refusal, reported as ours
        raise UnsupportedPool(f"tutti.sglang: {type(pool).__name__}.get_page_buffer_meta failed: {e}") from e
    want_p, want_s = [], []
    for p in sample:
        pp, ss = expected_regions(layout, p)
        want_p += pp
        want_s += ss
    got_p, got_s = [int(x) for x in ptrs], [int(x) for x in sizes]
    if got_p != want_p or got_s != want_s:
        raise UnsupportedPool(
            f"tutti.sglang: {type(pool).__name__} layout {layout.name!r} reports page regions tutti cannot address "
            f"as one strided registration (pages {sample}: got {len(got_p)} regions, first "
            f"{[hex(x - base) for x in got_p[:4]]} sizes {got_s[:4]}; expected {[hex(x - base) for x in want_p[:4]]} "
            f"sizes {want_s[:4]}, offsets from kv_buffer)"
        )
    last = max(p + n for p, n in zip(want_p, want_s))
    if min(want_p) < base or last > base + nbytes:
        raise UnsupportedPool(f"tutti.sglang: page regions reach outside kv_buffer ({last - base} > {nbytes} bytes)")
