"""A request's prompt as token ids, as the engine will see them (gateway.replica_routing: kv_events).

The model's own tokenizer (transformers' AutoTokenizer from the model's folder, loaded once per model) and, for
chat, its chat template with the generation prompt, which is what vLLM's OpenAI server renders and tokenizes
without adding special tokens; a completion's prompt is tokenized with them, as vLLM does. A few milliseconds
per thousands of tokens: in a thread, off the event loop (adr/0050 says why not the engine's /tokenize).
A prompt that cannot be rendered here (a template that needs what the request does not carry, images) has no
ids: its request is routed by prefix affinity.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

log = logging.getLogger("stack.gateway.routing.prompt_tokens")


def text_of(content: Any) -> Any:
    """A message's content list of text parts as one text (the template's usual input); others as they are."""
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
        return "".join(str(p.get("text", "")) for p in content)
    return content


def encode(tokenizer: Any, body: dict[str, Any]) -> list[int] | None:
    if isinstance(body.get("messages"), list):
        messages = [{**m, "content": text_of(m.get("content"))} for m in body["messages"] if isinstance(m, dict)]
        if any(not isinstance(m.get("content"), str | None) for m in messages):
            return None  # images, audio: their tokens are the engine's to make
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                            tools=body.get("tools") or None)  # fmt: skip
        ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
        return [int(t) for t in ids]
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return list(tokenizer(prompt).input_ids)
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return list(prompt)  # token ids already
    return None


def load_tokenizer(path: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def said(task: asyncio.Task, path: str) -> None:
    """A tokenizer that cannot be loaded is said once (its model is routed by prefix affinity from then on)."""
    if not task.cancelled() and task.exception() is not None:
        log.warning(
            "no tokenizer from %s (%s): its model's replicas are routed by prefix affinity, not by their "
            "KV events; check that the folder holds the model's tokenizer files",
            path,
            task.exception(),
        )


class PromptTokens:
    def __init__(self, load: Any = load_tokenizer) -> None:
        self._load = load
        self.paths: dict[str, str] = {}  # model group -> its model's folder
        self._tokenizers: dict[str, asyncio.Task] = {}

    def configure(self, group: str, path: str) -> None:
        self.paths[group] = path

    def _tokenizer(self, path: str) -> asyncio.Task:
        task = self._tokenizers.get(path)
        if task is None:
            task = self._tokenizers[path] = asyncio.get_running_loop().create_task(asyncio.to_thread(self._load, path))
            task.add_done_callback(lambda t: said(t, path))
        return task

    async def of(self, group: str, body: dict[str, Any] | None) -> list[int] | None:
        """The prompt's token ids, or None (no tokenizer for the model, or a prompt it cannot render)."""
        path = self.paths.get(group)
        if not path or not body:
            return None
        try:
            tokenizer = await asyncio.shield(self._tokenizer(path))
        except Exception as exc:  # said once when the load failed (`said`)
            log.debug("no tokenizer for %s from %s: %s", group, path, exc)
            return None
        try:
            return await asyncio.to_thread(encode, tokenizer, body)
        except Exception as exc:  # a template that wants more than the request has
            log.debug("prompt of a %s request not tokenized: %s: %s", group, type(exc).__name__, exc)
            return None
