"""TuttiConnector under vLLM's own scheduler: only the request's own KV is ever served.

vLLM 0.32's real ``Scheduler``, ``KVCacheManager``, ``Request`` and ``SchedulerOutput`` drive
both halves of the connector (tests/vllm_real_sched.py); the worker side runs on real CPU
tensors, and before every step every block vLLM counts as computed is checked against the bytes
that request's own computation gives. Between a store and the request that should (or should
not) hit it, vLLM's own prefix cache is reset, so what such a request is given came from tutti.

Each defect these guard against fails a test here when reintroduced: keys of token ids alone
(salts, LoRA adapters, multimodal items ignored), and a resumed request's new block table
appended to its old one (``resumed_req_ids`` ignored) — tested by preempting mid-prefill under
real block pressure.

Runs with the vLLM venv's Python (scripts/test-python); without vLLM it skips, and fails under
CI=true.
"""

from __future__ import annotations

import os
import sys

import pytest

try:
    import vllm  # noqa: F401
except ImportError:
    why = "vLLM is not importable here (scripts/test-python runs this with the vLLM venv's Python)"
    if os.environ.get("CI") == "true":
        raise
    print(f"SKIP: {why}", file=sys.stderr)
    pytest.skip(why, allow_module_level=True)

import tutti  # noqa: E402
from vllm_real_sched import Engine, engine  # noqa: E402

POOL = {"emulated_drives": 2, "emulated_capacity_bytes": 16 << 20, "open_mode": "create", "load_policy": "always"}
B = 16


def toks(seed: int, n: int) -> list[int]:
    return [(seed * 131 + i * 17) % 500 + 1 for i in range(n)]


def serve(e: Engine, req_id: str, tokens: list[int], reset: bool = True, **kw) -> int:
    """Runs one request to its end on a cold vLLM prefix cache; returns the tokens tutti supplied."""
    if reset:
        assert e.sched.reset_prefix_cache()
    before = e.stats().get("hit_tokens", 0)
    e.add(req_id, tokens, **kw)
    e.run()
    assert not e.wrong, "wrong KV: " + "; ".join(map(str, e.wrong))
    return e.stats()["hit_tokens"] - before


@pytest.fixture
def eng(library):
    with engine(POOL, block_size=B) as e:
        yield e


@pytest.mark.parametrize("async_sched", [False, True], ids=["sync", "async"])
def test_a_plain_prompt_hits_its_stored_blocks_with_its_own_bytes(library, async_sched):
    with engine(POOL, block_size=B, async_sched=async_sched) as e:
        p = toks(1, 5 * B + 3)
        assert serve(e, "a", p) == 0
        assert serve(e, "b", p) == 5 * B  # every full block of the prompt, from the pool
        assert e.checked_blocks >= 5
        # Chunked prefill across steps: a longer prompt in 64-token chunks extends the prefix.
        longer = p + toks(2, 6 * B)
        assert serve(e, "c", longer) == 5 * B
        assert serve(e, "d", longer) == 11 * B
        e.assert_empty()


def test_cache_salt_same_salt_hits_other_salt_and_no_salt_miss(eng):
    p = toks(2, 4 * B + 1)
    assert serve(eng, "x1", p, cache_salt="salt-x") == 0
    assert serve(eng, "y", p, cache_salt="salt-y") == 0
    assert serve(eng, "none", p) == 0
    assert serve(eng, "x2", p, cache_salt="salt-x") == 4 * B
    # Stored without a salt: a salted request does not see it either; an unsalted one does.
    q = toks(3, 3 * B + 1)
    assert serve(eng, "plain", q) == 0
    assert serve(eng, "salted", q, cache_salt="salt-x") == 0
    assert serve(eng, "plain2", q) == 3 * B
    eng.assert_empty()


def test_lora_adapters_never_share_kv_for_the_same_tokens(library):
    with engine(POOL, block_size=B, lora=True) as e:
        p = toks(4, 4 * B + 1)
        assert serve(e, "l1", p, lora=("adapter-1", 1, "/adapters/one")) == 0
        assert serve(e, "l2", p, lora=("adapter-2", 2, "/adapters/two")) == 0
        assert serve(e, "base", p) == 0
        # The same name pointed at another path is another adapter (vLLM keys on both) ...
        assert serve(e, "l1-moved", p, lora=("adapter-1", 3, "/adapters/one-v2")) == 0
        # ... and the int id is per process: the same name and path under another id hits.
        assert serve(e, "l1-again", p, lora=("adapter-1", 7, "/adapters/one")) == 4 * B
        e.assert_empty()


def test_multimodal_placeholders_of_different_items_do_not_share_kv(library):
    with engine(POOL, block_size=B, encoder_budget=1024) as eng:
        _multimodal(eng)


def _multimodal(eng):
    # Blocks 1-2 are an image's placeholder tokens: the same ids whatever the image.
    p = toks(5, B) + [3] * (2 * B) + toks(6, B + 1)
    img = (B, 2 * B)
    assert serve(eng, "cat", p, mm=[("img-cat", *img)]) == 0
    assert serve(eng, "dog", p, mm=[("img-dog", *img)]) == 1 * B  # the text block before the image only
    assert serve(eng, "cat2", p, mm=[("img-cat", *img)]) == 4 * B
    # The same image one token later is other KV from its block on.
    assert serve(eng, "cat-shifted", p, mm=[("img-cat", B + 1, 2 * B)]) == 1 * B
    eng.assert_empty()


def _preempting(e: Engine) -> list[tuple[str, int, int]]:
    """Records (request, computed tokens, prompt tokens) of every preemption vLLM makes."""
    seen: list[tuple[str, int, int]] = []
    real = e.sched._preempt_request

    def preempt(request, *a, **kw):
        seen.append((request.request_id, request.num_computed_tokens, request.num_prompt_tokens))
        return real(request, *a, **kw)

    e.sched._preempt_request = preempt
    return seen


@pytest.mark.parametrize("async_sched", [False, True], ids=["sync", "async"])
def test_a_request_preempted_mid_prefill_stores_its_own_blocks(library, async_sched):
    """11 usable blocks, 32-token chunks: PA (3 blocks) decodes 60 tokens while PB (9 blocks) is
    prefilled beside it; when PB needs a block the cache has not got, vLLM preempts PB itself in
    the middle of its prefill, and resumes it with a new block table once PA is done (vLLM's
    own prefix cache is off, so the table is not its old one), loading what it stored and
    storing the rest. What it stores after resuming must be its own KV: a
    later request sharing PB's prompt loads all of it and checks every byte. With vLLM's async
    scheduling too (the next step planned before the last one's output is seen)."""
    with engine(POOL, block_size=B, num_blocks=12, max_batched=32, max_seqs=2, async_sched=async_sched,
                reserve_full_prompt=False, prefix_cache=False) as e:
        seen = _preempting(e)
        pa, pb = toks(7, 2 * B + 1), toks(8, 8 * B + 1)
        e.add("pa", pa, max_tokens=60)
        e.add("pb", pb, max_tokens=3)
        e.run()
        assert not e.wrong, "; ".join(map(str, e.wrong))
        mid = [s for s in seen if s[0] == "pb" and 0 < s[1] < s[2]]
        assert mid, f"vLLM did not preempt PB in the middle of its prefill: {seen}"
        assert mid[0][1] < 8 * B, "PB had every full block computed when preempted: nothing stored after resuming"
        assert serve(e, "later", pb) == 8 * B  # loaded from tutti, every byte checked in serve()
        e.assert_empty()


def test_the_claim_never_exceeds_what_was_stored(eng):
    p = toks(9, 3 * B)  # a prompt of whole blocks: the last token is always computed
    assert serve(eng, "a", p) == 0
    assert serve(eng, "b", p) == 2 * B
    longer = p + toks(10, 2 * B + 5)
    assert serve(eng, "c", longer) == 3 * B  # all "a" stored: its prompt's three blocks, no more
    assert serve(eng, "d", longer) == 5 * B
    eng.assert_empty()


@pytest.fixture(params=[False, True], ids=["eager", "deferred"])
def eng_saves(request, library):
    with engine(dict(POOL, deferred_saves=request.param), block_size=B) as e:
        yield e


def test_aborted_requests_leave_no_pins_and_no_blocks(eng_saves):
    """Aborted after a load while decoding, and in the middle of a prefill whose saves (deferred:
    still in flight when the abort arrives) were planned: vLLM frees every block once tutti lets
    go of them, and tutti holds no pin, store or job."""
    eng = eng_saves
    p = toks(11, 6 * B + 1)
    assert serve(eng, "a", p) == 0
    assert eng.sched.reset_prefix_cache()
    eng.add("b", p, max_tokens=50)
    eng.step()  # b's load of 6 blocks and its first computed token
    assert eng.connector._s().requests["b"].pin
    eng.abort("b")  # aborted while decoding
    eng.add("c", toks(12, 8 * B), max_tokens=1)
    eng.step()  # c's first chunk: stored
    eng.abort("c")  # aborted mid-prefill
    eng.run()
    assert not eng.wrong
    eng.assert_empty()
    rt = eng.worker.runtime
    st = rt.stats()
    assert st.files_pinned == 0 and st.stores_open == 0 and st.jobs_in_flight == 0, st
    assert rt.lookup(tutti.chain_hashes(p, B)[:6], pin=False).hits == 6  # b's load left the pool whole


def test_a_load_that_fails_part_way_restarts_from_the_first_bad_block(eng):
    lib = tutti._lib.lib()
    assert lib.has("tutti_emulated_fail_next"), "libtutti built without the fault-injection feature"
    p = toks(13, 5 * B + 1)
    assert serve(eng, "a", p) == 0
    eng.worker.runtime.emulated_fail_next(0, "load", 1)  # one object read fails
    got = serve(eng, "b", p)
    assert got == 5 * B  # reported, then vLLM recomputed from the first bad block on
    s = eng.stats()
    assert s["failed_blocks"] >= 1
    # serve() checked every block vLLM counted as computed: recomputed ones are right too.
    eng.assert_empty()


def test_keys_mix_what_vllm_mixes_into_its_own_block_hashes():
    """tutti's per-block facts equal vLLM's own ``generate_block_hash_extra_keys`` on vLLM's
    requests: a vLLM release that keys blocks on more fails here."""
    import torch
    from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange
    from vllm import SamplingParams
    from vllm.lora.request import LoRARequest
    from vllm.v1.core.kv_cache_utils import generate_block_hash_extra_keys
    from vllm.v1.request import Request

    from tutti._connector.keys import block_extra_keys

    def mm(ident, off, n):
        return MultiModalFeatureSpec(data=None, modality="image", identifier=ident,
                                     mm_position=PlaceholderRange(offset=off, length=n))

    params = SamplingParams(max_tokens=1)
    cases = [
        dict(prompt_token_ids=toks(1, 70)),
        dict(prompt_token_ids=toks(1, 70), cache_salt="s"),
        dict(prompt_token_ids=toks(1, 70), lora_request=LoRARequest("a", 1, "/p")),
        dict(prompt_token_ids=toks(1, 70), mm_features=[mm("i1", 3, 20), mm("i2", 23, 2), mm("i3", 40, 25)],
             cache_salt="t", lora_request=LoRARequest("b", 2, "/q")),
        dict(prompt_token_ids=None, prompt_embeds=torch.arange(70 * 8, dtype=torch.float32).reshape(70, 8)),
    ]
    for i, kw in enumerate(cases):
        req = Request(request_id=f"r{i}", sampling_params=params, pooling_params=None, **kw)
        ours_idx = theirs_idx = 0
        for b in range(70 // B):
            theirs, theirs_idx = generate_block_hash_extra_keys(req, b * B, (b + 1) * B, theirs_idx)
            ours, ours_idx = block_extra_keys(req, b * B, (b + 1) * B, ours_idx)
            assert ours == theirs, (i, b, ours, theirs)


def test_keys_are_deterministic_and_differ_by_identity():
    from types import SimpleNamespace

    from tutti._connector.keys import Unkeyable, request_hashes

    def req(**kw):
        base = dict(request_id="r", cache_salt=None, lora_request=None, mm_features=[], prompt_embeds=None)
        base.update(kw)
        return SimpleNamespace(**base)

    p = toks(3, 4 * B)
    plain = request_hashes(req(), p, B)
    assert plain == tutti.chain_hashes(p, B)  # plain requests keep the keys pools already hold
    salted = request_hashes(req(cache_salt="x"), p, B)
    assert salted == request_hashes(req(cache_salt="x"), p, B)
    assert not set(salted) & set(plain) and salted != request_hashes(req(cache_salt="y"), p, B)
    feat = SimpleNamespace(identifier="img", mm_position=SimpleNamespace(offset=2 * B, length=B))
    with_mm = request_hashes(req(mm_features=[feat]), p, B)
    assert with_mm[:2] == plain[:2] and not set(with_mm[2:]) & set(plain)
    bad = SimpleNamespace(identifier=object(), mm_position=SimpleNamespace(offset=0, length=1))
    with pytest.raises(Unkeyable):
        request_hashes(req(mm_features=[bad]), p, B)


def test_the_connector_refuses_a_vllm_without_a_field_it_reads(monkeypatch):
    from tutti._connector import keys

    monkeypatch.setattr(keys, "READS", keys.READS + (
        ("vllm.v1.core.sched.output", "CachedRequestData", ("resumed_from_preemption",)),))
    assert keys.missing_vllm_fields() == ["vllm.v1.core.sched.output.CachedRequestData.resumed_from_preemption"]
    monkeypatch.setattr(keys, "READS", keys.READS[:-1])
    assert keys.missing_vllm_fields() == []


def test_the_stand_ins_name_only_fields_vllm_has():
    """vllm_standins.py's objects are vLLM 0.32's shapes: a field there that vLLM lacks (as
    ``resumed_from_preemption`` once was) fails here, not in production."""
    import dataclasses

    import vllm_standins as st
    from vllm import SamplingParams
    from vllm.v1.core.sched import output
    from vllm.v1.request import Request

    for name in ("SchedulerOutput", "NewRequestData", "CachedRequestData"):
        ours = {f.name for f in dataclasses.fields(getattr(st, name))}
        theirs = {f.name for f in dataclasses.fields(getattr(output, name))}
        assert ours <= theirs, f"{name}: {sorted(ours - theirs)} not in vLLM's"
    real = Request(request_id="r", prompt_token_ids=[1, 2], sampling_params=SamplingParams(max_tokens=1),
                   pooling_params=None)
    fake = st.Request("r", [1, 2])
    for f in [f.name for f in dataclasses.fields(fake)] + ["all_token_ids", "num_tokens"]:
        assert hasattr(real, f), f"vLLM's Request has no {f}"


def test_salts_with_a_daemon_every_rank_asked_under_the_request_keys(library, tmp_path):
    """Through tuttid (the scheduler side a control-only client asking under the workers'
    identities, handed over by vLLM's handshake): salts isolate the same way."""
    from conftest import require_tutti_bin

    require_tutti_bin()  # the connector starts `tutti serve` ($TUTTI_BIN)
    extra = dict(POOL, daemon="auto", emulated_dir=str(tmp_path / "pool"), daemon_idle_exit_s=5)
    extra.pop("open_mode")
    with engine(extra, block_size=B) as e:
        e.connector.set_xfer_handshake_metadata({0: e.worker.get_handshake_metadata()})
        p = toks(21, 4 * B + 1)
        assert serve(e, "x1", p, cache_salt="x") == 0
        assert serve(e, "y", p, cache_salt="y") == 0
        assert serve(e, "x2", p, cache_salt="x") == 4 * B
        e.assert_empty()
