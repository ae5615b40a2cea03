"""vLLM's secondary tiers side by side: the tutti tier against vLLM's ``fs`` tier, in one run.

Each backend is built by vLLM's own ``TieringOffloadingSpec`` (its primary tier: the shared mmap
region in /dev/shm; the secondary tier through ``SecondaryTierFactory``) and driven through the
``SecondaryTierManager`` calls vLLM's ``TieringOffloadingManager`` makes: ``submit_store`` of
primary chunks in jobs of ``--batch`` chunks (a cascade), then ``submit_load`` of the same
chunks into other primary slots (a promotion), ``get_finished_jobs`` polled until every job
reported. Backends:

- ``tutti``: the tutti tier on emulated NVMe drives in RAM (release libtutti), the drives DMA
  (here: memcpy by the emulated controllers' threads) into vLLM's primary region;
- ``fs-tmpfs``: vLLM's ``fs`` tier with its root on tmpfs (``/dev/shm``; O_DIRECT is refused
  there, so buffered I/O into the page cache: RAM, as tutti's emulated drives are);
- ``fs-ext4``: vLLM's ``fs`` tier on an ext4 directory (``--ext4-dir``; default /var/tmp, which
  must be ext4, else a loop-mounted ext4 image is made when run as root), with O_DIRECT.

Per backend and direction: chunks/s and host CPU per chunk of this process (every thread;
tutti's emulated drives' threads, which do what an SSD's DMA does, also shown apart), each as a
ratio to tutti; medians over ``--reps`` passes with new keys, backends in rotating order, one
unmeasured warm-up pass each. Every chunk loaded is compared byte for byte with what was stored.

    scripts/bench-vllm-tier [--chunks 64] [--chunk-mib 2] [--batch 8] [--reps 3] [--json]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE), str(HERE.parent / "tests" / "vllm_tier")]

import numpy as np  # noqa: E402
from sglang_hicache import drive_cpu, thread_cpu  # noqa: E402  (stdlib only: /proc thread CPU)


def _fs_type(path: str) -> str:
    out = subprocess.run(["stat", "-f", "-c", "%T", path], capture_output=True, text=True)
    return out.stdout.strip()


class Ext4:
    """An ext4 directory: ``--ext4-dir`` when it is ext4, else a loop-mounted image (root)."""

    def __init__(self, base: str, size_mib: int):
        self.mount: str | None = None
        self.image: str | None = None
        os.makedirs(base, exist_ok=True)
        if _fs_type(base) in ("ext2/ext3", "ext4"):  # stat names ext4 "ext2/ext3"
            self.dir = tempfile.mkdtemp(prefix="tutti-bench-fs-", dir=base)
            self.how = f"ext4 directory {base}"
            return
        if os.geteuid() != 0:
            raise RuntimeError(f"{base} is not ext4 and a loop-mounted image needs root")
        self.image = os.path.join(base, "tutti-bench-ext4.img")
        self.mount = tempfile.mkdtemp(prefix="tutti-bench-ext4-")
        subprocess.run(["truncate", "-s", f"{size_mib}M", self.image], check=True)
        subprocess.run(["mkfs.ext4", "-q", "-F", self.image], check=True)
        subprocess.run(["mount", "-o", "loop", self.image, self.mount], check=True)
        self.dir = self.mount
        self.how = f"loop-mounted ext4 image in {base}"

    def close(self) -> None:
        if self.mount:
            subprocess.run(["umount", self.mount], check=False)
            os.rmdir(self.mount)
            os.unlink(self.image)
        else:
            shutil.rmtree(self.dir, ignore_errors=True)


def cpu_now() -> tuple[float, dict]:
    t = os.times()
    return t.user + t.system, thread_cpu()


def run_jobs(tier, jobs, timeout: float = 600.0) -> tuple[float, list]:
    """Submits every job (stores or loads) and polls until each reported; (seconds, results)."""
    t0 = time.perf_counter()
    for j in jobs:
        (tier.submit_load if j.is_promotion else tier.submit_store)(j)
    want = {j.job_id for j in jobs}
    results = []
    deadline = time.monotonic() + timeout
    while want and time.monotonic() < deadline:
        for r in tier.get_finished_jobs():
            want.discard(r.job_id)
            results.append(r)
        if want:
            time.sleep(0.0002)
    if want:
        raise RuntimeError(f"{len(want)} jobs unfinished after {timeout} s")
    return time.perf_counter() - t0, results


def one_pass(stack, n: int, batch: int, tag: str, next_id) -> dict:
    from tier_support import job, key

    tier, chunks = stack.tier, stack.chunks
    keys = [key(int.from_bytes(hashlib.blake2b(f"{tag}/{i}".encode(), digest_size=8).digest(), "big"))
            for i in range(n)]
    src = list(range(n))
    dst = list(range(n, 2 * n))
    stores = [job(next_id(), keys[i:i + batch], src[i:i + batch]) for i in range(0, n, batch)]
    loads = [job(next_id(), keys[i:i + batch], dst[i:i + batch], promotion=True) for i in range(0, n, batch)]
    out = {}
    for what, jobs in (("store", stores), ("load", loads)):
        if what == "load":
            chunks[n:2 * n] = 0
        c0, th0 = cpu_now()
        secs, results = run_jobs(tier, jobs)
        c1, th1 = cpu_now()
        ok = all(r.success for r in results)
        out[what] = {"s": secs, "cpu_s": c1 - c0, "drive_cpu_s": drive_cpu(th0, th1), "ok": ok}
    same = all(chunks[n + i].tobytes() == chunks[i].tobytes() for i in range(n))
    out["bytes_equal"] = same
    return out


def backends(a, tmp: str, ext4: Ext4 | None) -> dict:
    chunk = a.chunk_mib << 20
    cap = max(64 << 20, ((a.reps + 1) * a.chunks * chunk * 5 // 4) // 2)
    cap = (cap + (1 << 20) - 1) // (1 << 20) << 20
    out = {"tutti": {"type": "tutti", "emulated_drives": 2, "emulated_capacity_bytes": cap,
                     "n_read_threads": a.tutti_threads, "n_write_threads": a.tutti_threads,
                     "host_threads": a.host_threads, **({"host_mode": "launch"} if a.host_threads > 1 else {})},
           "fs-tmpfs": {"type": "fs", "root_dir": os.path.join(tmp, "fs"), "n_read_threads": a.fs_threads,
                        "n_write_threads": a.fs_threads}}
    if ext4 is not None:
        out["fs-ext4"] = {"type": "fs", "root_dir": ext4.dir, "n_read_threads": a.fs_threads,
                          "n_write_threads": a.fs_threads}
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--chunks", type=int, default=64, help="chunks per pass (default 64)")
    p.add_argument("--chunk-mib", type=int, default=2, help="MiB per chunk (default 2: 16 tokens of Llama-3-8B)")
    p.add_argument("--batch", type=int, default=8, help="chunks per job (default 8)")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--fs-threads", type=int, default=16, help="the fs tier's read and write threads (vLLM's default 16)")
    p.add_argument("--tutti-threads", type=int, default=2, help="the tutti tier's read and write threads (default 2)")
    p.add_argument("--host-threads", type=int, default=2, help="tutti's host executor threads (default 2)")
    p.add_argument("--ext4-dir", default="/var/tmp", help="where the ext4 fs tier writes (default /var/tmp)")
    p.add_argument("--backends", default="tutti,fs-tmpfs,fs-ext4")
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    from tier_support import build

    from tutti import _vllm_plugin

    _vllm_plugin.register()
    wanted = a.backends.split(",")
    tmp = tempfile.mkdtemp(prefix="tutti-bench-tier-", dir="/dev/shm")
    ext4 = None
    notes = []
    if "fs-ext4" in wanted:
        try:
            ext4 = Ext4(a.ext4_dir, size_mib=(a.reps + 2) * a.chunks * a.chunk_mib * 2 + 256)
            notes.append(f"fs-ext4: {ext4.how}")
        except (RuntimeError, subprocess.CalledProcessError, OSError) as e:
            notes.append(f"fs-ext4 left out: {e}")
            print(f"bench-vllm-tier: fs-ext4 left out: {e}", file=sys.stderr)
    ids = iter(range(1 << 62))
    runs: dict[str, list] = {}
    try:
        cfgs = {k: v for k, v in backends(a, tmp, ext4).items() if k in wanted}
        stacks = {name: build([cfg], num_chunks=2 * a.chunks, chunk_bytes=a.chunk_mib << 20) for name, cfg in cfgs.items()}
        try:
            names = list(stacks)
            for name in names:  # warm-up: fresh RAM media and the page cache fault on first touch
                stacks[name].chunks[:a.chunks] = np.random.default_rng(1).integers(
                    0, 256, (a.chunks, a.chunk_mib << 20), dtype=np.uint8)
                one_pass(stacks[name], a.chunks, a.batch, f"w{name}", lambda: next(ids))
            for rep in range(a.reps):
                order = names[rep % len(names):] + names[:rep % len(names)]
                for name in order:
                    r = one_pass(stacks[name], a.chunks, a.batch, f"r{rep}{name}", lambda: next(ids))
                    if not (r["bytes_equal"] and r["store"]["ok"] and r["load"]["ok"]):
                        raise RuntimeError(f"{name}: a job failed or a chunk came back different: {r}")
                    runs.setdefault(name, []).append(r)
        finally:
            for s in stacks.values():
                s.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if ext4 is not None:
            ext4.close()
    n = a.chunks
    report = {"chunks": n, "chunk_bytes": a.chunk_mib << 20, "batch": a.batch, "reps": a.reps,
              "load_average": os.getloadavg(), "notes": notes, "backends": {}}
    for name, rs in runs.items():
        row = {}
        for what in ("store", "load"):
            row[what] = {
                "chunks_per_s": statistics.median(n / r[what]["s"] for r in rs),
                "cpu_ms_per_chunk": statistics.median(1e3 * r[what]["cpu_s"] / n for r in rs),
                "drive_cpu_ms_per_chunk": statistics.median(1e3 * r[what]["drive_cpu_s"] / n for r in rs),
            }
        report["backends"][name] = row
    base = report["backends"].get("tutti")
    if a.json:
        report["runs"] = runs
        print(json.dumps(report, indent=2))
        return 0
    print(f"vLLM secondary tiers: {n} chunks of {a.chunk_mib} MiB per pass, {a.batch} per job, median of {a.reps}; "
          f"load average {report['load_average'][0]:.1f}")
    for note in notes:
        print(f"  {note}")
    print(f"{'direction':9} {'backend':9} {'chunks/s':>9} {'vs tutti':>8} {'CPU ms/chunk':>14} {'vs tutti':>8}")
    for what in ("store", "load"):
        for name, row in report["backends"].items():
            r = row[what]
            ratio = r["chunks_per_s"] / base[what]["chunks_per_s"] if base else float("nan")
            cratio = r["cpu_ms_per_chunk"] / base[what]["cpu_ms_per_chunk"] if base else float("nan")
            drive = f" ({r['drive_cpu_ms_per_chunk']:.2f})" if name == "tutti" else ""
            print(f"{what:9} {name:9} {r['chunks_per_s']:9.0f} {ratio:7.2f}x {r['cpu_ms_per_chunk']:7.2f}{drive:7} "
                  f"{cratio:7.2f}x")
    print("CPU: every thread of this process; tutti's emulated drives' share (their memcpy stands in for an "
          "SSD's DMA) in parentheses")
    return 0


if __name__ == "__main__":
    sys.exit(main())
