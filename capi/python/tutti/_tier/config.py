"""The tutti tier's configuration: one entry of vLLM's ``secondary_tiers`` list.

vLLM's ``SecondaryTierFactory`` pops ``type``, ``module_path`` and ``backpressure`` from the entry
and passes every other key to the tier's constructor. The pool keys are the connector's
(:mod:`tutti._connector.config`, validated by the same code, :func:`from_vllm`); the tier adds its
own:

==========================  ===========================================================
pool keys                   ``emulated_drives``, ``emulated_capacity_bytes``, ``emulated_dir``,
                            ``vfio_drives``, ``vfio_noiommu``, ``daemon_socket``, ``daemon``,
                            ``daemon_idle_exit_s``, ``daemon_start_timeout_s``, ``host_threads``,
                            ``host_mode``, ``open_mode``, ``io_timeout_ms``, ``model``,
                            ``tenant_salt``, ``lib``, the ``emulated_*`` pacing keys: as for the
                            connector (docs/engines.md)
``executor``                ``"gio"`` only (the default): the tier moves host memory, and
                            ``"direct"`` leaves a timed-out read with an unknown outcome in a
                            primary slot vLLM reuses at once
``sched_mode``              ``"arbitrate"`` (default: never a read and a write on one drive at
                            once, reads first) or ``"pass"``; ``sched_backlog_bytes``,
                            ``sched_backlog_full`` as for the connector
``n_read_threads``          threads that run load (promotion) jobs (default 2)
``n_write_threads``         threads that run store (cascade) jobs (default 2); loads never wait
                            behind stores for a thread
``timeout_ms``              how long one job may take before its chunks count as failed
                            (default 30000)
``object_bytes``            bytes of one pool object (a chunk is split into objects striped
                            over the drives; default: the largest power of two up to 256 KiB
                            that divides half a chunk)
``enable_kv_events``        report stored and evicted chunks through ``take_events`` (needs
                            vLLM's KV cache events enabled)
``locality``                ``"LOCAL"`` or ``"REMOTE"``, as vLLM's tiers take it
==========================  ===========================================================

The cache identity is the connector's: model name, tenant salt, layout, plus what makes vLLM's
chunk bytes mean what they mean, taken from vLLM's own ``FileMapper`` (the fields that name the
``fs`` tier's directory: tokens per hash, blocks per chunk, dtype, the KV cache groups, the
parallel layout unless the chunk is parallelism-agnostic, the canonical format) and the rank.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from .._connector.config import EMULATED_PACING, POOL_KEYS, ConfigError, ConnectorConfig, from_vllm
from ..runtime import Geometry

WHERE = "secondary_tiers[type=tutti]"

# vLLM's own keys of a tier entry that reach the constructor.
VLLM_KEYS = frozenset({"locality"})
TIER_KEYS = frozenset({
    "n_read_threads",
    "n_write_threads",
    "timeout_ms",
    "object_bytes",
    "enable_kv_events",
})
# The connector's keys the tier takes (the break-even rule and the slack table are for an engine
# whose forward pass the connector sees; the tier sees none).
POOL_TIER_KEYS = (POOL_KEYS - {"load_policy", "slack_table"}) | set(EMULATED_PACING) | {
    "sched_mode",
    "sched_backlog_bytes",
    "sched_backlog_full",
}
KNOWN_KEYS = VLLM_KEYS | TIER_KEYS | POOL_TIER_KEYS

MAX_OBJECT_BYTES = 256 << 10
MAX_LAYERS = 4096  # objstore/src/geometry.rs MAX_LAYERS
MAX_THREADS = 64


class TierConfigError(ConfigError):
    """The tier's entry of ``secondary_tiers`` is wrong; the message names the key."""


@dataclass(frozen=True)
class TierConfig:
    pool: ConnectorConfig
    chunk_bytes: int
    n_read_threads: int
    n_write_threads: int
    timeout_s: float
    enable_kv_events: bool
    salt: bytes
    rank: int

    @property
    def geometry(self) -> Geometry:
        return self.pool.geometry


def _int(kw: dict, key: str, default: int, lo: int, hi: int) -> int:
    v = kw.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise TierConfigError(f"{WHERE}[{key!r}] = {v!r} must be an integer in {lo}..{hi}")
    return v


def chunk_geometry(chunk_bytes: int, object_bytes: int | None) -> Geometry:
    """A geometry whose block is one vLLM chunk: ``layers`` K/V pairs of ``object_bytes`` each (the
    bytes are opaque to tutti; the split only decides how a chunk stripes over the drives)."""
    if chunk_bytes <= 0 or chunk_bytes % 2:
        raise TierConfigError(f"{WHERE}: vLLM's primary tier has chunks of {chunk_bytes} bytes; tutti needs an even size")
    half = chunk_bytes // 2
    if object_bytes is None:
        object_bytes = 1
        while object_bytes * 2 <= MAX_OBJECT_BYTES and half % (object_bytes * 2) == 0:
            object_bytes *= 2
        while half // object_bytes > MAX_LAYERS:
            object_bytes *= 2
            if half % object_bytes:
                raise TierConfigError(
                    f"{WHERE}: no object size splits a {chunk_bytes}-byte chunk into at most {2 * MAX_LAYERS} objects; "
                    "set 'object_bytes'"
                )
    if object_bytes <= 0 or half % object_bytes or half // object_bytes > MAX_LAYERS:
        raise TierConfigError(
            f"{WHERE}['object_bytes'] = {object_bytes} must divide half a chunk ({half} bytes) into at most "
            f"{MAX_LAYERS} pieces"
        )
    return Geometry(layers=half // object_bytes, kv_heads=1, head_dim=object_bytes, tokens_per_block=1, dtype="i8")


def vllm_identity(offloading_spec: Any) -> tuple[str, dict, int]:
    """(model name, identity fields, rank) of the chunks vLLM hands this tier: the fields of vLLM's
    ``FileMapper``, which names the ``fs`` tier's directory after them."""
    from vllm.v1.kv_offload.file_mapper import FileMapper

    mapper = FileMapper.from_offloading_spec(
        root_dir="", offloading_spec=offloading_spec,
        blocks_per_file=offloading_spec.blocks_per_chunk, parallel_agnostic=True,
    )
    fields = dict(mapper.get_run_config())
    return str(fields.pop("model_name")), fields, int(mapper.rank)


def identity_salt(tenant_salt: bytes, fields: dict, rank: int) -> bytes:
    text = json.dumps(fields, sort_keys=True, separators=(",", ":"), default=str)
    return tenant_salt + b"\0tutti-vllm-tier:" + text.encode() + f";rank={rank}".encode()


def parse(kwargs: dict, offloading_spec: Any, chunk_bytes: int) -> TierConfig:
    """Validates the tier's keys and forms its pool settings and cache identity."""
    kw = dict(kwargs)
    unknown = set(kw) - KNOWN_KEYS
    if unknown:
        raise TierConfigError(f"tutti tier: unknown {WHERE} keys {sorted(unknown)}; known: {sorted(KNOWN_KEYS)}")
    executor = kw.get("executor", "gio")
    if executor != "gio":
        raise TierConfigError(
            f"tutti tier: {WHERE}['executor'] = {executor!r}: the tier takes 'gio' only (it moves host memory; "
            "'direct' leaves a timed-out read with an unknown outcome in a primary slot vLLM reuses at once)"
        )
    sched_mode = kw.get("sched_mode", "arbitrate")
    if sched_mode not in ("arbitrate", "pass"):
        raise TierConfigError(
            f"tutti tier: {WHERE}['sched_mode'] = {sched_mode!r}: use 'arbitrate' or 'pass' (the slack modes need "
            "the forward pass's timing, which only the connector sees)"
        )
    object_bytes = kw.get("object_bytes")
    if object_bytes is not None:
        object_bytes = _int(kw, "object_bytes", 0, 1, 1 << 30)
    geometry = chunk_geometry(chunk_bytes, object_bytes)
    model, fields, rank = vllm_identity(offloading_spec)
    extra = {k: kw[k] for k in POOL_TIER_KEYS if k in kw}
    extra.update(layers=geometry.layers, kv_heads=geometry.kv_heads, head_dim=geometry.head_dim, dtype="int8")
    # The connector's parser with this process as vLLM's scheduler sees it: the tier lives in the
    # scheduler process only (vLLM's workers never touch it), so one process owns its pool
    # unless 'daemon_socket' or "daemon": "auto" share it with others.
    shape = SimpleNamespace(
        kv_transfer_config=SimpleNamespace(kv_connector_extra_config=extra),
        parallel_config=SimpleNamespace(tensor_parallel_size=1, pipeline_parallel_size=1,
                                        distributed_executor_backend="uni"),
        model_config=SimpleNamespace(model=model, dtype="int8"),
        cache_config=SimpleNamespace(block_size=1, cache_dtype="auto"),
    )
    try:
        pool = from_vllm(shape)
    except ConfigError as e:
        raise TierConfigError(f"tutti tier: {str(e).replace('kv_connector_extra_config', WHERE)}") from None
    return TierConfig(
        pool=pool,
        chunk_bytes=chunk_bytes,
        n_read_threads=_int(kw, "n_read_threads", 2, 1, MAX_THREADS),
        n_write_threads=_int(kw, "n_write_threads", 2, 1, MAX_THREADS),
        timeout_s=_int(kw, "timeout_ms", 30_000, 1, 3_600_000) / 1000.0,
        enable_kv_events=bool(kw.get("enable_kv_events", False)),
        salt=identity_salt(pool.tenant_salt, fields, rank),
        rank=rank,
    )
