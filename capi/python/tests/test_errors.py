"""Bad input gets a specific exception whose message says what was wrong; nothing crashes."""

from __future__ import annotations

import ctypes
from ctypes import byref, c_size_t, c_uint64, c_void_p

import pytest

import tutti
from tutti import _lib
from tutti._lib import sized
from conftest import GEOMETRY, NUM_BLOCKS, vllm_layers


def raw(library, name, *args):
    """Calls libtutti directly and returns the exception it maps to (or None)."""
    try:
        library.call(name, *args)
    except tutti.TuttiError as e:
        return e
    return None


def test_every_status_has_its_name_and_class(library):
    for code in range(-16, 0):
        name = library.status_name(code)
        assert name.startswith("TUTTI_E_"), (code, name)
        cls = tutti.errors.exception_class(code)
        assert cls is not tutti.TuttiError and cls.status == code
    assert library.status_name(0) == "TUTTI_OK"
    assert library.status_name(1) == "TUTTI_IN_PROGRESS"
    assert library.status_name(-999) == "TUTTI_UNKNOWN_STATUS"


def test_exception_carries_status_name_and_message(runtime):
    with pytest.raises(tutti.NotFound) as info:
        runtime.unpin(424242)
    e = info.value
    assert e.status == -5 and e.status_name == "TUTTI_E_NOT_FOUND"
    assert e.call == "tutti_kv_unpin"
    assert "424242" in e.message
    assert "TUTTI_E_NOT_FOUND" in str(e) and "424242" in str(e)
    assert isinstance(e, LookupError)


@pytest.mark.parametrize(
    "geometry,field",
    [
        (tutti.Geometry(0, 2, 32, 4, "f16"), "layers"),
        (tutti.Geometry(4, 0, 32, 4, "f16"), "kv_heads"),
        (tutti.Geometry(4, 2, 32, 0, "f16"), "tokens_per_block"),
        (tutti.Geometry(4, 2, 16, 4, "f16"), "LBA"),  # a 256-byte object is not LBA-aligned
    ],
)
def test_open_rejects_bad_geometry(library, geometry, field):
    with pytest.raises(tutti.InvalidArgument, match=field):
        tutti.Runtime(geometry, emulated_drives=1, emulated_capacity_bytes=8 << 20, open_mode="create")


def test_open_rejects_bad_drive_config(library):
    with pytest.raises(tutti.InvalidArgument, match="capacity"):
        tutti.Runtime(GEOMETRY, emulated_drives=1, emulated_capacity_bytes=4096, open_mode="create")
    with pytest.raises(tutti.InvalidArgument, match="emulated_count|drives"):
        tutti.Runtime(GEOMETRY, emulated_drives=1000, emulated_capacity_bytes=8 << 20, open_mode="create")
    with pytest.raises(ValueError, match="either"):
        tutti.Runtime(GEOMETRY)  # neither emulated nor VFIO drives: refused before libtutti


def test_opening_blank_drives_without_create_is_a_pool_error(library, tmp_path):
    with pytest.raises(tutti.PoolError):
        tutti.Runtime(
            GEOMETRY, emulated_drives=1, emulated_capacity_bytes=8 << 20, emulated_dir=str(tmp_path),
            open_mode="open",
        )


def test_vfio_address_that_does_not_exist(library):
    with pytest.raises(tutti.TuttiError) as info:
        tutti.Runtime(GEOMETRY, vfio=["0000:ff:1f.7"], open_mode="open")
    assert "0000:ff:1f.7" in info.value.message


def test_calls_before_registration(runtime):
    h = tutti.chain_hashes(list(range(4)), 4)
    with pytest.raises(tutti.NotRegistered):
        runtime.lookup(h)
    with pytest.raises(tutti.NotRegistered):
        runtime.load(h, [0])
    with pytest.raises(tutti.NotRegistered):
        runtime.begin_store(h, [0])


def test_register_rejects_wrong_layouts(runtime, geometry):
    layers = vllm_layers(geometry)
    bases = [t.data_ptr() for t in layers]
    with pytest.raises(tutti.InvalidArgument, match="layer"):
        runtime.register_kv("vllm_per_layer", NUM_BLOCKS, model="m", k_bases=bases[:3])
    with pytest.raises(tutti.InvalidArgument, match="num_blocks"):
        runtime.register_kv("vllm_per_layer", 0, model="m", k_bases=bases)
    with pytest.raises(tutti.InvalidArgument, match="model"):
        runtime.register_kv("vllm_per_layer", NUM_BLOCKS, model="", k_bases=bases)
    with pytest.raises(tutti.InvalidArgument):
        runtime.register_kv("vllm_per_layer", NUM_BLOCKS, model="m", k_bases=[bases[0]] * 4)  # overlapping
    with pytest.raises(tutti.Unsupported):
        runtime.register_kv("vllm_per_layer", NUM_BLOCKS, model="m", k_bases=bases, memory="cuda")
    with pytest.raises(ValueError, match="kind"):
        runtime.register_kv("paged", NUM_BLOCKS, model="m", k_bases=bases)


def test_io_rejects_bad_requests(registered):
    rt, _ = registered
    h = tutti.chain_hashes(list(range(8)), 4)
    with pytest.raises(tutti.InvalidArgument, match="block"):
        rt.load(h[:1], [NUM_BLOCKS])  # one past the last registered block
    with pytest.raises(tutti.InvalidArgument, match="layer"):
        rt.load(h[:1], [0], layers=range(2, 9))
    with pytest.raises(tutti.InvalidArgument, match="block"):
        rt.begin_store(h[:1], [NUM_BLOCKS + 5])
    with pytest.raises(ValueError, match="2 hashes but 1 block"):
        rt.load(h, [0])
    with pytest.raises(ValueError, match="16 bytes"):
        rt.lookup([b"short"])
    with pytest.raises(ValueError, match="timeout"):
        with rt.load(h[:1], [0]) as job:
            job.wait(timeout=-1)


def test_job_layer_outside_its_range(registered):
    rt, layers = registered
    h = tutti.chain_hashes(list(range(4)), 4)
    with rt.load(h, [0], layers=range(1, 3)) as job:
        with pytest.raises(tutti.InvalidArgument, match="layer"):
            job.layer_done(0)
        with pytest.raises(tutti.InvalidArgument, match="layer"):
            job.wait_layer(3, timeout=1)
        job.wait()


def test_commit_twice_and_closed_handles(registered):
    rt, layers = registered
    h = tutti.chain_hashes(list(range(4)), 4)
    st = rt.begin_store(h, [0])
    with st.submit() as job:
        job.wait()
    st.commit()
    with pytest.raises(tutti.TuttiError) as info:
        st.commit()
    assert info.value.message
    st.close()
    st.close()  # closing twice does nothing
    with pytest.raises(tutti.BadHandle, match="closed"):
        st.submit()


def test_raw_null_pointers(library):
    out = c_void_p()
    e = raw(library, "tutti_runtime_open", None, byref(out))
    assert isinstance(e, tutti.NullPointer) and "config" in e.message
    cfg = sized(_lib.RuntimeConfig)
    e = raw(library, "tutti_runtime_open", byref(cfg), None)
    assert isinstance(e, tutti.NullPointer)
    e = raw(library, "tutti_chain_hashes", None, 4, 4, None, None, 0, byref(c_size_t()))
    assert isinstance(e, tutti.NullPointer) and "tokens" in e.message


def test_raw_wrong_struct_size(library, runtime):
    cfg = _lib.RuntimeConfig(struct_size=ctypes.sizeof(_lib.RuntimeConfig) - 4)  # between two versions
    out = c_void_p()
    e = raw(library, "tutti_runtime_open", byref(cfg), byref(out))
    assert isinstance(e, tutti.StructSizeError)
    assert str(ctypes.sizeof(_lib.RuntimeConfig)) in e.message
    stats = _lib.Stats(struct_size=12)
    e = raw(library, "tutti_get_stats", runtime._p(), byref(stats))
    assert isinstance(e, tutti.StructSizeError) and "12" in e.message


def test_raw_bad_handles_and_double_destroy(library, runtime):
    e = raw(library, "tutti_job_poll", c_void_p(0x1000), None)
    assert isinstance(e, tutti.BadHandle)
    # A runtime passed where a job is expected.
    e = raw(library, "tutti_job_destroy", runtime._p())
    assert isinstance(e, tutti.BadHandle)
    # NULL destroys are no-ops.
    assert raw(library, "tutti_job_destroy", None) is None
    assert raw(library, "tutti_runtime_close", None) is None
    # Double close of a runtime through the C ABI.
    rt = tutti.Runtime(GEOMETRY, emulated_drives=1, emulated_capacity_bytes=8 << 20, open_mode="create")
    ptr = rt._p()
    rt.close()
    e = raw(library, "tutti_runtime_close", ptr)
    assert isinstance(e, tutti.BadHandle)


def test_raw_huge_sizes(library, runtime):
    e = raw(library, "tutti_lookup", runtime._p(), None, 1 << 40, 0, byref(c_size_t()), None)
    assert isinstance(e, (tutti.InvalidArgument, tutti.NullPointer))
    hashes = (_lib.Hash * 1)()
    ids = (ctypes.c_uint32 * 1)()
    e = raw(library, "tutti_submit_load", runtime._p(), hashes, ids, (1 << 20) + 1, 0, 1, byref(c_void_p()))
    assert isinstance(e, (tutti.InvalidArgument, tutti.NotRegistered))
    e = raw(library, "tutti_job_wait", c_void_p(0x1000), c_uint64(1 << 62), None)
    assert isinstance(e, (tutti.InvalidArgument, tutti.BadHandle))


def test_last_error_is_cleared_by_success(library, runtime):
    with pytest.raises(tutti.NotFound):
        runtime.unpin(99)
    assert library.last_error() != ""
    runtime.info()
    assert library.last_error() == ""


def test_last_error_is_per_thread(library, runtime):
    import threading

    with pytest.raises(tutti.NotFound):
        runtime.unpin(77)
    seen = []
    t = threading.Thread(target=lambda: seen.append(library.last_error()))
    t.start()
    t.join()
    assert seen == [""]
    assert "77" in library.last_error()
