"""The break-even rule (tutti/_connector/breakeven.py): its fits and decisions on given timings,
then end to end in the connector driven like vLLM drives it (tests/vllm_standins.py), on emulated
drives paced far slower, or left far faster, than the stand-in engine computes.

Decisions and counters are asserted, never durations; the end-to-end cases keep a factor of ten
or more between loading and recomputing, so the decision does not hang on the machine's speed.
"""

from __future__ import annotations

import json

import pytest

from tutti._connector.breakeven import BreakEven, Line, Observations, SlackPrior, StepClock
from tutti._connector.config import ConfigError, from_vllm
from tutti.vllm import TuttiConnectorStats, TuttiWorkerMeta
from vllm_standins import EXTRA, MiniEngine, Request, assert_blocks_hold, prompt, vllm_config

B = 16  # tokens per block in the unit cases
BLOCK_BYTES = 1 << 20  # one block of one rank: 1 MiB


class FakeClock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def rule(policy="breakeven", **kw) -> tuple[BreakEven, FakeClock]:
    clock = FakeClock()
    return BreakEven(policy, BLOCK_BYTES, B, clock=clock, **kw), clock


def feed(r: BreakEven, loads=(), prefills=(), pending=0, step=1):
    r.observe(Observations(step=step, loads=list(loads), prefills=list(prefills), pending_write_bytes=pending))


# ---- the fit --------------------------------------------------------------------------------

def test_line_recovers_intercept_and_slope_and_forgets_old_points():
    line = Line(alpha=0.5)
    for x in (1, 2, 4, 8, 3, 6):
        line.add(x, 0.5 + 2.0 * x)
    a, b = line.fit()
    assert a == pytest.approx(0.5) and b == pytest.approx(2.0)
    for x in (1, 2, 4, 8) * 10:  # the drives became twice as fast
        line.add(x, 0.5 + 1.0 * x)
    assert line.fit()[1] == pytest.approx(1.0, rel=1e-3)


def test_line_without_spread_goes_through_the_origin_and_bounds_only_lower_it():
    line = Line()
    assert line.fit() == (0.0, 0.0)
    line.add(10, 5.0)
    line.add(10, 7.0)
    a, b = line.fit()
    assert a == 0.0 and 0.5 < b < 0.7
    before = line.predict(10)
    assert line.cap(10, 100.0) is False and line.predict(10) == before  # a bound above: nothing learnt
    assert line.cap(10, 1.0) is True and line.predict(10) < before
    line.add(0, 1.0)  # x must be positive: ignored
    line.add(5, float("nan"))
    assert line.n == 3


def test_observations_from_ranks_merge():
    a = Observations(step=7, loads=[(10, 0.1, True)], prefills=[(32, 0.2)], pending_write_bytes=5)
    b = Observations(step=6, loads=[(12, 0.2, False)], prefills=[], pending_write_bytes=9)
    m = TuttiWorkerMeta(a).aggregate(TuttiWorkerMeta(b)).obs
    assert m.step == 6 and len(m.loads) == 2 and m.prefills == [(32, 0.2)] and m.pending_write_bytes == 9


# ---- decisions ------------------------------------------------------------------------------

def test_the_first_requests_load_while_the_rates_are_learnt():
    r, _ = rule()
    assert r.decide(0, 4, 5 * B) == 4  # nothing known
    feed(r, prefills=[(100, 1.0)])
    assert r.decide(0, 4, 5 * B) == 4  # compute known, loads not yet
    assert r.counters["match_learning"] == 2 and r.counters["match_declined_tokens"] == 0
    assert r.counters["match_hit_tokens"] == r.counters["match_reported_tokens"] == 8 * B


@pytest.mark.parametrize("read_s_per_block,reported", [(0.001, 4), (1.0, 0)])
def test_a_hit_is_reported_only_when_loading_beats_recomputing(read_s_per_block, reported):
    """Recomputing costs 10 ms a token (160 ms a block): loading at 1 ms a block is reported, at
    1 s a block declined."""
    r, _ = rule()
    feed(r, prefills=[(100, 1.0), (200, 2.0)], loads=[(4 * BLOCK_BYTES, 4 * read_s_per_block, True)])
    assert r.decide(0, 4, 5 * B) == reported
    c = r.take_stats()
    assert c["match_hit_tokens"] == 4 * B and c["match_reported_tokens"] == reported * B
    assert c["match_declined_tokens"] == (4 - reported) * B
    assert c["match_declined_requests"] == (reported == 0)
    assert c["est_prefill_s_per_token"] == pytest.approx(0.01)
    assert c["est_read_bytes_per_s"] == pytest.approx(BLOCK_BYTES / read_s_per_block)
    assert r.take_stats()["match_hit_tokens"] == 0  # counters restart, gauges stay
    assert r.take_stats()["est_prefill_s_per_token"] == pytest.approx(0.01)


def test_local_hits_are_neither_weighed_nor_counted():
    r, _ = rule()
    feed(r, prefills=[(100, 1.0), (200, 2.0)], loads=[(BLOCK_BYTES, 1.0, True)])
    assert r.decide(3, 3, 5 * B) == 3  # vLLM's own cache holds all of tutti's hit
    assert r.decide(2, 6, 8 * B) == 2  # 4 blocks past the local 2: declined, the local 2 stay
    assert r.counters["match_hit_tokens"] == 4 * B and r.counters["match_declined_tokens"] == 4 * B


def test_the_backlog_delays_a_load_past_its_recompute():
    """Reads granted earlier in the pass and saves still in flight are read or written first."""
    r, _ = rule()
    feed(r, prefills=[(100, 1.0), (200, 2.0)], loads=[(BLOCK_BYTES, 0.05, True), (8 * BLOCK_BYTES, 0.4, True)])
    assert r.decide(0, 4, 5 * B) == 4  # 0.2 s to load, 0.64 s to recompute
    assert r.decide(0, 4, 5 * B, backlog_bytes=12 * BLOCK_BYTES) == 0  # 0.8 s with the backlog
    assert r.gauges["est_backlog_bytes"] == 12 * BLOCK_BYTES
    feed(r, pending=12 * BLOCK_BYTES, step=2)  # a worker's deferred saves, not yet written
    assert r.decide(0, 4, 5 * B) == 0


def test_the_longest_prefix_that_beats_recompute_is_reported():
    """A recompute cost that grows slower than the load (here: a prior from a profile) makes a
    shorter prefix the break-even one."""

    class Concave:
        def recompute_s(self, tokens, before, after):
            return 0.2 * (tokens / B) ** 0.5  # 1 block 0.2 s, 4 blocks 0.4 s

    r, _ = rule(prior=Concave())
    feed(r, loads=[(BLOCK_BYTES, 0.15, True)])
    assert r.decide(0, 4, 5 * B) == 1
    assert r.counters["match_reported_tokens"] == B and r.counters["match_declined_tokens"] == 3 * B


def test_a_stale_estimate_is_probed_only_when_the_load_was_close():
    r, clock = rule(probe_after_s=30.0)
    feed(r, prefills=[(100, 1.0), (200, 2.0)], loads=[(4 * BLOCK_BYTES, 0.96, True)])  # 1.5x recompute
    assert r.decide(0, 4, 5 * B) == 0
    clock.t += 31
    assert r.decide(0, 4, 5 * B) == 4 and r.counters["match_probes"] == 1
    assert r.decide(0, 4, 5 * B) == 0  # one probe per interval
    far, clock = rule(probe_after_s=30.0)
    feed(far, prefills=[(100, 1.0), (200, 2.0)], loads=[(4 * BLOCK_BYTES, 3.0, True)])  # 4.7x recompute
    clock.t += 1000
    assert far.decide(0, 4, 5 * B) == 0 and far.counters["match_probes"] == 0


def test_bounded_load_timings_only_lower_the_estimate():
    r, _ = rule()
    feed(r, prefills=[(100, 1.0), (200, 2.0)], loads=[(4 * BLOCK_BYTES, 1.0, True)])
    assert r.decide(0, 4, 5 * B) == 0
    feed(r, loads=[(4 * BLOCK_BYTES, 5.0, False)], step=2)  # "done within 5 s": says nothing new
    assert r.load.predict(4 * BLOCK_BYTES) == pytest.approx(1.0)
    feed(r, loads=[(4 * BLOCK_BYTES, 0.01, False)] * 8, step=3)  # done before the engine looked
    assert r.decide(0, 4, 5 * B) == 4


def test_always_reports_every_hit_and_counts_it():
    r, _ = rule("always")
    feed(r, prefills=[(100, 1.0)], loads=[(BLOCK_BYTES, 100.0, True)])
    assert r.decide(1, 5, 6 * B) == 5
    assert r.counters["match_reported_tokens"] == 4 * B and r.counters["match_declined_tokens"] == 0
    with pytest.raises(ValueError, match="load policy"):
        BreakEven("never", BLOCK_BYTES, B)


def test_step_clock_tells_exact_completions_from_bounds():
    clock = FakeClock()
    sc = StepClock(clock)
    sc.begin(step=3, scheduled_tokens=40, prefill_tokens=40)
    sc.loads_submitted(1000, clock.t)
    clock.t += 0.5
    sc.loads_seen_done(clock.t - 0.4, clock.t)  # the wait blocked 0.4 s: landed as it returned
    sc.in_hook(0.45)
    clock.t += 0.3
    sc.end_forward()
    sc.end_loads()
    obs = sc.take(pending_write_bytes=7)
    assert obs.step == 3 and obs.loads == [(1000, pytest.approx(0.5), True)]
    assert obs.prefills == [(40, pytest.approx(0.35))] and obs.pending_write_bytes == 7
    sc.begin(step=4, scheduled_tokens=1, prefill_tokens=0)  # a decode step: no prefill timing
    sc.loads_submitted(1000, clock.t)
    clock.t += 0.2
    sc.loads_seen_done(clock.t, clock.t)  # found done without waiting: a bound
    sc.end_forward()
    sc.end_loads()
    obs = sc.take(0)
    assert obs.loads == [(1000, pytest.approx(0.2), False)] and obs.prefills == []
    sc.begin(step=5, scheduled_tokens=8, prefill_tokens=8)
    sc.loads_submitted(1000, clock.t)
    sc.loads_seen_done(clock.t, clock.t + 1)
    sc.end_loads(failed=True)  # a failed load's time is not the drives'
    assert sc.take(0).loads == []


def test_gauges_are_kept_not_summed_when_stats_aggregate():
    a = TuttiConnectorStats(data={"match_declined_tokens": 32, "est_read_bytes_per_s": 1e9})
    b = TuttiConnectorStats(data={"match_declined_tokens": 16, "est_read_bytes_per_s": 2e9})
    a.aggregate(b)
    assert a.data["match_declined_tokens"] == 48 and a.data["est_read_bytes_per_s"] == 2e9
    a.aggregate(TuttiConnectorStats(data={"est_read_bytes_per_s": 0}))
    assert a.data["est_read_bytes_per_s"] == 2e9


def test_a_profiled_slack_table_is_the_starting_point(tmp_path, geometry):
    """A table from `tutti profile` (libtutti's own writer): its checksum is checked, and its
    windows give a recompute cost that grows with the tokens recomputed."""
    from test_vllm_scheduler import _slack_table

    path = _slack_table(tmp_path, geometry.layers)
    prior = SlackPrior(path, geometry.layers)
    costs = [prior.recompute_s(n, 0, 32) for n in (128, 512, 2048)]
    assert 0 < costs[0] < costs[1] < costs[2]
    r = BreakEven("breakeven", BLOCK_BYTES, B, prior=prior)
    feed(r, loads=[(BLOCK_BYTES, 1e-6, True)])
    assert r.decide(0, 8, 9 * B) == 8 and r.counters["match_learning"] == 0
    with pytest.raises(ValueError, match="layers"):
        SlackPrior(path, geometry.layers + 1)
    doc = json.loads(open(path).read())
    doc["table"]["prefill"]["window_ns"][0] += 1
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="checksum"):
        SlackPrior(str(bad), geometry.layers)


def test_config_keys(library, geometry):
    assert from_vllm(vllm_config(geometry, dict(EXTRA))).load_policy == "breakeven"
    assert from_vllm(vllm_config(geometry, dict(EXTRA, load_policy="always"))).load_policy == "always"
    with pytest.raises(ConfigError, match="load_policy"):
        from_vllm(vllm_config(geometry, dict(EXTRA, load_policy="sometimes")))


# ---- end to end in the connector ----------------------------------------------------------

def _run(geometry, extra: dict, compute_s_per_token: float):
    """a stores a 3-block prefix; b hits it (the rule is still learning: it loads); c hits it again."""
    e = MiniEngine(geometry, extra, feedback=True, compute_s_per_token=compute_s_per_token)
    try:
        Bt = e.B
        e.step(new=[Request("a", prompt(1, 3 * Bt + 1))])
        rb = e.step(new=[Request("b", prompt(1, 3 * Bt) + [5])])
        c = Request("c", prompt(1, 3 * Bt) + [6])
        rc = e.step(new=[c])
        assert_blocks_hold(e, c, range(3))  # loaded or recomputed, c's KV is right
        e.worker._collect_stats()
        e.scheduler._collect_stats()
        return rb, rc, dict(e.scheduler.reported.data), e.worker.runtime.stats().bytes_loaded
    finally:
        e.close()


def test_slow_drives_the_second_hit_is_recomputed(library, geometry):
    """Reads at 16 KiB/s a drive: the 12 KiB prefix takes ~0.4 s to load, 12 tokens ~12 ms to compute."""
    g = geometry
    extra = dict(EXTRA, emulated_read_bytes_per_sec=16 << 10)
    rb, rc, s, loaded = _run(g, extra, compute_s_per_token=1e-3)
    block = 2 * g.layers * g.object_bytes
    assert rb.matched == {"b": 3 * g.tokens_per_block} and rc.matched == {"c": 0}
    assert rc.meta.loads == [] and loaded == 3 * block  # only b's learning load
    assert s["match_learning"] == 1 and s["match_declined_requests"] == 1
    assert s["match_hit_tokens"] == 6 * g.tokens_per_block
    assert s["match_declined_tokens"] == s["match_reported_tokens"] == 3 * g.tokens_per_block
    assert 0 < s["est_read_bytes_per_s"] < 1 << 20 and s["est_prefill_s_per_token"] > 0
    assert s["hit_tokens"] == 3 * g.tokens_per_block  # what vLLM was given: b's only


def test_fast_drives_the_second_hit_is_loaded(library, geometry):
    """Unpaced drives: 12 KiB load in a few ms; 12 tokens take ~120 ms to compute."""
    g = geometry
    rb, rc, s, loaded = _run(g, dict(EXTRA), compute_s_per_token=10e-3)
    assert rb.matched == {"b": 3 * g.tokens_per_block} and rc.matched == {"c": 3 * g.tokens_per_block}
    assert loaded == 2 * 3 * 2 * g.layers * g.object_bytes
    assert s["match_learning"] == 1 and s["match_declined_tokens"] == 0
    assert s["match_reported_tokens"] == s["match_hit_tokens"] == 6 * g.tokens_per_block


def test_without_worker_timings_every_hit_is_reported(library, geometry):
    """A vLLM without the worker-metadata channel: nothing is learnt, every hit loads."""
    extra = dict(EXTRA, emulated_read_bytes_per_sec=16 << 10)
    e = MiniEngine(geometry, extra, compute_s_per_token=1e-3)
    try:
        Bt = e.B
        e.step(new=[Request("a", prompt(1, 3 * Bt + 1))])
        for name in ("b", "c"):
            r = e.step(new=[Request(name, prompt(1, 3 * Bt) + [len(name)])])
            assert r.matched == {name: 3 * Bt}
        assert e.scheduler._scheduler.rule.counters["match_learning"] == 2
    finally:
        e.close()


def test_emulated_pacing_keys_reach_the_runtime(library, geometry):
    cfg = from_vllm(vllm_config(geometry, dict(EXTRA, emulated_read_bytes_per_sec=5 << 20, emulated_latency_us=20)))
    kw = cfg.runtime_kwargs()
    assert kw["emulated_read_bytes_per_sec"] == 5 << 20 and kw["emulated_latency_us"] == 20
    assert "emulated_write_bytes_per_sec" not in kw
    assert cfg.pool_key() != from_vllm(vllm_config(geometry, dict(EXTRA))).pool_key()
    with pytest.raises(ConfigError, match="emulated_read_latency_us"):
        from_vllm(vllm_config(geometry, dict(EXTRA, emulated_read_latency_us=20_000_000)))
    with pytest.raises(ConfigError, match="emulated_drives"):
        from_vllm(vllm_config(geometry, {"daemon_socket": "/tmp/x.sock", "emulated_read_bytes_per_sec": 1}))
    with pytest.raises(ConfigError, match="1 MB/s"):
        from_vllm(vllm_config(geometry, dict(EXTRA, daemon="auto", emulated_dir="/tmp/x",
                                             emulated_read_bytes_per_sec=1000)))
    # Through tuttid the pacing becomes tutti serve's flags.
    from tutti._connector.shared import _serve_args

    auto = from_vllm(vllm_config(geometry, dict(EXTRA, daemon="auto", emulated_dir="/tmp/x",
                                                emulated_capacity_bytes=8 << 20,
                                                emulated_read_bytes_per_sec=2_000_000, emulated_read_latency_us=7)))
    args = _serve_args(auto, "tutti", "/tmp/x/tuttid.sock")
    assert args[args.index("--emu-read-gbps") + 1] == "0.002"
    assert args[args.index("--emu-read-latency-us") + 1] == "7"
