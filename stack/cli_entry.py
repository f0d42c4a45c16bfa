"""`python -m stack.cli_entry ...` runs the CLI (the same as the `vstack` script)."""

from stack.cli import main

main()
