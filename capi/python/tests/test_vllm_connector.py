"""tutti.vllm.TuttiConnector driven like vLLM drives it, against the real libtutti on emulated drives.

vLLM is not installable here; the connector runs on its stand-in base class
(see tutti/vllm.py) with request, block and scheduler-output stand-ins shaped
like vLLM 0.10/0.11's (tests/vllm_standins.py).
"""

from __future__ import annotations

import pickle

import pytest

import tutti
from tutti._connector.config import ConfigError, from_vllm
from tutti._connector.worker import LayoutError, layer_index_map
from tutti.vllm import KVConnectorRole, TuttiConnector, TuttiConnectorMetadata, VLLM_AVAILABLE
from tutti._connector.metadata import LoadSpec
from vllm_standins import MiniEngine, Request, layer_name, vllm_config

EXTRA = {"emulated_drives": 2, "emulated_capacity_bytes": 8 << 20, "open_mode": "create"}


@pytest.fixture
def engine(library, geometry):
    e = MiniEngine(geometry, dict(EXTRA))
    yield e
    e.close()


def prompt(prefix_seed: int, n: int, tail: list[int] = ()) -> list[int]:
    return [(prefix_seed * 7919 + i * 31) % 32000 for i in range(n)] + list(tail)


def assert_blocks_hold(engine, req: Request, blocks: range):
    """Every layer's K and V of the request's blocks ``blocks`` equal what computing them gives."""
    for index in blocks:
        block = engine.blocks[req.request_id][index]
        for layer in range(engine.g.layers):
            assert engine.block_kv(block, layer) == engine.expected(req.all_token_ids, index, layer), (
                f"request {req.request_id} block #{index} (id {block}) layer {layer}"
            )


def test_connector_class_is_standalone_here(library, geometry):
    assert VLLM_AVAILABLE is False  # this machine has no vLLM; the stand-in base is in use
    c = TuttiConnector(vllm_config(geometry, dict(EXTRA)), KVConnectorRole.WORKER)
    assert c.role is KVConnectorRole.WORKER
    for m in ("register_kv_caches", "start_load_kv", "wait_for_layer_load", "save_kv_layer", "wait_for_save",
              "get_finished", "get_block_ids_with_load_errors", "get_num_new_matched_tokens",
              "update_state_after_alloc", "build_connector_meta", "request_finished"):
        assert callable(getattr(c, m))
    c.shutdown()


def test_scheduler_and_worker_share_one_runtime(engine):
    assert engine.scheduler.runtime is engine.worker.runtime


def test_first_request_stores_second_loads_the_same_bytes(engine):
    B = engine.B
    a = Request("a", prompt(1, 3 * B + 2))  # 3 full blocks and a partial one
    r = engine.step(new=[a])
    assert r.matched == {"a": 0}
    assert r.meta.loads == []
    (save,) = r.meta.saves
    assert save.block_ids == engine.blocks["a"][:3] and len(save.hashes) == 3
    assert r.load_errors == set()
    assert engine.worker.runtime.stats().files_valid == 3

    # Same 3-block prefix, different tail: 12 tokens come from tutti, into other blocks.
    b = Request("b", prompt(1, 3 * B) + [5, 6, 7])
    r = engine.step(new=[b])
    assert r.matched == {"b": 3 * B}
    (load,) = r.meta.loads
    assert load.block_ids == engine.blocks["b"][:3]
    assert set(load.block_ids).isdisjoint(engine.blocks["a"])
    assert r.load_errors == set()
    # The loaded blocks were never computed in b's step, yet hold exactly a's KV.
    assert not any((blk, l) in engine.computed_writes for blk in load.block_ids for l in range(engine.g.layers))
    assert_blocks_hold(engine, b, range(3))
    # Nothing new to store: b's only new full block count is 3, all already in tutti.
    assert r.meta.saves == []
    stats = engine.worker.runtime.stats()
    assert stats.bytes_loaded == 3 * 2 * engine.g.layers * engine.g.object_bytes


def test_full_hit_leaves_the_last_block_to_compute(engine):
    B = engine.B
    engine.step(new=[Request("a", prompt(2, 4 * B))])
    # Exactly the stored 16 tokens: the last token must be computed, so only 3 blocks are offered.
    r = engine.step(new=[Request("b", prompt(2, 4 * B))])
    assert r.matched == {"b": 3 * B}


def test_local_prefix_cache_hits_are_not_loaded_again(engine):
    B = engine.B
    engine.step(new=[Request("a", prompt(3, 4 * B + 1))])
    req = Request("b", prompt(3, 4 * B + 1))
    # vLLM's own prefix cache already has the first block: only the next 3 come from tutti.
    ext, _ = engine.scheduler.get_num_new_matched_tokens(req, B)
    assert ext == 3 * B
    # Not block-aligned local hits: tutti offers nothing rather than a partial block.
    ext, _ = engine.scheduler.get_num_new_matched_tokens(req, B + 1)
    assert ext == 0
    engine.scheduler.request_finished(req, [])


def test_repeated_questions_pin_once_and_finish_unpins(engine):
    B = engine.B
    a = Request("a", prompt(4, 2 * B + 1))
    engine.step(new=[a])
    rt = engine.worker.runtime
    b = Request("b", prompt(4, 2 * B + 1))
    for _ in range(3):  # b waits for memory: vLLM asks again each step
        assert engine.scheduler.get_num_new_matched_tokens(b, 0) == (2 * B, False)
    assert rt.stats().files_pinned == 2
    assert engine.scheduler.request_finished(b, []) == (False, None)
    assert rt.stats().files_pinned == 0


def test_pins_released_when_nothing_is_loaded(engine):
    B = engine.B
    engine.step(new=[Request("a", prompt(5, 2 * B + 1))])
    rt = engine.worker.runtime
    b = Request("b", prompt(5, 2 * B + 1))
    assert engine.scheduler.get_num_new_matched_tokens(b, 0)[0] == 2 * B
    # vLLM decided to load nothing (e.g. it found the blocks elsewhere).
    from vllm_standins import KVCacheBlocks

    engine.scheduler.update_state_after_alloc(b, KVCacheBlocks([]), 0)
    assert rt.stats().files_pinned == 0
    assert engine.scheduler.build_connector_meta(__import__("vllm_standins").SchedulerOutput()).loads == []


def test_each_layer_is_ready_when_its_wait_returns(engine):
    B = engine.B
    engine.step(new=[Request("a", prompt(6, 3 * B + 1))])
    b = Request("b", prompt(6, 3 * B + 1))
    ext, _ = engine.scheduler.get_num_new_matched_tokens(b, 0)
    ids = engine._alloc(4)
    engine.blocks["b"] = ids
    from vllm_standins import KVCacheBlocks, NewRequestData, SchedulerOutput

    engine.scheduler.update_state_after_alloc(b, KVCacheBlocks(ids), ext)
    out = SchedulerOutput(scheduled_new_reqs=[NewRequestData("b", b.prompt_token_ids, (ids,), ext)],
                          num_scheduled_tokens={"b": b.num_tokens - ext})
    meta = engine.scheduler.build_connector_meta(out)
    w = engine.worker
    w.bind_connector_metadata(meta)
    w.start_load_kv(None)
    for layer in range(engine.g.layers):
        w.wait_for_layer_load(layer_name(layer))
        for index in range(3):
            assert engine.block_kv(ids[index], layer) == engine.expected(b.all_token_ids, index, layer)
    w.wait_for_layer_load("not.a.layer")  # unknown names are ignored
    w.wait_for_save()
    assert w.get_block_ids_with_load_errors() == set()
    w.clear_connector_metadata()
    engine.scheduler.request_finished(b, ids)


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


def test_chunked_prefill_stores_blocks_as_they_complete(engine):
    B = engine.B
    a = Request("a", prompt(9, 4 * B + 3))
    r1 = engine.step(new=[a], new_chunk={"a": 2 * B + 1})
    assert [len(s.block_ids) for s in r1.meta.saves] == [2]
    r2 = engine.step(cont={"a": a.num_tokens - a.num_computed_tokens})
    (save,) = r2.meta.saves
    assert save.block_ids == engine.blocks["a"][2:4]
    assert engine.worker.runtime.stats().files_valid == 4
    # Decode steps add no stored blocks (only prompt blocks are cached).
    a.output_token_ids.append(11)
    r3 = engine.step(cont={"a": 1})
    assert r3.meta.saves == []
    # The whole prompt's KV comes back for a newcomer with the same prompt.
    b = Request("b", prompt(9, 4 * B + 3))
    r = engine.step(new=[b])
    assert r.matched == {"b": 4 * B} and r.load_errors == set()
    assert_blocks_hold(engine, b, range(4))


def test_finished_requests(engine):
    B = engine.B
    a = Request("a", prompt(10, 2 * B + 1))
    engine.step(new=[a])
    # Saves finished inside their step: nothing held back, nothing reported later.
    assert engine.finish(a) == (False, None)
    r = engine.step(new=[Request("b", prompt(11, B + 1))])
    assert r.finished == (None, None)
    assert engine.worker.runtime.stats().files_pinned == 0


def test_two_requests_in_one_step(engine):
    B = engine.B
    engine.step(new=[Request("a", prompt(12, 2 * B + 1)), Request("b", prompt(13, 3 * B + 1))])
    c, d = Request("c", prompt(12, 2 * B + 1)), Request("d", prompt(13, 3 * B + 1))
    r = engine.step(new=[c, d])
    assert r.matched == {"c": 2 * B, "d": 3 * B} and r.load_errors == set()
    assert_blocks_hold(engine, c, range(2))
    assert_blocks_hold(engine, d, range(3))


def test_metadata_survives_pickling(engine):
    B = engine.B
    r = engine.step(new=[Request("a", prompt(14, 2 * B + 1))])
    again = pickle.loads(pickle.dumps(r.meta))
    assert isinstance(again, TuttiConnectorMetadata)
    assert again.saves == r.meta.saves and again.loads == r.meta.loads


def test_config_from_vllm(library, geometry):
    cfg = from_vllm(vllm_config(geometry, dict(EXTRA)))
    assert cfg.geometry == geometry  # f16 from model dtype when cache_dtype is "auto"
    assert cfg.model == "tiny/llama-test"
    cfg = from_vllm(vllm_config(geometry, dict(EXTRA, model="m2", tenant_salt="t1"), cache_dtype="fp8"))
    assert cfg.geometry.dtype == "fp8_e4m3" and cfg.model == "m2" and cfg.tenant_salt == b"t1"


@pytest.mark.parametrize(
    "extra,match",
    [
        ({}, "exactly one of"),
        ({"emulated_drives": 2, "vfio_drives": ["0000:01:00.0"]}, "exactly one of"),
        ({"emulated_drives": "two"}, "emulated_drives"),
        ({"emulated_drives": 2, "executor": "gpu"}, "executor"),
        ({"emulated_drives": 2, "open_mode": "wipe"}, "open_mode"),
        ({"emulated_drives": 2, "drive_count": 2}, "unknown"),
    ],
)
def test_config_errors_name_the_key(library, geometry, extra, match):
    with pytest.raises(ConfigError, match=match):
        from_vllm(vllm_config(geometry, extra))


def test_tensor_parallel_is_refused_with_a_reason(library, geometry):
    with pytest.raises(ConfigError, match="single rank"):
        from_vllm(vllm_config(geometry, dict(EXTRA), tp=2))


def test_register_rejects_tensors_of_another_shape(library, geometry):
    c = TuttiConnector(vllm_config(geometry, dict(EXTRA)), KVConnectorRole.WORKER)
    try:
        g = geometry
        bad = {layer_name(i): tutti.HostTensor((2, 8, g.tokens_per_block, g.kv_heads + 1, g.head_dim), 2)
               for i in range(g.layers)}
        with pytest.raises(LayoutError, match="kv_heads"):
            c.register_kv_caches(bad)
        wrong_dtype = {layer_name(i): tutti.HostTensor((2, 8, g.tokens_per_block, g.kv_heads, g.head_dim), 4)
                       for i in range(g.layers)}
        with pytest.raises(LayoutError, match="f16"):
            c.register_kv_caches(wrong_dtype)
        too_few = {layer_name(0): tutti.HostTensor((2, 8, g.tokens_per_block, g.kv_heads, g.head_dim), 2)}
        with pytest.raises(LayoutError, match="1 KV layers"):
            c.register_kv_caches(too_few)
    finally:
        c.shutdown()


def test_flashinfer_layout_round_trip(library, geometry):
    """[num_blocks, 2, B, H, D] per layer (K and V interleaved per block) registers as a strided layout."""
    g = geometry
    cfg = vllm_config(g, dict(EXTRA))
    w = TuttiConnector(cfg, KVConnectorRole.WORKER)
    try:
        nb = 8
        kv = {layer_name(i): tutti.HostTensor((nb, 2, g.tokens_per_block, g.kv_heads, g.head_dim), 2)
              for i in range(g.layers)}
        w.register_kv_caches(kv)
        rt = w.runtime
        obj = g.object_bytes
        hashes = tutti.chain_hashes(list(range(8)), g.tokens_per_block)
        for i, t in enumerate(kv.values()):
            t.write((2 * 1 + 0) * obj, bytes([i + 1]) * obj)  # block 1 K
            t.write((2 * 1 + 1) * obj, bytes([i + 101]) * obj)  # block 1 V
        with rt.begin_store(hashes[:1], [1]) as st:
            with st.submit() as job:
                job.wait()
            assert st.commit().stored == 1
        with rt.load(hashes[:1], [6]) as job:
            assert job.wait().failed == 0
        for i, t in enumerate(kv.values()):
            assert t.read((2 * 6 + 0) * obj, obj) == bytes([i + 1]) * obj
            assert t.read((2 * 6 + 1) * obj, obj) == bytes([i + 101]) * obj
    finally:
        w.shutdown()


def test_layer_names_map_to_indices():
    names = [f"model.layers.{i}.self_attn.attn" for i in (2, 0, 1)]
    assert layer_index_map(names) == {names[0]: 2, names[1]: 0, names[2]: 1}
    odd = ["enc.0.attn.1", "enc.1.attn.1"]
    assert layer_index_map(odd) == {odd[0]: 0, odd[1]: 1}  # ambiguous numbers: registration order


def test_worker_methods_refused_on_the_scheduler_instance(library, geometry):
    c = TuttiConnector(vllm_config(geometry, dict(EXTRA)), KVConnectorRole.SCHEDULER)
    try:
        with pytest.raises(RuntimeError, match="worker-side"):
            c.register_kv_caches({})
    finally:
        c.shutdown()


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
            "except ConfigError as e:\n    print('refused', e)\n"
        ) % (str(Path(__file__).parent), extra)
        env = dict(__import__("os").environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith("refused") and "in use by pid" in done.stdout
    finally:
        c.shutdown()
    # Released with the last connector: the directory opens again.
    c = TuttiConnector(vllm_config(geometry, dict(extra, open_mode="open")), KVConnectorRole.WORKER)
    c.shutdown()
