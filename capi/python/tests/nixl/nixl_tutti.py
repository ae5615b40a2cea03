"""Driving libplugin_TUTTI.so through the real NIXL agent (the pinned wheel's Python API).

The plugin directory is NIXL_PLUGIN_DIR (set before nixl is imported: the agent reads it once per
process), holding this plugin only.
"""

from __future__ import annotations

import mmap
import os
import time
from pathlib import Path

import numpy as np

# The geometry every test and the benchmark give the backend: one tutti block (2 layers, K and V,
# 16 tokens of 2 heads of 64 f16) = 16 KiB.
GEOMETRY = {"layers": "2", "kv_heads": "2", "head_dim": "64", "tokens_per_block": "16", "dtype": "f16"}
BLOCK = 2 * 2 * 16 * 2 * 64 * 2
XFER_DEADLINE_S = 60.0


def wheel_plugin_dir() -> Path:
    """The directory of the wheel's bundled plugins (nixl_cu13.libs/nixl)."""
    import importlib.util

    spec = importlib.util.find_spec("nixl_cu13")
    if spec is None or not spec.submodule_search_locations:
        raise LookupError("nixl_cu13 (the nixl wheel's binary part) is not installed")
    d = Path(list(spec.submodule_search_locations)[0]).parent / "nixl_cu13.libs" / "nixl"
    if not (d / "libplugin_POSIX.so").exists():
        raise LookupError(f"no libplugin_POSIX.so in {d}")
    return d


def agent(name: str, backends: dict[str, dict[str, str]]):
    """A NIXL agent with the given backends created with the given parameters."""
    from nixl._api import nixl_agent, nixl_agent_config

    a = nixl_agent(name, nixl_agent_config(enable_prog_thread=False, backends=[]))
    for b, params in backends.items():
        a.create_backend(b, params)
    return a


def tutti_agent(name: str, **params: str):
    return agent(name, {"TUTTI": {**GEOMETRY, **params}})


class Region:
    """Page-aligned host memory of `blocks` tutti blocks, registered as DRAM with `backend`."""

    def __init__(self, a, blocks: int, backend: str = "TUTTI"):
        self.agent, self.blocks = a, blocks
        self._map = mmap.mmap(-1, blocks * BLOCK)
        self.buf = np.frombuffer(self._map, dtype=np.uint8)
        self.addr = self.buf.ctypes.data
        self.reg = a.register_memory(a.get_reg_descs([(self.addr, blocks * BLOCK, 0, "")], "DRAM"), backends=[backend])

    def block(self, i: int) -> np.ndarray:
        return self.buf[i * BLOCK : (i + 1) * BLOCK]

    def descs(self, slots):
        return self.agent.get_xfer_descs([(self.addr + s * BLOCK, BLOCK, 0) for s in slots], "DRAM")

    def close(self):
        self.agent.deregister_memory(self.reg, backends=[])
        self.buf = None


def content(key: str) -> np.ndarray:
    """The bytes a test stores under `key` (derived from it, so any process can check them)."""
    seed = int.from_bytes(key.encode()[:32].ljust(32, b"\0"), "little") % (2**63)
    return np.random.default_rng(seed).integers(0, 256, BLOCK, dtype=np.uint8)


def register_objects(a, keys, first_dev: int = 0, backend: str = "TUTTI"):
    """Registers one OBJ segment per key (devId first_dev + i); returns (registration, devIds)."""
    devs = [first_dev + i for i in range(len(keys))]
    reg = a.register_memory(a.get_reg_descs([(0, BLOCK, d, k) for d, k in zip(devs, keys)], "OBJ"), backends=[backend])
    return reg, devs


def transfer(a, op: str, local, remote, deadline_s: float = XFER_DEADLINE_S) -> str:
    """Posts one transfer and polls it to the end: "DONE", "ERR", or the NIXL exception's class name
    (e.g. nixlNotFoundError) when the agent raises one."""
    try:
        h = a.initialize_xfer(op, local, remote, a.name)
    except Exception as e:  # the agent raises a nixl*Error per status
        return type(e).__name__
    try:
        try:
            st = a.transfer(h)
        except Exception as e:
            return type(e).__name__
        end = time.monotonic() + deadline_s
        while st == "PROC":
            if time.monotonic() > end:
                raise TimeoutError(f"{op} still in progress after {deadline_s} s")
            try:
                st = a.check_xfer_state(h)
            except Exception as e:
                return type(e).__name__
            if st == "PROC":
                time.sleep(0.0005)
        return st
    finally:
        a.release_xfer_handle(h)


def write_keys(a, region: Region, keys, slots, devs) -> str:
    for k, s in zip(keys, slots):
        region.block(s)[:] = content(k)
    return transfer(a, "WRITE", region.descs(slots), a.get_xfer_descs([(0, BLOCK, d) for d in devs], "OBJ"))


def read_keys(a, region: Region, slots, devs) -> str:
    return transfer(a, "READ", region.descs(slots), a.get_xfer_descs([(0, BLOCK, d) for d in devs], "OBJ"))


def setenv_plugin_dir(d: Path) -> None:
    os.environ["NIXL_PLUGIN_DIR"] = str(d)
