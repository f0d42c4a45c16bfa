"""The console's parts on their own: live figures from real Prometheus text (prometheus_client writes it as
vLLM's engines do), the activity ring and its export, the configuration as the Plan page shows it."""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from stack.config import load_config
from stack.config.redact import MASK, redacted_dump
from stack.gateway.console.live import Series, engine_row
from stack.gateway.prom_text import parse
from stack.gateway.routing.activity import ActivityRing, to_csv


def engine_metrics() -> tuple[CollectorRegistry, Histogram, Counter, Gauge]:
    r = CollectorRegistry()
    ttft = Histogram("vllm:time_to_first_token_seconds", "ttft", ["model_name"], registry=r,
                     buckets=(0.01, 0.05, 0.1, 0.5, 1.0))  # fmt: skip
    gen = Counter("vllm:generation_tokens", "tokens", ["model_name"], registry=r)
    kv = Gauge("vllm:kv_cache_usage_perc", "kv", ["model_name"], registry=r)
    return r, ttft, gen, kv


def test_ttft_percentiles_and_rates_come_from_the_difference_of_two_scrapes() -> None:
    r, ttft, gen, kv = engine_metrics()
    for _ in range(50):  # before the window: must not count
        ttft.labels("m").observe(0.9)
    series = Series()
    series.add(parse(generate_latest(r).decode()))
    for v in [0.02] * 50 + [0.3] * 50:
        ttft.labels("m").observe(v)
    gen.labels("m").inc(200)
    kv.labels("m").set(0.25)
    time.sleep(0.2)
    series.add(parse(generate_latest(r).decode()))
    row = engine_row(series)
    assert 10 <= row["ttft_p50_ms"] <= 50  # the 50th of 100 new observations is in the 0.01-0.05 bucket
    assert 100 <= row["ttft_p95_ms"] <= 500
    assert row["kv_use_pct"] == 25.0
    assert 200 / 0.4 < row["tokens_s"] < 200 / 0.15
    assert row["prefix_hit_pct"] is None and row["waiting"] is None  # series the engine did not send


def test_the_activity_ring_is_bounded_filtered_and_exported_without_bodies() -> None:
    ring = ActivityRing(size=3)
    t0 = time.perf_counter()
    for i, status in enumerate(["200", "503", "200", "200"]):
        ring.add(endpoint="chat", model=f"m{i % 2}", deployment="engine-m", route="local", status=status,
                 started=t0, ttft_s=0.05, usage={"prompt_tokens": 7, "completion_tokens": 3})  # fmt: skip
    rows = ring.last()
    assert [r["id"] for r in rows] == [4, 3, 2]  # newest first, the oldest dropped
    assert [r["id"] for r in ring.last(status="error")] == [2]
    assert [r["id"] for r in ring.last(model="m0", status="ok")] == [3]
    assert rows[0]["ttft_ms"] == 50.0 and rows[0]["tokens_in"] == 7 and rows[0]["tokens_out"] == 3
    assert [r["id"] for r in ring.since(2)] == [3, 4]  # what the console's stream sends next, oldest first
    assert ring.before(time.time() + 1) == 4 and ring.before(0) == 0
    text = to_csv(rows)
    header = "id,ts,endpoint,model,deployment,route,status,ttft_ms,tokens_in,tokens_out,duration_ms,why,tenant"
    assert text.splitlines()[0] == header
    assert len(text.splitlines()) == 4


def test_the_configuration_shown_masks_every_secret(tmp_path, monkeypatch) -> None:
    config = tmp_path / "stack.yaml"
    config.write_text("hf_token: hf_secret_value_123\nenv: {HF_HOME: /cache/hf, MY_DB_URL: postgres://u:pw@h/db}\n"
                      "gateway:\n  api_keys: [{name: team, sha256: " + "ab" * 32 + "}]\n")  # fmt: skip
    shown = redacted_dump(load_config(config))
    assert shown["hf_token"] == MASK
    assert shown["env"] == {"HF_HOME": "/cache/hf", "MY_DB_URL": MASK}
    assert shown["gateway"]["api_keys"] == [{"name": "team", "sha256": MASK, "env": None, "optional": False}]
    assert shown["gateway"]["admin_key"]["env"] == "VSTACK_ADMIN_KEY"  # a variable's name is not a secret
    assert "hf_secret_value_123" not in str(shown) and "pw@h" not in str(shown)


def test_every_file_the_pages_name_ships_in_the_package_with_the_vendored_licence() -> None:
    """No CDN: each script and stylesheet a page loads is a file of stack/gateway/console (in the wheel)."""
    import re
    from pathlib import Path

    import stack.gateway.console as console
    from stack.gateway.console.pages import PAGES

    root = Path(console.__file__).parent
    for template in ("page.html", "login.html"):
        text = (root / "templates" / template).read_text()
        names = re.findall(r'(?:src|href)="(/ui/static/[^"{]+)"', text)
        assert names and not re.search(r'(?:src|href)="(?:https?:)?//', text)
        for name in names:
            assert (root / "static" / name.removeprefix("/ui/static/")).is_file(), name
    for page in PAGES:
        assert (root / "static" / "pages" / f"{page}.js").is_file(), page
    vendored = (root / "static" / "vendor" / "VENDORED.md").read_text()
    assert "uPlot | 1.6.32" in vendored and (root / "static" / "vendor" / "uPlot.LICENSE").is_file()


def test_the_live_sampler_scrapes_each_engine_with_its_key_even_one_drawn_after_the_console_started() -> None:
    """Issue 50: the Live page showed "–" for every engine figure, as its sampler scraped without the engine's
    key (the engine's log: `GET /metrics 401`). The engine here answers 401 without its key, as vLLM does."""
    import asyncio
    from types import SimpleNamespace

    import aiohttp
    from aiohttp import web

    from stack.gateway.console.feeds import Console
    from stack.gateway.console.sources import ConsoleSources
    from stack.gateway.metrics import GatewayMetrics
    from stack.gateway.registry import Deployment, DeploymentRegistry

    r, ttft, gen, kv = engine_metrics()
    key, refused = "engine-key-0f3a9c", []

    async def metrics(request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != f"Bearer {key}":
            refused.append(request.path)
            return web.Response(status=401)
        gen.labels("m").inc(40)
        ttft.labels("m").observe(0.03)
        kv.labels("m").set(0.125)
        return web.Response(body=generate_latest(r), content_type="text/plain")

    async def run() -> dict:
        app = web.Application()
        app.router.add_get("/metrics", metrics)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        registry = DeploymentRegistry()
        registry.add(Deployment(id="engine-m", model_group="m", kind="local", upstream_model="m", state="stopped"))
        try:
            async with aiohttp.ClientSession() as session:
                state = SimpleNamespace(registry=registry, metrics=GatewayMetrics(), manager=None,
                                        dispatcher=SimpleNamespace(local=SimpleNamespace(session=session)))  # fmt: skip
                console = Console(state, ConsoleSources())  # type: ignore[arg-type]
                # The engine starts after the console: its port and key come with its state (stack.gateway.engines)
                registry.update("engine-m", api_base=f"http://127.0.0.1:{port}", engine_key=key)
                registry.set_state("engine-m", "ready")
                await console.sample()
                await asyncio.sleep(0.2)
                return await console.sample()
        finally:
            await runner.cleanup()

    row = asyncio.run(run())["engines"][0]
    assert refused == []
    assert row["tokens_s"] is not None and 40 / 0.5 < row["tokens_s"] < 40 / 0.15
    assert row["ttft_p50_ms"] is not None and 10 <= row["ttft_p50_ms"] <= 50
    assert row["kv_use_pct"] == 12.5
