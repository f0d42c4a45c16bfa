"""`python -m stack.entrypoints.cli ...` runs the CLI (the same as the `vstack` script)."""

from stack.cli import main

if __name__ == "__main__":
    main()
