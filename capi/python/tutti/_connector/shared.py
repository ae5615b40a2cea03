"""One runtime per pool per process, shared by the scheduler-side and worker-side connectors.

vLLM builds two connector instances: one in the scheduler, one in the worker.
With one GPU both live in the engine-core process, and they must see the same
pool: the worker registers the KV memory and moves bytes, the scheduler looks
up prefixes in the same index. A VFIO drive can belong to one process only,
so two runtimes on one pool are not an option anyway.
"""

from __future__ import annotations

import fcntl
import os
import threading

from ..runtime import Runtime
from .config import ConfigError, ConnectorConfig

_lock = threading.Lock()
_runtimes: dict[tuple, list] = {}  # pool key -> [runtime, users, lock file]


def _lock_dir(directory: str):
    """Emulated drives kept in files must have one user: two processes appending to the same
    journals would corrupt the pool. (VFIO drives are exclusive by themselves.)"""
    os.makedirs(directory, exist_ok=True)
    f = open(os.path.join(directory, ".tutti-connector.lock"), "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        owner = f.read().strip() or "another process"
        f.close()
        raise ConfigError(
            f"the emulated pool in {directory} is in use by {owner}; one process at a time may open it"
        ) from None
    f.seek(0)
    f.truncate()
    f.write(f"pid {os.getpid()}\n")
    f.flush()
    return f


def acquire(cfg: ConnectorConfig) -> Runtime:
    key = cfg.pool_key()
    with _lock:
        entry = _runtimes.get(key)
        if entry is None or entry[0].closed:
            held = _lock_dir(cfg.emulated_dir) if cfg.emulated_dir and not cfg.vfio_drives else None
            try:
                entry = [Runtime(cfg.geometry, **cfg.runtime_kwargs()), 0, held]
            except BaseException:
                if held is not None:
                    held.close()
                raise
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
    if entry[2] is not None:
        entry[2].close()  # releases the directory lock
