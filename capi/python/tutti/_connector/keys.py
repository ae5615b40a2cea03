"""A vLLM request's block keys: its tokens chained with everything else that makes its KV its own.

vLLM's own prefix cache does not key a block on token ids alone
(``vllm/v1/core/kv_cache_utils.py``, ``generate_block_hash_extra_keys``): it mixes in the
request's LoRA adapter (name and path), each multimodal item overlapping the block (the item's
identifier and its offset from the block's start: image placeholder tokens are the same ids for
every image), the request's ``cache_salt`` (first block only) and a digest of the block's prompt
embeddings. tutti's keys mix the same facts, so two requests share a chunk exactly when vLLM's
own prefix cache would let them share the block:

* **request-wide** facts (the LoRA adapter, the cache salt) are folded into the chain's root:
  ``root = BLAKE2b-128(encode(facts))``. Since every chunk hash chains its parent, they reach every
  block, as vLLM's per-block LoRA key and first-block salt do.
* **per-block** facts (multimodal items, prompt embeddings) are folded into the parent of the
  block they belong to: ``parent' = BLAKE2b-128(parent ‖ encode(facts))``, then libtutti's chain
  hash of the block's tokens under ``parent'``.
* a request with neither gets exactly ``tutti.chain_hashes(tokens)``, so pools written before
  this rule stay valid for plain requests.
* with vLLM's hybrid allocator (several KV-cache groups, :mod:`.groups`) the group's own facts
  (index, kind, window, layer names) are request-wide facts too: every group has its own chain.

``encode`` is a tagged, length-prefixed encoding of strings, bytes, integers and tuples, so keys
are the same in every process and after restarts (vLLM's own block hashes may depend on a
per-process seed, ``NONE_HASH``, and are not reused). A fact of any other type is not guessed at:
the request is keyed as uncacheable (no lookup, no store) and a warning names it. The
deployment's ``tenant_salt``, the model and the geometry stay in the pool's cache identity.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import struct
from typing import TYPE_CHECKING, Any, Sequence

from ..runtime import chain_hashes

if TYPE_CHECKING:  # vLLM's types, for type checkers only
    from vllm.v1.request import Request

log = logging.getLogger("vllm.tutti")

_ROOT = b"tutti-vllm-req1"  # BLAKE2b person strings (at most 16 bytes)
_BLOCK = b"tutti-vllm-blk1"
_DIGEST = 16


class Unkeyable(ValueError):
    """A request carries an identity fact tutti cannot encode deterministically."""


def encode(value: Any) -> bytes:
    """A deterministic, unambiguous byte encoding of vLLM's extra-key values."""
    if value is None:
        return b"N"
    if isinstance(value, bool):
        return b"T" if value else b"F"
    if isinstance(value, int):
        return b"I" + _len(str(value).encode())
    if isinstance(value, str):
        return b"S" + _len(value.encode("utf-8", "surrogatepass"))
    if isinstance(value, (bytes, bytearray, memoryview)):
        return b"B" + _len(bytes(value))
    if isinstance(value, (tuple, list)):
        return b"L" + struct.pack("<I", len(value)) + b"".join(encode(v) for v in value)
    raise Unkeyable(f"{type(value).__name__} value {value!r:.60}")


def _len(raw: bytes) -> bytes:
    return struct.pack("<I", len(raw)) + raw


def lora_keys(request: Request) -> list[tuple]:
    """The LoRA adapter, by name and path (vLLM keys on both, not on the per-process int id)."""
    lora = request.lora_request
    if not lora:
        return []
    return [("lora", lora.lora_name, lora.lora_path)]


def salt_keys(request: Request, start: int) -> list[tuple]:
    return [("cache_salt", request.cache_salt)] if start == 0 and request.cache_salt else []


def mm_keys(request: Request, start: int, end: int, mm_idx: int) -> tuple[list[tuple], int]:
    """Multimodal items overlapping tokens [start, end): (identifier, offset from ``start``), and
    the index of the first item a later block can overlap. Items are in position order, as vLLM
    keeps them."""
    features = request.mm_features or []
    keys: list[tuple] = []
    i = mm_idx
    while i < len(features):
        pos = features[i].mm_position
        offset, length = int(pos.offset), int(pos.length)
        if offset >= end:
            break  # this block ends before the item
        if offset + length <= start:
            i += 1  # the item ended before this block
            continue
        keys.append(("mm", features[i].identifier, offset - start))
        if offset + length > end:
            break  # the item goes on into the next block
        i += 1
    return keys, i


def embeds_keys(request: Request, start: int, end: int) -> list[tuple]:
    """A SHA-256 of the block's prompt embeddings (their raw bytes), when the prompt has them."""
    embeds = request.prompt_embeds
    if embeds is None:
        return []
    import torch  # only a request that carries a tensor gets here

    block = embeds[start:end].detach().to("cpu").contiguous()
    raw = block.view(torch.uint8).numpy().tobytes() if block.numel() else b""
    return [("prompt_embeds", hashlib.sha256(raw).digest())]


def block_extra_keys(request: Request, start: int, end: int, mm_idx: int) -> tuple[tuple | None, int]:
    """The facts of one block in vLLM's order (LoRA, multimodal, salt, embeddings), as vLLM's
    ``generate_block_hash_extra_keys`` returns them; the tests compare the two on vLLM's own
    requests, so a vLLM release that keys blocks on more fails a test."""
    mm, next_idx = mm_keys(request, start, end, mm_idx)
    keys = lora_keys(request) + mm + salt_keys(request, start) + embeds_keys(request, start, end)
    return (tuple(keys) if keys else None), next_idx


def _root(request: Request, group: tuple | None = None) -> bytes | None:
    facts = lora_keys(request) + salt_keys(request, 0) + ([group] if group is not None else [])
    if not facts:
        return None
    return hashlib.blake2b(encode(facts), digest_size=_DIGEST, person=_ROOT).digest()


def _mix(parent: bytes | None, facts: list[tuple]) -> bytes:
    h = hashlib.blake2b(digest_size=_DIGEST, person=_BLOCK)
    h.update(parent if parent is not None else b"\0" * _DIGEST)
    h.update(encode(facts))
    return h.digest()


def request_hashes(request: Request, tokens: Sequence[int], tokens_per_block: int,
                   group: tuple | None = None) -> list[bytes]:
    """The chained key of every full block of ``tokens`` (the request's tokens) under its identity.

    ``group``: the facts of one KV-cache group of a hybrid model (:meth:`.groups.Group.facts`),
    folded into the root with the request-wide facts, so each group's chunks have keys of their
    own; None (one group) keeps the keys unchanged.

    Raises :class:`Unkeyable` when a fact cannot be encoded."""
    B = tokens_per_block
    n = len(tokens) // B
    parent = _root(request, group)
    has_embeds = request.prompt_embeds is not None
    if not request.mm_features and not has_embeds:
        return chain_hashes(tokens[: n * B], B, parent)  # one call: nothing per block
    out: list[bytes] = []
    mm_idx = 0
    run_start = 0  # first block of the run of blocks with no facts of their own
    for i in range(n):
        mm, mm_idx = mm_keys(request, i * B, (i + 1) * B, mm_idx)
        facts = mm + embeds_keys(request, i * B, (i + 1) * B)
        if not facts:
            continue
        if run_start < i:
            out += chain_hashes(tokens[run_start * B: i * B], B, out[-1] if out else parent)
        mixed = _mix(out[-1] if out else parent, facts)
        out += chain_hashes(tokens[i * B: (i + 1) * B], B, mixed)
        run_start = i + 1
    if run_start < n:
        out += chain_hashes(tokens[run_start * B: n * B], B, out[-1] if out else parent)
    return out


# --- what the connector reads from vLLM's objects ------------------------------------------------

# (module, class, fields): every field of vLLM's scheduler objects the connector reads. Checked at
# start-up against the installed vLLM, so a renamed field fails there, naming it, instead of being
# read as missing (a resumed request's block table appended to its old one stores other blocks'
# bytes under its keys).
READS = (
    ("vllm.v1.core.sched.output", "SchedulerOutput",
     ("scheduled_new_reqs", "scheduled_cached_reqs", "num_scheduled_tokens", "finished_req_ids")),
    ("vllm.v1.core.sched.output", "NewRequestData", ("req_id", "block_ids", "num_computed_tokens")),
    ("vllm.v1.core.sched.output", "CachedRequestData",
     ("req_ids", "resumed_req_ids", "new_block_ids", "num_computed_tokens")),
    ("vllm.multimodal.inputs", "MultiModalFeatureSpec", ("identifier", "mm_position")),
    ("vllm.multimodal.inputs", "PlaceholderRange", ("offset", "length")),
    ("vllm.lora.request", "LoRARequest", ("lora_name", "lora_path")),
)
# vllm.v1.request.Request's constructor parameters the keys read back as attributes.
REQUEST_PARAMS = ("request_id", "prompt_token_ids", "prompt_embeds", "mm_features", "lora_request", "cache_salt")


def _field_names(cls: type) -> set[str]:
    if dataclasses.is_dataclass(cls):
        return {f.name for f in dataclasses.fields(cls)}
    struct_fields = getattr(cls, "__struct_fields__", None)  # msgspec.Struct
    if struct_fields is not None:
        return set(struct_fields)
    import inspect

    return set(inspect.signature(cls).parameters)


def missing_vllm_fields() -> list[str]:
    """``module.Class.field`` for every field the connector reads that the installed vLLM lacks."""
    import importlib
    import inspect

    missing = []
    for module, name, fields in READS:
        try:
            cls = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            missing.append(f"{module}.{name}")
            continue
        have = _field_names(cls)
        missing += [f"{module}.{name}.{f}" for f in fields if f not in have]
    try:
        from vllm.v1.request import Request

        params = set(inspect.signature(Request.__init__).parameters)
        missing += [f"vllm.v1.request.Request({p}=...)" for p in REQUEST_PARAMS if p not in params]
    except ImportError:
        missing.append("vllm.v1.request.Request")
    return missing
