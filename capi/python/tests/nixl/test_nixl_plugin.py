"""libplugin_TUTTI.so loaded by the real NIXL agent (the pinned wheel, scripts/setup-nixl): DRAM <->
tutti round trips with every byte checked, misses, failed blocks, two agents on one tuttid pool,
and a store torn by SIGKILL. Nothing here is a stand-in: the agent, its descriptor lists and its
plugin loader are NIXL's own; the drives are tutti's emulated ones (file media where a test
reopens the pool)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import nixl_tutti as nt

HERE = Path(__file__).resolve().parent


def keys(prefix: str, n: int) -> list[str]:
    return [f"{prefix}/block-{i:04d}" for i in range(n)]


def test_the_agent_loads_the_plugin_and_lists_its_memory_types(plugin_dir):
    a = nt.agent("lister", {})
    assert "TUTTI" in a.get_plugin_list()
    assert sorted(a.get_plugin_mem_types("TUTTI")) == ["DRAM_SEG", "FILE_SEG", "OBJ_SEG"]
    params = a.get_plugin_params("TUTTI")
    assert {"pool_dir", "daemon_socket", "drives", "layers", "model", "xfer_timeout_ms"} <= set(params)


def test_many_descriptors_round_trip_out_of_order(plugin_dir, tmp_path):
    a = nt.tutti_agent("rt", pool_dir=str(tmp_path / "pool"))
    region = nt.Region(a, 96)
    ks = keys("rt", 80)
    _, devs = nt.register_objects(a, ks)
    rng = random.Random(7)
    # Stored in three transfers of different sizes, each from shuffled DRAM slots.
    order = list(range(len(ks)))
    rng.shuffle(order)
    slots = rng.sample(range(region.blocks), len(ks))
    for lo, hi in ((0, 1), (1, 33), (33, 80)):
        idx = order[lo:hi]
        assert nt.write_keys(a, region, [ks[i] for i in idx], [slots[i] for i in idx], [devs[i] for i in idx]) == "DONE"
    # Loaded back in another order into other slots, over a wiped region.
    region.buf[:] = 0xEE
    order.reverse()
    back = rng.sample(range(region.blocks), len(ks))
    assert nt.read_keys(a, region, [back[i] for i in order], [devs[i] for i in order]) == "DONE"
    bad = [ks[i] for i in order if not (region.block(back[i]) == nt.content(ks[i])).all()]
    assert bad == []
    # The agent's query_memory goes through the backend's queryMem: stored keys answer, others not.
    resp = a.query_memory([(0, nt.BLOCK, 0, ks[0]), (0, nt.BLOCK, 1, "never-written")], "TUTTI", mem_type="OBJ")
    assert resp[0] is not None and resp[1] is None
    region.close()


def test_a_missing_key_is_not_found_and_moves_nothing(plugin_dir, tmp_path):
    a = nt.tutti_agent("miss")
    region = nt.Region(a, 8)
    ks = keys("miss", 3)
    _, devs = nt.register_objects(a, ks + ["miss/absent"])
    assert nt.write_keys(a, region, ks, [0, 1, 2], devs[:3]) == "DONE"
    region.buf[:] = 0xEE
    # One absent key among stored ones: not found, and not one byte of the stored ones lands.
    st = nt.read_keys(a, region, [4, 5, 6, 7], [devs[0], devs[1], devs[3], devs[2]])
    assert st == "nixlNotFoundError", st
    assert (region.buf == 0xEE).all()
    # The stored ones alone still load.
    assert nt.read_keys(a, region, [4, 5, 6], devs[:3]) == "DONE"
    assert all((region.block(4 + i) == nt.content(k)).all() for i, k in enumerate(ks))
    region.close()


def test_descriptors_that_are_not_whole_blocks_are_refused(plugin_dir):
    a = nt.tutti_agent("shape")
    region = nt.Region(a, 4)
    _, devs = nt.register_objects(a, ["shape/a"])
    half = a.get_xfer_descs([(region.addr, nt.BLOCK // 2, 0)], "DRAM")
    remote = a.get_xfer_descs([(0, nt.BLOCK // 2, devs[0])], "OBJ")
    assert nt.transfer(a, "WRITE", half, remote) == "nixlInvalidParamError"
    unaligned = a.get_xfer_descs([(region.addr + 512, nt.BLOCK, 0)], "DRAM")
    assert nt.transfer(a, "WRITE", unaligned, a.get_xfer_descs([(0, nt.BLOCK, devs[0])], "OBJ")) == "nixlInvalidParamError"
    # Nothing was stored under the key by the refused transfers.
    assert nt.read_keys(a, region, [1], devs) == "nixlNotFoundError"
    region.close()


def test_a_failed_block_is_an_error_never_stale_bytes(plugin_dir, tmp_path):
    pool = str(tmp_path / "pool")
    ks = keys("fault", 16)
    a = nt.tutti_agent("fault-writer", pool_dir=pool)
    region = nt.Region(a, 16)
    _, devs = nt.register_objects(a, ks)
    assert nt.write_keys(a, region, ks, list(range(16)), devs) == "DONE"
    region.close()
    del a, region
    # The next reads of drive 0 fail (a fault-injection libtutti): the load is an error.
    b = nt.tutti_agent("fault-reader", pool_dir=pool, fault_fail_next_load="4")
    region = nt.Region(b, 16)
    _, devs = nt.register_objects(b, ks)
    st = nt.read_keys(b, region, list(range(16)), devs)
    assert st in ("ERR", "nixlBackendError"), f"a load whose blocks failed ended {st}"
    # Once the injected failures are spent the same transfer moves every byte.
    region.buf[:] = 0
    assert nt.read_keys(b, region, list(range(16)), devs) == "DONE"
    assert all((region.block(i) == nt.content(k)).all() for i, k in enumerate(ks))
    region.close()


def _worker(name: str, params: dict, steps: list) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(HERE))
    return subprocess.Popen(
        [sys.executable, str(HERE / "nixl_worker.py"), name, json.dumps(params), json.dumps(steps)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _results(p: subprocess.Popen, timeout: float = 120) -> list[dict]:
    out, err = p.communicate(timeout=timeout)
    assert p.returncode == 0, f"worker failed ({p.returncode}): {err[-3000:]}"
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


@pytest.fixture
def tuttid(tutti_bin, tmp_path):
    sock = tmp_path / "tuttid.sock"
    g = nt.GEOMETRY
    args = [str(tutti_bin), "serve", "--json", "--socket", str(sock), "--dir", str(tmp_path / "pool"),
            "--emulated", "2", "--capacity-mib", "64", "--layers", g["layers"], "--kv-heads", g["kv_heads"],
            "--head-dim", g["head_dim"], "--block-tokens", g["tokens_per_block"], "--dtype", g["dtype"]]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
    try:
        hello = json.loads(proc.stdout.readline())
        assert hello["pid"] == proc.pid
        yield str(sock)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            assert proc.wait(timeout=30) == 0
        finally:
            if proc.poll() is None:
                proc.kill()


def test_two_agents_on_one_tuttid_pool_move_concurrently(plugin_dir, tuttid, tmp_path):
    ka, kb = keys("agent-a", 40), keys("agent-b", 40)
    fa, fb = str(tmp_path / "a-stored"), str(tmp_path / "b-stored")
    params = {"daemon_socket": tuttid}
    pa = _worker("agent-a", params, [{"write": ka}, {"flag": fa}, {"wait": fb}, {"read": kb}, {"read": ka}])
    pb = _worker("agent-b", params, [{"write": kb}, {"flag": fb}, {"wait": fa}, {"read": ka}, {"read": kb}])
    ra, rb = _results(pa), _results(pb)
    for r in (ra, rb):
        assert [s.get("state") for s in r if s["step"] in ("write", "read")] == ["DONE", "DONE", "DONE"], r
        assert all(s.get("bad") == [] for s in r if s["step"] == "read"), r
        assert all(s.get("state") is None for s in r if s["step"] == "wait"), r


def test_a_store_torn_by_sigkill_is_a_miss_on_reopen(plugin_dir, tmp_path):
    pool = str(tmp_path / "pool")
    kept, torn = keys("kept", 8), keys("torn", 8)
    p = _worker("torn", {"pool_dir": pool}, [{"write": kept}, {"post_write": torn}, {"hang": True}])
    lines = []
    while len(lines) < 3:
        line = p.stdout.readline()
        assert line, f"worker ended early: {p.stderr.read()[-3000:]}"
        if line.startswith("{"):  # the agent logs to stdout too
            lines.append(json.loads(line))
    assert lines[0] == {"step": "write", "state": "DONE"}
    assert lines[1]["step"] == "post_write" and lines[1]["state"] in ("PROC", "DONE")
    p.kill()  # SIGKILL: the posted store is never committed
    p.wait(timeout=30)
    a = nt.tutti_agent("reopen", pool_dir=pool, open_mode="existing")
    region = nt.Region(a, 16)
    _, devs = nt.register_objects(a, kept + torn)
    assert nt.read_keys(a, region, list(range(8)), devs[:8]) == "DONE"
    assert all((region.block(i) == nt.content(k)).all() for i, k in enumerate(kept))
    for i, k in enumerate(torn):
        region.block(8)[:] = 0xEE
        st = nt.read_keys(a, region, [8], [devs[8 + i]])
        assert st == "nixlNotFoundError", (k, st)
        assert (region.block(8) == 0xEE).all()
    region.close()


def test_file_ranges_map_to_pool_objects_and_a_rewrite_is_never_stale(plugin_dir, tmp_path):
    """KVBM's disk tier registers one preallocated file and moves (offset, length, fd) ranges; the
    backend keeps those ranges in the pool and leaves the file alone."""
    a = nt.tutti_agent("file")
    region = nt.Region(a, 8)
    path = tmp_path / "kvbm-disk-cache"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.posix_fallocate(fd, 0, 16 * nt.BLOCK)
        a.register_memory([(0, 16 * nt.BLOCK, fd, str(path))], "FILE", backends=["TUTTI"])

        def ranges(offsets):
            return a.get_xfer_descs([(o * nt.BLOCK, nt.BLOCK, fd) for o in offsets], "FILE")

        for i in range(4):
            region.block(i)[:] = nt.content(f"first-{i}")
        assert nt.transfer(a, "WRITE", region.descs([0, 1, 2, 3]), ranges([9, 3, 0, 12])) == "DONE"
        # Range 3 is written again with other bytes; a read gets the new ones.
        region.block(4)[:] = nt.content("second-1")
        assert nt.transfer(a, "WRITE", region.descs([4]), ranges([3])) == "DONE"
        region.buf[:] = 0xEE
        assert nt.transfer(a, "READ", region.descs([7, 6, 5]), ranges([12, 3, 9])) == "DONE"
        assert (region.block(7) == nt.content("first-3")).all()
        assert (region.block(6) == nt.content("second-1")).all()
        assert (region.block(5) == nt.content("first-0")).all()
        # A range never written is a miss, and nothing lands.
        region.buf[:] = 0xEE
        st = nt.transfer(a, "READ", region.descs([0]), ranges([5]))
        assert st == "nixlNotFoundError", st
        assert (region.buf == 0xEE).all()
        # The file itself was never written: the bytes live in the pool.
        assert os.pread(fd, 16 * nt.BLOCK, 0) == bytes(16 * nt.BLOCK)
    finally:
        os.close(fd)
    region.close()


def test_a_transfer_past_its_deadline_is_an_error_before_the_drive_answers(plugin_dir, tmp_path):
    """A drive that executes a read 3 s late (injected) against xfer_timeout_ms=300: checkXfer
    reports an error while the late read has not landed yet (not every DRAM block holds its
    object's bytes: it did not wait for the drive); releasing the request then waits for the drive,
    and the next load of the same keys is whole."""
    pool = str(tmp_path / "pool")
    ks = keys("slow", 4)
    a = nt.tutti_agent("slow-writer", pool_dir=pool)
    region = nt.Region(a, 8)
    _, devs = nt.register_objects(a, ks)
    assert nt.write_keys(a, region, ks, [0, 1, 2, 3], devs) == "DONE"
    region.close()
    del a, region
    b = nt.tutti_agent("slow-reader", pool_dir=pool, xfer_timeout_ms="300", fault_delay_next_load_ms="3000",
                       io_timeout_ms="10000")
    region = nt.Region(b, 8)
    _, devs = nt.register_objects(b, ks)
    region.buf[:] = 0xEE
    h = b.initialize_xfer("READ", region.descs([4, 5, 6, 7]), b.get_xfer_descs([(0, nt.BLOCK, d) for d in devs], "OBJ"),
                          b.name)
    st = b.transfer(h)
    polls = 0
    while st == "PROC" and polls < 200_000:
        try:
            st = b.check_xfer_state(h)
        except Exception as e:
            st = type(e).__name__
        polls += 1
    assert st in ("ERR", "nixlBackendError"), st
    whole = [i for i, k in enumerate(ks) if (region.block(4 + i) == nt.content(k)).all()]
    b.release_xfer_handle(h)  # waits for the late command (bounded by io_timeout_ms)
    region.buf[:] = 0
    assert nt.read_keys(b, region, [4, 5, 6, 7], devs) == "DONE"
    assert all((region.block(4 + i) == nt.content(k)).all() for i, k in enumerate(ks))
    region.close()
    # The delayed command's block cannot have been whole when the error came.
    assert len(whole) < 4, "every block had landed: the error waited for the drive"
