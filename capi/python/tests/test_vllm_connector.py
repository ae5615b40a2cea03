"""tutti.vllm.TuttiConnector driven like vLLM drives it, against the real libtutti on emulated drives.

Where vLLM is not importable the connector runs on its stand-in base class
(see tutti/vllm.py); where it is, on vLLM's own base. Either way it is driven
with request, block and scheduler-output stand-ins shaped like vLLM's
(tests/vllm_standins.py). Real vLLM runs it in tests/test_real_vllm.py.
"""

from __future__ import annotations

import pickle

import pytest

import tutti
from tutti._connector.config import ConfigError, from_vllm
from tutti._connector.worker import LayoutError, layer_index_map
from tutti.vllm import KVConnectorRole, TuttiConnector, TuttiConnectorMetadata, VLLM_AVAILABLE
from vllm_standins import EXTRA, Request, assert_blocks_hold, layer_name, prompt, vllm_config


def _vllm_importable() -> bool:
    try:
        import vllm.distributed.kv_transfer.kv_connector.v1.base  # noqa: F401
    except ImportError:
        return False
    return True


def test_connector_class_derives_from_the_base_in_use(library, geometry):
    """vLLM's own base where vLLM imports, the stand-in base where it does not; never a mix."""
    import tutti.vllm as tv

    assert VLLM_AVAILABLE is _vllm_importable()
    if VLLM_AVAILABLE:
        from vllm.distributed.kv_transfer.kv_connector.v1 import base, metrics

        assert tv.KVConnectorBase_V1 is base.KVConnectorBase_V1 and tv.KVConnectorRole is base.KVConnectorRole
        assert issubclass(tv.TuttiConnectorStats, metrics.KVConnectorStats)
    else:
        assert tv.KVConnectorBase_V1.__module__ == "tutti.vllm"
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


def test_tensor_parallel_without_a_daemon_is_refused_naming_the_daemon_keys(library, geometry):
    with pytest.raises(ConfigError, match="tensor_parallel_size × pipeline_parallel_size = 2") as e:
        from_vllm(vllm_config(geometry, dict(EXTRA), tp=2))
    assert "daemon_socket" in str(e.value) and '"daemon": "auto"' in str(e.value)
    with pytest.raises(ConfigError, match="daemon_socket"):
        from_vllm(vllm_config(geometry, dict(EXTRA, emulated_dir="/tmp/x", daemon="off"), tp=2))


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


@pytest.mark.parametrize("backend", ["mp", "ray"])
def test_executors_in_other_processes_are_refused_naming_what_to_set(library, geometry, backend):
    """The scheduler-side connector would see none of the worker's KV: refused before any pool opens."""
    cfg = vllm_config(geometry, dict(EXTRA))
    cfg.parallel_config.distributed_executor_backend = backend
    for role in (KVConnectorRole.SCHEDULER, KVConnectorRole.WORKER):
        with pytest.raises(ConfigError) as e:
            TuttiConnector(cfg, role)
        msg = str(e.value)
        assert repr(backend) in msg
        assert "VLLM_ENABLE_V1_MULTIPROCESSING=0" in msg and 'distributed_executor_backend="uni"' in msg


@pytest.mark.parametrize("backend", ["uni", "external_launcher", None])
def test_single_process_executors_are_accepted(library, geometry, backend):
    cfg = vllm_config(geometry, dict(EXTRA))
    cfg.parallel_config.distributed_executor_backend = backend
    TuttiConnector(cfg, KVConnectorRole.WORKER).shutdown()


def test_connector_refuses_sleep_mode():
    assert TuttiConnector.supports_sleep_mode(None) is False


class _View:
    """A strided view over a HostTensor's memory, with the torch tensor surface tutti reads."""

    def __init__(self, base, shape, strides):
        self.base, self.shape, self._strides = base, tuple(shape), tuple(strides)
        self.device = "cpu"

    def data_ptr(self):
        return self.base.data_ptr()

    def stride(self):
        return self._strides

    def element_size(self):
        return self.base.element_size()


def _strides(shape_logical, order):
    """Element strides of a logical shape laid out in physical ``order`` (outermost first)."""
    out, acc = [0] * len(shape_logical), 1
    for d in reversed(order):
        out[d] = acc
        acc *= shape_logical[d]
    return out


def test_packed_kv_views_are_read_from_strides_not_guessed(library):
    """vLLM >= 0.32's [num_blocks, H, N, 2*D] views: HND and NHD inside a block are both dense runs
    (tagged differently); a head-major layer (LHBNC) is refused naming layer, shape and strides."""
    from tutti._connector.worker import describe_vllm_layer

    g = tutti.Geometry(layers=1, kv_heads=2, head_dim=32, tokens_per_block=4, dtype="f16")
    shape = (2, g.kv_heads, g.tokens_per_block, 2 * g.head_dim)  # 2 blocks and 2 heads: no dim-2 guessing
    mem = tutti.HostTensor((2 * g.kv_heads * g.tokens_per_block * 2 * g.head_dim,), 2)
    hnc = describe_vllm_layer("l0", _View(mem, shape, _strides(shape, (0, 1, 2, 3))), g)
    nhc = describe_vllm_layer("l0", _View(mem, shape, _strides(shape, (0, 2, 1, 3))), g)
    obj = g.object_bytes
    assert (hnc.kind, hnc.blocks, hnc.block_stride, hnc.tag) == ("strided", 2, 2 * obj, "vllm-packed-HNC")
    assert hnc.v_base - hnc.k_base == obj
    assert nhc.tag == "vllm-packed-NHC" and nhc.block_stride == 2 * obj
    bad = _View(mem, shape, _strides(shape, (1, 0, 2, 3)))  # heads outermost: a block is two runs
    with pytest.raises(LayoutError, match=r"'l0' \(shape \(2, 2, 4, 64\), strides \(256, 512, 64, 1\), backend FA"):
        describe_vllm_layer("l0", bad, g, backend="FA")
    wrong = _View(mem, (2, 4, 2, 64), _strides((2, 4, 2, 64), (0, 1, 2, 3)))  # H and N swapped
    with pytest.raises(LayoutError, match="kv_heads, block_size"):
        describe_vllm_layer("l0", wrong, g)


def test_legacy_five_dim_layouts_with_two_blocks_and_two_heads(library):
    """[2, num_blocks, N, H, D] vs [num_blocks, 2, N, H, D] when num_blocks == 2 == kv_heads: the
    same shape and strides over differently ordered bytes, so the backend decides, and without
    one the tensor is refused rather than guessed."""
    from tutti._connector.worker import describe_vllm_layer

    g = tutti.Geometry(layers=1, kv_heads=2, head_dim=32, tokens_per_block=4, dtype="f16")
    shape = (2, 2, g.tokens_per_block, g.kv_heads, g.head_dim)
    mem = tutti.HostTensor((2 * 2 * g.tokens_per_block * g.kv_heads * g.head_dim,), 2)
    packed = _View(mem, shape, _strides(shape, (0, 1, 2, 3, 4)))
    with pytest.raises(LayoutError, match="refusing to guess"):
        describe_vllm_layer("l0", packed, g)
    fa = describe_vllm_layer("l0", packed, g, backend="FLASH_ATTN")
    assert fa.kind == "vllm_per_layer" and fa.v_base - fa.k_base == 2 * g.object_bytes and fa.tag == ""
    fi = describe_vllm_layer("l0", packed, g, backend="FLASHINFER")
    assert fi.kind == "strided" and fi.block_stride == 2 * g.object_bytes and fi.v_base - fi.k_base == g.object_bytes
    # Three blocks: no ambiguity, the strides say which dim is K/V.
    shape3 = (3, 2, g.tokens_per_block, g.kv_heads, g.head_dim)
    mem3 = tutti.HostTensor((3 * 2 * g.tokens_per_block * g.kv_heads * g.head_dim,), 2)
    fi3 = describe_vllm_layer("l0", _View(mem3, shape3, _strides(shape3, (0, 1, 2, 3, 4))), g)
    assert fi3.kind == "strided" and fi3.blocks == 3
    hnd = describe_vllm_layer("l0", _View(mem, shape, _strides(shape, (0, 1, 3, 2, 4))), g, backend="FLASH_ATTN")
    assert hnd.tag == "vllm-split-HND"


def test_host_threads_reach_the_runtime_and_bad_counts_name_the_key(library, geometry):
    cfg = from_vllm(vllm_config(geometry, dict(EXTRA, host_threads=2)))
    assert cfg.host_threads == 2
    assert cfg.runtime_kwargs()["host_lane_blocks"] == 2
    # Unset: libtutti's default (one thread), and a pool with other threads is another pool.
    default = from_vllm(vllm_config(geometry, dict(EXTRA)))
    assert "host_lane_blocks" not in default.runtime_kwargs()
    assert default.pool_key() != cfg.pool_key()
    for bad in (65, -1, "two", 1.5):
        with pytest.raises(ConfigError, match="host_threads"):
            from_vllm(vllm_config(geometry, dict(EXTRA, host_threads=bad)))
