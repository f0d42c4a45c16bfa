"""Benchmarks of the stack, run from the checkout (docs/development/benchmarks.md).

`bench.harness` is the one shared part: starting and stopping engines and stacks, waiting for them, the
results writer and its manifest, the performance page. The scripts beside it import the harness and `stack`,
never each other and never `tests` (.importlinter)."""
