"""SGLang's L3 backends through SGLang's own HiCacheController, measured in one run.

The same host-pool pages go through the controller's backup thread (``write_storage``: host
pool -> L3) and its prefetch threads (``prefetch``: ``batch_exists`` then the reads, L3 ->
host pool) with each backend:

- ``tutti``: ``tutti.sglang`` (``dynamic`` factory, ``interface_v1``), the pool in this process
  on emulated NVMe drives in RAM (release libtutti);
- ``file``: SGLang's ``HiCacheFile`` on a page-cached file system (tmpfs ``/dev/shm`` by
  default: its best case, no device below it);
- ``mooncake``: SGLang's ``MooncakeStore`` (zero-copy v1) with a local ``mooncake_master`` over
  TCP on 127.0.0.1, when Mooncake is installed (``scripts/setup-mooncake``); the run then moves
  into a private network namespace (``unshare -n``, root).

Per backend and direction: pages/s, GB/s and CPU seconds per GB of this process (every thread:
SGLang's, the backend's, and for tutti the emulated drives' threads, which do with memcpy what
an SSD does by DMA; their share is also shown apart), each as a ratio to tutti. Every page read
back is compared with what was written. Each repetition uses new keys and rotates the order of
the backends; the medians are reported.

    scripts/bench-sglang [--pages 128] [--page 32] [--reps 3] [--backends tutti,file,mooncake] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE.parent / "tests"), str(HERE.parent / "tests" / "sglang")]
_venv = Path(sys.prefix)
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(_venv / "torch-extensions"))
os.environ["PATH"] = f"{_venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"

CLK = os.sysconf("SC_CLK_TCK")


def thread_cpu() -> dict[int, tuple[str, float]]:
    """Every thread of this process: (name, user+system CPU seconds)."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        out[int(tid)] = (name, (int(fields[11]) + int(fields[12])) / CLK)
    return out


def drive_cpu(before: dict, after: dict) -> float:
    """CPU of the emulated drives' threads (named nvme-*) between two snapshots."""
    total = 0.0
    for tid, (name, cpu) in after.items():
        if name.startswith("nvme-"):
            total += cpu - before.get(tid, (name, 0.0))[1]
    return total


class Run:
    """One backend attached to SGLang's controller over a host pool of 2 × pages pages."""

    def __init__(self, name: str, a, extra: dict, backend: str):
        import sglang_env as E
        import torch
        from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost

        self.E, self.torch, self.name, self.page = E, torch, name, a.page
        dev = E.device_pool(tokens=2 * a.page, page=a.page, layers=a.layers, heads=a.heads, head_dim=a.head_dim)
        info = dev.get_device_pool_infos()[0].buffer_info
        self.host = MHATokenToKVPoolHost(
            info, 1.0, 0, a.page, a.layout, pin_memory=False, device="cpu", device_capacity_tokens=dev.size,
            start_layer=0, end_layer=a.layers, host_token_capacity=2 * a.pages * a.page,
        )
        self.ctl = E.controller(dev, self.host, extra, backend=backend, model="bench-model")
        self.src = self.host.alloc(a.pages * a.page)
        E.fill_random(self.host, 1)
        self.page_bytes = self.host.get_data_page(0, flat=True).numel() * self.host.dtype.itemsize

    def _timed(self, fn):
        t0, c0, th0 = time.perf_counter(), time.process_time(), thread_cpu()
        result = fn()
        t1, c1, th1 = time.perf_counter(), time.process_time(), thread_cpu()
        return result, t1 - t0, c1 - c0, drive_cpu(th0, th1)

    def backup(self, tokens, hashes) -> dict:
        ctl = self.ctl

        def go():
            op_id = ctl.write_storage(self.src, tokens, hashes)
            while True:
                op = ctl.ack_backup_queue.get(timeout=600)
                if op.id == op_id:
                    return op.completed_tokens

        done, secs, cpu, drives = self._timed(go)
        return self._report("backup", done // self.page, secs, cpu, drives)

    def prefetch(self, tokens, rid) -> dict:
        ctl, n = self.ctl, len(tokens) // self.page
        # The pages read into hold other random bytes (fill_random covered the whole pool), so a
        # page that was not read does not compare equal.
        dst_holder = {}

        def go():
            op = ctl.prefetch(rid, tokens, None, None)
            ctl.prefetch_hit_queue.get(timeout=600)
            if op.storage_hit_count == 0:
                return 0
            dst = ctl.mem_pool_host.alloc(op.storage_hit_count)
            dst_holder["dst"] = dst
            op.host_indices = dst
            ctl.prefetch_buffer.put(op)
            done = 0
            while True:
                ack = ctl.ack_prefetch_queue.get(timeout=600)
                if ack.operation is not op:
                    continue
                if ack.completed_tokens is not None:
                    done = ack.completed_tokens
                if getattr(ack, "completed_req", False):
                    return done

        done, secs, cpu, drives = self._timed(go)
        dst = dst_holder.get("dst")
        u8 = self.torch.uint8  # bytes, not bf16 values: random bytes hold NaNs, which never compare equal
        same = dst is not None and done == n * self.page and all(
            self.torch.equal(self.host.get_data_page(int(self.src[i * self.page])).view(u8),
                             self.host.get_data_page(int(dst[i * self.page])).view(u8))
            for i in range(n)
        )
        if dst is not None:
            self.host.free(dst)
        r = self._report("prefetch", done // self.page, secs, cpu, drives)
        r["verified"] = bool(same)
        return r

    def _report(self, what, pages, secs, cpu, drives) -> dict:
        gb = pages * self.page_bytes / 1e9
        return {
            "backend": self.name, "phase": what, "pages": pages, "seconds": secs,
            "pages_per_s": pages / secs if secs else 0.0, "gb_per_s": gb / secs if secs else 0.0,
            "cpu_s": cpu, "cpu_s_per_gb": cpu / gb if gb else 0.0,
            "drive_cpu_s_per_gb": drives / gb if gb else 0.0,
        }

    def close(self):
        try:
            self.ctl.storage_backend.clear()
        except Exception:  # noqa: BLE001 - best effort between repetitions
            pass
        self.E.stop(self.ctl)


def _start_mooncake(work: Path):
    import mooncake_cluster_run as mc

    mc.bring_up_lo()
    mc.check_isolated()
    os.environ["MC_TCP_BIND_ADDRESS"] = mc.HOST
    return mc.start_master(work), {
        "master_server_address": f"{mc.HOST}:{mc.RPC_PORT}",
        "metadata_server": f"http://{mc.HOST}:{mc.HTTP_PORT}/metadata",
        "local_hostname": mc.HOST,
        "protocol": "tcp",
        "device_name": "",
        "check_server": False,
    }


def _mooncake_installed() -> str | None:
    try:
        import mooncake.store  # noqa: F401
    except ImportError as e:
        return f"Mooncake is not importable ({e}); scripts/setup-mooncake installs it"
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--heads", type=int, default=8, help="KV heads")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--page", type=int, default=32, help="tokens per page (SGLang --page-size)")
    ap.add_argument("--pages", type=int, default=128, help="pages per backup and per prefetch")
    ap.add_argument("--layout", default="page_first")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--backends", default="tutti,file,mooncake")
    ap.add_argument("--file-dir", default="/dev/shm", help="where the file backend's directory goes")
    ap.add_argument("--drives", type=int, default=2, help="tutti: emulated drives")
    ap.add_argument("--host-threads", type=int, default=2, help="tutti: host executor threads")
    ap.add_argument("--warmup", type=int, default=1,
                    help="unmeasured backup+prefetch passes per backend and repetition, with other keys "
                         "(first-touch page faults of fresh RAM media, tutti's pool filled so the measured "
                         "backup evicts)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    backends = [b for b in a.backends.split(",") if b]
    if set(backends) - {"tutti", "file", "mooncake"} or "tutti" not in backends:
        ap.error("--backends: a list of tutti, file, mooncake that includes tutti (the baseline of the ratios)")
    notes = []
    if "mooncake" in backends:
        why = _mooncake_installed()
        if why:
            notes.append(f"mooncake left out: {why}")
            backends.remove("mooncake")
        elif [n for _, n in socket.if_nameindex()] != ["lo"]:
            try:  # the same command inside a network namespace of its own (root)
                return subprocess.run(["unshare", "-n", "--", sys.executable, *sys.argv]).returncode
            except FileNotFoundError:
                notes.append("mooncake left out: no `unshare` for a private network namespace")
                backends.remove("mooncake")

    import sglang_env as E  # noqa: F401 - SGLang, one rank

    work = Path(tempfile.mkdtemp(prefix="tutti-bench-sglang-"))
    file_dir = Path(tempfile.mkdtemp(prefix="tutti-bench-sglang-file-", dir=a.file_dir))
    page_bytes = 2 * a.layers * a.page * a.heads * a.head_dim * 2
    extras = {
        # About 1.25 × pages fit: after the warm-up the measured backup evicts (a cache at steady state).
        "tutti": ({"interface_v1": 1, "emulated_drives": a.drives, "host_threads": a.host_threads,
                   "emulated_capacity_bytes": ((a.pages * page_bytes * 5 // 4 // a.drives) >> 20 << 20) + (16 << 20)},
                  "dynamic"),
        "file": ({"file_storage_path": str(file_dir)}, "file"),
    }
    master = None
    if "mooncake" in backends:
        master, mc = _start_mooncake(work)
        seg = a.pages * page_bytes * 3 + (256 << 20)
        extras["mooncake"] = (dict(mc, global_segment_size=seg), "mooncake")
    results: list[dict] = []
    files = 0
    try:
        for rep in range(a.reps):
            order = backends[rep % len(backends):] + backends[: rep % len(backends)]
            for name in order:
                extra, kind = extras[name]
                run = Run(name, a, extra, kind)
                try:
                    base = 1_000_000 * (1 + rep) + 10_000_000 * (1 + backends.index(name))
                    for w in range(a.warmup + 1):  # unmeasured passes first, with other keys
                        start = base + 100_000 * w
                        tokens = list(range(start, start + a.pages * a.page))
                        hashes = E.hashes_for(tokens, a.page)
                        b, f = run.backup(tokens, hashes), run.prefetch(tokens, f"{name}-{rep}-{w}")
                    results.append(dict(b, rep=rep))
                    results.append(dict(f, rep=rep))
                    if name == "tutti":
                        files = run.ctl.storage_backend.rt.info().files
                finally:
                    run.close()
                    del run
    finally:
        if master is not None:
            master.kill()
            master.wait(10)
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(file_dir, ignore_errors=True)
    summary = summarize(results, backends)
    report = {"config": vars(a), "page_bytes": page_bytes, "tutti_pool_pages": files, "notes": notes, "runs": results,
              "summary": summary}
    if a.json:
        print(json.dumps(report, indent=2))
    else:
        print_table(report)
    bad = [r for r in results if r["phase"] == "prefetch" and not r["verified"]]
    if bad:
        print(f"sglang_hicache: {len(bad)} prefetch runs did not read back every page exactly", file=sys.stderr)
        return 1
    return 0


def summarize(results: list[dict], backends: list[str]) -> dict:
    out: dict = {}
    for phase in ("backup", "prefetch"):
        med = {}
        for b in backends:
            rs = [r for r in results if r["backend"] == b and r["phase"] == phase]
            med[b] = {k: statistics.median(r[k] for r in rs)
                      for k in ("pages_per_s", "gb_per_s", "cpu_s_per_gb", "drive_cpu_s_per_gb")}
        t = med["tutti"]
        for b in backends:
            m = med[b]
            m["pages_per_s_vs_tutti"] = m["pages_per_s"] / t["pages_per_s"] if t["pages_per_s"] else 0.0
            m["gb_per_s_vs_tutti"] = m["gb_per_s"] / t["gb_per_s"] if t["gb_per_s"] else 0.0
            m["cpu_per_gb_vs_tutti"] = m["cpu_s_per_gb"] / t["cpu_s_per_gb"] if t["cpu_s_per_gb"] else 0.0
        out[phase] = med
    return out


def print_table(report: dict) -> None:
    c = report["config"]
    print(f"SGLang HiCache L3 through HiCacheController: {c['pages']} pages of {c['page']} tokens "
          f"({report['page_bytes'] / 2**20:.1f} MiB each: {c['layers']} layers × {c['heads']} KV heads × "
          f"{c['head_dim']} × bf16, K+V), layout {c['layout']}, median of {c['reps']} after {c['warmup']} warm-up "
          f"pass(es); tutti's pool holds {report['tutti_pool_pages']} pages; load {os.getloadavg()[0]:.1f}")
    for n in report["notes"]:
        print(f"  note: {n}")
    print(f"{'phase':9} {'backend':9} {'pages/s':>9} {'GB/s':>7} {'CPU s/GB':>9} {'(drives)':>9} "
          f"{'pages/s vs tutti':>17} {'CPU/GB vs tutti':>16}")
    for phase, med in report["summary"].items():
        for b, m in med.items():
            print(f"{phase:9} {b:9} {m['pages_per_s']:9.0f} {m['gb_per_s']:7.2f} {m['cpu_s_per_gb']:9.2f} "
                  f"{m['drive_cpu_s_per_gb']:9.2f} {m['pages_per_s_vs_tutti']:16.2f}× {m['cpu_per_gb_vs_tutti']:15.2f}×")


if __name__ == "__main__":
    sys.exit(main())
