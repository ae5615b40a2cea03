"""First contact with the connector: what a new user sees when it works and when it does not.

- daemon "auto" and a pool it cannot open: a deterministic start-up failure (a pool of another
  geometry) comes back at once as the headline, quoted in whole lines, with the fix; tuttid is not
  started again. Only the failures a retry can cure (the media or the socket still held, as by a
  daemon of the same directory still exiting) are retried, until ``daemon_start_timeout_s``;
- a running tuttid whose pool has another geometry refuses the engine at once, with the fix;
- the connector says once, at start-up, where its pool is, its geometry and its data path, and
  logs each load's hit tokens, on the ``vllm.tutti`` logger (a child of vLLM's, whose handler
  prints it: the real-vLLM tests check it in vLLM's log).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import threading
from pathlib import Path

import pytest

import tutti
from conftest import require_tutti_bin, stop_tuttid
from test_daemon_client import _tutti_bin, daemon  # noqa: F401 - the fixture
from tutti._connector import shared
from tutti._connector.config import ConfigError
from tutti.vllm import KVConnectorRole, TuttiConnector
from vllm_standins import EXTRA, MiniEngine, Request, prompt, vllm_config


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)

    @property
    def messages(self) -> list[str]:
        return [r.getMessage() for r in self.records]


@pytest.fixture
def tutti_log():
    """Records of the connector's logger, caught on that logger itself (under vLLM its parent
    "vllm" does not propagate to the root, where pytest's caplog listens)."""
    lg = logging.getLogger("vllm.tutti")
    h, level = _Records(), lg.level
    lg.addHandler(h)
    lg.setLevel(logging.INFO)
    yield h
    lg.removeHandler(h)
    lg.setLevel(level)


@pytest.fixture
def tutti_bin(library, monkeypatch):
    exe = require_tutti_bin()
    monkeypatch.setenv("TUTTI_BIN", str(exe))
    return exe


G2 = tutti.Geometry(layers=4, kv_heads=2, head_dim=64, tokens_per_block=4, dtype="f16")
# The same model at TP=2: each rank holds half the KV heads.
G1 = tutti.Geometry(layers=4, kv_heads=1, head_dim=64, tokens_per_block=4, dtype="f16")


def _auto(d: Path, **kw) -> dict:
    return dict({"daemon": "auto", "emulated_drives": 2, "emulated_dir": str(d), "emulated_capacity_bytes": 8 << 20,
                 "daemon_idle_exit_s": 1, "daemon_start_timeout_s": 60}, **kw)


def _serve(exe: Path, d: Path, g: tutti.Geometry) -> subprocess.Popen:
    """tutti serve for the emulated pool in ``d``, as daemon "auto" starts it; returns once it serves."""
    args = [str(exe), "serve", "--json", "--socket", str(d / "tuttid.sock"), "--dir", str(d), "--emulated", "2",
            "--capacity-mib", "8", "--layers", str(g.layers), "--kv-heads", str(g.kv_heads), "--head-dim",
            str(g.head_dim), "--block-tokens", str(g.tokens_per_block), "--dtype", g.dtype]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
    hello = json.loads(proc.stdout.readline())
    assert hello["pid"] == proc.pid
    return proc


_stop = stop_tuttid


def _tp2_scheduler(d: Path, g: tutti.Geometry, **kw) -> TuttiConnector:
    cfg = vllm_config(g, _auto(d, **kw), tp=2)
    cfg.parallel_config.distributed_executor_backend = "mp"
    return TuttiConnector(cfg, KVConnectorRole.SCHEDULER)


def _quoted(msg: str) -> list[str]:
    return [l[len("    | "):] for l in msg.splitlines() if l.startswith("    | ")]


def test_a_pool_of_another_geometry_is_the_headline_and_tuttid_is_not_restarted(tutti_bin, tmp_path, tutti_log):
    """A pool made at TP=1 (2 KV heads per rank) opened by a TP=2 engine (1 per rank): the daemon
    exits at once with the geometry error, and that error, whole, is what the engine reports."""
    d = tmp_path / "pool"
    d.mkdir()
    _stop(_serve(tutti_bin, d, G2))
    before = (d / "tuttid.log").read_text() if (d / "tuttid.log").exists() else ""
    with pytest.raises(ConfigError) as e:
        _tp2_scheduler(d, G1)
    msg = str(e.value)
    assert msg.startswith(f"TuttiConnector: tuttid for the pool in {d} exited before serving (the same start-up "
                          "would fail again, so it was not restarted)"), msg
    # The daemon's error, quoted whole: both geometries, to the end of the line.
    err = [l for l in _quoted(msg) if "formatted for" in l]
    assert len(err) == 1, msg
    assert err[0].startswith("tutti: error: pool ") and (
        "formatted for 4 layers × 2 KV heads × head dim 64 × 4 tokens/block, f16, "
        "opened for 4 layers × 1 KV heads × head dim 64 × 4 tokens/block, f16") in err[0], err
    assert err[0].endswith("losing its contents)"), err  # to the end of the daemon's line
    # The fix: another directory, or formatting this one; TP changes the KV heads per rank.
    for part in ("'emulated_dir' another directory", '"open_mode": "create"', "tensor_parallel_size=2",
                 "each rank holds 1 KV heads", "TP changes the KV heads per rank"):
        assert part in msg, (part, msg)
    # Started once, not again and again until the deadline.
    assert sum("starting tuttid" in m for m in tutti_log.messages) == 1, tutti_log.messages
    added = (d / "tuttid.log").read_text()[len(before):]
    assert added.count("formatted for") == 1, added
    # The fix works: open_mode "create" formats the pool for this engine.
    c = _tp2_scheduler(d, G1, open_mode="create")
    try:
        assert c.runtime.info().geometry == G1
    finally:
        c.shutdown()


def test_a_running_tuttid_of_another_geometry_refuses_the_engine_at_once(tutti_bin, tmp_path, tutti_log):
    d = tmp_path / "pool"
    d.mkdir()
    proc = _serve(tutti_bin, d, G2)
    try:
        with pytest.raises(ConfigError) as e:
            _tp2_scheduler(d, G1)
    finally:
        _stop(proc)
    msg = str(e.value)
    assert msg.startswith(f"TuttiConnector: the tuttid serving {d / 'tuttid.sock'} refused this engine, and would "
                          "refuse it on every try"), msg
    # The daemon's refusal, quoted whole: both geometries and the `tutti serve` flags that match.
    assert any("the daemon's pool is formatted for 4 layers × 2 KV heads × head dim 64 × 4 tokens/block, f16 "
               "(`tutti serve --layers 4 --kv-heads 2 --head-dim 64 --block-tokens 4 --dtype f16`), this process "
               "has 4 layers × 1 KV heads × head dim 64 × 4 tokens/block, f16" in l
               and "`tutti serve --layers 4 --kv-heads 1 --head-dim 64 --block-tokens 4 --dtype f16`" in l
               and l.endswith("(under tensor parallelism the KV heads are per rank)")
               for l in _quoted(msg)), msg
    assert '"open_mode": "create"' in msg and "tensor_parallel_size=2" in msg
    assert not any("starting tuttid" in m for m in tutti_log.messages), "no daemon is started beside a running one"


def _hold_media(d: Path) -> tutti.Runtime:
    """An in-process runtime on the emulated media of ``d``: it holds their owner lock, as a daemon
    of that directory that is still exiting does."""
    return tutti.Runtime(G2, emulated_drives=2, emulated_capacity_bytes=8 << 20, emulated_dir=str(d))


def test_media_still_held_are_waited_for_until_the_deadline(tutti_bin, tmp_path, tutti_log):
    """The one start-up failure a retry can cure: the daemon is started again while the media are
    held, and the engine connects once they are free."""
    d = tmp_path / "pool"
    held = _hold_media(d)
    t = threading.Timer(1.5, held.close)
    t.start()
    try:
        c = _tp2_scheduler(d, G2)
    finally:
        t.join()
    try:
        assert c.runtime.info().geometry == G2
        assert sum("starting tuttid" in m for m in tutti_log.messages) >= 2, tutti_log.messages
        assert "already in use" in (d / "tuttid.log").read_text()
    finally:
        c.shutdown()


def test_media_held_past_the_deadline_name_their_holder_in_whole_lines(tutti_bin, tmp_path):
    d = tmp_path / "pool"
    held = _hold_media(d)
    try:
        with pytest.raises(ConfigError) as e:
            _tp2_scheduler(d, G2, daemon_start_timeout_s=5)
    finally:
        held.close()
    msg = str(e.value)
    assert msg.startswith(f"TuttiConnector: no tuttid answered on {d / 'tuttid.sock'} within 5 s"), msg
    lines = _quoted(msg)
    assert lines and all(l.startswith(("tutti", "{")) for l in lines), lines  # whole lines, none cut mid-word
    assert any("already in use" in l and f"pid {os.getpid()}" in l for l in lines), lines


def test_log_lines_are_whole_lines_from_the_given_offset(tmp_path):
    log = tmp_path / "tuttid.log"
    old = "an earlier daemon's line\n"
    big = "x" * 100 + "\n"
    log.write_text(old + big * 1000 + "tutti: error: the last line\n\nfinal words\n")
    start = len(old)
    lines = shared.log_lines(log, start, limit=3)
    assert lines == [big.strip(), "tutti: error: the last line", "final words"]
    # Past the 64 KiB read window, the first (partial) line is dropped, never shown cut.
    many = shared.log_lines(log, start, limit=100_000)
    assert all(l == big.strip() for l in many[:-2]) and len(many) < 1000
    assert shared.log_lines(log, log.stat().st_size) == []
    assert shared.log_lines(tmp_path / "none.log") == []
    long = tmp_path / "long.log"
    long.write_text("y" * 5000 + "\n")
    (cut,) = shared.log_lines(long)
    assert cut.endswith(" [line cut]") and len(cut) < 2100


def test_the_connector_says_where_its_pool_is_and_each_loads_hits(library, geometry, tutti_log):
    engine = MiniEngine(geometry, dict(EXTRA))
    try:
        B = engine.B
        engine.step(new=[Request("a", prompt(7, 3 * B + 1))])
        r = engine.step(new=[Request("b", prompt(7, 3 * B + 1))])
        assert r.matched == {"b": 3 * B}
        pool = engine.worker.runtime.info()
    finally:
        engine.close()
    name = f"{int.from_bytes(pool.pool_id, 'little') >> 64:016x}"
    where = f"pool in this process: 2 emulated drives of 8 MiB (RAM), pool {name} (2 drives, {pool.files} files)"
    geo = "geometry 4 layers × 2 KV heads × head dim 32 × 4 tokens/block, f16"
    msgs = tutti_log.messages
    assert msgs.count(f"tutti: worker tp0/pp0: {where}; {geo}; direct data path") == 1, msgs
    assert msgs.count(f"tutti: scheduler side: {where}; {geo}; looks up and plans loads (moves no bytes)") == 1, msgs
    hits = [m for m in msgs if "hit in the pool" in m]
    assert hits == [f"tutti: request b: {3 * B} tokens (3 blocks) hit in the pool, loading them"], msgs
    assert all(r.levelno == logging.INFO for r in tutti_log.records if "hit in the pool" in r.getMessage())


def test_through_tuttid_the_start_up_line_names_the_daemon_and_its_pool(daemon, geometry, tutti_log):  # noqa: F811
    c = TuttiConnector(vllm_config(geometry, {"daemon_socket": daemon}), KVConnectorRole.SCHEDULER)
    try:
        st = json.loads(subprocess.run([str(_tutti_bin()), "status", "--json", "--socket", daemon],
                                       capture_output=True, text=True, timeout=60, check=True).stdout)
    finally:
        c.shutdown()
    (line,) = [m for m in tutti_log.messages if m.startswith("tutti: scheduler side:")]
    assert line.startswith(f"tutti: scheduler side: pool in tuttid at {daemon}, pool {st['pool']} (2 drives, "), line


def test_a_run_of_identical_lines_is_quoted_once_with_its_count():
    text = shared._quote(["tutti: error: held", "tutti: error: held", "tutti: error: held", "other", "tutti: error: held"])
    assert text.splitlines() == ["    | tutti: error: held   [3 times]", "    | other", "    | tutti: error: held"]
    assert shared._quote([]) == "    | (nothing)"
