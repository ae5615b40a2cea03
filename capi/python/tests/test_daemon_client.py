"""tutti.Runtime.connect: two runtimes in this process are clients of a `tutti serve` process;
what one stores the other loads, byte for byte; a daemon that is not there is a clear error."""

from __future__ import annotations

import json
import subprocess
import time

import pytest

import tutti
from conftest import NUM_BLOCKS, block_bytes, fill_block, require_tutti_bin, stop_tuttid, tutti_bin_path, vllm_layers
from test_binding import store


_tutti_bin = tutti_bin_path  # imported by the other daemon tests


@pytest.fixture
def daemon(library, geometry, tmp_path):
    exe = require_tutti_bin()
    g = geometry
    sock = tmp_path / "tuttid.sock"
    args = [str(exe), "serve", "--json", "--socket", str(sock), "--dir", str(tmp_path / "pool")]
    args += ["--emulated", "2", "--capacity-mib", "8", "--layers", str(g.layers), "--kv-heads", str(g.kv_heads)]
    args += ["--head-dim", str(g.head_dim), "--block-tokens", str(g.tokens_per_block), "--dtype", g.dtype]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
    try:
        hello = json.loads(proc.stdout.readline())
        assert hello["pid"] == proc.pid
        yield str(sock)
    finally:
        stop_tuttid(proc)


def test_two_clients_share_the_daemons_pool(daemon, geometry):
    hashes = tutti.chain_hashes(list(range(8)), geometry.tokens_per_block)
    writer = tutti.Runtime.connect(daemon, geometry, client_name="writer")
    reader = tutti.Runtime.connect(daemon, geometry, client_name="reader")
    try:
        wl, rl = vllm_layers(geometry), vllm_layers(geometry)
        writer.register_kv("vllm_per_layer", NUM_BLOCKS, model="m", k_bases=[t.data_ptr() for t in wl])
        reader.register_kv("vllm_per_layer", NUM_BLOCKS, model="m", k_bases=[t.data_ptr() for t in rl])
        written = {b: fill_block(geometry, wl, NUM_BLOCKS, b, seed=10 + b) for b in (0, 1)}
        store(writer, hashes, [0, 1])
        with reader.lookup(hashes) as found:
            assert found.hits == 2
            with reader.load(hashes, [7, 6]) as job:
                assert job.wait().failed == 0
        assert block_bytes(geometry, rl, NUM_BLOCKS, 7) == written[0]
        assert block_bytes(geometry, rl, NUM_BLOCKS, 6) == written[1]
        assert reader.stats().lookups >= 1
    finally:
        writer.close()
        reader.close()


def test_connect_errors_name_what_is_wrong(library, geometry, tmp_path):
    t0 = time.monotonic()
    with pytest.raises(tutti.TuttiError, match="no tuttid listening"):
        tutti.Runtime.connect(str(tmp_path / "absent.sock"), geometry, control_timeout_ms=2000)
    assert time.monotonic() - t0 < 10
    with pytest.raises(ValueError, match="executor"):
        tutti.Runtime.connect(str(tmp_path / "absent.sock"), geometry, executor="gpu")


def test_a_geometry_other_than_the_pools_is_refused(daemon, geometry):
    other = tutti.Geometry(
        layers=geometry.layers + 1,
        kv_heads=geometry.kv_heads,
        head_dim=geometry.head_dim,
        tokens_per_block=geometry.tokens_per_block,
        dtype=geometry.dtype,
    )
    with pytest.raises(tutti.errors.InvalidArgument, match="geometry"):
        tutti.Runtime.connect(daemon, other)


def _serve(exe, sock, pool, g) -> subprocess.Popen:
    args = [str(exe), "serve", "--json", "--socket", str(sock), "--dir", str(pool)]
    args += ["--emulated", "2", "--capacity-mib", "8", "--layers", str(g.layers), "--kv-heads", str(g.kv_heads)]
    args += ["--head-dim", str(g.head_dim), "--block-tokens", str(g.tokens_per_block), "--dtype", g.dtype]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
    hello = json.loads(proc.stdout.readline())
    assert hello["pid"] == proc.pid
    return proc


def test_a_client_reconnects_after_tutti_serve_is_killed_and_restarted(library, geometry, tmp_path):
    """`tutti serve` SIGKILLed under a connected runtime, then started again on the same pool
    directory and socket: while it is away every call raises IoError at once naming tuttid; the
    first call after it is back reconnects (nothing done here but calling), the KV memory is
    registered again, what was stored before the kill loads byte for byte, and the counters say
    one reconnect. A daemon of another geometry on that socket meanwhile is refused, naming it."""
    exe = require_tutti_bin()
    sock, pool = tmp_path / "tuttid.sock", tmp_path / "pool"
    proc = _serve(exe, sock, pool, geometry)
    rt = tutti.Runtime.connect(str(sock), geometry, client_name="survivor", reconnect_backoff_ms=100)
    others = []
    try:
        layers = vllm_layers(geometry)
        rt.register_kv("vllm_per_layer", NUM_BLOCKS, model="m", k_bases=[t.data_ptr() for t in layers],
                       keepalive=layers)
        hashes = tutti.chain_hashes(list(range(2 * geometry.tokens_per_block)), geometry.tokens_per_block)
        written = {b: fill_block(geometry, layers, NUM_BLOCKS, b, seed=30 + b) for b in (0, 1)}
        store(rt, hashes, [0, 1])
        proc.kill()
        proc.wait(timeout=30)
        for _ in range(5):
            t0 = time.monotonic()
            with pytest.raises(tutti.errors.IoError, match="tuttid"):
                rt.lookup(hashes).close()
            assert time.monotonic() - t0 < 2, "a call while the daemon is away fails at once"
        assert rt.stats().disconnected == 1
        other = tutti.Geometry(layers=geometry.layers + 1, kv_heads=geometry.kv_heads, head_dim=geometry.head_dim,
                               tokens_per_block=geometry.tokens_per_block, dtype=geometry.dtype)
        wrong = _serve(exe, sock, tmp_path / "pool-other", other)
        others.append(wrong)
        with pytest.raises(tutti.errors.IoError, match="formatted for"):
            rt.lookup(hashes).close()
        stop_tuttid(wrong)
        proc = _serve(exe, sock, pool, geometry)
        with rt.lookup(hashes) as found:
            assert found.hits == 2
        for b in (0, 1):
            fill_block(geometry, layers, NUM_BLOCKS, 6 + b, seed=99)
        with rt.load(hashes, [6, 7]) as job:
            assert job.wait().failed == 0
        assert block_bytes(geometry, layers, NUM_BLOCKS, 6) == written[0]
        assert block_bytes(geometry, layers, NUM_BLOCKS, 7) == written[1]
        s = rt.stats()
        assert (s.reconnects, s.disconnected) == (1, 0) and s.reconnect_attempts >= 2 and s.disconnected_ns > 0, s
    finally:
        rt.close()
        for p in others:
            if p.poll() is None:
                p.kill()
        stop_tuttid(proc)
