"""Process entry points, together: each parses its arguments, calls the library, and picks the exit code.

    python -m stack.entrypoints.cli ...                 the `vstack` CLI
    python -m stack.entrypoints.up [PROFILE] --port P   the gateway owning its engines (compose; `vstack up`
                                                        starts it with --plan: stack.cli.gateway_process)
    python -m stack.entrypoints.gateway --upstream ...  a gateway in front of servers already running
    python -m stack.entrypoints.engine_container serve  inside an engine image: plan, fetch, exec vLLM
"""
