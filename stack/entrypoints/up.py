"""The gateway that owns its engines, as a process of its own: what the compose gateway runs, and what
`vstack up` starts in the background (stack.cli.gateway_process has the code and says how).

    python -m stack.entrypoints.up [PROFILE] --port P [--config FILE]          plans, then serves
    python -m stack.entrypoints.up --plan FILE [--secrets-stdin] --port P       serves a plan `vstack up` made
"""

from stack.cli.gateway_process import main

if __name__ == "__main__":
    main()
