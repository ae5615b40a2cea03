"""Two tutti nodes sharing KV through the real Mooncake Store, in a private network namespace.

Each test runs one scenario of tests/mooncake_cluster_run.py under ``unshare -n`` with a
Python that has ``mooncake.store`` (``$TUTTI_MOONCAKE_PYTHON``, else the venv
scripts/setup-mooncake fills: ``${TUTTI_VLLM_VENV:-~/.cache/tutti/vllm-venv}``). The master,
its metadata server and both nodes run inside that namespace, on 127.0.0.1 only. Without
Mooncake or without the namespace (not root, no ``unshare``) the tests skip saying why, and
fail under ``CI=true``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
RUNNER = HERE / "mooncake_cluster_run.py"
SCENARIO_TIMEOUT_S = 300


def _unavailable(why: str):
    if os.environ.get("CI") == "true":
        pytest.fail(f"{why} (CI=true: the Mooncake cluster tests must run)")
    print(f"SKIP: {why}", file=sys.stderr)
    pytest.skip(why)


def _mooncake_python() -> str:
    explicit = os.environ.get("TUTTI_MOONCAKE_PYTHON")
    venv = Path(os.environ.get("TUTTI_VLLM_VENV", Path.home() / ".cache/tutti/vllm-venv"))
    py = explicit or str(venv / "bin" / "python")
    if not os.access(py, os.X_OK):
        _unavailable(f"no Python with Mooncake at {py} (run scripts/setup-mooncake, or set TUTTI_MOONCAKE_PYTHON)")
    probe = subprocess.run([py, "-c", "import mooncake.store"], capture_output=True, timeout=60)
    if probe.returncode != 0:
        _unavailable(f"{py} cannot import mooncake.store (run scripts/setup-mooncake): "
                     f"{probe.stderr.decode(errors='replace')[-300:]}")
    return py


def _namespace() -> list[str]:
    exe = shutil.which("unshare")
    if exe is None:
        _unavailable("no `unshare` (util-linux): cannot make a private network namespace")
    probe = subprocess.run([exe, "-n", "true"], capture_output=True, timeout=30)
    if probe.returncode != 0:
        _unavailable(f"cannot make a private network namespace (`unshare -n`, needs root): "
                     f"{probe.stderr.decode(errors='replace').strip()}")
    return [exe, "-n", "--"]


@pytest.fixture(scope="module")
def run_scenario(library, tmp_path_factory):
    py = _mooncake_python()
    ns = _namespace()
    env = dict(os.environ)
    lib_path = getattr(library, "path", None)
    if lib_path and os.path.isabs(str(lib_path)):
        env["TUTTI_LIB"] = str(lib_path)  # the nodes load the library this process loaded
    env.pop("MC_TCP_BIND_ADDRESS", None)  # the runner sets it, inside the namespace

    def run(name: str) -> dict:
        work = tmp_path_factory.mktemp(name)
        try:
            p = subprocess.run(ns + [py, str(RUNNER), name, str(work)], capture_output=True, timeout=SCENARIO_TIMEOUT_S,
                               env=env, cwd=str(HERE.parent))
        except subprocess.TimeoutExpired as e:
            pytest.fail(f"scenario {name} ran past {SCENARIO_TIMEOUT_S} s: {(e.stderr or b'').decode()[-3000:]}")
        out = p.stdout.decode(errors="replace")
        lines = [l for l in out.splitlines() if l.startswith("RESULT ")]
        assert p.returncode == 0 and lines, (
            f"scenario {name} failed ({p.returncode}):\n{out[-2000:]}\n{p.stderr.decode(errors='replace')[-4000:]}"
        )
        return json.loads(lines[-1][len("RESULT "):])

    return run


def test_node_b_loads_node_a_prefix_byte_exact_then_misses_after_a_closes(run_scenario):
    r = run_scenario("two_nodes")
    assert r["a_store"]["matched_blocks"] == 0 and r["a_stats"]["remote_published_blocks"] == 7
    b = r["b_load"]
    # All four blocks from Mooncake, none computed on B, every byte what A computed.
    assert b == {"matched_blocks": 4, "remote_blocks": 4, "load_errors": 0, "blocks_exact": [True] * 4}
    assert r["b_stats"]["remote_loaded_blocks"] == 4
    assert r["b_stats"]["remote_bytes_loaded"] == 4 * (4 * 2 * 512)  # blocks × (layers × K,V × 512-byte objects)
    # Kept in B's own pool: the next hit is local.
    assert r["b_again"]["matched_blocks"] == 4 and r["b_again"]["remote_blocks"] == 0
    # A's second prefix is found while A runs, and is a clean miss once A closed.
    assert r["b_lookup2_before"]["matched_blocks"] == 3
    assert r["b_lookup2_after"]["matched_blocks"] == 0
    after = r["b_step2_after"]
    assert after["load_errors"] == 0 and after["blocks_exact"] == [True] * 3


def test_a_corrupted_object_in_mooncake_is_a_miss(run_scenario):
    r = run_scenario("corrupt")
    assert r["corrupt_rc"] == 0
    b = r["b_load"]
    assert b["matched_blocks"] == 3 and b["remote_blocks"] == 3
    assert b["load_errors"] == 1  # block #1: reported to vLLM, recomputed, never used
    assert b["blocks_exact"] == [True, False, True]  # (the engine stand-in does not recompute it)
    assert r["b_stats"]["remote_verify_failures"] == 1 and r["b_stats"]["remote_loaded_blocks"] == 2


def test_master_killed_mid_run_is_a_miss_and_node_b_keeps_serving(run_scenario):
    r = run_scenario("master_killed")
    assert r["b_load"]["remote_blocks"] == 3 and r["b_load"]["blocks_exact"] == [True] * 3
    assert r["b_lookup2"]["matched_blocks"] == 0  # A published it, but the master is gone
    assert r["b_step2"] == {"matched_blocks": 0, "remote_blocks": 0, "load_errors": 0, "blocks_exact": [True] * 3}
    # The local tier keeps serving: both prefixes now hit in B's own pool.
    assert r["b_step2_again"]["matched_blocks"] == 3 and r["b_step2_again"]["remote_blocks"] == 0
    assert r["b_step1_again"]["matched_blocks"] == 3 and r["b_step1_again"]["remote_blocks"] == 0
    assert r["b_stats"]["remote_failures"] >= 1


def test_publication_backpressure_with_a_stalled_master(run_scenario):
    r = run_scenario("backpressure")
    assert r["stats_before"]["remote_published_blocks"] == 2
    # Every step completed, byte-exact, while the master was stopped.
    assert [s["blocks_exact"] for s in r["stopped"]] == [[True, True]] * 6
    st = r["stats_stopped"]
    # Queue of one: one publication stuck in the publisher, one queued, the rest (≥ 4 × 2 blocks) dropped.
    assert st["remote_publish_drops"] >= 8
    assert r["flushed"] is True
    after = r["stats_after"]
    assert after["remote_publish_drops"] == st["remote_publish_drops"]
    assert after["remote_published_blocks"] + after["remote_publish_drops"] == 2 + 6 * 2


def test_two_vllm_processes_share_a_prefix_through_mooncake(run_scenario):
    """Real vLLM (CPU build, the tiny random-weight Llama of scripts/setup-vllm) as two nodes."""
    venv = Path(os.environ.get("TUTTI_VLLM_VENV", Path.home() / ".cache/tutti/vllm-venv"))
    model = venv / "tutti-models" / "tiny-llama" / "config.json"
    py = os.environ.get("TUTTI_MOONCAKE_PYTHON") or str(venv / "bin" / "python")
    if not model.exists():
        _unavailable(f"no test model at {model.parent} (run scripts/setup-vllm)")
    if subprocess.run([py, "-c", "import vllm"], capture_output=True, timeout=300).returncode != 0:
        _unavailable(f"{py} has Mooncake but not vLLM (run scripts/setup-vllm, then scripts/setup-mooncake)")
    r = run_scenario("vllm_two_nodes")
    a, b = r["a_first"], r["b_first"]
    assert a["cached"] == 0 and r["a_stats"]["remote_published_blocks"] == 4  # 141 tokens: 4 whole blocks
    # Node B: the same prompt, its 4 whole blocks loaded from Mooncake (B never computed them) ...
    assert b["cached"] == 128
    assert r["b_stats"]["remote_loaded_blocks"] == 4 and r["b_stats"]["remote_verify_failures"] == 0
    # ... and identical greedy tokens and top-3 logprobs.
    assert b["tokens"] == a["tokens"] and b["logprobs"] == a["logprobs"]
    # A request sharing only the 3-block prefix: served from B's own pool now.
    assert r["b_second"]["cached"] == 96
    assert r["b_stats"]["remote_lookups"] == 2 and r["b_stats"]["remote_hit_blocks"] == 4
