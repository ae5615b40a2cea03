"""Runs one cluster-tier scenario against the real Mooncake Store, inside a private network namespace.

    unshare -n -- PYTHON tests/mooncake_cluster_run.py SCENARIO WORKDIR

tests/test_cluster_mooncake.py starts it like that (PYTHON: one with ``mooncake.store``, e.g.
the venv scripts/setup-mooncake fills). It refuses to run unless the only network interface
is ``lo`` (it brings ``lo`` up itself), sets ``MC_TCP_BIND_ADDRESS=127.0.0.1``, starts
``mooncake_master`` (with its HTTP metadata server) on 127.0.0.1, and runs the "nodes" as
processes of the spawn start method, each with its own tutti pool on emulated drives and a
MiniEngine (tests/vllm_standins.py) driving the vLLM connector. It prints one line
``RESULT {json}`` with what the test checks, and exits 0; any failure exits non-zero, saying
why. Every wait is bounded.
"""

from __future__ import annotations

import fcntl
import json
import multiprocessing as mp
import os
import socket
import struct
import subprocess
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

HOST = "127.0.0.1"
RPC_PORT = 50051
HTTP_PORT = 8080
REPLY_S = 120.0  # one command of a node, at most

MC = {
    "master": f"{HOST}:{RPC_PORT}",
    "metadata_server": f"http://{HOST}:{HTTP_PORT}/metadata",
    "local_hostname": HOST,
    "segment_bytes": 32 << 20,
    "buffer_bytes": 16 << 20,
    "timeout_ms": 3000,
    "retry_ms": 500,
}


def bring_up_lo() -> None:
    try:
        subprocess.run(["ip", "link", "set", "lo", "up"], check=True, timeout=10, capture_output=True)
        return
    except (OSError, subprocess.SubprocessError):
        pass
    # No `ip`: SIOCGIFFLAGS / SIOCSIFFLAGS with IFF_UP.
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        req = struct.pack("16sH14s", b"lo", 0, b"")
        flags = struct.unpack("16sH14s", fcntl.ioctl(s, 0x8913, req))[1]
        fcntl.ioctl(s, 0x8914, struct.pack("16sH14s", b"lo", flags | 0x1, b""))
    finally:
        s.close()


def check_isolated() -> None:
    names = [n for _, n in socket.if_nameindex()]
    if names != ["lo"]:
        raise SystemExit(f"mooncake_cluster_run: refusing to run: interfaces {names}, expected only 'lo' "
                         f"(run it inside `unshare -n`)")


def wait_port(port: int, deadline: float, proc: subprocess.Popen) -> None:
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"mooncake_master exited with {proc.returncode}")
        try:
            with socket.create_connection((HOST, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"mooncake_master did not listen on {HOST}:{port} in time")


def start_master(work: Path) -> subprocess.Popen:
    exe = Path(sys.executable).parent / "mooncake_master"
    if not exe.exists():
        import mooncake

        exe = Path(mooncake.__file__).parent / "mooncake_master"
    log = open(work / "master.log", "w")
    proc = subprocess.Popen(
        [str(exe), f"--rpc_address={HOST}", f"--rpc_port={RPC_PORT}", "--enable_http_metadata_server=true",
         f"--http_metadata_server_host={HOST}", f"--http_metadata_server_port={HTTP_PORT}",
         "--default_kv_lease_ttl=500"],
        stdout=log, stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 30
    wait_port(RPC_PORT, deadline, proc)
    wait_port(HTTP_PORT, deadline, proc)
    return proc


# --- a node ---------------------------------------------------------------------------------


def node_main(name: str, conn, mc: dict) -> None:
    """One node: a MiniEngine (both connector halves) with its own pool and the Mooncake tier."""
    import tutti
    from vllm_standins import EXTRA, MiniEngine, Request, prompt

    g = tutti.Geometry(layers=4, kv_heads=2, head_dim=32, tokens_per_block=4, dtype="f16")
    e = MiniEngine(g, dict(EXTRA, mooncake=mc), num_blocks=64)
    n = 0
    try:
        while True:
            if not conn.poll(600):
                return
            cmd, *args = conn.recv()
            try:
                if cmd == "close":
                    e.close()
                    conn.send(("ok", None))
                    return
                if cmd == "step":  # (prompt seed, full blocks): run a request with that prefix + 1 token
                    seed, blocks = args
                    n += 1
                    req = Request(f"{name}{n}", prompt(seed, blocks * e.B) + [7])
                    r = e.step(new=[req])
                    good = []
                    for index in range(blocks):
                        blk = e.blocks[req.request_id][index]
                        good.append(all(e.block_kv(blk, l) == e.expected(req.all_token_ids, index, l)
                                        for l in range(g.layers)))
                    remote = sum(len(ld.remote_hashes) for ld in r.meta.loads)
                    e.finish(req)
                    conn.send(("ok", {"matched_blocks": r.matched[req.request_id] // e.B, "remote_blocks": remote,
                                      "load_errors": len(r.load_errors), "blocks_exact": good}))
                elif cmd == "lookup":  # the scheduler side only: how many blocks would come from where
                    seed, blocks = args
                    n += 1
                    req = Request(f"{name}{n}", prompt(seed, blocks * e.B) + [7])
                    t0 = time.monotonic()
                    ext, _ = e.scheduler.get_num_new_matched_tokens(req, 0)
                    took = time.monotonic() - t0
                    e.scheduler.request_finished(req, [])
                    conn.send(("ok", {"matched_blocks": ext // e.B, "took_s": took}))
                elif cmd == "flush":
                    conn.send(("ok", e.worker.tier.flush(30)))
                elif cmd == "stats":
                    conn.send(("ok", e.worker.tier.snapshot()))
                elif cmd == "corrupt":  # flips one byte of the object of block `index` of a prefix
                    seed, blocks, index = args
                    from tutti import cluster
                    from tutti.runtime import chain_hashes

                    toks = prompt(seed, blocks * e.B)
                    h = chain_hashes(toks, e.B)[index]
                    ident = cluster.identity_digest(e.worker._worker.identity, g)
                    # The object as published: every layer's K then V (what computing them gives).
                    data = bytearray(b"".join(b"".join(e.expected(toks, index, l)) for l in range(g.layers)))
                    data[100] ^= 1
                    rc = e.worker.tier._store.upsert(cluster.data_key(ident, h), bytes(data))
                    conn.send(("ok", rc))
                else:
                    conn.send(("error", f"unknown command {cmd!r}"))
            except Exception:  # noqa: BLE001 - reported to the runner
                conn.send(("error", traceback.format_exc()))
    finally:
        conn.close()


def vllm_node_main(name: str, conn, mc: dict, spec: dict) -> None:
    """One node running real vLLM (CPU build) with the tutti connector and the Mooncake tier:
    its own emulated pool, vLLM's own prefix cache off (a prefix comes from tutti or is computed)."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    try:
        from vllm import LLM, SamplingParams
        from vllm.distributed.kv_transfer import get_kv_transfer_group
        from vllm.inputs import TokensPrompt

        llm = LLM(
            model=spec["model"], skip_tokenizer_init=True, block_size=32, dtype="float32", enforce_eager=True,
            max_model_len=spec.get("max_model_len", 2048), seed=0, kv_cache_memory_bytes=spec.get("kv_bytes", 64 << 20),
            enable_prefix_caching=False, distributed_executor_backend="uni",
            kv_transfer_config=dict(
                kv_connector="TuttiConnector", kv_connector_module_path="tutti.vllm", kv_role="kv_both",
                kv_connector_extra_config={"emulated_drives": 2, "emulated_capacity_bytes": 256 << 20,
                                           "open_mode": "create", "mooncake": mc},
                kv_load_failure_policy="recompute",
            ),
        )
        conn_ = get_kv_transfer_group()
    except Exception:  # noqa: BLE001 - reported to the runner
        conn.send(("error", traceback.format_exc()))
        return
    conn.send(("ok", "ready"))
    while conn.poll(600):
        cmd, *args = conn.recv()
        try:
            if cmd == "close":
                llm.llm_engine.engine_core.shutdown() if hasattr(llm.llm_engine, "engine_core") else None
                conn.send(("ok", None))
                return
            if cmd == "gen":  # (prompt token ids, max_tokens)
                tokens, max_tokens = args
                sp = SamplingParams(max_tokens=max_tokens, temperature=0.0, logprobs=3, detokenize=False)
                t0 = time.perf_counter()
                o = llm.generate([TokensPrompt(prompt_token_ids=tokens)], sp, use_tqdm=False)[0]
                took = time.perf_counter() - t0
                c = o.outputs[0]
                conn.send(("ok", {"tokens": list(c.token_ids), "cached": o.num_cached_tokens, "took_s": took,
                                  "logprobs": [{str(k): v.logprob for k, v in d.items()} for d in (c.logprobs or [])]}))
            elif cmd == "flush":
                conn.send(("ok", conn_.tier.flush(60)))
            elif cmd == "stats":
                conn.send(("ok", conn_.tier.snapshot()))
            else:
                conn.send(("error", f"unknown command {cmd!r}"))
        except Exception:  # noqa: BLE001 - reported to the runner
            conn.send(("error", traceback.format_exc()))


class Node:
    def __init__(self, name: str, mc: dict | None = None, vllm: dict | None = None):
        ctx = mp.get_context("spawn")  # forking after mooncake.store is imported can hang setup
        self.name = name
        self.conn, child = ctx.Pipe()
        mc = dict(MC, **(mc or {}))
        target, args = (node_main, (name, child, mc)) if vllm is None else (vllm_node_main, (name, child, mc, vllm))
        self.proc = ctx.Process(target=target, args=args, name=f"node-{name}")
        self.proc.start()
        child.close()
        if vllm is not None:
            self._reply("start", vllm.get("start_s", 300))

    def __call__(self, *cmd):
        self.conn.send(cmd)
        return self._reply(cmd[0], REPLY_S)

    def _reply(self, what: str, seconds: float):
        if not self.conn.poll(seconds):
            raise RuntimeError(f"node {self.name}: no reply to {what!r} in {seconds:g} s")
        status, value = self.conn.recv()
        if status != "ok":
            raise RuntimeError(f"node {self.name}: {what!r} failed: {value}")
        return value

    def close(self):
        if self.proc.is_alive():
            try:
                self("close")
            except (RuntimeError, OSError, EOFError):
                pass
            self.proc.join(30)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(10)


def until(cond, seconds: float, what: str):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(0.2)
    raise RuntimeError(f"{what}: not within {seconds:g} s")


# --- scenarios ------------------------------------------------------------------------------


def two_nodes(work: Path, master) -> dict:
    """A stores two prefixes; B loads the first byte-exact; A closes; B's lookup of the second misses."""
    a, b = Node("a"), Node("b")
    try:
        out = {"a_store": a("step", 11, 4), "a_store2": a("step", 12, 3)}
        assert a("flush"), "node A's publications did not finish"
        out["a_stats"] = a("stats")
        out["b_load"] = b("step", 11, 4)
        out["b_again"] = b("step", 11, 4)  # now in B's own pool
        out["b_stats"] = b("stats")
        out["b_lookup2_before"] = b("lookup", 12, 3)
        a.close()
        out["b_lookup2_after"] = until(lambda: (lambda r: r if r["matched_blocks"] == 0 else None)(b("lookup", 12, 3)),
                                       30, "A's objects vanishing")
        out["b_step2_after"] = b("step", 12, 3)
        return out
    finally:
        a.close()
        b.close()


def corrupt(work: Path, master) -> dict:
    a, b = Node("a"), Node("b")
    try:
        out = {"a_store": a("step", 21, 3)}
        assert a("flush")
        out["corrupt_rc"] = a("corrupt", 21, 3, 1)
        out["b_load"] = b("step", 21, 3)
        out["b_stats"] = b("stats")
        return out
    finally:
        a.close()
        b.close()


def master_killed(work: Path, master) -> dict:
    a, b = Node("a"), Node("b")
    try:
        out = {"a_store": a("step", 31, 3), "a_store2": a("step", 32, 3)}
        assert a("flush")
        out["b_load"] = b("step", 31, 3)
        master.kill()
        master.wait(10)
        out["b_lookup2"] = b("lookup", 32, 3)
        out["b_step2"] = b("step", 32, 3)  # the engine keeps serving: computes, stores locally
        out["b_step2_again"] = b("step", 32, 3)
        out["b_step1_again"] = b("step", 31, 3)
        out["b_stats"] = b("stats")
        return out
    finally:
        a.close()
        b.close()


def backpressure(work: Path, master) -> dict:
    """The master stops answering (SIGSTOP) while node A keeps computing: its publications pile up in
    a queue of one, the rest are dropped, and every step still completes; then the master resumes."""
    import signal

    a = Node("a", {"publish_queue": 1})
    try:
        out = {"before": a("step", 100, 2)}
        assert a("flush")
        out["stats_before"] = a("stats")
        master.send_signal(signal.SIGSTOP)
        try:
            out["stopped"] = [a("step", 101 + i, 2) for i in range(6)]
            out["stats_stopped"] = a("stats")
        finally:
            master.send_signal(signal.SIGCONT)
        out["flushed"] = a("flush")
        out["stats_after"] = a("stats")
        return out
    finally:
        a.close()


def vllm_two_nodes(work: Path, master) -> dict:
    """Two vLLM processes as two nodes: B's request shares A's prefix, which B loads from Mooncake."""
    venv = Path(os.environ.get("TUTTI_VLLM_VENV") or Path.home() / ".cache/tutti/vllm-venv")
    spec = {"model": os.environ.get("TUTTI_TEST_MODEL") or str(venv / "tutti-models" / "tiny-llama")}
    prefix = list(range(1, 101))  # 3 whole 32-token blocks and 4 tokens
    first, second = prefix + list(range(300, 341)), prefix + list(range(400, 431))
    a = b = None
    try:
        a = Node("a", vllm=spec)
        out = {"a_first": a("gen", first, 6)}
        assert a("flush"), "node A's publications did not finish"
        out["a_stats"] = a("stats")
        b = Node("b", vllm=spec)  # A stays up: its objects live in its own Mooncake segment
        out["b_first"] = b("gen", first, 6)
        out["b_second"] = b("gen", second, 6)
        out["b_stats"] = b("stats")
        return out
    finally:
        for n in (b, a):
            if n is not None:
                n.close()


SCENARIOS = {f.__name__: f for f in (two_nodes, corrupt, master_killed, backpressure, vllm_two_nodes)}


def main() -> int:
    scenario, work = sys.argv[1], Path(sys.argv[2])
    if scenario not in SCENARIOS:
        print(f"mooncake_cluster_run: unknown scenario {scenario!r}; known: {sorted(SCENARIOS)}", file=sys.stderr)
        return 2
    work.mkdir(parents=True, exist_ok=True)
    bring_up_lo()
    check_isolated()
    os.environ["MC_TCP_BIND_ADDRESS"] = HOST
    master = start_master(work)
    try:
        result = SCENARIOS[scenario](work, master)
    finally:
        if master.poll() is None:
            master.kill()
            master.wait(10)
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
