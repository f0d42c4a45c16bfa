"""Checks that measure this machine as much as the code (adr/0038): run on demand, never by the suite.

    .venv/bin/pytest bench/checks -p no:cacheprovider            # all of them (~40 minutes on 2 cores)
    .venv/bin/pytest bench/checks/test_tune_grid.py -n 0          # one

They are the suite's former speed comparisons, searches and grids, kept whole with the suite's fixtures and
environment (tests/conftest.py: the run's shared engine, the `solo` lock, the test environment)."""

from __future__ import annotations

from tests.conftest import (  # noqa: F401 (fixtures and hooks, as pytest finds them in a conftest)
    _clean_env,
    pytest_collection_modifyitems,
    pytest_configure,
    pytest_runtest_protocol,
    pytest_sessionfinish,
    vllm_engine,
)
from tests.gateway.conftest import cloud_mock  # noqa: F401
from tests.load.conftest import vstack  # noqa: F401
