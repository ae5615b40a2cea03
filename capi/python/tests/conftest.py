"""Fixtures: libtutti, a small geometry, runtimes on emulated drives, vLLM-shaped KV tensors."""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import tutti  # noqa: E402
from tutti import _lib  # noqa: E402
from tutti.errors import LibraryNotFound  # noqa: E402

# 4 layers, 2 KV heads of 32 dims, 4-token blocks, f16: one object = 512 bytes = one LBA.
GEOMETRY = tutti.Geometry(layers=4, kv_heads=2, head_dim=32, tokens_per_block=4, dtype="f16")
NUM_BLOCKS = 24


@pytest.fixture(scope="session")
def library():
    try:
        return _lib.lib()
    except LibraryNotFound as e:
        print(f"SKIP: {e}", file=sys.stderr)
        pytest.skip(f"libtutti not available: {e}")


@pytest.fixture
def geometry():
    return GEOMETRY


@pytest.fixture
def runtime(library):
    rt = tutti.Runtime(GEOMETRY, emulated_drives=2, emulated_capacity_bytes=8 << 20, open_mode="create")
    yield rt
    rt.close()


def vllm_layers(g: tutti.Geometry, num_blocks: int = NUM_BLOCKS) -> list[tutti.HostTensor]:
    """One flash-attn shaped tensor per layer: [2, num_blocks, block_size, kv_heads, head_dim]."""
    return [
        tutti.HostTensor((2, num_blocks, g.tokens_per_block, g.kv_heads, g.head_dim), g.element_size)
        for _ in range(g.layers)
    ]


def obj_offset(g: tutti.Geometry, num_blocks: int, kv: int, block: int) -> int:
    return (kv * num_blocks + block) * g.object_bytes


def fill_block(g, layers, num_blocks, block, seed) -> dict:
    """Writes pseudo-random K and V into ``block`` of every layer; returns {(layer, kv): bytes}."""
    rnd = random.Random(seed)
    out = {}
    for l, t in enumerate(layers):
        for kv in (0, 1):
            data = rnd.randbytes(g.object_bytes)
            t.write(obj_offset(g, num_blocks, kv, block), data)
            out[(l, kv)] = data
    return out


def block_bytes(g, layers, num_blocks, block, layer=None) -> dict:
    ls = range(len(layers)) if layer is None else [layer]
    return {
        (l, kv): layers[l].read(obj_offset(g, num_blocks, kv, block), g.object_bytes) for l in ls for kv in (0, 1)
    }


@pytest.fixture
def registered(runtime, geometry):
    layers = vllm_layers(geometry)
    runtime.register_kv(
        "vllm_per_layer", NUM_BLOCKS, model="test-model", k_bases=[t.data_ptr() for t in layers], keepalive=layers
    )
    return runtime, layers


def has_cc() -> str | None:
    for cc in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if cc and any((Path(p) / cc).exists() for p in os.environ.get("PATH", "").split(os.pathsep)):
            return cc
    return None


@pytest.fixture
def engine(library, geometry):
    """A MiniEngine (tests/vllm_standins.py) with both connector halves on 2 emulated drives."""
    from vllm_standins import EXTRA, MiniEngine

    e = MiniEngine(geometry, dict(EXTRA))
    yield e
    e.close()


def tutti_bin_path() -> Path:
    """The `tutti` binary the tests run: TUTTI_BIN, else beside TUTTI_LIB, else target/debug."""
    explicit = os.environ.get("TUTTI_BIN")
    if explicit:
        return Path(explicit)
    lib = os.environ.get("TUTTI_LIB")
    return (Path(lib).parent if lib else Path(__file__).resolve().parents[3] / "target" / "debug") / "tutti"


def require_tutti_bin() -> Path:
    """tutti_bin_path(), or the test skips saying why (fails under CI=true) when it is not built."""
    exe = tutti_bin_path()
    if not exe.exists():
        why = f"the tutti binary is not at {exe} (cargo build -p tutti-tools, or set TUTTI_BIN)"
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        print(f"SKIP: {why}", file=sys.stderr)
        pytest.skip(why)
    return exe


def stop_tuttid(proc) -> None:
    """SIGTERMs a `tutti serve` process and asserts it exits 0 within 30 s; killed if it does not."""
    import signal

    proc.send_signal(signal.SIGTERM)
    try:
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
