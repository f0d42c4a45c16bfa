"""The quality guard of `vstack tune`: fixed prompts answered at temperature 0, compared with the baseline's.

A candidate that changes numerics (fp8 weights or KV cache, speculative decoding) can serve more requests
and answer differently. Greedy answers to the same prompts are deterministic per engine setting, so the
share of answers identical to the baseline's is a cheap, model-agnostic signal (not a benchmark score), and
the first token where an answer parts from the baseline's says how early the numbers moved.

The floor (stack.load.scenario.MIN_EXACT_MATCH) is there to catch broken numerics (a wrong fp8 scale, a kernel
bug: most answers change from their first tokens), not to rank healthy quantization: one flipped token changes
the rest of a 24-token greedy answer, so a sound fp8 candidate can still lose a few of the 8 answers, and a
floor near 1 would throw away the knob worth 1.5x goodput on the 8B case. Half of the answers token-identical
is the default; a scenario's `tune.min_exact_match` or `vstack tune --min-match` sets another.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

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


@dataclass(frozen=True)
class Answers:
    """Each prompt's greedy completion and its tokens as the engine produced them."""

    texts: list[str]
    tokens: list[list[str]]


def answers_of(base_url: str, model: str, timeout_s: float = 120) -> Answers | None:
    """Each prompt's greedy completion (the completions endpoint: no chat template in between), with its
    tokens (logprobs=1); None when the engine did not answer them all (the report then says so)."""
    texts, tokens = [], []
    try:
        with httpx.Client(timeout=timeout_s) as client:
            for prompt in PROMPTS:
                r = client.post(f"{base_url}/v1/completions", json={
                    "model": model, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, "seed": 0,
                    "logprobs": 1})
                r.raise_for_status()
                choice = r.json()["choices"][0]
                texts.append(choice["text"])
                tokens.append(list((choice.get("logprobs") or {}).get("tokens") or []))
    except (httpx.HTTPError, KeyError, IndexError, ValueError, TypeError):
        return None
    return Answers(texts, tokens)


def first_divergence(base: list[str], other: list[str]) -> int | None:
    """The index of the first token where two token lists part (the shorter one's end counts); None: equal."""
    for i, (a, b) in enumerate(zip(base, other, strict=False)):
        if a != b:
            return i
    return None if len(base) == len(other) else min(len(base), len(other))


def compare(base_texts: list[str], base_tokens: list[list[str]] | None, texts: list[str],
            tokens: list[list[str]] | None, min_match: float) -> dict[str, Any]:
    """A candidate's answers against the baseline's: the exact-match rate, the first diverging token of each
    changed answer, and whether the rate is below the floor (such a candidate is not chosen)."""
    n = len(base_texts)
    same = sum(a == b for a, b in zip(base_texts, texts, strict=False))
    rate = same / n if n else None
    diverged = []
    for i, (a, b) in enumerate(zip(base_texts, texts, strict=False)):
        if a == b:
            continue
        bt = (base_tokens or [])[i] if base_tokens and i < len(base_tokens) else []
        ct = (tokens or [])[i] if tokens and i < len(tokens) else []
        at = first_divergence(bt, ct) if bt and ct else None
        diverged.append({"prompt": PROMPTS[i] if i < len(PROMPTS) else str(i), "token": at,
                         "baseline": bt[at] if at is not None and at < len(bt) else None,
                         "candidate": ct[at] if at is not None and at < len(ct) else None})
    firsts = [d["token"] for d in diverged if d["token"] is not None]
    below = rate is not None and rate < min_match
    note = f"{same} of {n} answers identical to the baseline's at temperature 0"
    if firsts:
        note += f"; the earliest parts at token {min(firsts)}"
    if below:
        note += f"; below the {min_match:.0%} floor: not chosen"
    return {"exact_match": rate, "matched": same, "prompts": n, "first_divergence": diverged,
            "earliest_divergence": min(firsts) if firsts else None, "min_match": min_match, "below": below,
            "note": note}
