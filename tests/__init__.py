"""The test suite (a package, so `tests` is this checkout's alone for imports and import-linter, adr/0024)."""
