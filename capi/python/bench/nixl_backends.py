"""NIXL's POSIX backend on a file vs the tutti plugin on emulated drives, one run (scripts/bench-nixl).

Both go through the real NIXL agent with the same descriptors: `blocks` blocks of one tutti
block's bytes (the geometry below), moved in transfers of `batch` descriptors, DRAM -> storage
(WRITE) then storage -> DRAM (READ), every byte of the read pass checked. POSIX writes
(fd, offset) ranges of one preallocated file in `--dir`; tutti stores keyed objects on
`--drives` emulated drives whose media are files in `--dir` (same filesystem, same page cache).
Each figure is the median over `reps` passes; the ratio is tutti's rate over POSIX's.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

# 8 layers, 8 KV heads of 128 dims, 16-token blocks, f16: one block = 8 x 2 x 32 KiB = 512 KiB.
GEOMETRY = {"layers": "8", "kv_heads": "8", "head_dim": "128", "tokens_per_block": "16", "dtype": "f16"}
BLOCK = 8 * 2 * 16 * 8 * 128 * 2


def run(a, op, local, remote, deadline_s=300.0):
    h = a.initialize_xfer(op, local, remote, a.name)
    try:
        st = a.transfer(h)
        end = time.monotonic() + deadline_s
        while st == "PROC":
            if time.monotonic() > end:
                raise TimeoutError(f"{op} in progress after {deadline_s} s")
            st = a.check_xfer_state(h)
        if st != "DONE":
            raise RuntimeError(f"{op} ended {st}")
    finally:
        a.release_xfer_handle(h)


def passes(a, region, addr, remote_for, blocks, batch, reps, expect):
    """Median seconds of a WRITE pass and a READ pass over every block; remote_for(rep) gives a
    pass's remote descriptors (tutti's are new keys each pass: a stored key is not rewritten)."""
    wr, rd = [], []
    for rep in range(reps):
        remote_descs = remote_for(rep)
        region[:] = expect
        t = time.perf_counter()
        for lo in range(0, blocks, batch):
            idx = range(lo, min(lo + batch, blocks))
            local = a.get_xfer_descs([(addr + i * BLOCK, BLOCK, 0) for i in idx], "DRAM")
            run(a, "WRITE", local, a.get_xfer_descs([remote_descs[i] for i in idx], remote_descs.mem))
        wr.append(time.perf_counter() - t)
        region[:] = 0
        t = time.perf_counter()
        for lo in range(0, blocks, batch):
            idx = range(lo, min(lo + batch, blocks))
            local = a.get_xfer_descs([(addr + i * BLOCK, BLOCK, 0) for i in idx], "DRAM")
            run(a, "READ", local, a.get_xfer_descs([remote_descs[i] for i in idx], remote_descs.mem))
        rd.append(time.perf_counter() - t)
        if not np.array_equal(region, expect):
            raise AssertionError("the READ pass did not bring back the bytes written")
    return statistics.median(wr), statistics.median(rd)


class Descs(list):
    def __init__(self, items, mem):
        super().__init__(items)
        self.mem = mem


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--plugins", required=True, help="NIXL_PLUGIN_DIR holding libplugin_TUTTI.so")
    ap.add_argument("--blocks", type=int, default=256)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--drives", type=int, default=4)
    ap.add_argument("--dir", default=None, help="where the POSIX file and the emulated media live")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    # The wheel's POSIX plugin beside ours, in one plugin directory.
    from importlib.util import find_spec

    plugins = Path(args.plugins)
    wheel = Path(list(find_spec("nixl_cu13").submodule_search_locations)[0]).parent / "nixl_cu13.libs" / "nixl"
    link = plugins / "libplugin_POSIX.so"
    if not link.exists():
        link.symlink_to(wheel / "libplugin_POSIX.so")
    os.environ["NIXL_PLUGIN_DIR"] = str(plugins)
    from nixl._api import nixl_agent, nixl_agent_config

    import logging

    logging.getLogger("nixl").setLevel(logging.WARNING)  # its INFO lines would mix with the report

    work = Path(args.dir or tempfile.mkdtemp(prefix="tutti-bench-nixl-"))
    work.mkdir(parents=True, exist_ok=True)
    total = args.blocks * BLOCK
    m = mmap.mmap(-1, total)
    region = np.frombuffer(m, dtype=np.uint8)
    addr = region.ctypes.data
    expect = np.random.default_rng(1).integers(0, 256, total, dtype=np.uint8)
    results = {}

    # POSIX: one preallocated file, (fd, offset) per block.
    a = nixl_agent("bench-posix", nixl_agent_config(enable_prog_thread=False, backends=[]))
    a.create_backend("POSIX", {})
    path = work / "posix.bin"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    os.posix_fallocate(fd, 0, total)
    a.register_memory([(addr, total, 0, "")], "DRAM", backends=["POSIX"])
    a.register_memory([(0, total, fd, str(path))], "FILE", backends=["POSIX"])
    file_descs = Descs([(i * BLOCK, BLOCK, fd) for i in range(args.blocks)], "FILE")
    w, r = passes(a, region, addr, lambda rep: file_descs, args.blocks, args.batch, args.reps, expect)
    results["posix"] = {"write_s": w, "read_s": r}
    del a
    os.close(fd)
    path.unlink()

    # tutti: one keyed object per block on emulated drives with file media.
    cap_mib = max(64, (total * 3 // args.drives) >> 20)  # a pass's objects fit; older passes are evicted
    a = nixl_agent("bench-tutti", nixl_agent_config(enable_prog_thread=False, backends=[]))
    a.create_backend("TUTTI", {**GEOMETRY, "pool_dir": str(work / "pool"), "open_mode": "create",
                               "emulated_count": str(args.drives), "emulated_capacity_mb": str(cap_mib)})
    a.register_memory([(addr, total, 0, "")], "DRAM", backends=["TUTTI"])

    def objects(rep):
        devs = range(rep * args.blocks, (rep + 1) * args.blocks)
        a.register_memory([(0, BLOCK, d, f"bench/{d}") for d in devs], "OBJ", backends=["TUTTI"])
        return Descs([(0, BLOCK, d) for d in devs], "OBJ")

    w, r = passes(a, region, addr, objects, args.blocks, args.batch, args.reps, expect)
    results["tutti"] = {"write_s": w, "read_s": r}
    del a

    for v in results.values():
        v["write_gbps"] = total / v["write_s"] / 1e9
        v["read_gbps"] = total / v["read_s"] / 1e9
    ratios = {d: results["tutti"][f"{d}_gbps"] / results["posix"][f"{d}_gbps"] for d in ("write", "read")}
    out = {"blocks": args.blocks, "block_bytes": BLOCK, "batch": args.batch, "reps": args.reps,
           "drives": args.drives, "dir": str(work), "results": results, "tutti_over_posix": ratios}
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(f"{args.blocks} blocks of {BLOCK >> 10} KiB, {args.batch} descriptors per transfer, "
              f"median of {args.reps}, media in {work}")
        print(f"{'backend':8} {'write GB/s':>11} {'read GB/s':>10}")
        for k, v in results.items():
            print(f"{k:8} {v['write_gbps']:11.2f} {v['read_gbps']:10.2f}")
        print(f"tutti/posix: write {ratios['write']:.2f}x, read {ratios['read']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
