"""Time to first token in real vLLM (CPU build): a long prefix loaded from tutti vs recomputed.

One vLLM engine with the tutti connector (emulated drives, vLLM's own prefix cache off so
the prefix can only come from tutti or from compute). A warm-up request stores the prefix;
then, alternating, requests whose prompt is prefix + a fresh suffix (the prefix loaded from
tutti) and requests whose prompt is a fresh prefix of the same length + suffix (computed).
TTFT = wall time of a generate with max_tokens=1. Prints the model size and both medians
and their ratio; ``--json`` prints one JSON object instead.

    scripts/bench-vllm [--prefix 1536] [--suffix 32] [--reps 5] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="model dir (default: the venv's bench-llama)")
    ap.add_argument("--prefix", type=int, default=1536, help="prefix tokens (whole 32-token blocks)")
    ap.add_argument("--suffix", type=int, default=32)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    import tiny_llama

    venv = os.environ.get("TUTTI_VLLM_VENV") or os.path.expanduser("~/.cache/tutti/vllm-venv")
    model = a.model or str(tiny_llama.build(__import__("pathlib").Path(venv) / "tutti-models", "bench-llama"))
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    pool = tempfile.mkdtemp(prefix="tutti-bench-vllm-")
    llm = LLM(
        model=model, skip_tokenizer_init=True, block_size=32, dtype="float32", enforce_eager=True,
        max_model_len=a.prefix + a.suffix + 64, seed=0, kv_cache_memory_bytes=512 << 20,
        enable_prefix_caching=False, distributed_executor_backend="uni",
        kv_transfer_config=dict(
            kv_connector="TuttiConnector", kv_connector_module_path="tutti.vllm", kv_role="kv_both",
            kv_connector_extra_config={"emulated_drives": 2, "emulated_dir": pool,
                                       "emulated_capacity_bytes": 1 << 30},
            kv_load_failure_policy="recompute",
        ),
    )
    sp = SamplingParams(max_tokens=1, temperature=0.0, detokenize=False)
    vocab = 2000
    prefix = [(7 * i + 3) % vocab for i in range(a.prefix)]

    def ttft(tokens):
        t0 = time.perf_counter()
        out = llm.generate([TokensPrompt(prompt_token_ids=tokens)], sp, use_tqdm=False)[0]
        return time.perf_counter() - t0, out.num_cached_tokens

    ttft(prefix + [1] * a.suffix)  # warm-up: stores the prefix
    cached, computed, hits = [], [], []
    for r in range(a.reps):
        suffix = [(11 * r + j) % vocab for j in range(a.suffix)]
        t, n = ttft(prefix + suffix)
        cached.append(t)
        hits.append(n)
        fresh = [(13 * i + 5 + 17 * r) % vocab for i in range(a.prefix)]
        t, n = ttft(fresh + suffix)
        computed.append(t)
    from vllm.distributed.kv_transfer import get_kv_transfer_group

    params = tiny_llama.params(model)
    res = {
        "model": os.path.basename(model), "params": params,
        "layers": tiny_llama.MODELS["bench-llama"]["num_hidden_layers"] if a.model is None else None,
        "dtype": "float32", "prefix_tokens": a.prefix, "suffix_tokens": a.suffix, "reps": a.reps,
        "ttft_cached_s": statistics.median(cached), "ttft_recomputed_s": statistics.median(computed),
        "cached_tokens": hits, "bytes_loaded": get_kv_transfer_group().runtime.stats().bytes_loaded,
        "vllm": __import__("vllm").__version__,
    }
    res["speedup"] = res["ttft_recomputed_s"] / res["ttft_cached_s"]
    if a.json:
        print(json.dumps(res))
    else:
        print(f"model {res['model']} ({params / 1e6:.1f} M params, float32), vLLM {res['vllm']} CPU, "
              f"prefix {a.prefix} + suffix {a.suffix} tokens, median of {a.reps}")
        print(f"TTFT prefix from tutti: {res['ttft_cached_s'] * 1e3:.1f} ms (cached tokens {hits})")
        print(f"TTFT prefix recomputed: {res['ttft_recomputed_s'] * 1e3:.1f} ms")
        print(f"ratio recomputed/cached: {res['speedup']:.2f}x")


if __name__ == "__main__":
    main()
