"""The two halves of the vLLM connector; :mod:`tutti.vllm` puts them behind vLLM's interface."""
