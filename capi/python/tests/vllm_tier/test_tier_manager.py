"""The tutti tier inside vLLM's ``TieringOffloadingManager``, and what outlives one manager.

The manager scenarios follow vLLM's ``tests/v1/kv_offload/tiering/test_tiering_offloading.py``
(vLLM commit 000f561cfc0d7583b3254bef9656e3a354329aed): chunks stored in the primary tier
cascade to the secondary tier when their store completes; once evicted from the primary tier, a
lookup retries while the secondary tier answers, starts a promotion, reports the chunk pending
and then a hit, with the bytes back in a primary slot. Here the secondary tier is tutti's and
every byte is compared. Also: eviction and the LRU touch, restart from the pool's journal,
the cache identity (model, tenant salt, parallel layout), vLLM's backpressure detector fed by
tutti's store latency, the ``"tutti"`` name found through the package's entry point by vLLM's
own plugin loader, and the line below which vLLM's CPU build cannot go (its worker).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import tomllib
from pathlib import Path

import pytest
from vllm.v1.kv_offload.base import LookupResult, Medium, ReqContext, ScheduleEndContext

from tier_support import CHUNK_BYTES, END, build, drain, fill, job, key, lookups, offloading_config
from tutti import _vllm_plugin

_vllm_plugin.register()

REPO = Path(__file__).resolve().parents[4]


def entry(**kw) -> dict:
    return {"type": "tutti", "emulated_drives": 2, "emulated_capacity_bytes": 8 << 20, **kw}


def settle(manager, cond, timeout: float = 10.0):
    """Scheduler steps until ``cond()`` is true (each step ends like vLLM's)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        manager.on_schedule_end(END)
        time.sleep(0.005)
    raise AssertionError("the manager did not settle in time")


def test_primary_stores_cascade_to_tutti_and_come_back_after_primary_eviction(library):
    s = build([entry()], num_chunks=4)
    m = s.manager
    try:
        ctx = ReqContext(req_id="a")
        m.on_new_request(ctx)
        keys = [key(i) for i in range(4)]
        out = m.prepare_store(keys, ctx)
        ids = [int(c) for c in out.store_spec.chunk_ids]
        data = {k: v for k, v in zip(keys, fill(s.chunks, ids, seed=21).values())}
        m.complete_store(keys, ctx, True)  # the GPU -> primary copy done: cascade to tutti
        settle(m, lambda: not m.has_pending_work())
        assert s.tier.counters["chunks_stored"] == 4
        m.on_request_finished(ctx)
        # A second request fills the primary tier with other chunks, evicting the first four.
        ctx2 = ReqContext(req_id="b")
        m.on_new_request(ctx2)
        others = [key(100 + i) for i in range(4)]
        out2 = m.prepare_store(others, ctx2)
        assert set(out2.evicted_keys) == set(keys)
        fill(s.chunks, [int(c) for c in out2.store_spec.chunk_ids], seed=22)
        m.complete_store(others, ctx2, True)
        settle(m, lambda: not m.has_pending_work())
        m.on_request_finished(ctx2)
        # A third request wants the first chunk back: primary miss, tutti answers, promotion.
        ctx3 = ReqContext(req_id="c")
        m.on_new_request(ctx3)
        assert m.lookup(keys[0], ctx3) is LookupResult.RETRY
        seen = []

        def hit():
            r = m.lookup(keys[0], ctx3)
            seen.append(r)
            return r is LookupResult.HIT

        settle(m, hit)
        assert LookupResult.HIT_PENDING in seen  # the promotion ran as a tutti load job
        spec = m.prepare_load([keys[0]], ctx3)
        (slot,) = [int(c) for c in spec.chunk_ids]
        assert s.chunks[slot].tobytes() == data[keys[0]]
        m.complete_load([keys[0]], ctx3)
        m.on_request_finished(ctx3)
        assert s.tier.counters["chunks_loaded"] == 1
    finally:
        s.close()


def test_vllms_backpressure_detector_sees_tuttis_store_latency(library):
    bp = {"backpressure_cls": "EMABackpressureDetector", "warmup_completions": 1}
    s = build([entry(backpressure=bp)], num_chunks=4)
    m = s.manager
    try:
        det = s.tier.bp_detector
        assert det is not None and det.store_latency_ema == 0.0
        ctx = ReqContext(req_id="a")
        m.on_new_request(ctx)
        keys = [key(i) for i in range(3)]
        out = m.prepare_store(keys, ctx)
        fill(s.chunks, [int(c) for c in out.store_spec.chunk_ids], seed=23)
        m.complete_store(keys, ctx, True)
        settle(m, lambda: not m.has_pending_work())
        assert det.store_latency_ema > 0.0  # seconds per MiB of the tutti store jobs
        m.on_request_finished(ctx)
    finally:
        s.close()


EVICT_CHUNK = 256 << 10  # chunks of 256 KiB: a pool of two 4 MiB drives holds a few dozen


def _capacity_chunks(tmp_path) -> int:
    """How many chunks a 2-drive pool of 4 MiB drives holds (its file count)."""
    s = build([entry(emulated_capacity_bytes=4 << 20)], chunk_bytes=EVICT_CHUNK)
    try:
        return s.tier.rt.stats().files
    finally:
        s.close()


def test_eviction_drops_the_least_recently_used_and_reports_it(library, tmp_path):
    files = _capacity_chunks(tmp_path)
    assert 4 <= files < 200, files
    s = build([entry(emulated_capacity_bytes=4 << 20, enable_kv_events=True)], events=True, num_chunks=8,
              chunk_bytes=EVICT_CHUNK)
    try:
        tier = s.tier
        data = fill(s.chunks, [0], seed=30)
        tier.submit_store(job(0, [key(0)], [0]))
        tier.submit_store(job(1, [key(1)], [0]))
        assert all(r.success for r in drain(tier))
        # Chunk 0 is used again (vLLM touches a hit), chunk 1 is not.
        n = 2
        for i in range(2, files + 4):
            if i % 4 == 0:
                tier.touch([key(0)], ReqContext(req_id="t"))
                time.sleep(0.02)  # the touch runs on the tier's background thread
            tier.submit_store(job(i, [key(i)], [i % 8]))
            assert all(r.success for r in drain(tier))
            n += 1
        assert tier.rt.stats().evictions > 0
        found = lookups(tier, [key(0), key(1), key(n - 1)])
        assert found == [LookupResult.HIT, LookupResult.MISS, LookupResult.HIT], found
        removed = {k for e in s.manager.take_events() if e.removed and e.medium is Medium.STORAGE for k in e.keys}
        assert key(1) in removed and key(0) not in removed
        s.chunks[7] = 0
        tier.submit_load(job(999, [key(0)], [7], promotion=True))
        assert drain(tier)[0].success
        assert s.chunks[7].tobytes() == data[0]
    finally:
        s.close()


def test_a_restarted_engine_loads_what_the_last_one_stored(library, tmp_path):
    d = str(tmp_path / "pool")
    s = build([entry(emulated_dir=d)])
    try:
        data = fill(s.chunks, [0, 1, 2], seed=40)
        s.tier.submit_store(job(1, [key(1), key(2), key(3)], [0, 1, 2]))
        assert drain(s.tier)[0].success
    finally:
        s.close()
    s = build([entry(emulated_dir=d)])  # a new engine: new primary region, the pool reopened
    try:
        assert not s.chunks.any()
        assert lookups(s.tier, [key(1), key(2), key(3), key(4)]) == [LookupResult.HIT] * 3 + [LookupResult.MISS]
        s.tier.submit_load(job(2, [key(3), key(1), key(2)], [5, 6, 7], promotion=True))
        assert drain(s.tier)[0].success
        assert [s.chunks[c].tobytes() for c in (5, 6, 7)] == [data[2], data[0], data[1]]
    finally:
        s.close()


@pytest.mark.parametrize(
    "change",
    [
        {"model": "other-model"},
        {"tier": {"tenant_salt": "tenant-b"}},
        {"tier": {"model": "alias"}},
        {"tp_size": 2},
    ],
    ids=["vllm-model", "tenant-salt", "model-key", "tp-layout"],
)
def test_another_identity_never_sees_the_chunks(library, tmp_path, change):
    d = str(tmp_path / "pool")
    s = build([entry(emulated_dir=d)])
    try:
        fill(s.chunks, [0], seed=50)
        s.tier.submit_store(job(1, [key(1)], [0]))
        assert drain(s.tier)[0].success
    finally:
        s.close()
    kw = {k: v for k, v in change.items() if k != "tier"}
    s = build([entry(emulated_dir=d, **change.get("tier", {}))], **kw)
    try:
        assert lookups(s.tier, [key(1)]) == [LookupResult.MISS]
        s.tier.submit_load(job(2, [key(1)], [3], promotion=True))
        assert not drain(s.tier)[0].success
        assert not s.chunks[3].any()
    finally:
        s.close()
    s = build([entry(emulated_dir=d)])  # the same identity still hits
    try:
        assert lookups(s.tier, [key(1)]) == [LookupResult.HIT]
    finally:
        s.close()


def test_vllms_cpu_build_refuses_the_worker_of_cpu_offloading(library):
    """The line below which every test here runs: vLLM's ``CPUOffloadingSpec.get_worker`` (the
    GPU <-> primary copies of the full ``OffloadingConnector``) refuses a non-GPU platform."""
    from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

    spec = TieringOffloadingSpec(offloading_config([]))
    with pytest.raises(Exception, match="only supported on CUDA-alike"):
        spec.get_worker(None)


def test_vllms_plugin_loader_finds_the_tier_by_name_through_the_entry_point(library, tmp_path):
    """vLLM's own ``load_general_plugins`` (in a fresh process) reads the package's
    ``vllm.general_plugins`` entry point, as pyproject.toml declares it, from the package's
    metadata; the factory then resolves ``{"type": "tutti"}`` with no ``module_path``. The
    metadata is written from pyproject.toml into a dist-info directory (what pip installs); the
    full wheel install is exercised by tests/test_real_vllm.py for the connector."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    eps = project["entry-points"]["vllm.general_plugins"]
    site = tmp_path / "site"
    dist = site / "tutti-0.0.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: tutti\nVersion: 0.0.0\n")
    (dist / "entry_points.txt").write_text(
        "[vllm.general_plugins]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()))
    script = textwrap.dedent(f"""
        import json, sys
        sys.path[:0] = [{str(Path(__file__).parent)!r}]
        from vllm.plugins import load_general_plugins
        from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory
        before = "tutti" in SecondaryTierFactory._registry
        load_general_plugins()
        from tier_support import build
        s = build([{{"type": "tutti", "emulated_drives": 1, "emulated_capacity_bytes": 8 << 20}}])
        cls = type(s.tier)
        s.close()
        print(json.dumps({{"before": before, "cls": cls.__module__ + "." + cls.__name__}}))
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), str(REPO / "capi" / "python")]))
    env.pop("VLLM_PLUGINS", None)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-4000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res == {"before": False, "cls": "tutti.vllm_tier.TuttiTierManager"}
