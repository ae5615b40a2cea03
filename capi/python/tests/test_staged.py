"""The staged data path through the binding and the vLLM connector.

Host memory registered as ``memory="host_staged"`` is never mapped for the drives: every
byte moves through staging slots the executor copies, and ``Runtime.data_path`` says so.
CUDA memory is refused, with the reason, by runtimes that cannot move it; the connector
registers vLLM's GPU KV caches as CUDA memory and names the executor to configure.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import tutti
from conftest import GEOMETRY, NUM_BLOCKS, block_bytes, fill_block, vllm_layers
from tutti._connector.config import ConfigError, from_vllm
from tutti._connector.worker import LayoutError
from tutti.vllm import KVConnectorRole, TuttiConnector
from vllm_standins import EXTRA, layer_name, vllm_config


def _register(rt, layers, memory):
    return rt.register_kv(
        "vllm_per_layer", NUM_BLOCKS, model="m", k_bases=[t.data_ptr() for t in layers], memory=memory,
        keepalive=layers,
    )


def test_host_staged_memory_round_trips_through_staging(library, geometry):
    with tutti.Runtime(geometry, emulated_drives=2, emulated_capacity_bytes=8 << 20, open_mode="create",
                       staging_slots=3) as rt:
        assert rt.data_path().mode == "none"
        layers = vllm_layers(geometry)
        _register(rt, layers, "host_staged")
        hashes = tutti.chain_hashes(list(range(100, 116)), geometry.tokens_per_block)
        src = [2, 5, 7, 11]
        written = {b: fill_block(geometry, layers, NUM_BLOCKS, b, seed=b + 3) for b in src}
        with rt.begin_store(hashes, src) as st:
            with st.submit() as job:
                assert job.wait().failed == 0
            assert st.commit().stored == 4
        dst = [20, 21, 22, 23]
        with rt.lookup(hashes) as found:
            assert found.hits == 4
            with rt.load(hashes, dst) as job:
                assert job.wait().failed == 0
        for s, d in zip(src, dst):
            assert block_bytes(geometry, layers, NUM_BLOCKS, d) == written[s], f"block {s} -> {d}"
        path = rt.data_path()
        assert (path.mode, path.memory, path.staging_slots) == ("staged", "host_staged", 3)
        assert path.staged_bytes == 2 * 4 * 2 * geometry.layers * geometry.object_bytes
        assert "not DMA-mappable" in path.p2p_missing


def test_plain_host_memory_is_direct(runtime, geometry):
    _register(runtime, vllm_layers(geometry), "host")
    path = runtime.data_path()
    assert (path.mode, path.memory, path.p2p_missing, path.staging_slots) == ("direct", "host", "", 0)


def test_memory_a_runtime_cannot_move_is_refused_naming_why(library, geometry):
    layers = vllm_layers(geometry)
    with tutti.Runtime(geometry, emulated_drives=2, emulated_capacity_bytes=8 << 20, open_mode="create",
                       executor="direct") as rt:
        with pytest.raises(tutti.InvalidArgument, match="direct backend cannot run"):
            _register(rt, layers, "host_staged")
        with pytest.raises(tutti.errors.Unsupported, match="TUTTI_EXECUTOR_GIO_CUDA"):
            _register(rt, layers, "cuda")
        assert rt.data_path().mode == "none"
    with pytest.raises(ValueError, match="host_staged"):
        with tutti.Runtime(geometry, emulated_drives=1, emulated_capacity_bytes=8 << 20) as rt:
            _register(rt, layers, "gpu")


def test_the_cuda_executor_without_a_driver_is_unsupported(library, geometry):
    try:
        rt = tutti.Runtime(geometry, emulated_drives=2, emulated_capacity_bytes=8 << 20, open_mode="create",
                           executor="gio_cuda", cuda_device=0)
    except tutti.errors.Unsupported as e:
        assert "no CUDA" in str(e)
        return
    # A machine with a GPU: the CUDA executor runs the staged path.
    with rt:
        _register(rt, vllm_layers(geometry), "host_staged")
        assert rt.data_path().mode == "staged"


class _CudaTensor:
    """A vLLM KV tensor that says it lives on the GPU (its memory is host memory here)."""

    def __init__(self, t: tutti.HostTensor):
        self._t = t
        self.shape = t.shape
        self.device = SimpleNamespace(type="cuda", index=0)

    def data_ptr(self):
        return self._t.data_ptr()

    def stride(self):
        return self._t.stride()

    def element_size(self):
        return self._t.element_size()


def _gpu_caches(g):
    return {layer_name(i): _CudaTensor(t) for i, t in enumerate(vllm_layers(g))}


def test_connector_registers_gpu_caches_as_cuda_memory(library, geometry, monkeypatch):
    c = TuttiConnector(vllm_config(geometry, dict(EXTRA)), KVConnectorRole.WORKER)
    try:
        rt = c._worker.rt
        calls = []
        monkeypatch.setattr(rt, "register_kv", lambda *a, **kw: calls.append(kw))
        c.register_kv_caches(_gpu_caches(geometry))
        assert [kw["memory"] for kw in calls] == ["cuda"], calls
    finally:
        c.shutdown()


def test_connector_refuses_gpu_caches_without_the_cuda_executor_naming_the_key(library, geometry):
    c = TuttiConnector(vllm_config(geometry, dict(EXTRA)), KVConnectorRole.WORKER)
    try:
        with pytest.raises(LayoutError, match=r"executor'\] = 'gio_cuda'") as e:
            c.register_kv_caches(_gpu_caches(geometry))
        assert "TUTTI_EXECUTOR_GIO_CUDA" in str(e.value)
    finally:
        c.shutdown()


def test_connector_config_names_the_cuda_executor_options(library, geometry):
    cfg = from_vllm(vllm_config(geometry, dict(EXTRA, executor="gio_cuda", cuda_device=1, cuda_sm_count=8,
                                               staging_slots=64)))
    kw = cfg.runtime_kwargs()
    assert (kw["executor"], kw["cuda_device"], kw["cuda_sm_count"], kw["staging_slots"]) == ("gio_cuda", 1, 8, 64)
    assert kw["cuda_driver"] is None
    with pytest.raises(ConfigError, match="gio_cuda"):
        from_vllm(vllm_config(geometry, dict(EXTRA, executor="cuda")))
    with pytest.raises(ConfigError, match="cuda_sm_count"):
        from_vllm(vllm_config(geometry, dict(EXTRA, executor="gio_cuda", cuda_sm_count=-1)))


def _standin_driver() -> str:
    """The workspace's stand-in libcuda.so (scripts/test-python builds it and exports
    TUTTI_CUDA_STANDIN): CUDA's driver API with kernels run as host threads."""
    import os

    path = os.environ.get("TUTTI_CUDA_STANDIN", "")
    if not path or not os.path.isfile(path):
        if os.environ.get("CI") == "true":
            pytest.fail("TUTTI_CUDA_STANDIN names no stand-in libcuda.so under CI=true (scripts/test-python sets it)")
        pytest.skip("TUTTI_CUDA_STANDIN is not set (scripts/test-python builds the stand-in and sets it)")
    return path


def test_cuda_memory_round_trips_through_the_cuda_executor(library, geometry):
    """CUDA KV memory (allocated with the driver the runtime loaded) moves on the staged path."""
    import ctypes
    from ctypes import byref, c_int, c_size_t, c_uint64, c_void_p

    driver = _standin_driver()
    with tutti.Runtime(geometry, emulated_drives=2, emulated_capacity_bytes=8 << 20, open_mode="create",
                       executor="gio_cuda", cuda_driver=driver, cuda_sm_count=1, cuda_block_threads=32,
                       staging_slots=4) as rt:
        cu = ctypes.CDLL(driver)  # the library the runtime loaded: one driver per process
        cu.cuMemcpyHtoD_v2.argtypes = [c_uint64, c_void_p, c_size_t]
        cu.cuMemcpyDtoH_v2.argtypes = [c_void_p, c_uint64, c_size_t]
        cu.cuMemsetD8_v2.argtypes = [c_uint64, ctypes.c_ubyte, c_size_t]
        cu.cuMemAlloc_v2.argtypes = [ctypes.POINTER(c_uint64), c_size_t]
        cu.cuMemFree_v2.argtypes = [c_uint64]

        def ok(rc, what):
            assert rc == 0, f"{what}: CUresult {rc}"

        ok(cu.cuInit(0), "cuInit")
        dev, ctx = c_int(), c_void_p()
        ok(cu.cuDeviceGet(byref(dev), 0), "cuDeviceGet")
        ok(cu.cuDevicePrimaryCtxRetain(byref(ctx), dev), "cuDevicePrimaryCtxRetain")
        ok(cu.cuCtxPushCurrent_v2(ctx), "cuCtxPushCurrent")
        per_layer = 2 * NUM_BLOCKS * geometry.object_bytes
        total = geometry.layers * per_layer
        dptr = c_uint64()
        ok(cu.cuMemAlloc_v2(byref(dptr), total), "cuMemAlloc")
        import random

        host = (ctypes.c_uint8 * total)(*random.Random(5).randbytes(total))
        ok(cu.cuMemcpyHtoD_v2(dptr.value, host, total), "cuMemcpyHtoD")
        ok(cu.cuCtxSynchronize(), "cuCtxSynchronize")
        rt.register_kv("vllm_per_layer", NUM_BLOCKS, model="m",
                       k_bases=[dptr.value + l * per_layer for l in range(geometry.layers)], memory="cuda")

        def block(buf, b):
            return [bytes(buf[l * per_layer + (kv * NUM_BLOCKS + b) * geometry.object_bytes:][:geometry.object_bytes])
                    for l in range(geometry.layers) for kv in (0, 1)]

        hashes = tutti.chain_hashes(list(range(300, 312)), geometry.tokens_per_block)
        src, dst = [1, 4, 9], [20, 17, 13]
        with rt.begin_store(hashes, src) as st:
            with st.submit() as job:
                assert job.wait().failed == 0
            assert st.commit().stored == 3
        ok(cu.cuMemsetD8_v2(dptr.value, 0, total), "cuMemsetD8")
        ok(cu.cuCtxSynchronize(), "cuCtxSynchronize")
        with rt.lookup(hashes) as found:
            assert found.hits == 3
            with rt.load(hashes, dst) as job:
                assert job.wait().failed == 0
        back = (ctypes.c_uint8 * total)()
        ok(cu.cuMemcpyDtoH_v2(back, dptr.value, total), "cuMemcpyDtoH")
        for s, d in zip(src, dst):
            assert block(back, d) == block(host, s), f"block {s} -> {d}: every byte"
        path = rt.data_path()
        assert (path.mode, path.memory) == ("staged", "cuda")
        assert "CUDA memory" in path.p2p_missing
        rt.unregister_kv()
        ok(cu.cuMemFree_v2(dptr.value), "cuMemFree")


class _StandinCudaTensor:
    """A KV tensor in CUDA memory of the stand-in driver (cuMemAlloc), read and written with
    cuMemcpy as an engine's kernels would; torch-like: shape, stride, element_size, data_ptr,
    ``device.type == "cuda"``."""

    def __init__(self, cu, shape, element_size):
        import ctypes

        self._cu = cu
        self.shape = tuple(shape)
        self._element_size = element_size
        self.device = SimpleNamespace(type="cuda", index=0)
        n = element_size
        for d in self.shape:
            n *= d
        self.nbytes = n
        self._ptr = ctypes.c_uint64()
        assert cu.cuMemAlloc_v2(ctypes.byref(self._ptr), n) == 0
        assert cu.cuMemsetD8_v2(self._ptr.value, 0, n) == 0
        assert cu.cuCtxSynchronize() == 0

    def data_ptr(self):
        return self._ptr.value

    def element_size(self):
        return self._element_size

    def stride(self):
        out, acc = [], 1
        for d in reversed(self.shape):
            out.append(acc)
            acc *= d
        return tuple(reversed(out))

    def write(self, offset, data):
        import ctypes

        buf = ctypes.create_string_buffer(bytes(data), len(data))
        assert self._cu.cuMemcpyHtoD_v2(self._ptr.value + offset, buf, len(data)) == 0
        assert self._cu.cuCtxSynchronize() == 0

    def read(self, offset, n):
        import ctypes

        buf = ctypes.create_string_buffer(n)
        assert self._cu.cuMemcpyDtoH_v2(buf, self._ptr.value + offset, n) == 0
        return buf.raw


class _Event:
    """torch.cuda.Event, reduced to what the worker uses: the stand-in tensors' writes are
    synchronous (cuMemcpyHtoD + cuCtxSynchronize), so a recorded event is complete."""

    def record(self, stream):
        self.recorded = True

    def query(self):
        return self.recorded

    def synchronize(self):
        assert self.recorded


def test_the_connector_moves_gpu_kv_caches_through_the_cuda_executor(library, geometry, monkeypatch):
    """vLLM's worker with its KV caches in CUDA memory: the first request's blocks are stored and
    a second request with the same prefix loads exactly those bytes into other blocks, on the
    staged path of the CUDA executor (the stand-in driver here)."""
    import ctypes
    import sys

    if "torch" not in sys.modules:
        # No torch here: the worker's write markers (CUDA events) come from a stand-in module.
        fake = SimpleNamespace(cuda=SimpleNamespace(Event=_Event, current_stream=lambda device=None: None))
        monkeypatch.setitem(sys.modules, "torch", fake)
    from ctypes import byref, c_int, c_size_t, c_uint64, c_void_p

    from vllm_standins import MiniEngine, Request, assert_blocks_hold, prompt

    driver = _standin_driver()
    cu = ctypes.CDLL(driver, mode=ctypes.RTLD_GLOBAL)
    cu.cuMemcpyHtoD_v2.argtypes = [c_uint64, c_void_p, c_size_t]
    cu.cuMemcpyDtoH_v2.argtypes = [c_void_p, c_uint64, c_size_t]
    cu.cuMemsetD8_v2.argtypes = [c_uint64, ctypes.c_ubyte, c_size_t]
    cu.cuMemAlloc_v2.argtypes = [ctypes.POINTER(c_uint64), c_size_t]
    extra = dict(EXTRA, executor="gio_cuda", cuda_driver=driver, cuda_sm_count=1, cuda_block_threads=32,
                 staging_slots=8)
    # The engine's own context: the device's primary context, current on this thread.
    assert cu.cuInit(0) == 0
    dev, ctx = c_int(), c_void_p()
    assert cu.cuDeviceGet(byref(dev), 0) == 0
    assert cu.cuDevicePrimaryCtxRetain(byref(ctx), dev) == 0
    assert cu.cuCtxPushCurrent_v2(ctx) == 0
    engine = MiniEngine(geometry, extra, tensor=lambda shape, size: _StandinCudaTensor(cu, shape, size))
    try:
        B = engine.B
        a = Request("a", prompt(7, 3 * B + 1))
        r = engine.step(new=[a])
        assert r.matched == {"a": 0} and len(r.meta.saves) == 1
        b = Request("b", prompt(7, 3 * B) + [9])
        r = engine.step(new=[b])
        assert r.matched == {"b": 3 * B}
        (load,) = r.meta.loads
        assert set(load.block_ids).isdisjoint(engine.blocks["a"])
        assert r.load_errors == set()
        assert_blocks_hold(engine, b, range(3))
        path = engine.worker.runtime.data_path()
        assert (path.mode, path.memory) == ("staged", "cuda")
        assert path.staged_bytes >= 2 * 3 * 2 * geometry.layers * geometry.object_bytes
        assert "GDRCopy" in path.p2p_missing, path.p2p_missing
    finally:
        engine.close()


def test_the_connector_moves_gpu_kv_caches_peer_to_peer_where_gdrcopy_maps_them(library, geometry, monkeypatch):
    """As above, with GDRCopy (the stand-in's gdrapi, which maps the stand-in's device memory a second
    time as BAR1 would): the worker's KV tensors go P2P, the drives DMA straight into them (no byte
    through a staging slot), and the second request loads exactly the first one's bytes."""
    import ctypes
    import sys

    if "torch" not in sys.modules:
        fake = SimpleNamespace(cuda=SimpleNamespace(Event=_Event, current_stream=lambda device=None: None))
        monkeypatch.setitem(sys.modules, "torch", fake)
    from ctypes import byref, c_int, c_size_t, c_uint64, c_void_p

    from vllm_standins import MiniEngine, Request, assert_blocks_hold, prompt

    driver = _standin_driver()
    monkeypatch.setenv("TUTTI_GDRAPI", driver)
    monkeypatch.delenv("TUTTI_P2P", raising=False)
    cu = ctypes.CDLL(driver, mode=ctypes.RTLD_GLOBAL)
    cu.cuMemcpyHtoD_v2.argtypes = [c_uint64, c_void_p, c_size_t]
    cu.cuMemcpyDtoH_v2.argtypes = [c_void_p, c_uint64, c_size_t]
    cu.cuMemsetD8_v2.argtypes = [c_uint64, ctypes.c_ubyte, c_size_t]
    cu.cuMemAlloc_v2.argtypes = [ctypes.POINTER(c_uint64), c_size_t]
    extra = dict(EXTRA, executor="gio_cuda", cuda_driver=driver, cuda_sm_count=1, cuda_block_threads=32,
                 staging_slots=8)
    assert cu.cuInit(0) == 0
    dev, ctx = c_int(), c_void_p()
    assert cu.cuDeviceGet(byref(dev), 0) == 0
    assert cu.cuDevicePrimaryCtxRetain(byref(ctx), dev) == 0
    assert cu.cuCtxPushCurrent_v2(ctx) == 0
    # 128 blocks: each layer's tensor spans whole 64 KiB GPU pages, which GDRCopy pins.
    engine = MiniEngine(geometry, extra, num_blocks=128,
                        tensor=lambda shape, size: _StandinCudaTensor(cu, shape, size))
    try:
        path = engine.worker.runtime.data_path()
        assert (path.mode, path.memory, path.provider) == ("p2p", "cuda", "gdrcopy"), path
        B = engine.B
        a = Request("a", prompt(11, 3 * B + 1))
        r = engine.step(new=[a])
        assert r.matched == {"a": 0} and len(r.meta.saves) == 1
        b = Request("b", prompt(11, 3 * B) + [9])
        r = engine.step(new=[b])
        assert r.matched == {"b": 3 * B}
        (load,) = r.meta.loads
        assert set(load.block_ids).isdisjoint(engine.blocks["a"])
        assert r.load_errors == set()
        assert_blocks_hold(engine, b, range(3))
        path = engine.worker.runtime.data_path()
        assert path.mode == "p2p" and path.staged_bytes == 0, path
    finally:
        engine.close()
