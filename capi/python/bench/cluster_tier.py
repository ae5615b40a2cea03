"""Time to first token on node B for one prefix: loaded from Mooncake (computed on node A), loaded
from B's own tutti pool, and recomputed; ratios from one run.

Two real vLLM processes (CPU build) with the tutti connector and the Mooncake tier, a
mooncake_master, all inside a private network namespace on 127.0.0.1 (the script re-runs
itself under ``unshare -n`` when it is not in one; that needs root). vLLM's own prefix cache
is off, so a prefix comes from tutti (local or remote) or is computed. Per repetition: node A
computes prefix P_r (+ a suffix) and publishes it (one extra first repetition, B's first transfer from A's
segment, which sets up the transfer engine's connection, is reported apart); node B then asks for P_r + s1 (remote hit:
Mooncake → B's KV, verified, then kept in B's pool), P_r + s2 (local hit: B's pool) and a fresh
prefix F_r + s3 of the same length (recompute). TTFT = wall time of a generate with
max_tokens=1. Prints medians and ratios; ``--json`` prints one JSON object.

    scripts/bench-mooncake [--prefix 1536] [--suffix 32] [--reps 3] [--json]
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
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE.parent / "tests"), str(HERE)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="model dir (default: the venv's bench-llama)")
    ap.add_argument("--prefix", type=int, default=1536, help="prefix tokens (whole 32-token blocks)")
    ap.add_argument("--suffix", type=int, default=32)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if a.prefix % 32 or a.prefix <= 0 or a.suffix <= 0 or a.reps <= 0:
        ap.error("--prefix must be a positive multiple of 32; --suffix and --reps positive")
    if [n for _, n in socket.if_nameindex()] != ["lo"]:
        # Not isolated yet: the same command inside a network namespace of its own.
        try:
            return subprocess.run(["unshare", "-n", "--", sys.executable, *sys.argv]).returncode
        except FileNotFoundError:
            print("cluster_tier: needs `unshare` (util-linux) and root for a private network namespace",
                  file=sys.stderr)
            return 1
    import mooncake_cluster_run as run
    import tiny_llama

    venv = Path(os.environ.get("TUTTI_VLLM_VENV") or Path.home() / ".cache/tutti/vllm-venv")
    model = a.model or str(tiny_llama.build(venv / "tutti-models", "bench-llama"))
    run.bring_up_lo()
    run.check_isolated()
    os.environ["MC_TCP_BIND_ADDRESS"] = run.HOST
    work = Path(tempfile.mkdtemp(prefix="tutti-bench-mooncake-"))
    master = run.start_master(work)
    total = a.prefix + a.suffix
    blocks = a.prefix // 32
    per_block = None
    spec = {"model": model, "max_model_len": total + 64, "kv_bytes": 512 << 20, "start_s": 600}
    mc = {"segment_bytes": 1 << 30, "buffer_bytes": 64 << 20, "timeout_ms": 30000}
    vocab = 2000
    res: dict = {}
    nodes = []
    try:
        na = run.Node("a", mc, vllm=spec)
        nodes.append(na)
        nb = run.Node("b", mc, vllm=spec)
        nodes.append(nb)
        remote, local, recompute, cached = [], [], [], []
        first_contact = None
        for r in range(-1, a.reps):  # rep -1: B's first contact with A's segment, reported apart
            prefix = [(7 * i + 3 + 101 * r) % vocab for i in range(a.prefix)]
            fresh = [(13 * i + 5 + 17 * r) % vocab for i in range(a.prefix)]
            sfx = [[(11 * r + 3 * k + j) % vocab for j in range(a.suffix)] for k in range(4)]
            na("gen", prefix + sfx[0], 1)
            if not na("flush"):
                raise RuntimeError("node A's publications did not finish")
            before = nb("stats")
            o = nb("gen", prefix + sfx[1], 1)
            after = nb("stats")
            got = after["remote_loaded_blocks"] - before["remote_loaded_blocks"]
            if got != blocks:
                raise RuntimeError(f"rep {r}: node B loaded {got} of {blocks} blocks from Mooncake")
            per_block = (after["remote_bytes_loaded"] - before["remote_bytes_loaded"]) // blocks
            if r < 0:
                first_contact = o["took_s"]
                continue
            remote.append(o["took_s"])
            cached.append(o["cached"])
            o = nb("gen", prefix + sfx[2], 1)
            if o["cached"] != a.prefix or nb("stats")["remote_loaded_blocks"] != after["remote_loaded_blocks"]:
                raise RuntimeError(f"rep {r}: the second request on B was not a local hit ({o['cached']} cached)")
            local.append(o["took_s"])
            o = nb("gen", fresh + sfx[3], 1)
            if o["cached"] != 0:
                raise RuntimeError(f"rep {r}: the fresh prefix was not recomputed ({o['cached']} cached)")
            recompute.append(o["took_s"])
        res = {
            "model": os.path.basename(model), "params": tiny_llama.params(model), "prefix_tokens": a.prefix,
            "suffix_tokens": a.suffix, "reps": a.reps, "block_bytes": per_block,
            "ttft_remote_s": statistics.median(remote), "ttft_local_s": statistics.median(local),
            "ttft_recompute_s": statistics.median(recompute), "cached_tokens_remote": cached,
            "transport": "tcp over loopback (127.0.0.1), one machine",
            "ttft_remote_first_contact_s": first_contact, "ttft_remote_each_s": remote, "ttft_local_each_s": local, "ttft_recompute_each_s": recompute,
            "node_b_tier": nb("stats"),
        }
        res["recompute_over_remote"] = res["ttft_recompute_s"] / res["ttft_remote_s"]
        res["recompute_over_local"] = res["ttft_recompute_s"] / res["ttft_local_s"]
        res["remote_over_local"] = res["ttft_remote_s"] / res["ttft_local_s"]
    finally:
        for n in reversed(nodes):
            n.close()
        master.kill()
        master.wait(10)
        shutil.rmtree(work, ignore_errors=True)
    if a.json:
        print(json.dumps(res))
    else:
        print(f"model {res['model']} ({res['params'] / 1e6:.1f} M params, float32), vLLM CPU, prefix {a.prefix} "
              f"+ suffix {a.suffix} tokens, median of {a.reps}; Mooncake over {res['transport']}")
        print(f"TTFT prefix from Mooncake (node A's KV): {res['ttft_remote_s'] * 1e3:8.1f} ms")
        print(f"  (the first one, B's first contact with A: {res['ttft_remote_first_contact_s'] * 1e3:.1f} ms)")
        print(f"TTFT prefix from B's own tutti pool:     {res['ttft_local_s'] * 1e3:8.1f} ms")
        print(f"TTFT prefix recomputed:                  {res['ttft_recompute_s'] * 1e3:8.1f} ms")
        print(f"ratios: recompute/remote {res['recompute_over_remote']:.2f}x, recompute/local "
              f"{res['recompute_over_local']:.2f}x, remote/local {res['remote_over_local']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
