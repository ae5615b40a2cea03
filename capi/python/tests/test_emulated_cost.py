"""Runtime(...) keyword arguments of the emulated drives' bandwidth and latency model (ABI 1.5)."""

from __future__ import annotations

import pytest

import tutti
from conftest import GEOMETRY, NUM_BLOCKS, block_bytes, fill_block, vllm_layers


def open_rt(**cost):
    return tutti.Runtime(GEOMETRY, emulated_drives=2, emulated_capacity_bytes=8 << 20, open_mode="create", **cost)


@pytest.mark.parametrize(
    "cost, field",
    [
        ({"emulated_latency_us": 10_000_001}, "emulated_latency_us"),
        ({"emulated_write_latency_us": 20_000_000}, "emulated_write_latency_us"),
        ({"emulated_mixed_efficiency": 0.4}, "emulated_mixed_efficiency"),
        ({"emulated_read_bytes_per_sec": 10**9, "emulated_mixed_efficiency": 1.5}, "emulated_mixed_efficiency"),
        ({"emulated_read_bytes_per_sec": 10**9, "emulated_mixed_efficiency": float("nan")}, "emulated_mixed_efficiency"),
        (
            {"emulated_read_bytes_per_sec": 10**9, "emulated_mixed_efficiency": 0.4, "emulated_mixed_read_share": 1.0},
            "emulated_mixed_read_share",
        ),
        ({"emulated_mixed_read_share": 0.5}, "emulated_mixed_read_share"),
    ],
)
def test_bad_cost_fields_are_refused_by_name(library, cost, field):
    with pytest.raises(tutti.InvalidArgument, match=field):
        open_rt(**cost)


def test_a_drive_with_a_cost_model_stores_and_loads_byte_for_byte(library):
    rt = open_rt(
        emulated_read_bytes_per_sec=2 * 10**9,
        emulated_write_bytes_per_sec=10**9,
        emulated_latency_us=20,
        emulated_read_latency_us=30,
        emulated_mixed_efficiency=0.4,
        emulated_mixed_read_share=0.6,
    )
    try:
        layers = vllm_layers(GEOMETRY)
        rt.register_kv(
            "vllm_per_layer", NUM_BLOCKS, model="test-model", k_bases=[t.data_ptr() for t in layers], keepalive=layers
        )
        hashes = tutti.chain_hashes(list(range(8)), GEOMETRY.tokens_per_block)
        written = {b: fill_block(GEOMETRY, layers, NUM_BLOCKS, b, seed=b + 1) for b in (0, 1)}
        with rt.begin_store(hashes, [0, 1]) as st:
            with st.submit() as job:
                assert job.wait().failed == 0
            report = st.commit()
        assert (report.stored, report.failed) == (2, 0)
        with rt.load(hashes, [5, 6]) as job:
            status = job.wait()
        assert status.done and status.failed == 0
        for src, dst in ((0, 5), (1, 6)):
            assert block_bytes(GEOMETRY, layers, NUM_BLOCKS, dst) == written[src]
    finally:
        rt.close()


def test_host_executor_threads_keyword(library):
    # More threads than libtutti allows is refused by name; a valid count opens a working pool.
    with pytest.raises(tutti.InvalidArgument, match="host_lane_blocks"):
        open_rt(host_lane_blocks=65)
    rt = open_rt(host_lane_blocks=2)
    try:
        layers = vllm_layers(GEOMETRY)
        rt.register_kv(
            "vllm_per_layer", NUM_BLOCKS, model="test-model", k_bases=[t.data_ptr() for t in layers], keepalive=layers
        )
        hashes = tutti.chain_hashes(list(range(4)), GEOMETRY.tokens_per_block)
        written = fill_block(GEOMETRY, layers, NUM_BLOCKS, 0, seed=9)
        with rt.begin_store(hashes, [0]) as st:
            with st.submit() as job:
                assert job.wait().failed == 0
            assert st.commit().stored == 1
        with rt.load(hashes, [3]) as job:
            assert job.wait().failed == 0
        assert block_bytes(GEOMETRY, layers, NUM_BLOCKS, 3) == written
    finally:
        rt.close()
