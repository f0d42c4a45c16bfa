"""Process entry points, together: each parses its arguments, calls the library, and picks the exit code.

    python -m stack.entrypoints.cli ...                 the `vstack` CLI
    python -m stack.entrypoints.up [PROFILE] --port P   what `vstack up` runs in the background
    python -m stack.entrypoints.gateway --upstream ...  a gateway in front of servers already running
    python -m stack.entrypoints.engine_container serve  inside an engine image: plan, fetch, exec vLLM
"""
