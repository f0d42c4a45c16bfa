"""The `vstack` fixture for the CLI's end-to-end tests (tests.support.cli.Vstack)."""

from tests.support.cli import vstack  # noqa: F401  (a fixture)
