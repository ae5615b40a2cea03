"""tutti in vLLM's CPU build, one process: a tiny random-weight Llama, a pool on two emulated
NVMe drives (files in WORKDIR/pool), and a second prompt whose shared prefix comes from the pool.
Usage: python examples/vllm_one_process.py [WORKDIR]"""
import os
import sys

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # scheduler and worker: one process
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")  # do not pin threads to cores


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
    work = sys.argv[1] if len(sys.argv) > 1 else "/tmp/tutti-quickstart"
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    llm = LLM(model=tiny_model(os.path.join(work, "tiny-llama")), skip_tokenizer_init=True,
              dtype="float32", enforce_eager=True, block_size=32, max_model_len=1024,
              kv_cache_memory_bytes=32 << 20, distributed_executor_backend="uni",
              enable_prefix_caching=False,
              kv_transfer_config=dict(
                  kv_connector="TuttiConnector", kv_role="kv_both",
                  kv_load_failure_policy="recompute",
                  kv_connector_extra_config={"emulated_drives": 2, "emulated_capacity_bytes": 64 << 20,
                                             "emulated_dir": os.path.join(work, "pool")}))
    params = SamplingParams(max_tokens=4, temperature=0.0, detokenize=False)
    cached = []
    for prompt in (list(range(1, 151)), list(range(1, 101)) + list(range(300, 341))):
        out = llm.generate([TokensPrompt(prompt_token_ids=prompt)], params, use_tqdm=False)[0]
        print(f"{len(prompt)} prompt tokens, {out.num_cached_tokens} loaded by tutti, "
              f"output {list(out.outputs[0].token_ids)}")
        cached.append(out.num_cached_tokens)
    if cached[1] != 96:  # the 100 shared tokens hold 3 whole 32-token blocks
        sys.exit(f"expected 96 tokens of the second prompt from tutti, got {cached[1]}")
    print("ok: the shared prefix came back from the pool")


if __name__ == "__main__":
    main()
