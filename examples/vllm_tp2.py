"""tutti in vLLM's CPU build at tensor parallelism 2: tuttid owns the pool (two emulated NVMe
drives, files in WORKDIR/pool); vLLM's scheduler and both rank processes are its clients.
Usage: python examples/vllm_tp2.py [WORKDIR]"""
import os
import shutil
import subprocess
import sys
import time

os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0|1")  # one core per rank


def tiny_model(path):  # 2 layers, 2 KV heads of 32, random weights: no download
    if not os.path.exists(os.path.join(path, "config.json")):
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM
        torch.manual_seed(0)
        LlamaForCausalLM(LlamaConfig(
            hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=512, initializer_range=0.25)).save_pretrained(path)
    return path


def main():
    work = sys.argv[1] if len(sys.argv) > 1 else "/tmp/tutti-quickstart-tp2"
    model = tiny_model(os.path.join(work, "tiny-llama"))
    tutti = shutil.which("tutti") or os.path.join(os.path.dirname(sys.executable), "tutti")
    sock, pool = os.path.join(work, "tuttid.sock"), os.path.join(work, "pool")
    os.makedirs(pool, exist_ok=True)
    # The pool's geometry is one rank's: TP=2 gives each rank 1 of the model's 2 KV heads.
    tuttid = subprocess.Popen([tutti, "serve", "--socket", sock, "--dir", pool, "--emulated", "2",
                               "--capacity-mib", "64", "--layers", "2", "--kv-heads", "1",
                               "--head-dim", "32", "--block-tokens", "32", "--dtype", "f32"])
    try:
        deadline = time.monotonic() + 60
        while not os.path.exists(sock):
            if tuttid.poll() is not None or time.monotonic() > deadline:
                sys.exit(f"tuttid did not start (exit status {tuttid.poll()})")
            time.sleep(0.2)
        run_vllm(model, tutti, sock)
    finally:
        tuttid.terminate()  # SIGTERM: tuttid stops cleanly and removes its socket
        tuttid.wait(timeout=60)


def run_vllm(model, tutti, sock):
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    llm = LLM(model=model, skip_tokenizer_init=True, dtype="float32", enforce_eager=True,
              block_size=32, max_model_len=1024, kv_cache_memory_bytes=32 << 20,
              tensor_parallel_size=2, distributed_executor_backend="mp",
              enable_prefix_caching=False,
              kv_transfer_config=dict(
                  kv_connector="TuttiConnector", kv_role="kv_both",
                  kv_load_failure_policy="recompute",
                  kv_connector_extra_config={"daemon_socket": sock}))
    params = SamplingParams(max_tokens=4, temperature=0.0, detokenize=False)
    cached = []
    for prompt in (list(range(1, 151)), list(range(1, 101)) + list(range(300, 341))):
        out = llm.generate([TokensPrompt(prompt_token_ids=prompt)], params, use_tqdm=False)[0]
        print(f"{len(prompt)} prompt tokens, {out.num_cached_tokens} loaded by tutti, "
              f"output {list(out.outputs[0].token_ids)}")
        cached.append(out.num_cached_tokens)
    subprocess.run([tutti, "status", "--socket", sock], check=True)  # the clients, while vLLM runs
    if cached[1] != 96:  # the 100 shared tokens hold 3 whole 32-token blocks
        sys.exit(f"expected 96 tokens of the second prompt from tutti, got {cached[1]}")
    print("ok: both ranks loaded their shard of the shared prefix from tuttid")


if __name__ == "__main__":
    main()
