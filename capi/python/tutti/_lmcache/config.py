"""The LMCache integration's configuration, for both routes.

The pool settings (drives, executor, daemon, identity) are SGLang's backend's, checked by the
same code (:func:`tutti._hicache.config.parse`), with messages naming LMCache's config. Where
they come from:

- the storage plugin: LMCache's ``extra_config``, each key prefixed with
  ``storage_plugin.<name>.`` (the ``<name>`` listed in ``storage_plugins``);
- the L2 adapter: the ``adapter_params`` of ``--l2-adapter '{"type": "native_plugin", ...}'``.

Keys beyond the pool settings (emulated/vfio drives, ``daemon_socket``, ``daemon``,
``executor``, ``host_threads``, ``host_mode``, ``open_mode``, ``io_timeout_ms``, ``model``,
``tenant_salt``, ``lib``; see :mod:`tutti._hicache.config`):

=====================  =================================================================
``timeout_ms``         how long one batch may take before its chunks count as failed
                       (misses; default 30000)
``unit_bytes``         L2 adapter: bytes of one tutti block; a chunk is stored as
                       ``ceil(size / unit_bytes)`` blocks (default 262144, a multiple of
                       4096). The storage plugin uses LMCache's allocator alignment instead
``staging_bytes``      L2 adapter: host memory registered with tutti that chunks are copied
                       through (default 64 MiB; at least the largest chunk)
``max_chunk_bytes``    L2 adapter: the largest chunk an existence check after a restart
                       probes for (default 64 MiB)
=====================  =================================================================
"""

from __future__ import annotations

from dataclasses import dataclass

from .._connector.config import POOL_KEYS
from .._hicache import config as _hc
from .._hicache.config import BackendConfig, ConfigError

__all__ = ["ConfigError", "LmcacheConfig", "parse", "PLUGIN_WHERE", "L2_WHERE"]

PLUGIN_WHERE = "extra_config['storage_plugin.<name>.*']"
L2_WHERE = "l2-adapter adapter_params"
# SGLang's break-even keys mean nothing here (LMCache decides what to load).
_POOL = POOL_KEYS - {"load_policy", "slack_table"}
OWN_KEYS = frozenset({"timeout_ms", "unit_bytes", "staging_bytes", "max_chunk_bytes"})
KNOWN_KEYS = _POOL | OWN_KEYS
MIN_UNIT = 4096


@dataclass(frozen=True)
class LmcacheConfig:
    pool: BackendConfig
    unit_bytes: int
    staging_bytes: int
    max_chunk_bytes: int

    @property
    def timeout_s(self) -> float:
        return self.pool.timeout_s


def parse(params: dict | None, *, who: str, where: str) -> LmcacheConfig:
    """Checks every key before anything is opened; a wrong one raises :class:`ConfigError` naming it."""
    params = dict(params or {})
    own = {k: params.pop(k) for k in list(params) if k in OWN_KEYS - {"timeout_ms"}}
    pool = _hc.parse(params, who=who, where=where, known=KNOWN_KEYS)
    unit = _hc._int(own, "unit_bytes", 256 << 10, MIN_UNIT, 1 << 30, where=where)
    if unit % MIN_UNIT:
        raise ConfigError(f"{who}: {where}['unit_bytes'] = {unit} must be a multiple of {MIN_UNIT}")
    staging = _hc._int(own, "staging_bytes", 64 << 20, unit, 1 << 40, where=where)
    max_chunk = _hc._int(own, "max_chunk_bytes", 64 << 20, 1, 1 << 40, where=where)
    if max_chunk > staging:
        raise ConfigError(
            f"{who}: {where}['max_chunk_bytes'] = {max_chunk} is more than 'staging_bytes' = {staging}: "
            "a chunk is copied through the staging memory whole"
        )
    return LmcacheConfig(pool, unit, staging - staging % unit, max_chunk)


def plugin_params(extra_config: dict | None, name: str) -> dict:
    """The ``storage_plugin.<name>.*`` keys of LMCache's ``extra_config``, prefix removed
    (``module_path`` and ``class_name`` are LMCache's own)."""
    prefix = f"storage_plugin.{name}."
    out = {}
    for k, v in (extra_config or {}).items():
        if isinstance(k, str) and k.startswith(prefix):
            sub = k[len(prefix):]
            if sub not in ("module_path", "class_name"):
                out[sub] = v
    return out
