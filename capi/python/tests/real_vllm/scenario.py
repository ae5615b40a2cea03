"""Runs real vLLM (CPU build) on a tiny model, with or without the tutti connector, and prints
what happened as JSON on the last line of stdout. Driven by tests/test_real_vllm.py, run with
the Python of the venv scripts/setup-vllm made. One process may run several engines in turn.

    python scenario.py SPEC.json

SPEC: {"engines": [ENGINE, ...]}; ENGINE: {"name", "model", "connector": {extra config} | null,
"prefix_cache": bool, "policy": "fail"|"recompute", "batches": [[prompt, ...], ...],
"max_tokens", "llm": {more LLM(...) kwargs}; a prompt is a list of token ids or {"tokens": [...],
"cache_salt": str}, "fail_loads": n (fail the next n emulated reads
before batch 1), "tamper": bool (perturb every loaded block after it lands), "executor": str,
"max_model_len", "kv_bytes", "ignore_eos": bool, "check_loaded": bool (compare every loaded block, layer
by layer, with the bytes vLLM computed for that chunk when it was saved: "loaded_checked",
"loaded_mismatched"), "status_socket": path (report `tutti status --json`
of that tuttid while the engine is up, as "daemon_status"), "force_zeroing": bool (vLLM zeroes every
newly allocated block, as for Mamba or mixed-precision models), "by_name": bool (no
kv_connector_module_path: vLLM finds TuttiConnector in its connector registry, where the installed
package's vllm.general_plugins entry point put it), "own_daemon": {"args": [tutti's arguments, e.g.
"serve", ...], "restart_before_batch": i} (start `tutti serve` before the engine, SIGKILL it and
start it again with the same arguments before batch i, stop it after the engine; the pids are
reported as "daemon_pids")}.
The result also says which tutti package, library and binary the process used ("tutti_package").
Per engine it reports "preemptions" (vLLM's scheduler preempted a request), "preempted_mid_prefill"
(the victim had computed part of its prompt) and
"preempted_with_pending_saves" (the victim still had deferred saves in flight), and with
force_zeroing "zeroed_blocks" and "zeroed_under_pending_save" (blocks vLLM zeroed while a
deferred save was still reading them).
"""

from __future__ import annotations

import gc
import json
import os
import sys
import traceback

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")  # 2 shared cores: no pinning
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

HERE = os.path.dirname(os.path.abspath(__file__))
# TUTTI_TEST_INSTALLED=1: the tutti package is an installed one (on PYTHONPATH, found by vLLM
# through its entry point; tests/installed_package.py); otherwise capi/python, the source tree.
sys.path.insert(0, os.path.dirname(HERE))  # tests/: installed_package
if os.environ.get("TUTTI_TEST_INSTALLED") != "1":
    sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

BLOCK = 32
TAMPER = {"on": False}  # the engine running now tampers with loaded blocks
ZEROING = {"on": False}  # the engine running now has vLLM zero newly allocated blocks


def _patch_counters(counters: dict) -> None:
    """Counts vLLM's preemptions as its scheduler makes them, those in the middle of the victim's
    prefill, and those whose victim still had deferred saves in flight (its blocks are freed while
    tutti may still be reading them)."""
    from vllm.v1.core.sched.scheduler import Scheduler

    orig = Scheduler._preempt_request

    def counting(self, request, *a, **kw):
        counters["preemptions"] += 1
        if 0 < request.num_computed_tokens < request.num_prompt_tokens:
            counters["preempted_mid_prefill"] += 1
        conn = _connector()
        worker = getattr(conn, "_worker", None) if conn is not None else None
        if worker is not None and any(sv.spec.req_id == request.request_id for sv in worker._pending):
            counters["preempted_with_pending_saves"] += 1
        return orig(self, request, *a, **kw)

    Scheduler._preempt_request = counting


def _patch_tamper() -> None:
    """Every block a tutti load lands in gets its KV perturbed right after it lands: the
    negative control that proves the output comparison notices wrong KV."""
    from tutti._connector.worker import WorkerSide

    orig, orig_finish = WorkerSide.wait_layer, WorkerSide.finish_loads

    def tampered(self, layer_name):
        orig(self, layer_name)
        if not TAMPER["on"]:
            return
        t = self.kv_caches.get(layer_name)
        for ld in self._loads:
            if not ld.spec.notify:
                for b in ld.spec.block_ids:
                    t[b] += 0.25

    def tampered_finish(self):
        # Asynchronous loads (vLLM's hybrid allocator) land here, for a later step to read: every
        # layer of the load's KV-cache group gets its blocks perturbed.
        landing = [ld.spec for ld in self._loads if ld.spec.notify]
        orig_finish(self)
        if not TAMPER["on"]:
            return
        for spec in landing:
            for name, t in self.kv_caches.items():
                if self.group_of(name) == spec.group:
                    for b in spec.block_ids:
                        t[b] += 0.25

    WorkerSide.wait_layer, WorkerSide.finish_loads = tampered, tampered_finish


CHECKS = {"saved": {}, "checked": 0, "mismatched": 0}


def _patch_check_loaded() -> None:
    """Every block a tutti load lands in is compared, layer by layer, with the bytes vLLM computed
    for the same chunk when that block was saved (in this process): what the model reads after a
    load is what it computed, whatever the attention backend then does with it."""
    import hashlib

    from tutti._connector.worker import WorkerSide

    def digest(t, b) -> bytes:
        return hashlib.blake2b(t[b].contiguous().view(-1).view(torch_u8()).numpy().tobytes(), digest_size=16).digest()

    orig_save, orig_wait = WorkerSide.save_layer, WorkerSide.wait_layer

    def save_layer(self, plan, layer_name, kv_layer):
        for sv in (plan.saves if plan is not None else []):
            for h, b in zip(sv.hashes, sv.block_ids):
                CHECKS["saved"][(bytes(h), layer_name)] = digest(kv_layer, b)
        return orig_save(self, plan, layer_name, kv_layer)

    def wait_layer(self, layer_name):
        orig_wait(self, layer_name)
        t = self.kv_caches.get(layer_name)
        for ld in self._loads:
            for h, b in zip(ld.spec.hashes, ld.spec.block_ids):
                want = CHECKS["saved"].get((bytes(h), layer_name))
                if want is not None:
                    CHECKS["checked"] += 1
                    CHECKS["mismatched"] += int(digest(t, b) != want)

    WorkerSide.save_layer, WorkerSide.wait_layer = save_layer, wait_layer


def torch_u8():
    import torch

    return torch.uint8


def _patch_zeroing() -> None:
    """Makes vLLM zero every newly allocated KV block at the start of the step that uses it, as
    it does for models with Mamba layers or mixed KV precisions (the tiny Llama has neither).
    vLLM does it after handle_preemptions and before the forward pass."""
    from vllm.v1.kv_cache_interface import KVCacheConfig

    orig = KVCacheConfig.needs_kv_cache_zeroing

    KVCacheConfig.needs_kv_cache_zeroing = property(lambda self: ZEROING["on"] or orig.fget(self))


def _patch_zeroing_check(counters: dict) -> None:
    """Counts blocks vLLM zeroes while a deferred save of the connector still reads them: that
    save would store zeroes. vLLM zeroes them right after handle_preemptions."""
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner

    orig = CPUModelRunner._zero_block_ids

    def checked(self, block_ids):
        conn = _connector()
        worker = getattr(conn, "_worker", None) if conn is not None else None
        if worker is not None:
            pending = {b for sv in worker._pending for b in sv.spec.block_ids}
            counters["zeroed_under_pending_save"] += len(pending & set(block_ids))
        counters["zeroed_blocks"] += len(block_ids)
        return orig(self, block_ids)

    CPUModelRunner._zero_block_ids = checked


def _connector():
    from vllm.distributed.kv_transfer import get_kv_transfer_group, has_kv_transfer_group

    return get_kv_transfer_group() if has_kv_transfer_group() else None


def _prompt(p):
    """A prompt of the spec: a list of token ids, or {"tokens": [...], "cache_salt": str}."""
    from vllm.inputs import TokensPrompt

    if isinstance(p, dict):
        return TokensPrompt(prompt_token_ids=p["tokens"], cache_salt=p["cache_salt"])
    return TokensPrompt(prompt_token_ids=p)
def _start_daemon(args: list[str]):
    """`tutti serve` with ``args`` (it prints one JSON line once it serves)."""
    import subprocess

    from tutti._connector.shared import find_tutti_bin

    p = subprocess.Popen([find_tutti_bin(), *args], stdout=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    if not line:
        raise RuntimeError(f"tutti {' '.join(args)} did not start (exit {p.wait(timeout=30)})")
    assert json.loads(line)["pid"] == p.pid
    return p


def run_engine(spec: dict) -> dict:
    own = spec.get("own_daemon")
    daemons = [_start_daemon(own["args"])] if own else []
    try:
        out = _run_engine(spec, daemons)
    finally:
        for p in daemons:
            if p.poll() is None:
                p.terminate()
                p.wait(timeout=30)
    if own:
        out["daemon_pids"] = [p.pid for p in daemons]
    return out


def _run_engine(spec: dict, daemons: list) -> dict:
    from vllm import LLM, SamplingParams

    kw = dict(
        model=spec["model"], skip_tokenizer_init=True, block_size=BLOCK, dtype="float32", enforce_eager=True,
        max_model_len=spec.get("max_model_len", 2048), seed=0, kv_cache_memory_bytes=spec.get("kv_bytes", 32 << 20),
        enable_prefix_caching=spec.get("prefix_cache", True),
        distributed_executor_backend=spec.get("executor", "uni"),
    )
    kw.update(spec.get("llm", {}))
    if spec.get("connector") is not None:
        kw["kv_transfer_config"] = dict(
            kv_connector="TuttiConnector", kv_role="kv_both",
            kv_connector_extra_config=spec["connector"], kv_load_failure_policy=spec.get("policy", "recompute"),
        )
        if not spec.get("by_name"):
            kw["kv_transfer_config"]["kv_connector_module_path"] = "tutti.vllm"
    llm = LLM(**kw)
    sp = SamplingParams(max_tokens=spec.get("max_tokens", 6), temperature=0.0, logprobs=3, detokenize=False,
                        ignore_eos=bool(spec.get("ignore_eos")))
    out = {"batches": []}
    conn = _connector()
    for i, batch in enumerate(spec["batches"]):
        if daemons and i == spec["own_daemon"].get("restart_before_batch"):
            # SIGKILL under the running engine, then the same daemon again on the same media and
            # socket; the engine is left alone.
            daemons[-1].kill()
            daemons[-1].wait(timeout=30)
            daemons.append(_start_daemon(spec["own_daemon"]["args"]))
        if i == 1 and spec.get("fail_loads"):
            conn.runtime.emulated_fail_next(0, "load", spec["fail_loads"])
            conn.runtime.emulated_fail_next(1, "load", spec["fail_loads"])
        results = []
        try:
            outs = llm.generate([_prompt(p) for p in batch], sp, use_tqdm=False)
        except Exception as e:  # noqa: BLE001 - reported to the test
            out["batches"].append({"error": f"{type(e).__name__}: {e}"})
            continue
        for o in outs:
            c = o.outputs[0]
            results.append({
                "tokens": list(c.token_ids),
                "logprobs": [{str(k): v.logprob for k, v in d.items()} for d in (c.logprobs or [])],
                "cached": o.num_cached_tokens,
                "finish": c.finish_reason,
            })
        out["batches"].append({"results": results})
    if spec.get("status_socket"):
        # The daemon's view while this engine is up: its clients and their leases.
        import subprocess

        from tutti._connector.shared import find_tutti_bin

        done = subprocess.run([find_tutti_bin(), "status", "--json", "--socket", spec["status_socket"]],
                              capture_output=True, text=True, timeout=60)
        out["daemon_status"] = json.loads(done.stdout) if done.returncode == 0 else {"error": done.stderr}
    if conn is not None:
        st = conn.runtime.stats()
        out["tutti"] = {"bytes_loaded": st.bytes_loaded, "bytes_stored": st.bytes_stored,
                        "lookup_hits": st.lookup_hits, "failed_blocks": st.failed_blocks,
                        "object_bytes": conn.config.geometry.object_bytes, "layers": conn.config.geometry.layers,
                        "layout_tag": conn._worker.layout_tag}
        conn._collect_stats()
        out["reported_worker"] = dict(conn.reported.data)
        try:
            sched = llm.llm_engine.engine_core.engine_core.scheduler.connector
            sched._collect_stats()
            out["reported_scheduler"] = dict(sched.reported.data)
        except AttributeError as e:
            out["reported_scheduler"] = {"error": str(e)}
    llm.llm_engine.engine_core.shutdown() if hasattr(llm.llm_engine, "engine_core") else None
    del llm
    gc.collect()
    return out


def main() -> None:
    spec = json.load(open(sys.argv[1]))
    counters = {"preemptions": 0, "preempted_mid_prefill": 0, "preempted_with_pending_saves": 0,
                "zeroed_blocks": 0, "zeroed_under_pending_save": 0}
    _patch_counters(counters)
    if any(e.get("force_zeroing") for e in spec["engines"]):
        _patch_zeroing()
        _patch_zeroing_check(counters)
    if any(e.get("tamper") for e in spec["engines"]):
        _patch_tamper()
    if any(e.get("check_loaded") for e in spec["engines"]):
        _patch_check_loaded()
    res = {"engines": []}
    for e in spec["engines"]:
        before = dict(counters)
        TAMPER["on"] = bool(e.get("tamper"))
        ZEROING["on"] = bool(e.get("force_zeroing"))
        try:
            r = run_engine(e)
        except Exception as ex:  # noqa: BLE001 - reported to the test
            r = {"start_error": f"{type(ex).__name__}: {ex}", "trace": traceback.format_exc()[-3000:]}
        for k in counters:
            r[k] = counters[k] - before[k]
        if e.get("check_loaded"):
            r["loaded_checked"], r["loaded_mismatched"] = CHECKS["checked"], CHECKS["mismatched"]
            CHECKS.update(saved={}, checked=0, mismatched=0)
        r["name"] = e.get("name")
        res["engines"].append(r)
    from installed_package import report

    res["tutti_package"] = report()
    print("\nRESULT " + json.dumps(res))


if __name__ == "__main__":
    main()
