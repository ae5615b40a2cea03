"""In SGLang the request's identity is in the page keys SGLang forms itself: its controller names
pages with ``get_storage_hash_str`` over a ``RadixKey``, whose chain is seeded with the request's
``extra_key`` (LoRA and the like) and ``cache_salt`` (``storage_namespace_seed``). tutti maps each
key to one chunk hash, adding nothing and dropping nothing, so pages stored under one namespace
are never found under another. Checked with SGLang's own key functions and host pool."""

from __future__ import annotations

from array import array

import torch

import sglang_env as E
from sglang.srt.mem_cache.radix_cache import RadixKey
from sglang.srt.mem_cache.utils import get_storage_hash_str

PAGE = 4
N = 6


def _keys(tokens, **ns) -> list[str]:
    return get_storage_hash_str(RadixKey(array("l", tokens), **ns), None, page_size=PAGE)


def test_pages_are_found_only_under_their_own_salt_and_extra_key(library, pool_extra):
    dev = E.device_pool(dtype=torch.bfloat16)
    host = E.host_pool(dev, "page_first")
    b = E.make_backend(host, pool_extra)
    try:
        E.fill_random(host, 11)
        toks = E.tokens_for(N, PAGE)
        namespaces = [dict(cache_salt="tenant-x"), dict(cache_salt="tenant-y"), dict(extra_key="lora-a"),
                      dict(extra_key="lora-b"), dict()]
        keys = [_keys(toks, **ns) for ns in namespaces]
        assert len({k[0] for k in keys}) == len(namespaces)  # SGLang's keys differ from the first page
        src = host.alloc(N * PAGE)
        assert b.batch_set_v1(keys[0], src) == [True] * N  # stored under tenant-x only
        assert b.batch_exists(keys[0]) == N
        for other in keys[1:]:
            assert b.batch_exists(other) == 0
        dst = host.alloc(N * PAGE)
        assert b.batch_get_v1(keys[1], dst) == [False] * N  # a miss, never tenant-x's bytes
    finally:
        b.close()
