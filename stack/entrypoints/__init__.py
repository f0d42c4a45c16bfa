"""Process entry points, together: each parses its arguments, calls the library, and picks the exit code.
Every `__main__` of the stack is here (tests/test_children.py).

    python -m stack.entrypoints.cli ...                 the `vstack` CLI
    python -m stack.entrypoints.up [PROFILE] --port P   the gateway owning its engines (compose; `vstack up`
                                                        starts it with --plan: stack.cli.gateway_process)
    python -m stack.entrypoints.gateway --upstream ...  a gateway in front of servers already running
    python -m stack.entrypoints.engine_container serve  inside an engine image: plan, fetch, exec vLLM
    python -m stack.entrypoints.bench tune|load ...     `vstack tune` / `vstack bench` without the CLI
    python -m stack.entrypoints.run MODULE ARGS         a child process of the stack, named by module object
                                                        (stack.engine_env.child_argv): the vLLM launcher,
                                                        vLLM introspection, the GGUF conversion, the bench worker
"""
