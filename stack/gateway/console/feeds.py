"""What the console keeps while pages are open, and what it feeds them each second: the Live page's engine
and gateway figures, new log lines for the Logs page, new requests for the Activity page."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

from stack.gateway.console.hub import Hub
from stack.gateway.console.live import Series, engine_row, gateway_row
from stack.gateway.console.logs import GatewayLog, follow
from stack.gateway.console.sessions import Sessions
from stack.gateway.console.sources import ConsoleSources
from stack.gateway.console.throttle import LoginThrottle
from stack.gateway.http.route_context import GatewayState
from stack.gateway.prom_text import parse
from stack.gateway.registry import Deployment

SCRAPABLE = ("ready", "sleeping")


class Console:
    """What the console keeps: sessions, the event hub, the gateway's log ring, the live series, log offsets."""

    def __init__(self, state: GatewayState, sources: ConsoleSources) -> None:
        self.state, self.sources = state, sources
        self.sessions = Sessions()
        self.throttle = LoginThrottle()
        self.hub = Hub(self.tick)
        self.gateway_log = GatewayLog()
        self.series: dict[str, Series] = {}
        self.log_seq = 0
        self.offsets: dict[str, int] = {}
        self.logs_followed_at = 0.0
        self.activity_seen, self.activity_read_at = 0, 0.0

    # -- the once-a-second sample, while a page listens ----------------------------------------------
    async def tick(self, hub: Hub) -> None:
        if hub.wants("live"):
            hub.publish("live", await self.sample())
        if hub.wants("log"):
            for source, lines in self.new_lines():
                hub.publish("log", {"source": source, "lines": lines})
        if hub.wants("activity"):
            ring = self.state.dispatcher.activity
            if time.monotonic() - self.activity_read_at > 3:  # after a pause: the last seconds only (pages
                self.activity_seen = ring.before(time.time() - 5)  # opening now read the list; they skip twins)
            self.activity_read_at = time.monotonic()
            if rows := ring.since(self.activity_seen):
                self.activity_seen = rows[-1]["id"]
                hub.publish("activity", rows)

    async def sample(self) -> dict[str, Any]:
        state = self.state
        engines = [d for d in state.registry.all() if d.kind == "local" and d.api_base and d.state in SCRAPABLE]
        texts = await asyncio.gather(*(self._scrape(d) for d in engines))
        rows = []
        for dep, text in zip(engines, texts, strict=True):
            series = self.series.setdefault(dep.id, Series())
            if text is not None:
                series.add(parse(text))
            rows.append({"id": dep.id, "model": dep.model_group, "state": dep.state, **engine_row(series)})
        gateway = self.series.setdefault("gateway", Series())
        gateway.add(parse(state.metrics.render().decode()))
        used = state.manager.probe.used() if state.manager is not None else None
        return {"engines": rows, "gateway": gateway_row(gateway),
                "gpu_used_gib": None if used is None else round(used / 2**30, 2)}  # fmt: skip

    async def _scrape(self, dep: Deployment) -> str | None:
        """An engine's /metrics with its key (an engine we started answers 401 without it), read from the
        registry at each sample: a cold start draws a new key and port after the console started."""
        try:
            async with self.state.dispatcher.local.session.get(f"{dep.api_base}/metrics", headers=dep.auth()) as resp:
                return (await resp.read()).decode(errors="replace") if resp.status == 200 else None
        except Exception:
            return None

    def log_files(self) -> dict[str, Path]:
        manager = self.state.manager
        if manager is None:
            return {}
        files = {}
        for name, slot in manager.slots.items():
            path = getattr(slot.runtime.spec, "log_path", None)
            if path:
                files[name] = Path(path)
        return files

    def new_lines(self) -> list[tuple[str, list[str]]]:
        """Lines written since the last tick. After a pause (no Logs page open) following starts again at the
        ends: a page opening later read the tail already (/ui/api/logs)."""
        now, out = time.monotonic(), []
        if now - self.logs_followed_at > 3:
            self.offsets.clear()
            self.log_seq = self.gateway_log.before(time.time() - 5)  # the page skips lines it has
        self.logs_followed_at = now
        self.log_seq, lines = self.gateway_log.since(self.log_seq)
        if lines:
            out.append(("gateway", lines))
        for name, path in self.log_files().items():
            key = str(path)
            if key not in self.offsets:
                self.offsets[key] = size_of(path)
                continue
            self.offsets[key], lines = follow(path, self.offsets[key])
            if lines:
                out.append((name, lines))
        return out

    async def close(self, _state: GatewayState) -> None:
        await self.hub.stop()
        for name in ("", "uvicorn.error"):
            logging.getLogger(name).removeHandler(self.gateway_log)


def size_of(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0
