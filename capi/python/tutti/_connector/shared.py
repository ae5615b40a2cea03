"""One runtime per pool per process, shared by the scheduler-side and worker-side connectors.

vLLM builds two connector instances: one in the scheduler, one in the worker.
With one GPU both live in the engine-core process, and they must see the same
pool: the worker registers the KV memory and moves bytes, the scheduler looks
up prefixes in the same index. A VFIO drive can belong to one process only,
so two runtimes on one pool are not an option anyway.
"""

from __future__ import annotations

import threading

from ..runtime import Runtime
from .config import ConnectorConfig

_lock = threading.Lock()
_runtimes: dict[tuple, list] = {}  # pool key -> [runtime, users]


def acquire(cfg: ConnectorConfig) -> Runtime:
    key = cfg.pool_key()
    with _lock:
        entry = _runtimes.get(key)
        if entry is None or entry[0].closed:
            entry = [Runtime(cfg.geometry, **cfg.runtime_kwargs()), 0]
            _runtimes[key] = entry
        entry[1] += 1
        return entry[0]


def release(cfg: ConnectorConfig, runtime: Runtime) -> None:
    """Drops one user; the last one closes the runtime."""
    key = cfg.pool_key()
    with _lock:
        entry = _runtimes.get(key)
        if entry is None or entry[0] is not runtime:
            return
        entry[1] -= 1
        if entry[1] > 0:
            return
        del _runtimes[key]
    runtime.close()
