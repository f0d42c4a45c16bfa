"""The upgrade check's fixed prompt set, answered at temperature 0 by the pinned and the candidate engine alike.

Three kinds, because an upgrade breaks each in its own place: plain chat (the chat template, the sampler), a
`json_schema` response format (the structured-output backend) and a forced tool call (structured outputs plus
the tool-call rendering). Each answer is kept as text (a tool call as its name and arguments) with its tokens
(`logprobs`), so two versions' answers are compared exactly and a difference names its first diverging token
(stack.tune.quality_guard.first_divergence, the tune's quality guard).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import httpx

from stack.tune.quality_guard import first_divergence

Kind = Literal["chat", "json_schema", "tool"]
MAX_TOKENS = 24
CITY = {"type": "object", "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
        "required": ["city", "country"], "additionalProperties": False}
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"]}}}


@dataclass(frozen=True)
class Prompt:
    id: str
    kind: Kind
    text: str


# Ordered so that the first N keep every kind: a short CI run asks for 3 and still covers all three.
PROMPTS: tuple[Prompt, ...] = (
    Prompt("chat-capital", "chat", "What is the capital of France?"),
    Prompt("json-city", "json_schema", "Name one large city in Japan and its country, as JSON."),
    Prompt("tool-weather", "tool", "What is the weather in Paris, in celsius?"),
    Prompt("chat-boil", "chat", "At what temperature does water boil at sea level?"),
    Prompt("json-capital", "json_schema", "Give the capital city of Italy and its country, as JSON."),
    Prompt("tool-weather-2", "tool", "Is it cold in Oslo right now? Answer in fahrenheit."),
    Prompt("chat-haiku", "chat", "Write a haiku about the sea."),
    Prompt("chat-code", "chat", "Write a Python function that returns the n-th Fibonacci number."),
)


@dataclass
class Answer:
    id: str
    kind: Kind
    text: str | None  # None: no answer (the error says why)
    tokens: list[str] = field(default_factory=list)
    error: str | None = None


def request_body(prompt: Prompt, model: str) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": prompt.text}],
                            "temperature": 0, "seed": 0, "max_tokens": MAX_TOKENS, "logprobs": True}
    if prompt.kind == "json_schema":
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "city", "schema": CITY}}
    elif prompt.kind == "tool":
        body["tools"] = [WEATHER_TOOL]
        body["tool_choice"] = {"type": "function", "function": {"name": "get_weather"}}
    return body


def answer_of(reply: dict[str, Any]) -> tuple[str, list[str]]:
    """(text, tokens) of one chat completion: a tool call as `name(arguments)`, else the message's content."""
    choice = reply["choices"][0]
    message = choice.get("message") or {}
    calls = message.get("tool_calls") or []
    if calls:
        text = "; ".join(f"{c['function']['name']}({c['function'].get('arguments') or ''})" for c in calls)
    else:
        text = message.get("content") or ""
    tokens = [t.get("token", "") for t in ((choice.get("logprobs") or {}).get("content") or [])]
    return text, tokens


def ask(base_url: str, model: str, prompts: tuple[Prompt, ...] | list[Prompt], api_key: str | None = None,
        timeout_s: float = 120) -> list[Answer]:
    """Each prompt's answer from an OpenAI-compatible server (an engine, or the gateway in front of one)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    out: list[Answer] = []
    with httpx.Client(timeout=timeout_s, headers=headers) as client:
        for p in prompts:
            try:
                r = client.post(f"{base_url}/v1/chat/completions", json=request_body(p, model))
                r.raise_for_status()
                text, tokens = answer_of(r.json())
                out.append(Answer(p.id, p.kind, text, tokens))
            except (httpx.HTTPError, KeyError, IndexError, ValueError, TypeError) as exc:
                detail = exc.response.text[:200] if isinstance(exc, httpx.HTTPStatusError) else str(exc)[:200]
                out.append(Answer(p.id, p.kind, None, error=f"{type(exc).__name__}: {detail}"))
    return out


def compare_answers(pinned: list[Answer], candidate: list[Answer]) -> dict[str, Any]:
    """Exact comparison, prompt by prompt: the match rate and, for each difference, the first diverging token."""
    rows = []
    for a, b in zip(pinned, candidate, strict=True):
        same = a.text is not None and a.text == b.text
        row: dict[str, Any] = {"id": a.id, "kind": a.kind, "same": same}
        if not same:
            at = first_divergence(a.tokens, b.tokens) if a.tokens and b.tokens else None
            row.update({"token": at,
                        "pinned_token": a.tokens[at] if at is not None and at < len(a.tokens) else None,
                        "candidate_token": b.tokens[at] if at is not None and at < len(b.tokens) else None,
                        "pinned": a.text if a.text is not None else f"(no answer: {a.error})",
                        "candidate": b.text if b.text is not None else f"(no answer: {b.error})"})
        rows.append(row)
    n = len(rows)
    same = sum(r["same"] for r in rows)
    return {"prompts": n, "matched": same, "match_rate": same / n if n else None, "differences": [
        r for r in rows if not r["same"]], "by_kind": {k: f"{sum(r['same'] for r in rows if r['kind'] == k)}/"
                                                     f"{sum(r['kind'] == k for r in rows)}"
                                                     for k in dict.fromkeys(r["kind"] for r in rows)}}


def chosen(n: int | None) -> tuple[Prompt, ...]:
    """The first n prompts (every kind from 3 on); None: all of them."""
    return PROMPTS if n is None else PROMPTS[:max(1, n)]
