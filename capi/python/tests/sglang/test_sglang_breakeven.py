"""The break-even rule in ``batch_exists`` (real SGLang host pool, in-process pool on emulated
drives): after a first, timed read, a run expected to load slower than SGLang recomputes it is
not reported. The recompute cost is given (``prefill_s_per_token``) a million times below or
far above any load's, so the decision does not hang on the machine's speed."""

from __future__ import annotations

import pytest

import sglang_env as E
from tutti.sglang import ConfigError, TuttiHiCacheStorage

PAGE = 4


def _stored(b, host, n: int, start: int):
    E.fill_random(host, start)
    src = host.alloc(n * PAGE)
    keys = E.hashes_for(E.tokens_for(n, PAGE, start=start), PAGE)
    assert b.batch_set_v1(keys, src) == [True] * n
    return keys


def _backend(host, pool_extra, **extra) -> TuttiHiCacheStorage:
    return E.make_backend(host, dict(pool_extra, **extra))


@pytest.mark.parametrize("s_per_token,reported", [(1e-12, 0), (0.5, 6)])
def test_a_run_is_reported_only_when_loading_beats_recomputing(library, pool_extra, s_per_token, reported):
    host = E.host_pool(E.device_pool(), "page_first")
    b = _backend(host, pool_extra, prefill_s_per_token=s_per_token)
    try:
        keys = _stored(b, host, 6, 100)
        assert b.batch_exists(keys) == 6  # no read timed yet: the rule learns from this one
        dst = host.alloc(6 * PAGE)
        assert b.batch_get_v1(keys, dst) == [True] * 6
        assert b.batch_exists(keys) == reported
        if reported:
            assert b.batch_get_v1(keys, dst) == [True] * 6
        st = b.stats()
        assert st["match_learning"] == 1 and st["match_hit_tokens"] == 12 * PAGE
        assert st["match_declined_tokens"] == (6 - reported) * PAGE
        assert st["match_reported_tokens"] == (6 + reported) * PAGE
        assert st["est_read_bytes_per_s"] > 0
        assert st["pins_held"] == 0  # a declined run is not left pinned
        host.free(dst)
    finally:
        b.close()


def test_without_a_recompute_estimate_or_with_always_every_hit_is_reported(library, pool_extra):
    for extra in ({}, {"load_policy": "always", "prefill_s_per_token": 1e-12}):
        host = E.host_pool(E.device_pool(), "page_first")
        b = _backend(host, pool_extra, **extra)
        try:
            keys = _stored(b, host, 4, 300)
            dst = host.alloc(4 * PAGE)
            for _ in range(2):
                assert b.batch_exists(keys) == 4
                assert b.batch_get_v1(keys, dst) == [True] * 4
            st = b.stats()
            assert st["match_declined_tokens"] == 0 and st["match_reported_tokens"] == 8 * PAGE
            assert st["match_learning"] == (2 if not extra else 0)
        finally:
            b.close()


def test_the_keys_are_checked(library, pool_extra, tmp_path):
    host = E.host_pool(E.device_pool(), "page_first")
    for bad, what in [({"load_policy": "never"}, "load_policy"), ({"prefill_s_per_token": -1}, "prefill_s_per_token"),
                      ({"prefill_s_per_token": "fast"}, "prefill_s_per_token"),
                      ({"slack_table": str(tmp_path / "none.json")}, "slack_table"),
                      ({"host_mode": "inline", "host_threads": 2}, "host_threads"),
                      ({"host_mode": "sqpoll"}, "host_mode")]:
        with pytest.raises(ConfigError, match=what):
            _backend(host, pool_extra, **bad)
    for mode in ("inline", "persistent", "launch"):
        b = _backend(host, pool_extra, host_mode=mode)
        try:
            keys = _stored(b, host, 2, 500 + len(mode))
            assert b.batch_exists(keys) == 2
            assert b.batch_get_v1(keys, host.alloc(2 * PAGE)) == [True] * 2
        finally:
            b.close()
