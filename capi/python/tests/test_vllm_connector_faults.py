"""The vLLM connector when things go wrong or run late: load and device failures, deadlines,
deferred saves, GPU kernels still running, a shared pool directory, profiling.

Same setting as test_vllm_connector.py: the real libtutti on emulated drives, vLLM stand-ins.
"""

from __future__ import annotations

import os

import pytest

import tutti
from tutti._connector.config import ConfigError, from_vllm
from tutti._connector.metadata import LoadSpec
from tutti.vllm import KVConnectorRole, TuttiConnector, TuttiConnectorMetadata
from vllm_standins import EXTRA, MiniEngine, Request, assert_blocks_hold, layer_name, prompt, vllm_config


def test_load_failures_are_reported_once_with_their_block_ids(engine):
    B = engine.B
    a = Request("a", prompt(7, 2 * B + 1))
    engine.step(new=[a])
    stored = tutti.chain_hashes(a.all_token_ids, B)[:2]
    gone = tutti.chain_hashes(prompt(99, B), B)[0]  # a chunk tutti never held
    ids = engine._alloc(3)
    engine.blocks["x"] = ids
    engine.running["x"] = Request("x", a.prompt_token_ids)
    meta = TuttiConnectorMetadata(loads=[LoadSpec("x", [stored[0], gone, stored[1]], ids)])
    w = engine.worker
    w.bind_connector_metadata(meta)
    w.start_load_kv(None)
    for layer in range(engine.g.layers):
        w.wait_for_layer_load(layer_name(layer))
    w.wait_for_save()
    # The chain breaks at the missing chunk: it and every later block fail; the first one loads.
    assert w.get_block_ids_with_load_errors() == {ids[1], ids[2]}
    assert w.get_block_ids_with_load_errors() == set()
    w.clear_connector_metadata()
    for layer in range(engine.g.layers):
        assert engine.block_kv(ids[0], layer) == engine.expected(a.all_token_ids, 0, layer)


def test_device_read_failure_reaches_vllm(engine):
    lib = tutti._lib.lib()
    if not lib.has("tutti_emulated_fail_next"):
        print("SKIP: libtutti has no tutti_emulated_fail_next (fault injection)")
        pytest.skip("libtutti has no tutti_emulated_fail_next")
    B = engine.B
    engine.step(new=[Request("a", prompt(8, 3 * B + 1))])
    engine.worker.runtime.emulated_fail_next(0, "load", 1)  # one object read fails
    b = Request("b", prompt(8, 3 * B + 1))
    r = engine.step(new=[b])
    assert r.matched == {"b": 3 * B}
    assert len(r.load_errors) == 1 and r.load_errors <= set(engine.blocks["b"][:3])
    bad = engine.blocks["b"].index(next(iter(r.load_errors)))
    assert_blocks_hold(engine, b, [i for i in range(3) if i != bad])
    assert engine.worker.get_block_ids_with_load_errors() == set()  # reported once


def test_device_write_failure_costs_only_a_miss(engine):
    lib = tutti._lib.lib()
    if not lib.has("tutti_emulated_fail_next"):
        print("SKIP: libtutti has no tutti_emulated_fail_next (fault injection)")
        pytest.skip("libtutti has no tutti_emulated_fail_next")
    B = engine.B
    rt = engine.worker.runtime
    engine.worker.runtime.emulated_fail_next(1, "store", 1)
    a = Request("a", prompt(30, 3 * B + 1))
    r = engine.step(new=[a])
    assert [len(s.block_ids) for s in r.meta.saves] == [3]
    assert rt.stats().files_valid == 2
    hashes = tutti.chain_hashes(a.all_token_ids, B)
    hits = rt.lookup(hashes, pin=False).hits
    assert hits < 3
    b = Request("b", prompt(30, 3 * B + 1))
    r = engine.step(new=[b])
    assert r.matched == {"b": hits * B} and r.load_errors == set()
    assert_blocks_hold(engine, b, range(3))  # loaded or recomputed, the KV is right


def test_profiled_steps_make_a_slack_table(library, geometry, tmp_path):
    """With profiling on, the layer hooks feed tutti's profiler; shutdown saves the fitted slack table."""
    import json

    path = tmp_path / "slack.json"
    e = MiniEngine(geometry, dict(EXTRA, slack_table=str(path), profile_gpu="test-gpu"), num_blocks=200)
    try:
        for i, n in enumerate([5, 9, 17, 33, 65, 129, 40, 80]):
            r = Request(f"r{i}", prompt(100 + i, n))
            res = e.step(new=[r])
            assert res.meta.prefill_tokens == n - res.matched[r.request_id]
            for _ in range(2):
                r.output_token_ids.append(1)
                res = e.step(cont={r.request_id: 1})
                assert res.meta.prefill_tokens == 0 and res.meta.decode_context_tokens == r.num_tokens
            e.finish(r)
        assert not path.exists()
    finally:
        e.close()
    table = json.loads(path.read_text())
    assert table["format"] == "tutti-slack-table"
    assert "test-gpu" in path.read_text() and "tiny/llama-test" in path.read_text()


def test_profile_config_errors(library, geometry):
    with pytest.raises(ConfigError, match="profile_iocbs_per_sm_per_us"):
        from_vllm(vllm_config(geometry, dict(EXTRA, profile=True, profile_iocbs_per_sm_per_us=0)))
    with pytest.raises(ConfigError, match="profile_io_sms"):
        from_vllm(vllm_config(geometry, dict(EXTRA, profile=True, profile_io_sms=0)))


def test_deferred_saves_hold_finished_requests_until_reported(library, geometry):
    e = MiniEngine(geometry, dict(EXTRA, deferred_saves=True))
    B = e.B
    try:
        rt = e.worker.runtime
        a = Request("a", prompt(20, 3 * B + 1))
        r = e.step(new=[a])
        assert [len(s.block_ids) for s in r.meta.saves] == [3]
        # The writes are still being completed: nothing visible yet, nothing reported.
        assert rt.stats().files_valid == 0 and r.finished == (None, None)
        # a finishes with saves in its last step: vLLM must keep its blocks.
        assert e.finish(a) == (True, None)
        assert "a" in e.held
        # The next step (no tokens to run) completes the saves and reports a.
        r = e.step()
        assert r.finished == ({"a"}, None)
        assert "a" not in e.held and rt.stats().files_valid == 3
        # And the stored bytes are the right ones.
        b = Request("b", prompt(20, 3 * B + 1))
        r = e.step(new=[b])
        assert r.matched == {"b": 3 * B} and r.load_errors == set()
        assert_blocks_hold(e, b, range(3))
        # b stored nothing new; after a decode step it finishes without being held.
        b.output_token_ids.append(3)
        e.step(cont={"b": 1})
        assert e.finish(b) == (False, None)
        r = e.step()
        assert r.finished == (None, None)
    finally:
        e.close()


def test_deferred_saves_are_complete_before_the_next_step_writes(library, geometry):
    """A preempted request's blocks are reused at once; its deferred writes finish before that step writes."""
    e = MiniEngine(geometry, dict(EXTRA, deferred_saves=True), num_blocks=12)
    B = e.B
    try:
        a = Request("a", prompt(21, 4 * B))
        r = e.step(new=[a])
        assert [len(s.block_ids) for s in r.meta.saves] == [4]
        a_blocks = list(e.blocks["a"])
        e.preempt(a)
        # c gets a's blocks and its forward pass overwrites them in this step.
        c = Request("c", prompt(22, 4 * B + 1))
        e.step(new=[c])
        assert e.blocks["c"][:4] == a_blocks
        b = Request("b", prompt(21, 4 * B + 1))
        r = e.step(new=[b])
        assert r.matched == {"b": 4 * B} and r.load_errors == set()
        assert_blocks_hold(e, b, range(4))
    finally:
        e.close()


class _FakeMarker:
    """Stands in for a CUDA event: done only once the test (or a wait) says so."""

    log: list = []

    def __init__(self, layer_tensor, ready: bool):
        self.ready = ready
        self.tensor = layer_tensor

    def done(self) -> bool:
        return self.ready

    def wait(self) -> None:
        _FakeMarker.log.append(("wait", self.tensor))
        self.ready = True


@pytest.mark.parametrize("kernels_done", [False, True], ids=["kernels-still-running", "kernels-done"])
def test_gpu_layers_are_stored_only_after_their_kernels(engine, monkeypatch, kernels_done):
    """Writes of a layer go out when its marker (a CUDA event on a GPU) is done, never before."""
    import tutti._connector.worker as worker_mod

    B = engine.B
    markers = []

    def fake_mark(t):
        m = _FakeMarker(t, kernels_done)
        markers.append(m)
        return m

    submitted = []
    real_submit = worker_mod.WorkerSide._submit

    def spy_submit(self, sv, layers):
        # At submission, every layer submitted must have a done marker.
        for l in layers:
            assert markers[l].ready, f"layer {l} submitted before its kernels finished"
        submitted.append((list(layers), len(markers)))
        return real_submit(self, sv, layers)

    monkeypatch.setattr(worker_mod, "mark_written", fake_mark)
    monkeypatch.setattr(worker_mod.WorkerSide, "_submit", spy_submit)
    a = Request("a", prompt(40, 3 * B + 1))
    engine.step(new=[a])
    assert [l for ls, _ in submitted for l in ls] == list(range(engine.g.layers))
    if kernels_done:
        # Each layer went out from its own save_kv_layer call.
        assert [n for _, n in submitted] == list(range(1, engine.g.layers + 1))
    else:
        # Nothing could go out during the forward pass; wait_for_save waited for each layer in order.
        assert all(n == engine.g.layers for _, n in submitted)
        assert [t for _, t in _FakeMarker.log[-engine.g.layers:]] == [
            engine.kv[layer_name(i)] for i in range(engine.g.layers)
        ]
    b = Request("b", prompt(40, 3 * B + 1))
    r = engine.step(new=[b])
    assert r.matched == {"b": 3 * B}
    assert_blocks_hold(engine, b, range(3))


def test_a_layer_that_times_out_fails_the_whole_load(engine, monkeypatch):
    """A load that misses its deadline cannot be trusted for any layer: all its blocks go back to vLLM."""
    from tutti.jobs import Job

    B = engine.B
    engine.step(new=[Request("a", prompt(50, 3 * B + 1))])
    real = Job.wait_layer

    def slow_layer_2(self, layer, timeout=30.0):
        if layer == 2:
            raise tutti.Timeout(-7, "TUTTI_E_TIMEOUT", "tutti_job_wait_layer: deadline passed", "tutti_job_wait_layer")
        return real(self, layer, timeout)

    monkeypatch.setattr(Job, "wait_layer", slow_layer_2)
    b = Request("b", prompt(50, 3 * B + 1))
    r = engine.step(new=[b])
    assert r.matched == {"b": 3 * B}
    assert r.load_errors == set(engine.blocks["b"][:3])
    stats = engine.worker.runtime.stats()
    assert stats.jobs_in_flight == 0


def test_an_emulated_pool_in_files_has_one_user_process(library, geometry, tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    extra = dict(EXTRA, emulated_dir=str(tmp_path))
    c = TuttiConnector(vllm_config(geometry, extra), KVConnectorRole.WORKER)
    try:
        code = (
            "import sys; sys.path.insert(0, %r)\n"
            "from vllm_standins import vllm_config\n"
            "import tutti\n"
            "from tutti.vllm import TuttiConnector, KVConnectorRole\n"
            "from tutti._connector.config import ConfigError\n"
            "g = tutti.Geometry(4, 2, 32, 4, 'f16')\n"
            "try:\n    TuttiConnector(vllm_config(g, %r), KVConnectorRole.WORKER)\n"
            "except tutti.errors.Busy as e:\n    print('refused', e)\n"
        ) % (str(Path(__file__).parent), extra)
        env = dict(__import__("os").environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        # The driver's owner lock on the media files refuses the second process, naming the first.
        assert done.stdout.startswith("refused") and f"owned by pid {os.getpid()}" in done.stdout, done.stdout
    finally:
        c.shutdown()
    # Released with the last connector: the directory opens again.
    c = TuttiConnector(vllm_config(geometry, dict(extra, open_mode="open")), KVConnectorRole.WORKER)
    c.shutdown()


def test_unknown_outcome_load_blocks_are_load_errors_with_a_warning(library, geometry, caplog):
    """A read the drive executes after the host gave up on it (300 ms deadline, 3 s late), on the
    CPU-driven path, which cannot recover the drive's queues: its block is a load error like any
    other, and the connector warns that the drive may still write it."""
    if not library.has("tutti_emulated_delay_next"):
        pytest.skip("libtutti has no tutti_emulated_delay_next")
    engine = MiniEngine(geometry, dict(EXTRA, io_timeout_ms=300, executor="direct"))
    try:
        B = engine.B
        engine.step(new=[Request("a", prompt(40, 3 * B + 1))])
        w = engine.worker
        assert w._w().unknown_load_blocks == set()
        w.runtime.emulated_delay_next(0, "load", 3000)
        b = Request("b", prompt(40, 3 * B + 1))
        with caplog.at_level("WARNING", logger="vllm.tutti"):
            r = engine.step(new=[b])
        assert r.matched == {"b": 3 * B}
        assert len(r.load_errors) == 1 and r.load_errors <= set(engine.blocks["b"][:3])
        assert w._w().unknown_load_blocks == r.load_errors
        assert any("unknown outcome" in m and "may still write" in m for m in caplog.messages), caplog.messages
        assert w.get_block_ids_with_load_errors() == set()  # reported once
    finally:
        engine.close()


def test_a_late_read_on_the_gio_path_is_settled_by_recovering_the_drive(library, geometry, caplog):
    """The same late read through gio_uring: the drive's queues are deleted and recreated, which
    aborts the read, so the block is an ordinary load error (recomputed), not an unknown one."""
    if not library.has("tutti_emulated_delay_next"):
        pytest.skip("libtutti has no tutti_emulated_delay_next")
    engine = MiniEngine(geometry, dict(EXTRA, io_timeout_ms=300, executor="gio"))
    try:
        B = engine.B
        engine.step(new=[Request("a", prompt(40, 3 * B + 1))])
        w = engine.worker
        w.runtime.emulated_delay_next(0, "load", 3000)
        b = Request("b", prompt(40, 3 * B + 1))
        with caplog.at_level("WARNING", logger="vllm.tutti"):
            r = engine.step(new=[b])
        assert r.matched == {"b": 3 * B}
        assert len(r.load_errors) == 1 and r.load_errors <= set(engine.blocks["b"][:3])
        assert w._w().unknown_load_blocks == set()
        assert not any("may still write" in m for m in caplog.messages), caplog.messages
        assert w.runtime.stats().quarantined_files == 0
    finally:
        engine.close()
