"""GPU clients of tuttid through the binding and the vLLM connector (the stand-in libcuda.so).

Each rank of a TP=2 mini engine is its own process, as vLLM's GPU workers are: a tuttid client
running the CUDA executor, with its KV caches in CUDA memory moved on the staged path through its
own staging slots. The scheduler-side connector is a control-only client (no queue pairs, no
executor). Every byte a rank loads is checked against what that rank computed, and every rank's
loads and stores must have launched kernels: a rank whose layers went to host lanes fails."""

from __future__ import annotations

import json
import subprocess
import time

import pytest

import tutti
from gpu_ranks import RanksEngine
from test_daemon_client import _tutti_bin, daemon  # noqa: F401 - the fixture
from test_staged import _standin_driver
from vllm_standins import Request, prompt


def _status(socket: str) -> dict:
    out = subprocess.run([str(_tutti_bin()), "status", "--socket", socket, "--json"], capture_output=True,
                         text=True, timeout=60, check=True)
    return json.loads(out.stdout)


def _gpu_extra(daemon: str) -> dict:
    return {"daemon_socket": daemon, "executor": "gio_cuda", "cuda_driver": _standin_driver(),
            "cuda_sm_count": 1, "cuda_block_threads": 32, "staging_slots": 8}


def test_a_tp2_engine_of_gpu_rank_processes_moves_every_byte_through_tuttid(daemon, geometry):  # noqa: F811
    engine = RanksEngine(geometry, _gpu_extra(daemon), tp=2)
    try:
        status = _status(daemon)
        clients = {c["name"]: c for c in status["clients"]}
        sched = [c for n, c in clients.items() if n.startswith("vllm-scheduler")]
        workers = [c for n, c in clients.items() if n.startswith("vllm-worker")]
        assert len(sched) == 1 and len(workers) == 2, clients
        assert sched[0]["queues"] == [] and sched[0]["mappings"] == 0, "the scheduler leases nothing"
        assert sched[0]["arbitration_slot"] is None
        assert all(w["queues"] and w["mappings"] for w in workers), workers
        assert engine.scheduler.runtime.info().executor == "control"

        B = engine.B
        a = Request("a", prompt(7, 3 * B + 1))
        r = engine.step(new=[a])
        assert r.matched == {"a": 0} and len(r.meta.saves) == 1
        stored = list(engine.launches)
        assert all(n > 0 for n in stored), f"each rank's stores launched kernels: {stored}"
        b = Request("b", prompt(7, 3 * B) + [9])
        r = engine.step(new=[b])
        assert r.matched == {"b": 3 * B}, "the prefix both ranks hold"
        (load,) = r.meta.loads
        assert set(load.block_ids).isdisjoint(engine.blocks["a"])
        assert r.load_errors == set()
        engine.assert_blocks_hold(b, range(3))
        assert all(n > s for n, s in zip(engine.launches, stored)), f"each rank's loads launched kernels: {engine.launches}"
        for rank in engine.ranks:
            mode, memory, staged = rank.ask("path")[1]
            assert (mode, memory) == ("staged", "cuda") and staged >= 2 * 3 * 2 * geometry.layers * geometry.object_bytes
    finally:
        engine.close()
    # Every client left: nothing leased or mapped stays behind (the status request is a client too).
    deadline = time.monotonic() + 30
    while True:
        status = _status(daemon)
        others = [c for c in status["clients"] if c["name"] != "tutti status"]
        if not others and all(c["client_mappings"] == 0 for c in status["controllers"]):
            break
        assert time.monotonic() < deadline, f"clients not released: {status}"
        time.sleep(0.05)


def test_the_connector_takes_gio_cuda_with_a_daemon_and_checks_its_keys(library, geometry):
    from tutti._connector.config import ConfigError, from_vllm
    from vllm_standins import vllm_config

    extra = {"daemon_socket": "/tmp/nobody.sock", "executor": "gio_cuda", "cuda_sm_count": 4, "cuda_mode": "persistent",
             "staging_slots": 32}
    cfg = vllm_config(geometry, extra, tp=2)
    cfg.parallel_config.distributed_executor_backend = "mp"
    c = from_vllm(cfg)
    kw = c.io_kwargs()
    assert (kw["executor"], kw["exec_mode"], kw["cuda_sm_count"], kw["staging_slots"]) == ("gio_cuda", "persistent", 4, 32)
    with pytest.raises(ConfigError, match="cuda_sm_count"):
        from_vllm(vllm_config(geometry, dict(extra, cuda_sm_count=0)))
    with pytest.raises(ConfigError, match="'launch' or 'persistent'"):
        from_vllm(vllm_config(geometry, dict(extra, cuda_mode="sqpoll")))


def test_runtime_connect_passes_the_cuda_settings_and_a_control_client_registers_nothing(daemon, geometry):  # noqa: F811
    with pytest.raises(tutti.errors.Unsupported, match="/nonexistent/libcuda.so"):
        tutti.Runtime.connect(daemon, geometry, executor="gio_cuda", cuda_driver="/nonexistent/libcuda.so")
    with pytest.raises(tutti.InvalidArgument, match="exec_mode"):
        tutti.Runtime.connect(daemon, geometry, executor="gio_cuda", cuda_driver=_standin_driver(),
                              exec_mode="inline")
    with pytest.raises(ValueError, match="exec_mode"):
        tutti.Runtime.connect(daemon, geometry, exec_mode="sqpoll")
    with tutti.Runtime.connect(daemon, geometry, executor="control", client_name="looker") as rt:
        assert rt.info().executor == "control"
        with pytest.raises(tutti.errors.Unsupported, match="TUTTI_EXECUTOR_CONTROL"):
            from conftest import vllm_layers

            layers = vllm_layers(geometry)
            rt.register_kv("vllm_per_layer", 8, model="m", k_bases=[t.data_ptr() for t in layers], keepalive=layers)
        looker = [c for c in _status(daemon)["clients"] if c["name"] == "looker"]
        assert looker and looker[0]["queues"] == [] and looker[0]["mappings"] == 0
