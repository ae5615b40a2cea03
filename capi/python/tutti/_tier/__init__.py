"""Parts of :mod:`tutti.vllm_tier` (vLLM's secondary-tier manager): its config and its I/O threads."""
