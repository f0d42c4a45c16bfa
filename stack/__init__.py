"""vllm-stack: run open models on your own GPUs, around upstream vLLM."""

__version__ = "0.1.0"
