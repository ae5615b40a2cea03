"""The vLLM connector passes vLLM's compute timeline to libtutti's scheduler (ABI 1.6), and
every load and store it makes goes through it.

Checked from the scheduler's counters, never from durations: windows announced per layer and
per decode step, every layer of every job scheduled, no drive ever given reads and writes
together, and in the slack mode stores held outside the windows the table allows.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tutti._connector.config import ConfigError, from_vllm
from conftest import require_tutti_bin
from vllm_standins import EXTRA, MiniEngine, Request, prompt, vllm_config




def _slack_table(tmp_path: Path, layers: int) -> str:
    exe = require_tutti_bin()
    out = tmp_path / "slack.json"
    subprocess.run([str(exe), "profile", "--layers", str(layers), "--out", str(out)], check=True,
                   stdout=subprocess.DEVNULL)
    return str(out)


def test_every_step_is_announced_and_every_layer_scheduled(engine):
    g = engine.g
    a = Request("a", prompt(1, 3 * engine.B + 1))
    engine.step(new=[a])
    b = Request("b", prompt(1, 3 * engine.B) + [9, 9])
    r = engine.step(new=[b])
    assert r.meta.loads and r.load_errors == set()
    engine.step(cont={"b": 1})  # a decode step
    s = engine.worker.runtime.sched_stats()
    assert s["mode"] == "arbitrate" and s["policy_off"] == "mode" and not s["slack_active"]
    assert s["prefill_windows"] == 2 * g.layers
    assert s["decode_windows"] == 1
    # a's store and b's load, each one unit per layer, all through the scheduler.
    assert s["reads_issued"] == g.layers
    assert s["writes_issued"] >= g.layers
    assert s["mixed_issues"] == 0
    assert s["backlog_bytes"] == 0


def test_slack_mode_holds_stores_outside_windows_and_still_stores_them(library, geometry, tmp_path):
    table = _slack_table(tmp_path, geometry.layers)
    extra = dict(EXTRA, sched_mode="slack", sched_slack_table=table, sched_idle_ms=60_000)
    e = MiniEngine(geometry, extra)
    try:
        a = Request("a", prompt(2, 3 * e.B + 1))
        r = e.step(new=[a])
        s = e.worker.runtime.sched_stats()
        assert s["mode"] == "slack" and s["slack_active"] and s["policy_off"] is None
        # Each layer's store is submitted after its window closed: held for slack, then written
        # when the step blocks on it.
        assert s["write_waits_for_slack"] > 0
        assert s["writes_issued"] == geometry.layers and s["mixed_issues"] == 0
        (save,) = r.meta.saves
        assert e.worker.runtime.stats().files_valid == len(save.hashes)
        b = Request("b", prompt(2, 3 * e.B) + [1])
        r = e.step(new=[b])
        assert r.matched == {"b": 3 * e.B} and r.load_errors == set()
    finally:
        e.close()


@pytest.mark.parametrize(
    "extra, match",
    [
        ({"sched_mode": "fast"}, "sched_mode"),
        ({"sched_mode": "slack"}, "sched_slack_table"),
        ({"sched_backlog_full": "spill"}, "sched_backlog_full"),
        ({"sched_backlog_bytes": -1}, "sched_backlog_bytes"),
    ],
)
def test_scheduler_keys_are_checked(library, geometry, extra, match):
    with pytest.raises(ConfigError, match=match):
        from_vllm(vllm_config(geometry, dict(EXTRA, **extra)))


def test_binding_configures_the_scheduler_and_reports_why_slack_is_off(runtime, tmp_path):
    import tutti

    s = runtime.sched_stats()
    assert (s["mode"], s["slack_active"], s["policy_off"]) == ("arbitrate", False, "mode")
    with pytest.raises(ValueError, match="mode"):
        runtime.configure_scheduler(mode="fast")
    with pytest.raises(tutti.errors.InvalidArgument, match="slack_table"):
        runtime.configure_scheduler(mode="slack")
    table = _slack_table(tmp_path, runtime.geometry.layers)
    runtime.configure_scheduler(mode="slack_online", slack_table=table, backlog_bytes=1 << 20, backlog_full="drop")
    s = runtime.sched_stats()
    assert (s["mode"], s["slack_active"], s["policy_off"]) == ("slack_online", False, "no_timings")
    assert s["backlog_capacity"] == 1 << 20
    runtime.sched_layer_start(64, 0, 0)
    s = runtime.sched_stats()
    assert s["slack_active"] and s["policy_off"] is None and s["prefill_windows"] == 1
    runtime.sched_layer_end(0)
    runtime.sched_decode_start(64)
    runtime.sched_decode_end()
    assert runtime.sched_stats()["decode_windows"] == 1
