"""`python -m stack.entrypoints.run MODULE [ARGS...]`: a child process of the stack, running MODULE's `main()`.

The stack starts its children by module object (stack.engine_env.child_argv), and this is their one
`__main__`: the vLLM launcher (stack.vllm.launcher: `... stack.vllm.launcher serve MODEL ...`, the same
arguments as `vllm`), vLLM introspection (stack.vllm.introspect), the GGUF conversion (stack.model_convert),
the benchmark worker (stack.load.bench_worker), `vstack plan` alone (stack.cli.plan_cmd). It imports nothing
but the module it is given: children run in the engine's Python, which needs only the stack on its path.
"""

from __future__ import annotations

import importlib
import sys


def main() -> int:
    if len(sys.argv) < 2 or not sys.argv[1].startswith("stack."):
        print(__doc__, file=sys.stderr)
        return 2
    name = sys.argv[1]
    module = importlib.import_module(name)
    run = getattr(module, "main", None)
    if not callable(run):
        print(f"{name} has no main(): it is not a child process of the stack", file=sys.stderr)
        return 2
    sys.argv = [name, *sys.argv[2:]]  # the child reads its own arguments, as under `python -m MODULE`
    code = run()
    return code if isinstance(code, int) else 0


if __name__ == "__main__":
    raise SystemExit(main())
