"""The host executor's three modes (inline, persistent, launch) compared in one run: ``tutti bench
retrieve`` on one executor thread (rounds interleaved across the modes; each round's tutti ÷
memcpy ratio is taken within that round, so machine load between rounds cancels), then TTFT in
real vLLM (``vllm_ttft.py --host-modes``: one engine per mode, loading and recomputing the
prefix interleaved in each).

    scripts/bench-host-modes [--rounds 5] [--reps 12] [--md PATH] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
MODES = ("inline", "persistent", "launch")
# (name, tutti bench retrieve arguments): the bench model's 960-token prefix, and a long
# request of the default (Llama-3-8B) geometry.
SHAPES = (
    ("bench-llama 960 tokens", ["--layers", "8", "--kv-heads", "4", "--head-dim", "64", "--block-tokens", "32",
                                "--dtype", "f32", "--request-blocks", "30"]),
    ("Llama-3-8B 4096 tokens", ["--request-blocks", "256"]),
)


def retrieve(tutti: str, mode: str, args: list[str]) -> dict:
    done = subprocess.run([tutti, "bench", "retrieve", "--executor", mode, "--exec-blocks", "1", "--no-sweep",
                           "--quiet", "--json", "--reps", "5", *args], capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        sys.exit(f"tutti bench retrieve --executor {mode} failed: {done.stderr[-2000:]}")
    runs = {r["method"]: r for r in json.loads(done.stdout)["request"]["runs"]}
    t, m = runs["tutti"], runs["memcpy"]
    if not (t["verified"] and m["verified"]):
        sys.exit(f"tutti bench retrieve --executor {mode}: bytes not verified")
    return {"gb_per_s": t["gb_per_s"], "vs_memcpy": t["gb_per_s"] / m["gb_per_s"],
            "cpu_s_per_gb": t["process_cpu_s_per_gb"], "wait_us_per_layer": t["wait_cpu_us_per_layer"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=12, help="rounds of each vLLM engine (vllm_ttft.py --reps)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--md", default=None)
    a = ap.parse_args()
    tutti = os.environ["TUTTI_BIN"]
    res: dict = {"retrieve": {}, "rounds": a.rounds}
    for shape, args in SHAPES:
        runs: dict[str, list[dict]] = {m: [] for m in MODES}
        for r in range(a.rounds):
            for j in range(len(MODES)):
                mode = MODES[(r + j) % len(MODES)]
                runs[mode].append(retrieve(tutti, mode, args))
                print(f"  retrieve {shape} round {r} {mode}: {runs[mode][-1]['gb_per_s']:.2f} GB/s", file=sys.stderr,
                      flush=True)
        res["retrieve"][shape] = {
            m: {k: statistics.median(x[k] for x in v) for k in v[0]} for m, v in runs.items()
        }
    done = subprocess.run([sys.executable, str(HERE / "vllm_ttft.py"), "--paces", "", "--host-modes", ",".join(MODES),
                           "--reps", str(a.reps), "--json"], capture_output=True, text=True, timeout=3600)
    lines = [l for l in done.stdout.splitlines() if l.startswith("{")]
    if done.returncode != 0 or not lines:
        sys.exit(f"vllm_ttft.py failed: {done.stderr[-3000:]}")
    res["vllm"] = json.loads(lines[-1])
    text = report(res)
    if a.md:
        Path(a.md).write_text(text)
    print(json.dumps(res) if a.json else text)


def report(r: dict) -> str:
    v = r["vllm"]
    lines = [f"tutti bench retrieve, one executor thread, median of {r['rounds']} interleaved rounds "
             f"({v['cpus']} CPUs, emulated drives with RAM media; commit {v['commit']})", ""]
    for shape, modes in r["retrieve"].items():
        lines += [f"{shape}:", "", "| host_mode | GB/s | tutti ÷ memcpy | process CPU s/GB | wait CPU µs/layer |",
                  "|---|---|---|---|---|"]
        for m, x in modes.items():
            lines.append(f"| {m} | {x['gb_per_s']:.2f} | {x['vs_memcpy']:.2f} | {x['cpu_s_per_gb']:.3f} | "
                         f"{x['wait_us_per_layer']:.0f} |")
        lines.append("")
    lim = v["limit"]
    lines += [f"vLLM {v['vllm']} CPU, {v['model']}, prefix {v['prefix_tokens']} + suffix {v['suffix_tokens']} "
              f"tokens, unpaced drives: TTFT ms (median / p90), loading the prefix and recomputing it, interleaved "
              f"in one engine per mode ({v['reps']} rounds); vLLM's own prefix cache (limit): "
              f"{lim['median_s'] * 1e3:.0f} / {lim['p90_s'] * 1e3:.0f} ms", "",
              "| host_mode | load | recompute | load ÷ recompute | load ÷ limit | forward pass's wait for the load, ms |",
              "|---|---|---|---|---|---|"]
    for mode, m in v["host_modes"].items():
        al, rc = m["always"], m["recompute"]
        lines.append(f"| {mode} | {al['median_s'] * 1e3:.1f} / {al['p90_s'] * 1e3:.1f} | "
                     f"{rc['median_s'] * 1e3:.0f} / {rc['p90_s'] * 1e3:.0f} | {al['median_s'] / rc['median_s']:.3f} | "
                     f"{al['median_s'] / lim['median_s']:.2f} | {m['load_wait_s_per_load'] * 1e3:.2f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
