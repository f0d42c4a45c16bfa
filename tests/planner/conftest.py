"""Helpers for the planner's tests: real config.json files of known models, the built-in configuration."""

from __future__ import annotations

import hashlib
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from stack.config import StackConfig, load_config
from stack.planner.model_meta import ModelShape, parse_config
from stack.planner.model_sources import KNOWN_CONFIGS

FIXTURES = KNOWN_CONFIGS  # the config.json copies the planner ships for offline planning, kept once
GIB = 1024**3


def config_of(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / f"{name}.json").read_text())


def shape_of(name: str) -> ModelShape:
    return parse_config(config_of(name), name)


@pytest.fixture(scope="session")
def cfg() -> StackConfig:
    return load_config()


@pytest.fixture(autouse=True)
def _offline_hub(monkeypatch: pytest.MonkeyPatch) -> None:
    # The planner falls back to its built-in copies of known configs; never wait on a network here.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


class _HubStandIn(BaseHTTPRequestHandler):
    """Serves `<root>/<org>/<repo>/<file>` at /<org>/<repo>/resolve/<revision>/<file>, as the Hub does:
    HEAD with ETag and X-Repo-Commit, GET with Range. The Hub is outside this machine: this stands in."""

    root: Path

    def _file(self) -> Path | None:
        parts = self.path.split("?")[0].strip("/").split("/")
        if len(parts) < 5 or parts[2] != "resolve":
            return None
        path = self.root / parts[0] / parts[1] / "/".join(parts[4:])
        return path if path.is_file() else None

    def _headers(self, path: Path, length: int, status: int = 200) -> None:
        self.send_response(status)
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        self.send_header("ETag", f'"{digest}"')
        self.send_header("X-Repo-Commit", "0" * 40)
        self.send_header("Content-Length", str(length))
        self.end_headers()

    def do_HEAD(self) -> None:
        path = self._file()
        if path is None:
            self.send_response(404)
            self.send_header("X-Error-Code", "EntryNotFound")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self._headers(path, path.stat().st_size)

    def do_GET(self) -> None:
        path = self._file()
        if path is None:
            self.do_HEAD()
            return
        data = path.read_bytes()
        if m := re.match(r"bytes=(\d+)-(\d*)", self.headers.get("Range", "")):
            start, end = int(m.group(1)), int(m.group(2) or len(data) - 1)
            data = data[start:end + 1]
            self._headers(path, len(data), 206)
        else:
            self._headers(path, len(data))
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def hub_standin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A local stand-in for the Hugging Face Hub; yields the folder to put <org>/<repo>/files in."""
    root = tmp_path / "hub"
    root.mkdir()
    handler = type("Handler", (_HubStandIn,), {"root": root})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.server_address[1]}")
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", False)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    yield root
    server.shutdown()
    thread.join(5)
