"""Helpers only the tests use: engines rendered as `vstack up` renders them (stack_engine), the `vstack` CLI
fixture (cli). What benchmarks use as well (free ports and waits, the gateway in a thread, the mock upstream,
the Ray cluster, the CLI runner) is in bench.harness (adr/0024)."""
