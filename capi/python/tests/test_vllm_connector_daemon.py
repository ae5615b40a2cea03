"""The connector through tuttid (vLLM stand-ins): each rank of a TP=2 engine is its own client and
stores its own shard under its own identity; the scheduler-side connector, with no KV memory, reports
the prefix every rank holds; a chunk one rank lacks is a load error there, never another rank's bytes.
``daemon: "auto"`` starts one tutti serve per pool directory and it leaves after its last client."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

import tutti
import tutti.vllm as tv
from conftest import fill_block
from test_binding import store
from test_daemon_client import _tutti_bin, daemon  # noqa: F401 - the fixture
from tutti._connector import shared
from tutti._connector.config import ConfigError, from_vllm
from tutti.vllm import KVConnectorRole, TuttiConnector, TuttiConnectorMetadata
from tutti._connector.metadata import LoadSpec
from vllm_standins import Request, layer_name, prompt, vllm_config

NB = 8


def _worker(cfg, rank: int, monkeypatch):
    monkeypatch.setattr(tv, "_rank", lambda: (rank, 0))
    c = TuttiConnector(cfg, KVConnectorRole.WORKER)
    g = c.config.geometry
    layers = [tutti.HostTensor((2, NB, g.tokens_per_block, g.kv_heads, g.head_dim), g.element_size)
              for _ in range(g.layers)]
    c.register_kv_caches({layer_name(i): t for i, t in enumerate(layers)})
    return c, layers


def test_tp2_ranks_keep_their_own_shards_and_the_scheduler_counts_all(daemon, geometry, monkeypatch):  # noqa: F811
    cfg = vllm_config(geometry, {"daemon_socket": daemon}, tp=2)
    cfg.parallel_config.distributed_executor_backend = "mp"
    w0, l0 = _worker(cfg, 0, monkeypatch)
    w1, l1 = _worker(cfg, 1, monkeypatch)
    sched = TuttiConnector(cfg, KVConnectorRole.SCHEDULER)
    try:
        B = geometry.tokens_per_block
        toks = prompt(5, 4 * B + 1)
        hashes = tutti.chain_hashes(toks, B)[:4]
        for b in range(3):
            fill_block(geometry, l0, NB, b, seed=b)
            fill_block(geometry, l1, NB, b, seed=100 + b)
        assert store(w0.runtime, hashes[:3], [0, 1, 2]).stored == 3
        assert store(w1.runtime, hashes[:2], [0, 1]).stored == 2

        m0, m1 = w0.get_handshake_metadata(), w1.get_handshake_metadata()
        assert (m0.tp_rank, m1.tp_rank) == (0, 1) and m0.tenant_salt != m1.tenant_salt
        # Each rank sees only its own chunks: rank 1 never gets rank 0's third block.
        assert w0.runtime.lookup(hashes, pin=False).hits == 3
        assert w1.runtime.lookup(hashes, pin=False).hits == 2
        # A TP=1 engine's identity (the plain salt) holds none of them.
        assert sched.runtime.contains_identity(hashes, model=m0.model, kind=m0.kind, tenant_salt=b"") == 0

        sched.set_xfer_handshake_metadata({0: m0, 1: m1})
        assert sched._identities() and len(sched._identities()) == 2
        matched, _ = sched.get_num_new_matched_tokens(Request("r", toks), 0)
        assert matched == 2 * B, "the prefix every rank holds: the minimum over ranks"

        # The scheduler promised 3 blocks (say rank 1's third was evicted in between): rank 1 loads
        # two and reports the third as a load error; its block keeps no foreign bytes.
        meta = TuttiConnectorMetadata(loads=[LoadSpec("r", hashes[:3], [5, 6, 7])])
        for w in (w0, w1):
            w.bind_connector_metadata(meta)
            w.start_load_kv(None)
            for i in range(geometry.layers):
                w.wait_for_layer_load(layer_name(i))
            w.wait_for_save()
            w.clear_connector_metadata()
        assert w0.get_block_ids_with_load_errors() == set()
        assert w1.get_block_ids_with_load_errors() == {7}
    finally:
        for c in (sched, w0, w1):
            c.shutdown()


def test_daemon_keys_are_checked(library, geometry, tmp_path):
    with pytest.raises(ConfigError, match="daemon owns the drives"):
        from_vllm(vllm_config(geometry, {"daemon_socket": "/tmp/x.sock", "emulated_drives": 2}))
    with pytest.raises(ConfigError, match="emulated_dir"):
        from_vllm(vllm_config(geometry, {"daemon": "auto", "emulated_drives": 2}))
    with pytest.raises(ConfigError, match="whole number of MiB"):
        from_vllm(vllm_config(geometry, {"daemon": "auto", "emulated_drives": 2, "emulated_dir": str(tmp_path),
                                         "emulated_capacity_bytes": (8 << 20) + 1}))
    with pytest.raises(ConfigError, match="'auto' or 'off'"):
        from_vllm(vllm_config(geometry, {"daemon": "yes", "emulated_drives": 2}))
    # Multiprocess with an emulated_dir: the daemon is the default.
    cfg = vllm_config(geometry, {"emulated_drives": 2, "emulated_dir": str(tmp_path)})
    cfg.parallel_config.distributed_executor_backend = "mp"
    c = from_vllm(cfg)
    assert c.daemon == "auto" and c.daemon_socket == str(tmp_path / "tuttid.sock")
    assert from_vllm(vllm_config(geometry, {"emulated_drives": 2, "emulated_dir": str(tmp_path)})).daemon == "off"


def test_the_tutti_binary_not_found_names_where_it_looked(library, monkeypatch, tmp_path):
    monkeypatch.setenv("TUTTI_BIN", str(tmp_path / "nope"))
    monkeypatch.setenv("TUTTI_LIB", str(tmp_path / "lib" / "libtutti.so"))
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(shared, "_loaded_lib_dir", lambda: None)
    with pytest.raises(ConfigError) as e:
        shared.find_tutti_bin()
    msg = str(e.value)
    assert str(tmp_path / "nope") in msg and str(tmp_path / "lib" / "tutti") in msg and "PATH" in msg


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is gone for our purposes.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def test_daemon_auto_starts_one_tuttid_per_directory_and_it_leaves_when_idle(library, geometry, tmp_path):
    exe = _tutti_bin()
    if not exe.exists():
        if os.environ.get("CI") == "true":
            pytest.fail(f"no tutti binary at {exe}")
        pytest.skip(f"no tutti binary at {exe}")
    os.environ.setdefault("TUTTI_BIN", str(exe))
    extra = {"daemon": "auto", "emulated_drives": 2, "emulated_dir": str(tmp_path), "emulated_capacity_bytes": 8 << 20,
             "daemon_idle_exit_s": 1}
    cfg = vllm_config(geometry, extra)
    sched = TuttiConnector(cfg, KVConnectorRole.SCHEDULER)
    sock = str(tmp_path / "tuttid.sock")
    try:
        # A second process on the same directory connects to the same daemon.
        code = (
            "import sys, json; sys.path.insert(0, %r)\n"
            "from vllm_standins import vllm_config\n"
            "import tutti\n"
            "from tutti.vllm import TuttiConnector, KVConnectorRole\n"
            "g = tutti.Geometry(%d, %d, %d, %d, %r)\n"
            "c = TuttiConnector(vllm_config(g, %r), KVConnectorRole.WORKER)\n"
            "print('ok'); sys.stdout.flush(); sys.stdin.readline(); c.shutdown()\n"
        ) % (str(Path(__file__).parent), geometry.layers, geometry.kv_heads, geometry.head_dim,
             geometry.tokens_per_block, geometry.dtype, extra)
        env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
        other = subprocess.Popen([os.sys.executable, "-c", code], env=env, stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True)
        try:
            assert other.stdout.readline().strip() == "ok"
            st = json.loads(subprocess.run([str(exe), "status", "--json", "--socket", sock], capture_output=True,
                                           text=True, timeout=60, check=True).stdout)
            names = sorted(c["name"].split("-pid")[0] for c in st["clients"])
            assert names == ["tutti status", "vllm-scheduler-tp0-pp0", "vllm-worker-tp0-pp0"], st
            pid = st["pid"]
        finally:
            other.stdin.write("\n")
            other.stdin.flush()
            assert other.wait(timeout=60) == 0
    finally:
        sched.shutdown()
    # Bounded by the idle period, or by the 30 s grace of a daemon that never saw a client
    # (see the report: under pytest the latter has been observed).
    deadline = time.monotonic() + 60
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(pid), "tuttid left after its last client (--idle-exit-s)"
    assert not os.path.exists(sock)
