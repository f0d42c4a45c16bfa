"""What runs on a Ray node for one replica: a small actor that starts vLLM as its child and answers for it.

The actor holds the replica's resources (its placement group bundle, or its node for a pipeline whose
workers vLLM's Ray executor places), picks a free port on its node, and starts the engine in its own
process group with PR_SET_PDEATHSIG: when the actor dies (killed, or its node lost) the engine dies with
it, so a lost node never leaves an engine serving that nobody routes to or stops.
"""

from __future__ import annotations

import ctypes
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

from stack.engine.diagnose import log_size, log_tail
from stack.engine.ports import free_port
from stack.engine.process import stop_process_tree
from stack.engine_env import ENGINE_KEY_ENV, engine_environ
from stack.planner.disaggregation_args import SIDE_CHANNEL_HOST, SIDE_CHANNEL_PORT, side_channel
from stack.planner.kv_events_args import publishes, with_endpoints

PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # runs in the child between fork and exec
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def bind_to(argv: list[str], host: str, port: int) -> list[str]:
    out = list(argv)
    for i, arg in enumerate(out[:-1]):
        if arg == "--host":
            out[i + 1] = host
        elif arg == "--port":
            out[i + 1] = str(port)
    return out


def node_ip(engine_host: str) -> str:
    if engine_host == "loopback":
        return "127.0.0.1"
    import ray

    return ray.util.get_node_ip_address()


def kv_endpoints(host: str, engine_host: str) -> tuple[str, str, str, str | None]:
    """(publish, replay, where the gateway subscribes, a folder to remove at stop) for a replica's KV events.
    Loopback: Unix sockets in a folder of our own (mode 0700): the events carry prompts' token ids, and no
    other user of the machine may read them. Node: vLLM binds a PUB socket only on a wildcard address
    (tcp://*:PORT, every interface of the node: keep the cluster's network internal, as for the engines' HTTP);
    its replay socket binds the node's IP."""
    if engine_host == "loopback":
        folder = tempfile.mkdtemp(prefix="vstack-kv-")
        return f"ipc://{folder}/events", f"ipc://{folder}/replay", f"ipc://{folder}/events", folder
    port, replay = free_port(host), free_port(host)
    return f"tcp://*:{port}", f"tcp://{host}:{replay}", f"tcp://{host}:{port}", None


class EngineHost:
    """The actor's class (made a Ray actor by stack.engine.ray_runtime). Its methods run on its node."""

    def __init__(self) -> None:
        self.popen: subprocess.Popen[bytes] | None = None
        self.log_path: Path | None = None
        self.log_start = 0
        self.kv_folder: str | None = None

    def start(self, argv: list[str], env: dict[str, str], log_path: str, engine_host: str,
              drop_env: tuple[str, ...] = ()) -> dict:  # fmt: skip
        """Start the engine on this node; `drop_env`: variables of the actor's own environment the engine
        must not inherit (Ray empties CUDA_VISIBLE_DEVICES for an actor without GPUs; a pipeline's API
        server must still see the node's devices to start vLLM's CUDA platform)."""
        import ray

        host = node_ip(engine_host)
        port = free_port(host)
        self.log_path = Path(log_path)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log_start = log_size(self.log_path)
        argv = bind_to(argv, host, port)
        kv: dict[str, str] = {}
        if publishes(argv):
            publish, replay, subscribe, self.kv_folder = kv_endpoints(host, engine_host)
            argv = with_endpoints(argv, publish, replay)
            kv = {"kv_events": subscribe, "kv_replay": replay}
        if side_channel(argv):  # its NIXL handshake listener: a port of its own on its node (adr/0052)
            env = {**env, SIDE_CHANNEL_HOST: host, SIDE_CHANNEL_PORT: str(free_port(host))}
            kv["side_channel"] = f"{host}:{env[SIDE_CHANNEL_PORT]}"
        with open(self.log_path, "ab") as log:
            log.write(f"\n==> vstack (ray node {ray.get_runtime_context().get_node_id()[:8]}): starting\n".encode())
            log.flush()
            self.popen = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                          env=engine_environ({**env, "PYTHONUNBUFFERED": "1"},
                                                             env.get(ENGINE_KEY_ENV), drop_env),
                                          start_new_session=True, preexec_fn=_die_with_parent)  # fmt: skip
        return {"host": host, "port": port, "pid": self.popen.pid,
                "node_id": ray.get_runtime_context().get_node_id(), **kv}  # fmt: skip

    def exit_code(self) -> int | None:
        return self.popen.poll() if self.popen else None

    def stop(self, grace: float = 20) -> list[int]:
        if self.popen is None:
            return []
        left = stop_process_tree(self.popen.pid, grace)
        if self.kv_folder:
            shutil.rmtree(self.kv_folder, ignore_errors=True)
        return left

    def logs(self, lines: int = 40) -> str:
        return log_tail(self.log_path, lines, self.log_start) if self.log_path else ""
