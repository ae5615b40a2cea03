"""The ctypes binding against the real libtutti on emulated drives; every load is checked byte for byte."""

from __future__ import annotations

import pytest

import tutti
from conftest import NUM_BLOCKS, block_bytes, fill_block, vllm_layers


def test_abi_version_is_the_one_the_package_binds(library):
    assert tutti.abi_version() == 1
    assert library.tutti_abi_version() == tutti._lib.ABI_VERSION
    assert library.tutti_abi_minor() >= tutti._lib.ABI_MINOR == 11


def test_clock_is_monotonic(library):
    a = tutti.clock_ns()
    b = tutti.clock_ns()
    assert 0 < a <= b


def test_chain_hashes_identify_prefixes(library):
    tokens = list(range(1000, 1018))  # 4 full chunks of 4 and a partial one of 2
    h = tutti.chain_hashes(tokens, 4)
    assert len(h) == 4 and all(len(x) == 16 for x in h)
    assert len(set(h)) == 4
    # Same prefix, same keys; a different tail changes only later keys.
    other = tokens[:8] + [7] * 10
    h2 = tutti.chain_hashes(other, 4)
    assert h2[:2] == h[:2] and h2[2] != h[2] and h2[3] != h[3]
    # A different first chunk changes every key, even for identical later chunks.
    h3 = tutti.chain_hashes([0] + tokens[1:], 4)
    assert all(a != b for a, b in zip(h, h3))
    # Continuing from a parent equals hashing the whole sequence.
    assert tutti.chain_hashes(tokens[8:16], 4, parent=h[1]) == h[2:4]
    # Nothing to hash: fewer tokens than a chunk.
    assert tutti.chain_hashes(tokens[:3], 4) == []
    assert tutti.chain_hashes([], 4) == []


def test_runtime_info_reports_the_pool(runtime, geometry):
    info = runtime.info()
    assert info.drives == 2
    assert info.geometry == geometry
    assert info.object_bytes == geometry.object_bytes
    assert info.file_bytes == 2 * geometry.layers * geometry.object_bytes
    assert info.formatted_now
    assert info.files > 0
    assert info.executor == "gio"
    assert len(info.pool_id) == 16 and info.pool_id != bytes(16)


def test_register_reports_sgl_table(runtime, geometry):
    layers = vllm_layers(geometry)
    sizes = runtime.register_kv(
        "vllm_per_layer", NUM_BLOCKS, model="m", k_bases=[t.data_ptr() for t in layers], keepalive=layers
    )
    # One descriptor per (block, layer, K|V) when an object fits one command.
    assert sizes.descriptors == NUM_BLOCKS * geometry.layers * 2
    assert sizes.sgl_bytes == 16 * sizes.descriptors * sizes.tables


def store(rt, hashes, blocks, layers_at_a_time=None):
    with rt.begin_store(hashes, blocks) as st:
        if layers_at_a_time:
            for l in range(0, rt.geometry.layers, layers_at_a_time):
                with st.submit(range(l, min(l + layers_at_a_time, rt.geometry.layers))) as job:
                    assert job.wait().failed == 0
        else:
            with st.submit() as job:
                status = job.wait()
                assert status.done and status.failed == 0 and status.direction == "store"
        return st.commit()


def test_store_lookup_load_round_trip_bytes(registered, geometry):
    rt, layers = registered
    tokens = list(range(40, 56))
    hashes = tutti.chain_hashes(tokens, geometry.tokens_per_block)
    src = [3, 8, 9, 1]
    written = {b: fill_block(geometry, layers, NUM_BLOCKS, b, seed=b) for b in src}
    report = store(rt, hashes, src)
    assert (report.stored, report.present, report.failed) == (4, 0, 0)

    # Hits stop at the first missing chunk.
    miss = tutti.chain_hashes([9] * 4, 4)[0]
    with rt.lookup(hashes[:3] + [miss] + hashes[3:]) as found:
        assert found.hits == 3 and found.pin != 0
        assert rt.stats().files_pinned == 3
        dst = [20, 21, 22]
        with rt.load(hashes[:3], dst) as job:
            status = job.wait()
        assert status.done and status.failed == 0 and status.failed_blocks == []
        assert status.bytes == 3 * 2 * geometry.layers * geometry.object_bytes
    assert rt.stats().files_pinned == 0
    for s, d in zip(src, dst):
        assert block_bytes(geometry, layers, NUM_BLOCKS, d) == written[s]


def test_store_layer_by_layer_then_load_layer_by_layer(registered, geometry):
    rt, layers = registered
    hashes = tutti.chain_hashes(list(range(8)), 4)
    written = {b: fill_block(geometry, layers, NUM_BLOCKS, b, seed=100 + b) for b in (0, 1)}
    assert store(rt, hashes, [0, 1], layers_at_a_time=1).stored == 2
    with rt.load(hashes, [10, 11]) as job:
        for l in range(geometry.layers):
            st = job.wait_layer(l)
            assert job.layer_done(l)
            assert st.layers_done >= l + 1
            # The layer waited for is complete, whatever the later ones are doing.
            for s, d in ((0, 10), (1, 11)):
                got = block_bytes(geometry, layers, NUM_BLOCKS, d, layer=l)
                assert got == {k: v for k, v in written[s].items() if k[0] == l}
        assert job.poll().done


def test_partial_layer_range_load(registered, geometry):
    rt, layers = registered
    hashes = tutti.chain_hashes(list(range(4)), 4)
    written = fill_block(geometry, layers, NUM_BLOCKS, 2, seed=7)
    store(rt, hashes, [2])
    with rt.load(hashes, [5], layers=range(1, 3)) as job:
        st = job.wait()
        assert (st.first_layer, st.num_layers, st.layers_done) == (1, 2, 2)
    got = block_bytes(geometry, layers, NUM_BLOCKS, 5)
    for (l, kv), data in written.items():
        if l in (1, 2):
            assert got[(l, kv)] == data
        else:
            assert got[(l, kv)] == bytes(geometry.object_bytes)  # untouched, still zero


def test_storing_a_present_chunk_reports_it_present(registered, geometry):
    rt, layers = registered
    hashes = tutti.chain_hashes(list(range(4)), 4)
    fill_block(geometry, layers, NUM_BLOCKS, 0, seed=1)
    assert store(rt, hashes, [0]).stored == 1
    again = store(rt, hashes, [4])
    assert (again.stored, again.present) == (0, 1)


def test_load_of_a_chunk_not_stored_fails_only_that_block_onward(registered, geometry):
    rt, layers = registered
    hashes = tutti.chain_hashes(list(range(8)), 4)
    written = fill_block(geometry, layers, NUM_BLOCKS, 0, seed=3)
    store(rt, hashes[:1], [0])
    with rt.load(hashes, [12, 13]) as job:
        st = job.wait()
        assert st.done and st.failed == 1 and st.failed_blocks == [1]
        assert "not stored" in job.error()
    assert block_bytes(geometry, layers, NUM_BLOCKS, 12) == written


def test_cancelled_job_reports_its_blocks(library):
    """A job keeps at most 8 layers in flight; cancelled before it could submit more, the rest
    never run and every block is reported failed."""
    g = tutti.Geometry(layers=16, kv_heads=2, head_dim=32, tokens_per_block=4, dtype="f16")
    with tutti.Runtime(g, emulated_drives=2, emulated_capacity_bytes=8 << 20, open_mode="create") as rt:
        layers = vllm_layers(g, 4)
        rt.register_kv("vllm_per_layer", 4, model="m", k_bases=[t.data_ptr() for t in layers], keepalive=layers)
        hashes = tutti.chain_hashes(list(range(8)), 4)
        for b in (0, 1):
            fill_block(g, layers, 4, b, seed=b)
        store(rt, hashes, [0, 1])
        with rt.load(hashes, [2, 3]) as job:
            job.cancel()
            st = job.wait()
            assert st.done and st.cancelled and st.layers_done == st.num_layers == 16
            # At most the 8 layers in flight issued commands (one per K or V object and block).
            assert st.commands <= 8 * 2 * 2 < 16 * 2 * 2
            assert st.failed_blocks == [0, 1] and st.bytes == 0
            assert "cancel" in job.error()


def test_stats_count_traffic(registered, geometry):
    rt, layers = registered
    before = rt.stats()
    hashes = tutti.chain_hashes(list(range(8)), 4)
    fill_block(geometry, layers, NUM_BLOCKS, 0, seed=1)
    fill_block(geometry, layers, NUM_BLOCKS, 1, seed=2)
    store(rt, hashes, [0, 1])
    with rt.lookup(hashes) as found:
        assert found.hits == 2
        with rt.load(hashes, [6, 7]) as job:
            job.wait()
    s = rt.stats()
    file_bytes = 2 * geometry.layers * geometry.object_bytes
    assert s.bytes_stored - before.bytes_stored == 2 * file_bytes
    assert s.bytes_loaded - before.bytes_loaded == 2 * file_bytes
    assert s.files_valid == 2 and s.files_committed - before.files_committed == 2
    assert s.lookups > before.lookups and s.lookup_hits >= before.lookup_hits + 2
    assert s.jobs_in_flight == 0 and s.stores_open == 0


def test_host_work_counters_of_jobs_and_stats(registered, geometry):
    rt, layers = registered
    before = rt.stats()
    hashes = tutti.chain_hashes(list(range(8)), 4)
    fill_block(geometry, layers, NUM_BLOCKS, 0, seed=1)
    fill_block(geometry, layers, NUM_BLOCKS, 1, seed=2)
    statuses = []
    with rt.begin_store(hashes, [0, 1]) as st:
        with st.submit(range(0, geometry.layers)) as job:
            statuses.append(job.wait())
        st.commit()
    with rt.load(hashes, [6, 7]) as job:
        for layer in range(geometry.layers):
            job.wait_layer(layer)
        statuses.append(job.wait())
    for s in statuses:
        assert s.done and s.failed == 0
        # The main path registers a job's pairs once; no layer carries them again.
        assert s.pairs_registered and s.host_pairs == 0
        assert s.host_calls >= geometry.layers and s.commands > 0
        assert len(s.layer_submit_ns) == geometry.layers
        assert sum(s.layer_submit_ns) == s.submit_ns
        assert all(0 <= ns <= s.submit_ns for ns in s.layer_submit_ns)
    after = rt.stats()
    assert after.pairs_registered - before.pairs_registered == 2
    assert after.host_pairs == before.host_pairs
    for f in ("host_calls", "host_built", "setup_ns", "submit_ns"):
        assert getattr(after, f) - getattr(before, f) == sum(getattr(s, f) for s in statuses), f


def test_failed_blocks_counts_each_missing_block_once(registered, geometry):
    rt, layers = registered
    hashes = tutti.chain_hashes(list(range(16)), 4)
    fill_block(geometry, layers, NUM_BLOCKS, 0, seed=1)
    store(rt, hashes[:1], [0])
    before = rt.stats().failed_blocks
    with rt.load(hashes, [8, 9, 10, 11]) as job:
        for _ in range(3):
            job.poll()
        st = job.wait()
        job.wait_layer(0)
        assert st.failed_blocks == [1, 2, 3]
        assert rt.stats().failed_blocks - before == 3
    assert rt.stats().failed_blocks - before == 3, "closing the job counts nothing again"
    # Nothing stored, never polled: counted anyway.
    with rt.load(hashes[1:], [8, 9, 10]):
        pass
    assert rt.stats().failed_blocks - before == 6


def test_lookup_without_pin_pins_nothing(registered, geometry):
    rt, layers = registered
    hashes = tutti.chain_hashes(list(range(4)), 4)
    fill_block(geometry, layers, NUM_BLOCKS, 0, seed=1)
    store(rt, hashes, [0])
    found = rt.lookup(hashes, pin=False)
    assert found.hits == 1 and found.pin == 0
    assert rt.stats().files_pinned == 0


def test_profile_hooks_accept_a_request(registered, geometry, tmp_path):
    rt, _ = registered
    rt.profile_request_begin(7, input_tokens=64, prefix_tokens=32)
    for l in range(geometry.layers):
        rt.profile_layer_start(7, l)
        rt.profile_layer_end(7, l)
    t = tutti.clock_ns()
    rt.profile_request_begin(9, input_tokens=16, prefix_tokens=0)
    rt.profile_layer(9, 0, t, t + 1000)
    rt.profile_decode_step(7, 65, t, t + 5000)
    with pytest.raises(tutti.ProfileError, match="twice"):
        rt.profile_layer(9, 0, t, t + 1000)
    with pytest.raises(tutti.ProfileError, match="never began"):
        rt.profile_layer(8, 0, t, t + 1000)


def test_runtime_reopens_a_pool_kept_in_files(library, geometry, tmp_path):
    """Chunks stored through one runtime are found by the next one on the same (file-backed) drives."""
    kw = dict(emulated_drives=2, emulated_capacity_bytes=8 << 20, emulated_dir=str(tmp_path))
    hashes = tutti.chain_hashes(list(range(8)), 4)
    with tutti.Runtime(geometry, open_mode="create", **kw) as rt:
        layers = vllm_layers(geometry)
        rt.register_kv("vllm_per_layer", NUM_BLOCKS, model="m", k_bases=[t.data_ptr() for t in layers])
        written = {b: fill_block(geometry, layers, NUM_BLOCKS, b, seed=b) for b in (0, 1)}
        store(rt, hashes, [0, 1])
        rt.unregister_kv()
    with tutti.Runtime(geometry, open_mode="open", **kw) as rt:
        assert not rt.info().formatted_now
        layers = vllm_layers(geometry)
        rt.register_kv("vllm_per_layer", NUM_BLOCKS, model="m", k_bases=[t.data_ptr() for t in layers])
        with rt.lookup(hashes) as found:
            assert found.hits == 2
            with rt.load(hashes, [4, 5]) as job:
                assert job.wait().failed == 0
        assert block_bytes(geometry, layers, NUM_BLOCKS, 4) == written[0]
        assert block_bytes(geometry, layers, NUM_BLOCKS, 5) == written[1]
        # Another model's identity never sees these chunks.
        rt.unregister_kv()
        rt.register_kv("vllm_per_layer", NUM_BLOCKS, model="other", k_bases=[t.data_ptr() for t in layers])
        assert rt.lookup(hashes, pin=False).hits == 0


def test_device_read_failure_is_reported_per_block(registered, geometry, library):
    if not library.has("tutti_emulated_fail_next"):
        print("SKIP: libtutti has no tutti_emulated_fail_next (fault injection)")
        pytest.skip("libtutti has no tutti_emulated_fail_next")
    rt, layers = registered
    hashes = tutti.chain_hashes(list(range(8)), 4)
    written = {b: fill_block(geometry, layers, NUM_BLOCKS, b, seed=b) for b in (0, 1)}
    store(rt, hashes, [0, 1])
    # One object is one command here (512 bytes): one failed read fails exactly one block.
    rt.emulated_fail_next(0, "load", 1)
    with rt.load(hashes, [8, 9]) as job:
        st = job.wait()
        assert st.failed == 1 and len(st.failed_blocks) == 1
        assert job.error()
    (bad,) = st.failed_blocks
    good = 1 - bad
    assert block_bytes(geometry, layers, NUM_BLOCKS, 8 + good) == written[good]
    # The failure was the device's, not the data's: the chunk loads fine next time.
    with rt.load(hashes, [8, 9]) as job:
        assert job.wait().failed == 0
    assert block_bytes(geometry, layers, NUM_BLOCKS, 8 + bad) == written[bad]


def test_device_write_failure_leaves_the_block_out(registered, geometry, library):
    if not library.has("tutti_emulated_fail_next"):
        print("SKIP: libtutti has no tutti_emulated_fail_next (fault injection)")
        pytest.skip("libtutti has no tutti_emulated_fail_next")
    rt, layers = registered
    hashes = tutti.chain_hashes(list(range(12)), 4)
    for b in (0, 1, 2):
        fill_block(geometry, layers, NUM_BLOCKS, b, seed=b)
    rt.emulated_fail_next(1, "store", 1)
    with rt.begin_store(hashes, [0, 1, 2]) as st:
        with st.submit() as job:
            status = job.wait()
        assert status.failed == 1
        report = st.commit()
    assert (report.stored, report.failed) == (2, 1) and report.failed_blocks == status.failed_blocks
    # Only the blocks before the one that failed form a hit prefix.
    assert rt.lookup(hashes, pin=False).hits == report.failed_blocks[0]


def test_threads_share_a_runtime(registered, geometry):
    """Four threads store and load disjoint blocks at once (ctypes drops the GIL in every call)."""
    import threading

    rt, layers = registered
    errors = []

    def worker(t: int):
        try:
            src, dst = 2 * t, 2 * t + 10
            hashes = tutti.chain_hashes([t] * 4, 4)
            written = fill_block(geometry, layers, NUM_BLOCKS, src, seed=1000 + t)
            for _ in range(5):
                store(rt, hashes, [src])
                with rt.lookup(hashes) as found:
                    assert found.hits == 1
                    with rt.load(hashes, [dst]) as job:
                        for l in range(geometry.layers):
                            job.wait_layer(l)
                        assert job.wait().failed == 0
                assert block_bytes(geometry, layers, NUM_BLOCKS, dst) == written
        except Exception as e:  # reported to the main thread
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=120)
    assert not any(th.is_alive() for th in threads)
    assert errors == []
    assert rt.stats().files_pinned == 0


def _python(code: str, env: dict):
    import subprocess
    import sys
    from pathlib import Path

    env = dict(env, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


def test_library_found_in_the_cargo_target_dir(library):
    import os
    from pathlib import Path

    path = Path(library.path).resolve()
    if path.parent.name not in ("debug", "release"):
        print(f"SKIP: {path} is not in a cargo target dir")
        pytest.skip("library not in a cargo target dir")
    env = {k: v for k, v in os.environ.items() if k != "TUTTI_LIB"}
    env["CARGO_TARGET_DIR"] = str(path.parent.parent)
    done = _python("from tutti import _lib; print(_lib.lib().path)", env)
    assert done.returncode == 0, done.stderr
    found = Path(done.stdout.strip()).resolve()
    assert found.name == "libtutti.so" and found.parent.parent == path.parent.parent


def test_missing_library_is_a_clear_error(library, tmp_path):
    import os

    env = dict(os.environ, TUTTI_LIB=str(tmp_path / "nope.so"))
    done = _python(
        "from tutti import _lib\n"
        "try:\n    _lib.lib()\nexcept _lib.LibraryNotFound as e:\n    print('LNF', e)\n",
        env,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("LNF") and "nope.so" in done.stdout and "cargo build" in done.stdout


def test_zero_timeout_wait_reports_progress(library):
    """A wait that cannot finish in time raises Timeout carrying the job's progress at the deadline."""
    g = tutti.Geometry(layers=16, kv_heads=2, head_dim=32, tokens_per_block=4, dtype="f16")
    with tutti.Runtime(g, emulated_drives=2, emulated_capacity_bytes=8 << 20, open_mode="create") as rt:
        layers = vllm_layers(g, 4)
        rt.register_kv("vllm_per_layer", 4, model="m", k_bases=[t.data_ptr() for t in layers], keepalive=layers)
        hashes = tutti.chain_hashes(list(range(8)), 4)
        store(rt, hashes, [0, 1])
        timeouts = 0
        for _ in range(5):
            with rt.load(hashes, [2, 3]) as job:
                try:
                    st = job.wait(timeout=0)
                    assert st.done and st.layers_done == 16
                except tutti.Timeout as e:
                    timeouts += 1
                    assert e.status_name == "TUTTI_E_TIMEOUT" and e.call == "tutti_job_wait"
                    p = e.job_status
                    assert p is not None and not p.done and p.layers_done < 16 and p.blocks == 2
                assert job.wait().failed == 0
        print(f"{timeouts} of 5 zero-timeout waits timed out")


def test_a_caller_of_abi_1_0_gets_the_old_stats_struct(registered):
    """An engine built against ABI 1.0 passes the smaller tutti_stats_t: it is filled up to its
    end and not a byte further."""
    import ctypes

    rt, _ = registered
    old_size = tutti._lib.Stats.host_calls.offset
    assert old_size == 136
    buf = tutti._lib.Stats()
    ctypes.memset(ctypes.byref(buf), 0xA5, ctypes.sizeof(buf))
    buf.struct_size = old_size
    tutti._lib.lib().call("tutti_get_stats", rt._p(), ctypes.byref(buf))
    raw = ctypes.string_at(ctypes.byref(buf), ctypes.sizeof(buf))
    assert raw[old_size:] == b"\xa5" * (ctypes.sizeof(buf) - old_size)
    assert buf.files == rt.stats().files > 0 and buf.stores_open == 0
    buf.struct_size = old_size + 8
    with pytest.raises(tutti.StructSizeError, match="136 or 184 or 192"):
        tutti._lib.lib().call("tutti_get_stats", rt._p(), ctypes.byref(buf))


def test_a_caller_of_abi_1_1_gets_no_1_2_fields(registered):
    """An engine built against ABI 1.1 passes the 184-byte tutti_stats_t: the host-work
    counters are filled, ``quarantined_files`` (ABI 1.2) is not written."""
    import ctypes

    rt, _ = registered
    old_size = tutti._lib.Stats.quarantined_files.offset
    assert old_size == 184
    buf = tutti._lib.Stats()
    ctypes.memset(ctypes.byref(buf), 0xA5, ctypes.sizeof(buf))
    buf.struct_size = old_size
    tutti._lib.lib().call("tutti_get_stats", rt._p(), ctypes.byref(buf))
    raw = ctypes.string_at(ctypes.byref(buf), ctypes.sizeof(buf))
    assert raw[old_size:] == b"\xa5" * (ctypes.sizeof(buf) - old_size)
    assert buf.files == rt.stats().files > 0 and buf.submit_ns == rt.stats().submit_ns


def test_unknown_outcome_fields_on_definite_failures(registered, geometry, library):
    """Missing chunks and media errors are failures of known outcome: ``unknown`` stays 0."""
    rt, layers = registered
    hashes = tutti.chain_hashes(list(range(12)), 4)
    fill_block(geometry, layers, NUM_BLOCKS, 0, seed=1)
    store(rt, hashes[:1], [0])
    rt.emulated_fail_next(0, "load", 1)
    with rt.load(hashes, [8, 9, 10]) as job:
        st = job.wait()
    assert st.failed == len(st.failed_blocks) >= 2 and 1 in st.failed_blocks and 2 in st.failed_blocks
    assert (st.unknown, st.unknown_blocks) == (0, [])
    s = rt.stats()
    assert s.quarantined_files == 0 and s.files_free + s.files_valid == s.files


def test_late_write_and_late_read_are_reported_unknown(library, geometry):
    """A drive that executes a command after the host gave up on it (emulated, 3 s late
    against a 300 ms deadline), on the CPU-driven path, which cannot recover the drive's
    queues: a late write quarantines its file and is never served; a late read is reported in
    ``unknown_blocks`` and does write the engine block afterwards."""
    import time

    if not library.has("tutti_emulated_delay_next"):
        pytest.skip("libtutti has no tutti_emulated_delay_next")
    late_ms = 3000
    with tutti.Runtime(
        geometry,
        emulated_drives=1,
        emulated_capacity_bytes=8 << 20,
        open_mode="create",
        io_timeout_ms=300,
        executor="direct",
    ) as rt:
        layers = vllm_layers(geometry)
        rt.register_kv("vllm_per_layer", NUM_BLOCKS, model="m", k_bases=[t.data_ptr() for t in layers], keepalive=layers)
        hashes = tutti.chain_hashes(list(range(8)), 4)
        good = fill_block(geometry, layers, NUM_BLOCKS, 0, seed=10)
        store(rt, hashes[:1], [0])
        start = time.monotonic()

        fill_block(geometry, layers, NUM_BLOCKS, 1, seed=11)
        rt.emulated_delay_next(0, "store", late_ms)
        with rt.begin_store(hashes[1:], [1]) as st:
            with st.submit() as job:
                status = job.wait()
                assert "outcome unknown" in job.error()
            assert (status.failed, status.unknown, status.unknown_blocks) == (1, 1, [0])
            assert st.commit().stored == 0
        assert rt.stats().quarantined_files == 1
        assert rt.lookup(hashes, pin=False).hits == 1

        rt.emulated_delay_next(0, "load", late_ms)
        with rt.load(hashes[:1], [8]) as job:
            status = job.wait()
        assert status.failed_blocks == status.unknown_blocks == [0] and status.unknown == 1
        assert block_bytes(geometry, layers, NUM_BLOCKS, 8) != good

        time.sleep(max(0.0, late_ms / 1000 + 1.0 - (time.monotonic() - start)))
        assert block_bytes(geometry, layers, NUM_BLOCKS, 8) == good, "the late read landed"
        with rt.load(hashes, [9, 10]) as job:
            status = job.wait()
        assert status.failed_blocks == [1] and status.unknown == 0
        assert block_bytes(geometry, layers, NUM_BLOCKS, 9) == good, "the late write changed no stored chunk"
        assert rt.stats().quarantined_files == 1


def test_late_io_on_the_gio_path_is_settled_by_recovering_the_drive(library, geometry):
    """The same late write and late read through gio_uring: the drive's queues are deleted and
    recreated, which aborts the late commands, so their blocks fail with a known outcome, no
    file is quarantined, and nothing lands after the delay."""
    import time

    if not library.has("tutti_emulated_delay_next"):
        pytest.skip("libtutti has no tutti_emulated_delay_next")
    late_ms = 3000
    with tutti.Runtime(
        geometry,
        emulated_drives=1,
        emulated_capacity_bytes=8 << 20,
        open_mode="create",
        io_timeout_ms=300,
        executor="gio",
    ) as rt:
        layers = vllm_layers(geometry)
        rt.register_kv("vllm_per_layer", NUM_BLOCKS, model="m", k_bases=[t.data_ptr() for t in layers], keepalive=layers)
        hashes = tutti.chain_hashes(list(range(8)), 4)
        good = fill_block(geometry, layers, NUM_BLOCKS, 0, seed=10)
        store(rt, hashes[:1], [0])
        start = time.monotonic()

        fill_block(geometry, layers, NUM_BLOCKS, 1, seed=11)
        rt.emulated_delay_next(0, "store", late_ms)
        with rt.begin_store(hashes[1:], [1]) as st:
            with st.submit() as job:
                status = job.wait()
            assert (status.failed, status.unknown) == (1, 0)
            assert st.commit().stored == 0
        assert rt.stats().quarantined_files == 0

        rt.emulated_delay_next(0, "load", late_ms)
        with rt.load(hashes[:1], [8]) as job:
            status = job.wait()
        assert status.failed_blocks == [0] and status.unknown == 0

        time.sleep(max(0.0, late_ms / 1000 + 1.0 - (time.monotonic() - start)))
        assert block_bytes(geometry, layers, NUM_BLOCKS, 8) != good, "the aborted late read never landed"
        with rt.load(hashes[:1], [9]) as job:
            status = job.wait()
        assert status.failed == 0 and block_bytes(geometry, layers, NUM_BLOCKS, 9) == good
        assert rt.stats().quarantined_files == 0
