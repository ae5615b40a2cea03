"""SGLang's MLA host pool (``MLATokenToKVPoolHost``) as one tutti registration.

An MLA model (DeepSeek-V2/V3/R1, Kimi K2) keeps per layer and token one latent vector of
``kv_cache_dim = kv_lora_rank + qk_rope_head_dim`` elements (512 + 64 for DeepSeek-V3),
with no K/V pair, and every TP rank holds the same latents. SGLang lays the host pool out
as ``layer_first`` ``[layers, tokens, 1, dim]``, ``page_first`` ``[tokens, layers, 1, dim]``
or ``page_first_direct`` ``[pages, layers, page_size, 1, dim]``, and ``get_page_buffer_meta``
reports one region per page and layer (``layer_first``) or one per page (the page-major two).

tutti's pool keeps two objects per registered layer and block (the executor's K|V tables).
A latent region is one dense run, so it is registered as its two halves, byte for byte, the
way the vLLM connector stores vLLM's packed K|V blocks: tutti geometry ``layers L, KV heads 1,
head dim dim/2`` for ``layer_first`` and ``layers 1, KV heads L, head dim dim/2`` for the
page-major layouts, tokens per block = page size. Nothing is stored twice: one page is
``layers × page_size × dim`` elements on the drives, exactly SGLang's page. The cache identity
(:func:`tutti._hicache.config.identity_salt`) names the pool as latent and leaves the TP rank
out: every rank reads the same pages, and a pool written at one TP size is read at any other
with the same latent, layout, page size and dtype.

Refused, naming why: ``page_unified`` (SGLang reports no page regions for it), Ascend's
``page_first_kv_split`` (split K/V buffers and indexer sidecars), an allocator-only pool
(no ``kv_buffer``), decode context parallelism, and an odd ``kv_cache_dim`` (no byte-exact
halves).
"""

from __future__ import annotations

from typing import Any

from ..runtime import Geometry
from .layout import _DTYPES, PoolLayout, UnsupportedPool, check_against_meta, check_object_fits

MLA_LAYOUTS = ("layer_first", "page_first", "page_first_direct")

_WHY_NOT = {
    "page_unified": "SGLang reports no per-page buffer regions for it (get_page_buffer_meta refuses it)",
    "page_first_kv_split": "Ascend's split latent/rope buffers and indexer sidecars are not one region per page",
}


def _get(pool: Any, name: str):
    if not hasattr(pool, name):
        raise UnsupportedPool(
            f"tutti.sglang: MLA host pool {type(pool).__name__} has no {name!r}; tutti addresses SGLang's "
            f"MLATokenToKVPoolHost in the layouts {', '.join(MLA_LAYOUTS)}"
        )
    return getattr(pool, name)


def from_mla_host_pool(pool: Any) -> PoolLayout:
    """The registration of an SGLang MLA host pool, checked against its own page metadata."""
    name = _get(pool, "layout")
    if name not in MLA_LAYOUTS:
        why = _WHY_NOT.get(name, "not one of SGLang's MLA host layouts tutti knows")
        raise UnsupportedPool(
            f"tutti.sglang: MLA host pool layout {name!r} is refused ({why}); use --hicache-mem-layout "
            f"{' or '.join(MLA_LAYOUTS)}"
        )
    kv = _get(pool, "kv_buffer")
    if kv is None:
        raise UnsupportedPool(
            f"tutti.sglang: {type(pool).__name__} has no kv_buffer (an allocator-only host pool); tutti moves "
            "pages between the drives and a materialised host pool"
        )
    if getattr(pool, "dcp_size", 1) != 1:
        raise UnsupportedPool("tutti.sglang: decode context parallelism (dcp_size > 1) is not supported")
    L, D = int(_get(pool, "layer_num")), int(_get(pool, "kv_cache_dim"))
    ps, size = int(_get(pool, "page_size")), int(_get(pool, "size"))
    dt = str(kv.dtype)
    if dt not in _DTYPES:
        raise UnsupportedPool(f"tutti.sglang: KV dtype {dt} is not one tutti stores ({', '.join(sorted(_DTYPES))})")
    if str(kv.device) != "cpu" or not kv.is_contiguous():
        raise UnsupportedPool(f"tutti.sglang: kv_buffer must be contiguous host memory, is on {kv.device}, "
                              f"contiguous={kv.is_contiguous()}")
    if ps < 1 or size < ps or size % ps:
        raise UnsupportedPool(f"tutti.sglang: a pool of {size} tokens is not whole pages of {ps} tokens")
    if D % 2:
        raise UnsupportedPool(
            f"tutti.sglang: the MLA latent has {D} elements per token (odd); tutti stores each latent run as two "
            "byte-exact halves"
        )
    e = kv.element_size()
    token = D * e
    if kv.numel() * e != L * size * token:
        raise UnsupportedPool(
            f"tutti.sglang: kv_buffer is {kv.numel() * e} bytes; {L} layers × {size} tokens × latent {D} × {e} bytes "
            f"is {L * size * token}: not the pool SGLang describes"
        )
    base = kv.data_ptr()
    if name == "layer_first":
        geometry = Geometry(L, 1, D // 2, ps, _DTYPES[dt])
        k_bases = tuple(base + l * size * token for l in range(L))
        stride = ps * token
    else:
        geometry = Geometry(1, L, D // 2, ps, _DTYPES[dt])
        k_bases = (base,)
        stride = ps * L * token
    half = geometry.object_bytes
    check_object_fits(geometry, name, f"half of a latent run: page size {ps} × {geometry.kv_heads} × {D // 2} × {e} bytes")
    layout = PoolLayout(
        name=name, geometry=geometry, num_blocks=size // ps, page_size=ps, k_bases=k_bases,
        v_bases=tuple(k + half for k in k_bases), block_stride=stride, torch_dtype=dt, latent=True,
    )
    check_against_meta(pool, layout, base, kv.numel() * e)
    return layout
