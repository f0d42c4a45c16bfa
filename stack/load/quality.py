"""The quality guard of `vstack tune`: fixed prompts answered at temperature 0, compared with the baseline's.

A candidate that changes numerics (fp8 weights or KV cache, speculative decoding) can serve more requests
and answer differently. Greedy answers to the same prompts are deterministic per engine setting, so the
share of answers identical to the baseline's is a cheap, model-agnostic signal (not a benchmark score).
"""

from __future__ import annotations

import httpx

PROMPTS = (
    "The capital of France is",
    "Water boils at a temperature of",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "The three primary colours are",
    "Translate to French: good morning ->",
    "12 multiplied by 12 equals",
    "The first law of thermodynamics states that",
    "A haiku about the sea:\n",
)
MAX_TOKENS = 24


def answers_of(base_url: str, model: str, timeout_s: float = 120) -> list[str] | None:
    """Each prompt's greedy completion (the completions endpoint: no chat template in between); None when the
    engine did not answer them all (the report then says the check was not made)."""
    out = []
    try:
        with httpx.Client(timeout=timeout_s) as client:
            for prompt in PROMPTS:
                r = client.post(f"{base_url}/v1/completions", json={
                    "model": model, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, "seed": 0})
                r.raise_for_status()
                out.append(r.json()["choices"][0]["text"])
    except (httpx.HTTPError, KeyError, IndexError, ValueError):
        return None
    return out
