"""Tensor-parallel ranks of a mini engine, each in its own process, each a GPU client of tuttid.

A rank process is what one vLLM GPU worker is: a worker-side ``TuttiConnector`` whose KV caches
live in CUDA memory (the stand-in libcuda.so's, allocated with ``cuMemAlloc``), connected to
tuttid with the CUDA executor, so its loads and stores run its own I/O kernels on the staged path.
:class:`RanksEngine` is :class:`vllm_standins.MiniEngine` with its model runner split over such
processes: the scheduler-side connector stays in the test's process, every step's metadata goes
to every rank, and each rank "computes" its own shard (KV bytes that depend on the prefix and on
the rank), so a rank that loaded another rank's bytes, or a load that moved nothing, is caught.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import sys
from types import SimpleNamespace

import tutti
from vllm_standins import MiniEngine, SchedulerOutput, kv_bytes, layer_name, vllm_config

# Every wait on a rank process is bounded.
RANK_TIMEOUT_S = 120


def rank_kv(prefix: tuple, rank: int, layer: int, kv: int, n: int) -> bytes:
    """What rank ``rank`` computes for K or V of the block ending ``prefix`` in ``layer``."""
    return kv_bytes(prefix + (f"rank{rank}",), layer, kv, n)


def _standin_cuda(driver: str):
    """The stand-in driver with the engine's own context (the primary one) current, as a GPU
    worker has; a fake ``torch`` for the worker's write markers where torch is missing."""
    from ctypes import byref, c_int, c_size_t, c_uint64, c_void_p

    if "torch" not in sys.modules:
        try:
            import torch  # noqa: F401
        except ImportError:
            from test_staged import _Event

            sys.modules["torch"] = SimpleNamespace(
                cuda=SimpleNamespace(Event=_Event, current_stream=lambda device=None: None))
    cu = ctypes.CDLL(driver, mode=ctypes.RTLD_GLOBAL)
    cu.cuMemcpyHtoD_v2.argtypes = [c_uint64, c_void_p, c_size_t]
    cu.cuMemcpyDtoH_v2.argtypes = [c_void_p, c_uint64, c_size_t]
    cu.cuMemsetD8_v2.argtypes = [c_uint64, ctypes.c_ubyte, c_size_t]
    cu.cuMemAlloc_v2.argtypes = [ctypes.POINTER(c_uint64), c_size_t]
    cu.tt_standin_stat.argtypes = [ctypes.c_char_p, c_uint64, ctypes.POINTER(c_uint64)]
    assert cu.cuInit(0) == 0
    dev, ctx = c_int(), c_void_p()
    assert cu.cuDeviceGet(byref(dev), 0) == 0
    assert cu.cuDevicePrimaryCtxRetain(byref(ctx), dev) == 0
    assert cu.cuCtxPushCurrent_v2(ctx) == 0
    return cu


def _launches(cu) -> int:
    """Kernels launched through the stand-in in this process (counted at launch)."""
    out = ctypes.c_uint64()
    assert cu.tt_standin_stat(b"launches", 0, ctypes.byref(out)) == 0
    return out.value


def rank_main(conn, rank: int, tp: int, g: tutti.Geometry, extra: dict, num_blocks: int) -> None:
    """One rank process: answers the engine's messages until told to stop."""
    import tutti.vllm as tv
    from test_staged import _StandinCudaTensor
    from tutti.vllm import KVConnectorRole, TuttiConnector

    cu = _standin_cuda(extra["cuda_driver"])
    tv._rank = lambda: (rank, 0)
    cfg = vllm_config(g, extra, tp=tp)
    cfg.parallel_config.distributed_executor_backend = "mp"
    worker = TuttiConnector(cfg, KVConnectorRole.WORKER)
    B, n = g.tokens_per_block, g.object_bytes
    kv = {layer_name(i): _StandinCudaTensor(cu, (2, num_blocks, B, g.kv_heads, g.head_dim), g.element_size)
          for i in range(g.layers)}
    worker.register_kv_caches(kv)
    off = lambda k, b: (k * num_blocks + b) * n  # noqa: E731
    conn.send(("ready", worker.get_handshake_metadata()))
    while True:
        op, *args = conn.recv()
        if op == "junk":
            for b in args[0]:
                for t in kv.values():
                    t.write(off(0, b), b"\xee" * n)
                    t.write(off(1, b), b"\xee" * n)
            conn.send(("ok",))
        elif op == "step":
            meta, writes, finished_ids = args
            before = _launches(cu)
            worker.bind_connector_metadata(meta)
            if writes is None:  # a step without tokens: loads start, nothing is computed
                worker.start_load_kv(None)
            else:
                worker.start_load_kv(SimpleNamespace(attn_metadata=None, no_compile_layers={}, virtual_engine=0))
                for layer in range(g.layers):
                    name = layer_name(layer)
                    worker.wait_for_layer_load(name)
                    for block, prefix in writes:
                        kv[name].write(off(0, block), rank_kv(prefix, rank, layer, 0, n))
                        kv[name].write(off(1, block), rank_kv(prefix, rank, layer, 1, n))
                    worker.save_kv_layer(name, kv[name], None)
                worker.wait_for_save()
            errors = worker.get_block_ids_with_load_errors()
            finished = worker.get_finished(finished_ids)
            worker.clear_connector_metadata()
            conn.send(("ok", errors, finished, _launches(cu) - before))
        elif op == "read":
            block, layer = args
            t = kv[layer_name(layer)]
            conn.send(("ok", t.read(off(0, block), n), t.read(off(1, block), n)))
        elif op == "path":
            p = worker.runtime.data_path()
            conn.send(("ok", (p.mode, p.memory, p.staged_bytes)))
        elif op == "stop":
            worker.shutdown()
            conn.send(("ok",))
            return
        else:
            conn.send(("error", f"unknown op {op!r}"))


class Rank:
    """The engine's end of one rank process."""

    def __init__(self, rank: int, tp: int, g: tutti.Geometry, extra: dict, num_blocks: int):
        ctx = multiprocessing.get_context("spawn")
        self.rank = rank
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=rank_main, args=(child, rank, tp, g, extra, num_blocks), daemon=True)
        self.proc.start()
        child.close()
        self.handshake = self.ask_raw()[1]

    def ask_raw(self):
        if not self.conn.poll(RANK_TIMEOUT_S):
            raise TimeoutError(f"rank {self.rank} did not answer within {RANK_TIMEOUT_S} s")
        reply = self.conn.recv()
        if reply[0] == "error":
            raise RuntimeError(f"rank {self.rank}: {reply[1]}")
        return reply

    def ask(self, *msg):
        self.conn.send(msg)
        return self.ask_raw()

    def close(self):
        try:
            if self.proc.is_alive():
                self.ask("stop")
        finally:
            self.proc.join(30)
            if self.proc.is_alive():
                self.proc.kill()
                self.proc.join(10)


class RanksEngine(MiniEngine):
    """A mini engine whose model runner is ``tp`` rank processes (see the module docs)."""

    def __init__(self, g: tutti.Geometry, extra: dict, tp: int, num_blocks: int = 16):
        from tutti.vllm import KVConnectorRole, TuttiConnector

        self.g, self.B, self.num_blocks = g, g.tokens_per_block, num_blocks
        self.ranks: list[Rank] = []
        self.scheduler = None
        try:
            for r in range(tp):
                self.ranks.append(Rank(r, tp, g, extra, num_blocks))
            cfg = vllm_config(g, extra, tp=tp)
            cfg.parallel_config.distributed_executor_backend = "mp"
            self.scheduler = TuttiConnector(cfg, KVConnectorRole.SCHEDULER)
            self.scheduler.set_xfer_handshake_metadata({r.rank: r.handshake for r in self.ranks})
        except BaseException:
            self.close()
            raise
        self.free = list(range(num_blocks))
        self.used: set[int] = set()
        self.blocks: dict[str, list[int]] = {}
        self.running: dict = {}
        self.finished_last_step: set[str] = set()
        self.held: dict[str, list[int]] = {}
        self.launches = [0] * tp  # kernels each rank launched for its loads and stores

    def close(self):
        for r in self.ranks:
            r.close()
        if self.scheduler is not None:
            self.scheduler.shutdown()

    def _junk(self, blocks: list[int]) -> None:
        for r in self.ranks:
            r.ask("junk", blocks)

    def _run_workers(self, out: SchedulerOutput, meta) -> tuple[set[int], tuple]:
        writes = None
        if out.num_scheduled_tokens:
            writes = []
            for req_id, count in out.num_scheduled_tokens.items():
                req = self.running[req_id]
                start, end = req.num_computed_tokens, req.num_computed_tokens + count
                for index in range(start // self.B, -(-end // self.B)):
                    prefix = tuple(req.all_token_ids[: (index + 1) * self.B])
                    writes.append((self.blocks[req_id][index], prefix))
        for r in self.ranks:
            r.conn.send(("step", meta, writes, set(out.finished_req_ids)))
        errors: set[int] = set()
        sending: set[str] | None = None
        recving: set[str] | None = None
        for r in self.ranks:
            _, e, (s, v), launched = r.ask_raw()
            errors |= set(e)
            # vLLM counts a request finished once every worker reported it.
            sending = set(s or ()) if sending is None else sending & set(s or ())
            recving = set(v or ()) if recving is None else recving & set(v or ())
            self.launches[r.rank] += launched
        return errors, (sending or None, recving or None)

    def rank_block(self, rank: int, block: int, layer: int) -> tuple[bytes, bytes]:
        _, k, v = self.ranks[rank].ask("read", block, layer)
        return k, v

    def assert_blocks_hold(self, req, indices) -> None:
        """Every rank's K and V of the request's blocks ``indices`` are what that rank computes."""
        n = self.g.object_bytes
        for index in indices:
            block = self.blocks[req.request_id][index]
            prefix = tuple(req.all_token_ids[: (index + 1) * self.B])
            for r in self.ranks:
                for layer in range(self.g.layers):
                    want = (rank_kv(prefix, r.rank, layer, 0, n), rank_kv(prefix, r.rank, layer, 1, n))
                    assert self.rank_block(r.rank, block, layer) == want, (
                        f"rank {r.rank}: request {req.request_id} block #{index} (id {block}) layer {layer}"
                    )
