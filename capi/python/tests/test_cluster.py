"""The cluster tier (tutti.cluster) inside the vLLM connector, against an in-process Mooncake stand-in.

Two MiniEngines with their own pools (emulated drives) are two nodes; they share KV only
through the fake Mooncake cluster (tests/mooncake_fake.py). The same scenarios against the
real Mooncake, in a private network namespace, are in tests/test_cluster_mooncake.py.
"""

from __future__ import annotations

import time

import pytest

from tutti import cluster
from tutti._connector.config import ConfigError, from_vllm
from mooncake_fake import FakeCluster, FakeStore
from vllm_standins import EXTRA, MiniEngine, Request, assert_blocks_hold, prompt, vllm_config

MC = {"master": "127.0.0.1:50051", "metadata_server": "http://127.0.0.1:8080/metadata", "timeout_ms": 500,
      "retry_ms": 1}


@pytest.fixture
def fake():
    fc = FakeCluster()
    cluster.set_store_factory(lambda: FakeStore(fc))
    yield fc
    for ev in fc.hang.values():
        ev.set()
    cluster.set_store_factory(None)


def node(geometry, name: str, mc: dict | None = None, **extra) -> MiniEngine:
    """One node: its own pool (the capacity differs per node, so the pools differ) and the tier."""
    capacity = {"a": 8 << 20, "b": 9 << 20, "c": 10 << 20}[name]
    cfg = dict(EXTRA, emulated_capacity_bytes=capacity, mooncake=dict(MC, **(mc or {})), **extra)
    return MiniEngine(geometry, cfg)


@pytest.fixture
def nodes(library, geometry, fake):
    made = []

    def make(name, mc=None, **extra):
        e = node(geometry, name, mc, **extra)
        made.append(e)
        return e

    yield make
    for e in made:
        e.close()


def _until(cond, what="condition"):
    for _ in range(1000):  # bounded: 10 s
        if cond():
            return
        time.sleep(0.01)
    raise AssertionError(f"{what} never held")


def publish_prefix(a: MiniEngine, seed: int, blocks: int, found: int = 0) -> Request:
    """Node A computes a prompt of ``blocks`` full blocks and a partial one (``found`` blocks of it
    come from Mooncake); the blocks it computes reach Mooncake."""
    req = Request(f"a{seed}", prompt(seed, blocks * a.B + 2))
    r = a.step(new=[req])
    assert r.matched == {req.request_id: found * a.B}
    assert a.worker.tier.flush(10)
    return req


def test_a_prefix_stored_on_node_a_is_loaded_by_node_b_byte_exact(nodes, fake):
    a, b = nodes("a"), nodes("b")
    publish_prefix(a, 1, 3)
    assert a.worker.tier.snapshot()["remote_published_blocks"] == 3
    assert len([k for k in fake.objects if k.endswith("/m")]) == 3

    req = Request("b", prompt(1, 3 * b.B) + [9, 9, 9])
    r = b.step(new=[req])
    assert r.matched == {"b": 3 * b.B}  # nothing local: all three blocks from Mooncake
    (load,) = r.meta.loads
    assert load.hashes == [] and len(load.remote_hashes) == 3
    assert r.load_errors == set()
    # Never computed on B, yet they hold exactly A's KV.
    assert not any((blk, l) in b.computed_writes for blk in load.remote_block_ids for l in range(b.g.layers))
    assert_blocks_hold(b, req, range(3))
    g = b.g
    stats = b.worker.get_kv_connector_stats().data
    assert stats["remote_loaded_blocks"] == 3
    assert stats["remote_bytes_loaded"] == 3 * g.layers * 2 * g.object_bytes
    assert stats["remote_verify_failures"] == 0
    sched = b.scheduler.get_kv_connector_stats().data
    assert sched["remote_lookups"] == 1 and sched["remote_hit_blocks"] == 3

    # store_local: B keeps them in its own pool, so the next request with that prefix hits locally.
    lookups = fake.calls.get("batch_is_exist", 0)
    r = b.step(new=[Request("b2", prompt(1, 3 * b.B) + [8])])
    assert r.matched == {"b2": 3 * b.B}
    (load,) = r.meta.loads
    assert len(load.hashes) == 3 and load.remote_hashes == []
    assert fake.calls.get("batch_is_exist", 0) == lookups  # all local: Mooncake not asked


def test_local_hit_is_extended_by_the_remote_rest_of_the_prefix(nodes, fake):
    a, b = nodes("a"), nodes("b")
    # B holds the first 2 blocks locally (and published them); A loads those and publishes 2 more.
    b.step(new=[Request("b0", prompt(2, 2 * b.B + 1))])
    assert b.worker.tier.flush(10)
    publish_prefix(a, 2, 4, found=2)
    req = Request("b", prompt(2, 4 * b.B) + [7])
    r = b.step(new=[req])
    assert r.matched == {"b": 4 * b.B}
    (load,) = r.meta.loads
    assert len(load.hashes) == 2 and len(load.remote_hashes) == 2
    assert load.block_ids + load.remote_block_ids == b.blocks["b"][:4]
    assert r.load_errors == set()
    assert_blocks_hold(b, req, range(4))


def test_cache_identity_separates_deployments(nodes, fake):
    a = nodes("a")
    publish_prefix(a, 3, 2)
    other_tenant = nodes("b", tenant_salt="tenant-2")
    r = other_tenant.step(new=[Request("b", prompt(3, 2 * a.B + 1))])
    assert r.matched == {"b": 0}
    other_model = nodes("c", model="another/model")
    r = other_model.step(new=[Request("c", prompt(3, 2 * a.B + 1))])
    assert r.matched == {"c": 0}


def _data_keys(fake):
    return sorted(k for k in fake.objects if not k.endswith("/m"))


@pytest.mark.parametrize("how", ["flip", "truncate", "manifest"])
def test_a_corrupted_remote_object_is_a_miss(nodes, fake, how):
    a, b = nodes("a"), nodes("b")
    publish_prefix(a, 4, 3)
    # Which object is block #1 of the prefix: the key carries the chain hash.
    from tutti.runtime import chain_hashes

    h1 = chain_hashes(prompt(4, 3 * a.B), a.B)[1].hex()
    (key,) = [k for k in _data_keys(fake) if k.endswith(h1)]
    data = fake.objects[key]
    if how == "flip":
        fake.objects[key] = data[:100] + bytes([data[100] ^ 1]) + data[101:]
    elif how == "truncate":
        fake.objects[key] = data[:-512]
    else:  # a manifest naming another length
        m = fake.objects[key + "/m"]
        fake.objects[key + "/m"] = m[:-40] + (len(data) + 1).to_bytes(8, "little") + m[-32:]
    req = Request("b", prompt(4, 3 * b.B) + [1])
    r = b.step(new=[req])
    assert r.matched == {"b": 3 * b.B}
    (load,) = r.meta.loads
    bad = load.remote_block_ids[1]
    assert r.load_errors == {bad}  # handed to vLLM, which recomputes it
    stats = b.worker.get_kv_connector_stats().data
    assert stats["remote_verify_failures"] == 1 and stats["remote_loaded_blocks"] == 2
    # The two good blocks are A's KV; the bad one was not kept in B's pool.
    for index in (0, 2):
        blk = b.blocks["b"][index]
        for layer in range(b.g.layers):
            assert b.block_kv(blk, layer) == b.expected(req.all_token_ids, index, layer)
    st = b.worker.runtime.stats()
    assert st.files_valid == 2 + 0  # blocks 0 and 2 kept locally; b's own prompt has nothing new


def test_mooncake_down_is_a_miss_and_the_engine_keeps_serving(nodes, fake):
    a, b = nodes("a"), nodes("b")
    publish_prefix(a, 5, 2)
    fake.down = True
    r = b.step(new=[Request("b", prompt(5, 2 * b.B + 1))])
    assert r.matched == {"b": 0}  # the lookup failed: recompute, locally stored as usual
    assert b.worker.runtime.stats().files_valid == 2
    assert b.scheduler.get_kv_connector_stats().data["remote_lookups"] == 1
    fake.down = False
    r = b.step(new=[Request("b2", prompt(5, 2 * b.B) + [3, 3, 3, 3, 3])])  # B now holds them itself
    assert r.matched == {"b2": 2 * b.B} and r.meta.loads[0].remote_hashes == []


@pytest.mark.parametrize("how", ["master_down", "peer_gone"])
def test_mooncake_failing_between_lookup_and_load_is_a_load_error(nodes, fake, how):
    a, b = nodes("a"), nodes("b")
    publish_prefix(a, 9, 2)

    def fail():  # runs when B's load asks for the manifests, after its lookup found them
        if how == "master_down":
            fake.down = True
        else:  # the owner closed: its objects are gone
            fake.objects.clear()

    fake.before["get_batch"] = fail
    r = b.step(new=[Request("b", prompt(9, 2 * b.B + 1))])
    assert r.matched == {"b": 2 * b.B}
    (load,) = r.meta.loads
    assert r.load_errors == set(load.remote_block_ids)
    assert b.worker.runtime.stats().files_valid == 0  # nothing unverified kept locally


def test_a_hung_mooncake_is_a_miss_within_the_deadline(nodes, fake):
    a, b = nodes("a"), nodes("b")
    publish_prefix(a, 6, 2)
    release = fake.block("batch_is_exist")
    r = b.step(new=[Request("b", prompt(6, 2 * b.B + 1))])
    # The step returned while Mooncake's call is still stuck: the deadline made it a miss.
    assert fake.blocked["batch_is_exist"] >= 1
    assert r.matched == {"b": 0}
    assert b.scheduler.tier.snapshot()["remote_failures"] == 1
    # While that call is stuck every lookup is an immediate miss, without calling Mooncake again.
    lookups = ("batch_is_exist", "tutti-mooncake")  # the lookups' thread (publication has its own)
    calls = fake.calls_by_thread[lookups]
    r = b.step(new=[Request("b2", prompt(6, 3 * b.B + 1))])
    assert r.matched == {"b2": 2 * b.B}  # B's own pool, filled by the first request
    assert fake.calls_by_thread[lookups] == calls
    release.set()
    # Once it returned (and retry_ms passed) Mooncake is asked again.
    for _ in range(1000):
        if not b.scheduler.tier._caller.busy:
            break
        time.sleep(0.01)
    publish_prefix(a, 7, 2)
    r = b.step(new=[Request("b3", prompt(7, 2 * b.B + 1))])
    assert r.matched == {"b3": 2 * b.B}


def test_a_load_past_its_deadline_is_a_load_error_of_unknown_outcome(nodes, fake):
    a, b = nodes("a"), nodes("b")
    publish_prefix(a, 8, 2)
    release = fake.block("batch_get_into_multi_buffers")
    r = b.step(new=[Request("b", prompt(8, 2 * b.B + 1))])
    (load,) = r.meta.loads
    assert r.load_errors == set(load.remote_block_ids)
    assert b.worker._worker.unknown_load_blocks == set(load.remote_block_ids)
    release.set()


def test_publication_backpressure_drops_and_never_blocks_the_engine(nodes, fake):
    a = nodes("a", {"publish_queue": 1})
    release = fake.block("batch_put_from_multi_buffers")  # the publisher gets stuck in its first put
    for i in range(4):
        r = a.step(new=[Request(f"r{i}", prompt(20 + i, 2 * a.B + 1))])
        assert r.load_errors == set()
        if i == 0:
            _until(lambda: fake.blocked.get("batch_put_from_multi_buffers") == 1)
    # The engine went on: all four requests were stored in A's own pool.
    assert a.worker.runtime.stats().files_valid == 8
    stats = a.worker.get_kv_connector_stats().data
    # One publication is with the stuck publisher, one waits in the queue (size 1), two dropped.
    assert stats["remote_publish_drops"] == 4
    release.set()
    assert a.worker.tier.flush(10)
    assert a.worker.tier.snapshot()["remote_published_blocks"] == 4


def test_a_block_rewritten_before_publication_is_not_published(nodes, fake):
    a, b = nodes("a"), nodes("b")
    release = fake.block("batch_put_from_multi_buffers")
    req = Request("a", prompt(30, 2 * a.B + 1))
    a.step(new=[req])
    # vLLM reused block #0 before the publisher got to it.
    blk = a.blocks["a"][0]
    a.kv[next(iter(a.kv))].write(a.offset(0, blk), b"\x11" * a.g.object_bytes)
    release.set()
    assert a.worker.tier.flush(10)
    snap = a.worker.tier.snapshot()
    assert snap["remote_published_blocks"] == 1 and snap["remote_publish_drops"] == 1
    r = b.step(new=[Request("b", prompt(30, 2 * b.B + 1))])
    assert r.matched == {"b": 0}  # block #0 is not in Mooncake, so the prefix is not


@pytest.mark.parametrize(
    "mc, needle",
    [
        ({"master": "10.0.0.1:50051"}, "mooncake['master'] host '10.0.0.1' is not a loopback"),
        ({"metadata_server": "http://example.com:8080/metadata"}, "mooncake['metadata_server'] host"),
        ({"local_hostname": "192.168.1.2"}, "mooncake['local_hostname'] host"),
        ({"master": "127.0.0.1"}, "is not host:port"),
        ({"metadata_server": "etcd://127.0.0.1:2379"}, "is not http://host:port/metadata"),
        ({"publish_queue": 0}, "mooncake['publish_queue'] = 0 must be a positive integer"),
        ({"protocol": "nvlink"}, "use 'tcp' or 'rdma'"),
        ({"speed": 3}, "unknown mooncake keys ['speed']"),
    ],
)
def test_bad_mooncake_config_is_refused_naming_the_key(geometry, fake, mc, needle):
    cfg = vllm_config(geometry, dict(EXTRA, mooncake=dict(MC, **mc)))
    with pytest.raises(ConfigError) as e:
        from_vllm(cfg)
    assert needle in str(e.value)
    assert fake.calls == {}  # refused before anything reached Mooncake


def test_non_loopback_bind_address_is_refused(geometry, fake, monkeypatch):
    monkeypatch.setenv("MC_TCP_BIND_ADDRESS", "10.1.2.3")
    with pytest.raises(ConfigError, match="MC_TCP_BIND_ADDRESS='10.1.2.3' is not a loopback"):
        from_vllm(vllm_config(geometry, dict(EXTRA, mooncake=MC)))
    monkeypatch.delenv("MC_TCP_BIND_ADDRESS")
    ok = from_vllm(vllm_config(geometry, dict(EXTRA, mooncake=dict(MC, allow_remote_hosts=True,
                                                                        master="10.0.0.1:50051"))))
    assert ok.mooncake.master == "10.0.0.1:50051"


def test_manifest_checks():
    ident, chain = b"i" * 16, b"c" * 32
    m = cluster.make_manifest(ident, chain, 4096, b"d" * 32)
    assert cluster.check_manifest(m, ident, chain, 4096) == (b"d" * 32, "")
    assert "another cache identity" in cluster.check_manifest(m, b"j" * 16, chain, 4096)[1]
    assert "another chunk" in cluster.check_manifest(m, ident, b"x" * 32, 4096)[1]
    assert "object length 4096" in cluster.check_manifest(m, ident, chain, 8192)[1]
    assert "manifest magic" in cluster.check_manifest(b"X" + m[1:], ident, chain, 4096)[1]
    assert "bytes, expected" in cluster.check_manifest(m[:-1], ident, chain, 4096)[1]
