"""`python -m stack.entrypoints.cli ...` runs the CLI (the same as the `vstack` script)."""

from stack.cli import main

main()
