"""Helpers only the tests use: the `vstack` CLI fixture (cli). What benchmarks use as well (engines rendered as
`vstack up` renders them, free ports and waits, the gateway in a thread, the mock upstream, the Ray cluster,
the CLI runner) is in bench.harness (adr/0024)."""
