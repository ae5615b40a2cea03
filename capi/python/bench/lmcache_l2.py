"""Chunks per second and host CPU per chunk: tutti's L2 adapter against LMCache's own ``fs`` and
``fs_native`` L2 adapters, through LMCache's real adapter code, in one run (scripts/bench-lmcache).

Each adapter gets the same chunks (random bytes in LMCache memory objects): all are stored
(batches of ``--batch``, waiting on the adapter's store eventfd), then all are loaded into
fresh objects and every byte is compared. Wall time and this process's CPU time
(``time.process_time``: every thread, LMCache's and tutti's) are taken per phase. tutti's pool
is two emulated drives whose media are files in the same directory as the fs adapters' files
(``--dir``), so every adapter's bytes end in the same filesystem's page cache: this measures the
host software path of each adapter, not a drive.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import shutil
import tempfile
import time

import torch

os.environ.setdefault("LMCACHE_TRACK_USAGE", "false")

from lmcache.v1.distributed.api import ObjectKey  # noqa: E402
from lmcache.v1.distributed.l2_adapters.config import get_l2_adapter_config_class  # noqa: E402
from lmcache.v1.distributed.l2_adapters.factory import create_l2_adapter_from_registry  # noqa: E402
from lmcache.v1.memory_management import MemoryFormat, MemoryObjMetadata, TensorMemoryObj  # noqa: E402
from lmcache.v1.platform import consume_fd  # noqa: E402


def obj(n: int, src: torch.Tensor | None) -> TensorMemoryObj:
    raw = torch.empty(n, dtype=torch.uint8)
    if src is not None:
        raw.copy_(src)
    else:
        raw.zero_()
    md = MemoryObjMetadata(shape=torch.Size([n]), dtype=torch.uint8, address=0, phy_size=n,
                           fmt=MemoryFormat.KV_2LTD, ref_count=1)
    return TensorMemoryObj(raw, md, parent_allocator=None)


def wait(fd: int, pop, tids: set, timeout: float = 120.0) -> dict:
    p = select.poll()
    p.register(fd, select.POLLIN)
    got: dict = {}
    deadline = time.monotonic() + timeout
    while not tids <= set(got):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(tids - set(got))} tasks not done in {timeout} s")
        p.poll(100)
        if p.poll(0):
            consume_fd(fd)  # LMCache's notifier, drained its own way (else the poll spins)
        got.update(pop())
    return got


def run(name: str, cfg: dict, data: list[torch.Tensor], batch: int) -> dict:
    config = get_l2_adapter_config_class(cfg["type"]).from_dict(cfg)
    adp = create_l2_adapter_from_registry(config)
    try:
        keys = [ObjectKey(chunk_hash=ObjectKey.IntHash2Bytes(i), model_name="bench", kv_rank=0)
                for i in range(len(data))]
        src = [obj(len(d), d) for d in data]
        w0, c0 = time.perf_counter(), time.process_time()
        tids = {adp.submit_store_task(keys[i:i + batch], src[i:i + batch]) for i in range(0, len(keys), batch)}
        done = wait(adp.get_store_event_fd(), adp.pop_completed_store_tasks, tids)
        w1, c1 = time.perf_counter(), time.process_time()
        assert all(r.is_successful() for r in done.values()), f"{name}: a store failed"
        dst = [obj(len(d), None) for d in data]
        loads: dict = {}
        for i in range(0, len(keys), batch):
            loads[adp.submit_load_task(keys[i:i + batch], dst[i:i + batch])] = min(batch, len(keys) - i)
        fd = adp.get_load_event_fd()
        res: dict = {}
        deadline = time.monotonic() + 120
        p = select.poll()
        p.register(fd, select.POLLIN)
        while len(res) < len(loads):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name}: loads not done in 120 s")
            p.poll(100)
            if p.poll(0):
                consume_fd(fd)
            for t in loads:
                if t not in res:
                    r = adp.query_load_result(t)
                    if r is not None:
                        res[t] = r
        w2, c2 = time.perf_counter(), time.process_time()
        assert all(res[t].count_leading_ones() == n for t, n in loads.items()), f"{name}: a load missed"
        bad = sum(not torch.equal(s.tensor, d.tensor) for s, d in zip(src, dst))
        assert bad == 0, f"{name}: {bad} chunks came back different"
    finally:
        adp.close()
    n = len(data)
    return {"adapter": name, "chunks": n, "store_chunks_s": n / (w1 - w0), "load_chunks_s": n / (w2 - w1),
            "store_cpu_us_per_chunk": (c1 - c0) / n * 1e6, "load_cpu_us_per_chunk": (c2 - c1) / n * 1e6}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chunks", type=int, default=128)
    ap.add_argument("--chunk-mib", type=float, default=1.0)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--dir", default=None, help="where every adapter's files go (default: a temp dir)")
    ap.add_argument("--json", default=None, help="also write the results here")
    a = ap.parse_args()
    base = tempfile.mkdtemp(prefix="tutti-bench-lmcache-", dir=a.dir)
    n = int(a.chunk_mib * (1 << 20))
    g = torch.Generator().manual_seed(1)
    data = [torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g) for _ in range(a.chunks)]
    total = a.chunks * n
    cap = max(64 << 20, -(-(total * 2) // (2 << 20)) << 20)  # per drive, whole MiB, room to spare
    adapters = {
        "tutti (native_plugin)": {"type": "native_plugin", "module_path": "tutti.lmcache", "class_name": "TuttiL2Client",
                                  "adapter_params": {"emulated_drives": 2, "emulated_capacity_bytes": cap,
                                                     "emulated_dir": os.path.join(base, "tutti"),
                                                     "staging_bytes": max(64 << 20, 2 * n * a.batch),
                                                     "max_chunk_bytes": n}},
        "lmcache fs": {"type": "fs", "base_path": os.path.join(base, "fs")},
        "lmcache fs_native": {"type": "fs_native", "base_path": os.path.join(base, "fs_native")},
    }
    rows = []
    try:
        for name, cfg in adapters.items():
            rows.append(run(name, cfg, data, a.batch))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(f"{a.chunks} chunks of {a.chunk_mib:g} MiB, batches of {a.batch}, every byte checked")
    print(f"{'adapter':24} {'store ch/s':>11} {'load ch/s':>11} {'store CPU us/ch':>16} {'load CPU us/ch':>15}")
    for r in rows:
        print(f"{r['adapter']:24} {r['store_chunks_s']:11.0f} {r['load_chunks_s']:11.0f} "
              f"{r['store_cpu_us_per_chunk']:16.0f} {r['load_cpu_us_per_chunk']:15.0f}")
    t = rows[0]
    for r in rows[1:]:
        print(f"tutti / {r['adapter']}: store {t['store_chunks_s'] / r['store_chunks_s']:.2f}x chunks/s, "
              f"load {t['load_chunks_s'] / r['load_chunks_s']:.2f}x chunks/s; CPU per chunk store "
              f"{t['store_cpu_us_per_chunk'] / r['store_cpu_us_per_chunk']:.2f}x, load "
              f"{t['load_cpu_us_per_chunk'] / r['load_cpu_us_per_chunk']:.2f}x")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"args": vars(a), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
