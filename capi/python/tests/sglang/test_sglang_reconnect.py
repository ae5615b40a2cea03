"""SGLang's own HiCacheController, its backup and prefetch threads running, with ``tutti.sglang``
as a client of a real ``tutti serve`` (``daemon_socket``) that is SIGKILLed and started again on
the same pool directory and socket: while it is away the controller goes on (backups store
nothing, prefetches miss: no stale bytes), and once it is back, with nothing done to the
controller or the backend, the pages stored before the kill prefetch again byte for byte, new
backups store and prefetch, and the backend's runtime counts one reconnect. A daemon of another
geometry on that socket meanwhile is refused (its pages stay misses)."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
import torch

import sglang_env as E

PAGE = 4
# How tutti.sglang keys a page_first host pool of sglang_env.device_pool's defaults (3 layers,
# 2 KV heads of 32, bf16, pages of 4 tokens): one object per page, every layer's K and V in it.
GEOMETRY = dict(layers=1, kv_heads=6, head_dim=32, block_tokens=PAGE, dtype="bf16")


def _pages(host, idx, n):
    return [E.page_bytes(host, int(idx[i * PAGE])) for i in range(n)]


def _serve(sock: Path, pool: Path, layers: int = GEOMETRY["layers"]) -> subprocess.Popen:
    g = dict(GEOMETRY, layers=layers)
    args = [E.tutti_bin(), "serve", "--json", "--socket", str(sock), "--dir", str(pool), "--emulated", "2",
            "--capacity-mib", "16", "--layers", str(g["layers"]), "--kv-heads", str(g["kv_heads"]),
            "--head-dim", str(g["head_dim"]), "--block-tokens", str(g["block_tokens"]), "--dtype", g["dtype"]]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    assert line, f"tutti serve did not start: exit {proc.wait(timeout=30)}"
    assert json.loads(line)["pid"] == proc.pid
    return proc


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _until(what, cond, timeout=30.0):
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        assert time.monotonic() < deadline, f"{what} within {timeout} s"
        time.sleep(0.05)


def test_the_controller_survives_a_tuttid_kill_and_restart(library, tmp_path):
    sock, pool = tmp_path / "tuttid.sock", tmp_path / "pool"
    procs = [_serve(sock, pool)]
    dev = E.device_pool()
    host = E.host_pool(dev, "page_first")
    c = E.controller(dev, host, {"interface_v1": 1, "daemon_socket": str(sock)})
    try:
        b = c.storage_backend
        E.fill_random(host, 31)
        n = 5
        idx = host.alloc(n * PAGE)
        toks = E.tokens_for(n, PAGE)
        want = _pages(host, idx, n)
        assert E.backup(c, idx, toks) == n * PAGE
        host.free(idx)

        procs[0].kill()  # SIGKILL, the controller's threads running
        procs[0].wait(timeout=30)
        # Away: a prefetch misses (no stale bytes), a backup stores nothing; the threads go on.
        hit, done, got = E.prefetch(c, toks, rid="while-away")
        assert done == 0, (hit, done)
        if got is not None:
            host.free(got)
        idx2 = host.alloc(2 * PAGE)
        toks2 = E.tokens_for(2, PAGE, start=50_000)
        want2 = _pages(host, idx2, 2)
        assert E.backup(c, idx2, toks2) == 0
        assert b.rt.stats().disconnected == 1

        # Another geometry on the same socket: refused, every page still a miss.
        procs.append(_serve(sock, tmp_path / "pool-other", layers=GEOMETRY["layers"] + 1))
        hit, done, got = E.prefetch(c, toks, rid="other-geometry")
        assert done == 0, (hit, done)
        if got is not None:
            host.free(got)
        _stop(procs[-1])

        # Back on the same media: nothing done to the controller; the next operations reconnect.
        procs.append(_serve(sock, pool))
        host.kv_buffer.view(-1).view(torch.uint8).fill_(0x5A)
        hit, done, got = E.prefetch(c, toks, rid="after")
        assert (hit, done) == (n * PAGE, n * PAGE)
        assert _pages(host, got, n) == want, "every page stored before the kill, byte for byte"
        host.free(got)
        # The backup that failed while away, again: stored now, and it prefetches exactly.
        E.fill_random(host, 37)
        want2 = _pages(host, idx2, 2)
        assert E.backup(c, idx2, toks2) == 2 * PAGE
        host.free(idx2)
        host.kv_buffer.view(-1).view(torch.uint8).fill_(0xA5)
        hit, done, got = E.prefetch(c, toks2, rid="new")
        assert (hit, done) == (2 * PAGE, 2 * PAGE)
        assert _pages(host, got, 2) == want2
        s = b.rt.stats()
        assert (s.reconnects, s.disconnected) == (1, 0), s
        assert s.reconnect_attempts >= 2, s
        assert b.stats()["pins_held"] == 0
    finally:
        E.stop(c)
        for p in procs:
            _stop(p)
