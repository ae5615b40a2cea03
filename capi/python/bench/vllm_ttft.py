"""Time to first token in real vLLM (CPU build): a long shared prefix recomputed, loaded from tutti
always, or loaded only when the break-even rule expects loading to win — on emulated drives paced
from unpaced down to slower than recomputing — and vLLM's own prefix cache as the limit.

Every request is the prefix + a fresh suffix, served one at a time; TTFT = wall time of a
generate with max_tokens=1. Engines, in order:

* ``limit``: no connector, vLLM's prefix cache on (the prefix is computed once, then reused);
* ``recompute``: no connector, prefix cache off (every prompt computed whole);
* one engine per pace with the tutti connector (prefix cache off, so the prefix comes from tutti
  or from compute) on ``--drives`` emulated drives whose reads are paced (writes are not). Its
  requests interleave three policies, in rotating order, so that each is measured under the same
  machine load: ``always`` (``load_policy`` "always"), ``breakeven`` (the rule) and
  ``recompute`` (the same prompt with ``skip_reading_prefix_cache``: vLLM ignores the hit and
  computes the prompt whole, tutti attached). The rule learns from every request's timings;
  its counters include the decisions vLLM discarded for the recompute requests;
* with ``--host-modes``, one engine per host executor mode on unpaced drives, interleaving
  ``always`` and ``recompute`` requests.

Each tutti engine first serves ``--warmup`` requests (the first computes and stores the prefix,
the next ones hit it: the rule's first, learning load is among them), then ``--reps`` rounds.

Paces: ``unpaced``; ``nvme4``: 7 GB/s a drive (a real NVMe drive; four with the default
``--drives 4``); ``fast``, ``between`` and ``slow``: a rate at which reading the prefix takes 0.5x,
1.5x and 3x the time it takes to recompute here. That time is the unpaced engine's recompute
median less its always-load median (the unpaced engine runs first), or without it the separate
engines' recompute median less the limit's.

Prints a table (or ``--json``); with ``--md PATH`` also writes it as Markdown.

    scripts/bench-vllm [--prefix 960] [--suffix 32] [--reps 16] [--warmup 4] [--drives 4]
                       [--paces unpaced,nvme4,fast,between,slow] [--host-modes inline,persistent,launch]
                       [--json] [--md PATH]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")  # 2 shared cores: no pinning
os.environ.setdefault("OMP_NUM_THREADS", "1")  # oversubscribed OpenMP barriers make TTFT swing 10x here
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

VOCAB = 2000
NVME_BYTES_PER_SEC = 7_000_000_000
RELATIVE_PACES = {"fast": 0.5, "between": 1.5, "slow": 3.0}  # load time ÷ recompute time of the prefix


def pct(xs: list[float], q: float) -> float:
    """The q-quantile, linearly interpolated (q=0.9: p90)."""
    s = sorted(xs)
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def summary(ts: list[float]) -> dict:
    return {"median_s": statistics.median(ts), "p90_s": pct(ts, 0.9), "all_s": ts}


class Bench:
    def __init__(self, a, model: str):
        self.a = a
        self.model = model
        self.prefix = [(7 * i + 3) % VOCAB for i in range(a.prefix)]
        self.n = 0  # requests served: every one gets a fresh suffix

    def prompt(self) -> list[int]:
        self.n += 1
        return self.prefix + [(11 * self.n + 5 * j + 1) % VOCAB for j in range(self.a.suffix)]

    def run(self, name: str, prefix_cache: bool, connector: dict | None, kinds: tuple[str, ...]) -> dict:
        """Serves the warm-up, then ``reps`` rounds of one request of each kind ("plain": no policy
        switch; "always"/"breakeven": the rule's policy for that request; "recompute": the hit
        ignored by vLLM), the order rotating by round. Returns {kind: TTFT summary}."""
        from vllm import LLM, SamplingParams
        from vllm.inputs import TokensPrompt

        kw = dict(
            model=self.model, skip_tokenizer_init=True, block_size=32, dtype="float32", enforce_eager=True,
            max_model_len=self.a.prefix + self.a.suffix + 64, seed=0, kv_cache_memory_bytes=256 << 20,
            enable_prefix_caching=prefix_cache, distributed_executor_backend="uni",
        )
        if connector is not None:
            kw["kv_transfer_config"] = dict(
                kv_connector="TuttiConnector", kv_connector_module_path="tutti.vllm", kv_role="kv_both",
                kv_connector_extra_config=connector, kv_load_failure_policy="recompute",
            )
        llm = LLM(**kw)
        rule = None
        if connector is not None:
            rule = llm.llm_engine.engine_core.engine_core.scheduler.connector._scheduler.rule
        plain = SamplingParams(max_tokens=1, temperature=0.0, detokenize=False)
        skip = SamplingParams(max_tokens=1, temperature=0.0, detokenize=False, skip_reading_prefix_cache=True)

        def ttft(kind: str) -> tuple[float, int]:
            if kind in ("always", "breakeven"):
                rule.policy = kind
            t0 = time.perf_counter()
            out = llm.generate([TokensPrompt(prompt_token_ids=self.prompt())],
                               skip if kind == "recompute" else plain, use_tqdm=False)[0]
            return time.perf_counter() - t0, out.num_cached_tokens

        warm = ["always", "breakeven"] + [k for k in kinds if k != "plain"] if rule is not None else []
        for i in range(self.a.warmup):
            ttft(warm[i % len(warm)] if warm else "plain")
        ts: dict[str, list[float]] = {k: [] for k in kinds}
        cached: dict[str, set[int]] = {k: set() for k in kinds}
        for r in range(self.a.reps):
            for j in range(len(kinds)):
                k = kinds[(r + j) % len(kinds)]
                t, n = ttft(k)
                ts[k].append(t)
                cached[k].add(n)
        res = {k: dict(summary(v), cached_tokens=sorted(cached[k])) for k, v in ts.items()}
        if connector is not None:
            from vllm.distributed.kv_transfer import get_kv_transfer_group

            sched = llm.llm_engine.engine_core.engine_core.scheduler.connector
            sched._collect_stats()
            worker = get_kv_transfer_group()
            worker._collect_stats()
            w = worker.reported.data
            res["bytes_loaded"] = worker.runtime.stats().bytes_loaded
            # The time forward passes waited for loads, per loaded request (warm-up included).
            res["load_wait_s_per_load"] = w["load_s"] / w["loads"] if w["loads"] else 0.0
            res["rule"] = {k: v for k, v in sched.reported.data.items() if k.startswith(("match_", "est_"))}
            res["host_mode"] = worker.config.host_mode
        llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()
        for k in kinds:
            print(f"  {name:24s} {k:9s} median {res[k]['median_s'] * 1e3:8.1f} ms  p90 {res[k]['p90_s'] * 1e3:8.1f} ms"
                  f"  cached {res[k]['cached_tokens']}", file=sys.stderr, flush=True)
        return res


def commit() -> str:
    try:
        out = subprocess.run(["git", "-C", HERE, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             timeout=10)
        dirty = subprocess.run(["git", "-C", HERE, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return out.stdout.strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="model dir (default: the venv's bench-llama)")
    ap.add_argument("--prefix", type=int, default=960, help="prefix tokens (whole 32-token blocks)")
    ap.add_argument("--suffix", type=int, default=32)
    ap.add_argument("--reps", type=int, default=16)
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--drives", type=int, default=4)
    ap.add_argument("--paces", default="unpaced,nvme4,fast,between,slow")
    ap.add_argument("--host-modes", default="", help="also compare these host executor modes (unpaced, always)")
    ap.add_argument("--host-mode", default=None, help="host executor mode of the pace runs (default: the connector's)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--md", default=None, help="write the tables as Markdown to this path")
    a = ap.parse_args()
    if a.prefix % 32 or a.warmup < 2:
        sys.exit("--prefix must be whole 32-token blocks and --warmup at least 2 (store, then a first hit)")
    import tiny_llama

    venv = os.environ.get("TUTTI_VLLM_VENV") or os.path.expanduser("~/.cache/tutti/vllm-venv")
    model = a.model or str(tiny_llama.build(Path(venv) / "tutti-models", "bench-llama"))
    import tutti
    from tutti.runtime import HOST_EXEC_MODE_DEFAULT

    b = Bench(a, model)
    t_start = time.monotonic()
    res: dict = {"model": os.path.basename(model), "params": tiny_llama.params(model),
                 "prefix_tokens": a.prefix, "suffix_tokens": a.suffix, "reps": a.reps, "warmup": a.warmup,
                 "drives": a.drives, "vllm": __import__("vllm").__version__, "commit": commit(),
                 "host_mode": a.host_mode or HOST_EXEC_MODE_DEFAULT, "cpus": os.cpu_count(), "paces": {}}
    res["limit"] = b.run("limit (vLLM prefix cache)", True, None, ("plain",))["plain"]
    res["recompute"] = b.run("recompute (no connector)", False, None, ("plain",))["plain"]
    recompute_prefix_s = max(res["recompute"]["median_s"] - res["limit"]["median_s"], 1e-3)
    res["recompute_prefix_s"] = recompute_prefix_s
    # Bytes of the prefix's KV (every layer's K and V, this model, float32).
    cfg = json.loads((Path(model) / "config.json").read_text())
    heads = cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    prefix_bytes = a.prefix * 2 * cfg["num_hidden_layers"] * heads * head_dim * 4
    res["prefix_bytes"] = prefix_bytes
    base = {"emulated_drives": a.drives, "emulated_capacity_bytes": 256 << 20, "io_timeout_ms": 60_000}
    if a.host_mode:
        base["host_mode"] = a.host_mode
    paces = [p for p in a.paces.split(",") if p]
    res["calibration"] = "separate engines: recompute - limit"
    for pace in sorted(paces, key=lambda p: p != "unpaced"):  # unpaced first: it calibrates the others
        if pace == "unpaced":
            rate = 0
        elif pace == "nvme4":
            rate = NVME_BYTES_PER_SEC
        elif pace in RELATIVE_PACES:
            rate = int(prefix_bytes / (RELATIVE_PACES[pace] * recompute_prefix_s) / a.drives)
        else:
            sys.exit(f"unknown pace {pace!r}: use unpaced, nvme4, fast, between, slow")
        extra = dict(base, **({"emulated_read_bytes_per_sec": rate} if rate else {}))
        row = b.run(pace, False, extra, ("always", "breakeven", "recompute"))
        row.update(read_bytes_per_sec_per_drive=rate,
                   expected_load_s=prefix_bytes / (rate * a.drives) if rate else None)
        res["paces"][pace] = row
        if pace == "unpaced":
            # Measured interleaved in one engine, so the machine's load at the time cancels.
            recompute_prefix_s = max(row["recompute"]["median_s"] - row["always"]["median_s"], 1e-3)
            res["recompute_prefix_s"] = recompute_prefix_s
            res["calibration"] = "unpaced engine: recompute - always-load"
    if a.host_modes:
        res["host_modes"] = {}
        for mode in a.host_modes.split(","):
            res["host_modes"][mode] = b.run(f"unpaced host_mode={mode}", False,
                                            dict(base, load_policy="always", host_mode=mode), ("always", "recompute"))
    res["wall_s"] = time.monotonic() - t_start
    res["tutti_abi"] = tutti.abi_version()
    text = report(res)
    if a.md:
        Path(a.md).write_text(text)
    if a.json:
        print(json.dumps(res))
    else:
        print(text)


def report(r: dict) -> str:
    ms = lambda s: f"{s * 1e3:.0f}"  # noqa: E731
    mp = lambda x: f"{ms(x['median_s'])} / {ms(x['p90_s'])}"  # noqa: E731
    lim, rec = r["limit"], r["recompute"]
    lines = [
        f"model {r['model']} ({r['params'] / 1e6:.1f} M params, float32), vLLM {r['vllm']} CPU, {r['cpus']} CPUs; "
        f"prefix {r['prefix_tokens']} + suffix {r['suffix_tokens']} tokens ({r['prefix_bytes'] / 2**20:.1f} MiB of "
        f"prefix KV); {r['warmup']} warm-up requests and {r['reps']} rounds per engine; {r['drives']} emulated "
        f"drives (reads paced, writes not), host executor {r['host_mode']}; commit {r['commit']}; "
        f"{r['wall_s'] / 60:.1f} min",
        "",
        f"separate engines, no connector: limit (vLLM's own prefix cache) {mp(lim)} ms, recompute {mp(rec)} ms "
        f"(median / p90); the prefix's recompute {ms(r['recompute_prefix_s'])} ms ({r['calibration']}), "
        f"from which the fast, between and slow paces are set",
        "",
        "TTFT ms, median / p90; the three policies interleaved in one engine per pace",
        "",
        "| pace | read MB/s per drive | prefix read at that pace | recompute | always-load | break-even "
        "| break-even ÷ better | always ÷ limit | break-even ÷ limit | tokens declined / hit |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for pace, row in r["paces"].items():
        al, be, rc = row["always"], row["breakeven"], row["recompute"]
        better = min(rc["median_s"], al["median_s"])
        rate = row["read_bytes_per_sec_per_drive"]
        rule = row.get("rule", {})
        rate_s = f"{rate / 1e6:.2f}" if rate else "-"
        load_s = f"{row['expected_load_s'] * 1e3:.0f} ms" if rate else "-"
        lines.append(
            f"| {pace} | {rate_s} | {load_s} | {mp(rc)} | {mp(al)} | {mp(be)} | {be['median_s'] / better:.3f} | "
            f"{al['median_s'] / lim['median_s']:.2f} | {be['median_s'] / lim['median_s']:.2f} | "
            f"{rule.get('match_declined_tokens', 0)} / {rule.get('match_hit_tokens', 0)} |"
        )
    if r.get("host_modes"):
        lines += ["", "host executor mode, unpaced drives: TTFT ms (median / p90) loading the prefix, and "
                  "recomputing it in the same engine; the forward pass's wait for the load", "",
                  "| host_mode | load | recompute | load ÷ recompute | load ÷ limit | load wait ms |",
                  "|---|---|---|---|---|---|"]
        for mode, m in r["host_modes"].items():
            lines.append(f"| {mode} | {mp(m['always'])} | {mp(m['recompute'])} | "
                         f"{m['always']['median_s'] / m['recompute']['median_s']:.3f} | "
                         f"{m['always']['median_s'] / lim['median_s']:.2f} | {m['load_wait_s_per_load'] * 1e3:.2f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
