"""vLLM's KV-cache groups (its hybrid memory allocator, HMA), as tutti serves them.

A model with one kind of attention has one group: every layer shares one block table, and
that path is the one tutti always served (:data:`None` here: nothing changes). A hybrid model
(Gemma 2/3, Mistral with a window on some layers, gpt-oss) has several: vLLM 0.32 groups the
layers by spec into groups of equal size (``_get_kv_cache_groups_uniform_page_size``), gives each
group its own block table drawn from one block pool, and overlays the groups in memory: the
``j``-th layer of every group views the same KV tensor (``get_kv_cache_config_from_groups``:
"groups alias from byte 0"). A block id belongs to one group at a time, so block ``b`` of that
tensor holds the ``j``-th layer of whichever group owns ``b``.

tutti follows that layout. The pool's layers are the overlaid tensors ("slots": slot ``j`` is the
``j``-th layer of every group), and one chunk is one block id across all slots. A chunk of group
``g`` is keyed under ``g``'s own chain (the group's index, kind, window and layer names are folded
into the chain's root, :func:`group_facts`), so the chunks of two groups never alias, and a pool
written under another grouping of the layers never answers.

A sliding-window group keeps only the blocks its window still needs; vLLM replaces the others
in the group's block table by its null block (block id 0, never a real block:
``BlockPool.null_block``). At a hit of ``n`` blocks the next token attends to the tokens from
``n * block_size - window + 1`` on (``SlidingWindowManager.get_num_skipped_tokens``), so the
blocks from :meth:`Group.window_start` to ``n`` must be in the pool, and only those are loaded.

Groups whose state is not per-token attention KV in blocks (Mamba/SSM state, cross-attention,
chunked local attention, sink tokens, ...) are refused when the connector is built, naming the
group and its kind: a skipped group would leave its layers computing from missing state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # vLLM's types, for type checkers only
    from vllm.v1.kv_cache_interface import KVCacheConfig

FULL = "full_attention"
SLIDING = "sliding_window"
NULL_BLOCK = 0  # vLLM's BlockPool reserves block 0 as the null block of every group


class UnservableGroup(ValueError):
    """A KV-cache group whose kind tutti cannot store; the message names it."""


@dataclass(frozen=True)
class Group:
    index: int
    kind: str  # FULL or SLIDING
    layers: tuple[str, ...]  # vLLM's order: layer j sits in slot j
    window: int = 0  # SLIDING: tokens kept behind the next one (sliding_window + extra_retained_tokens)

    def window_start(self, blocks: int, tokens_per_block: int) -> int:
        """The first block the next token after ``blocks`` full blocks attends to (0 for full
        attention): vLLM's skipped tokens at that point, in whole blocks."""
        if self.kind != SLIDING:
            return 0
        return max(0, blocks * tokens_per_block - self.window + 1) // tokens_per_block

    def facts(self) -> tuple:
        """What the group's chunks depend on besides the request: mixed into its keys' root."""
        return ("kv_group", self.index, self.kind, self.window, tuple(self.layers))


@dataclass(frozen=True)
class Groups:
    """The groups of a hybrid KV cache, and the pool's slots (the overlaid tensors)."""

    groups: tuple[Group, ...]

    @property
    def slots(self) -> int:
        return max(len(g.layers) for g in self.groups)

    def slot_of(self) -> dict[str, tuple[int, int]]:
        """Layer name → (group index, slot)."""
        return {name: (g.index, j) for g in self.groups for j, name in enumerate(g.layers)}

    def describe(self) -> str:
        parts = []
        for g in self.groups:
            w = f" window {g.window}" if g.kind == SLIDING else ""
            parts.append(f"group {g.index} {g.kind}{w} ({len(g.layers)} layers)")
        return "; ".join(parts)


def _spec_kind(spec: Any) -> tuple[str, int] | None:
    """(kind, window) of a spec tutti serves, None for any other. Exact classes only: a subclass
    of vLLM's attention specs (sink tokens, R-SWA's middle gap, bounded replay, hidden states)
    changes which blocks hold what, and is refused rather than guessed at."""
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MLAAttentionSpec, SlidingWindowSpec

    cls = type(spec)
    if cls in (FullAttentionSpec, MLAAttentionSpec):
        return FULL, 0
    if cls is SlidingWindowSpec:
        return SLIDING, int(spec.sliding_window) + int(getattr(spec, "extra_retained_tokens", 0) or 0)
    return None


def _kind_name(spec: Any) -> str:
    try:
        from vllm.v1.kv_cache_interface import get_kv_cache_spec_kind

        return str(getattr(get_kv_cache_spec_kind(spec), "value", "unknown"))
    except (ImportError, AttributeError):
        return "unknown"


def from_kv_cache_config(cfg: KVCacheConfig | None) -> Groups | None:
    """The hybrid groups of vLLM's KV-cache config; None when there is one full-attention group
    (or no config, as before vLLM 0.11): the single-group path, unchanged.

    Raises :class:`UnservableGroup` naming the first group tutti cannot serve."""
    if cfg is None:
        return None
    groups = list(cfg.kv_cache_groups)
    if len(groups) == 1:
        from vllm.v1.kv_cache_interface import FullAttentionSpec, UniformTypeKVCacheSpecs

        spec = groups[0].kv_cache_spec
        # One group of attention in every block: the path tutti always served (with HMA off vLLM
        # turns sliding-window layers into FullAttentionSpec with the window noted, and keeps
        # every block).
        if isinstance(spec, (FullAttentionSpec, UniformTypeKVCacheSpecs)):
            return None
    out = []
    for i, g in enumerate(groups):
        spec = g.kv_cache_spec
        kind = _spec_kind(spec)
        if kind is None:
            raise UnservableGroup(
                f"KV-cache group {i} is {type(spec).__name__} (kind {_kind_name(spec)}, layers "
                f"{list(g.layer_names)[:4]}{' ...' if len(g.layer_names) > 4 else ''}); tutti stores full-attention "
                "and sliding-window KV groups only, so it cannot serve this model's KV cache (a skipped group "
                "would compute from state that is not there)"
            )
        if not getattr(g, "enable_kv_transfer", True):
            raise UnservableGroup(f"KV-cache group {i} ({type(spec).__name__}) is marked not transferable by vLLM")
        out.append(Group(i, kind[0], tuple(g.layer_names), kind[1]))
    return Groups(tuple(out))
