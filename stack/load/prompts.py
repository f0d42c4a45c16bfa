"""Synthetic prompts of a chosen length, for any tokenizer.

Common short English words are one token each in the BPE vocabularies of Llama-, SmolLM- and GPT-style
tokenizers, so N words make about N prompt tokens; the report uses the exact counts the server returns
(`usage`), so the approximation only shapes the load, it never enters a figure.
"""

from __future__ import annotations

import random

WORDS = (  # noqa: SIM905 - one readable block of words
    "the of and to in is you that it he was for on are as with his they at be this have from or one had by "
    "word but not what all were we when your can said there use an each which she do how their if will up "
    "other about out many then them these so some her would make like him into time has look two more write "
    "go see number no way could people my than first water been call who oil its now find long down day did "
    "get come made may part over new sound take only little work know place year live me back give most very "
    "after thing our just name good sentence man think say great where help through much before line right"
).split()
# The chat template and the request nonce take a few tokens of their own.
TEMPLATE_TOKENS = 12


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choices(WORDS, k=max(1, n)))


def shared_prefix(n_tokens: int) -> str:
    """The same text in every process (fixed seed): a system prompt that prefix caching can reuse."""
    return words(random.Random(1234), n_tokens) if n_tokens > 0 else ""


def chat_messages(rng: random.Random, prompt_tokens: int, prefix: str = "") -> list[dict[str, str]]:
    # A nonce first, so two users never share a cached prefix by accident (only `prefix` is meant to be shared).
    body = f"{rng.randrange(10**9)} " + words(rng, prompt_tokens - TEMPLATE_TOKENS - len(prefix.split()))
    messages = [{"role": "system", "content": prefix}] if prefix else []
    return [*messages, {"role": "user", "content": body}]
