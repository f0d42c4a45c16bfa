"""`vstack upgrade apply`: a running stack moved to the candidate vLLM without dropping a request.

Through the gateway's admin API only:
1. the candidate engine starts next to the model's engine (where memory allows), from the candidate venv, with
   the profile's rendered options, on loopback;
2. shadow: the check's fixed prompts answered through the gateway (the old engine) and by the candidate,
   compared exactly; a difference, or a failed start, stops the candidate: the old engine never stopped serving;
3. the candidate joins the model's group as a *bridge* (`POST /admin/deployments`): requests are spread over
   both, and while the group's own engine restarts the gateway sends them to the bridge;
4. `POST /admin/reload {"engine_python": candidate}`: the manager drains its engine, stops it and starts it
   again from the candidate's Python (what it owns, restarts, sleeps from now on);
5. once that engine is ready, the bridge is removed (`DELETE`), finishes what it holds, and stops.
If the restarted engine fails, the gateway is reloaded back to the pinned Python, with the bridge serving
until the old version is ready again.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from stack.config.schema import StackConfig
from stack.engine.launch import engine_spec
from stack.engine.ports import free_port
from stack.engine.process import EngineProcess
from stack.errors import EngineError, StackError
from stack.hardware import GIB, HardwareInfo
from stack.manager.client import ADMIN_HINT, admin_headers, gateway_url
from stack.manager.memory import engine_need
from stack.planner.model_planner import plan_model
from stack.planner.plans import ModelPlan
from stack.upgrade import answers as ans
from stack.vllm.options import engine_python, installed_catalog


class RolloutRefused(StackError):
    """The candidate did not take over: its start, its shadow comparison or the restart failed. The old engine
    kept serving (or was brought back)."""


@dataclass
class Rollout:
    model: str
    candidate_python: str
    steps: list[dict[str, Any]] = field(default_factory=list)

    def step(self, name: str, t0: float, **detail: Any) -> None:
        self.steps.append({"step": name, "at_s": round(time.monotonic() - t0, 1), **detail})


# gateway URL -> its admin headers, read once with the config's state_dir (where its admin token lies) by `apply`
_auth: dict[str, dict[str, str]] = {}


def _call(gw: str, method: str, path: str, json: Any = None, timeout: float = 30) -> dict[str, Any]:
    headers = _auth.get(gw)
    try:
        r = httpx.request(method, gw + path, json=json, headers=admin_headers(gw) if headers is None else headers,
                          timeout=timeout)
    except httpx.HTTPError as exc:
        raise EngineError(f"the gateway at {gw} is not reachable ({type(exc).__name__})") from exc
    if r.status_code >= 400:
        raise EngineError(f"{method} {path}: {r.status_code} {r.text[:300]}",
                          hint=ADMIN_HINT if r.status_code in (401, 403) else None)
    return r.json() if r.content else {}


def managed_entry(gw: str, model: str) -> dict[str, Any]:
    for m in _call(gw, "GET", "/admin/models")["models"]:
        if m["model"] == model:
            return m
    raise RolloutRefused(f"the gateway serves no model `{model}`", hint="`vstack models` lists them")


def memory_allows(plan: ModelPlan, hardware: HardwareInfo) -> tuple[bool, str]:
    """Whether the candidate fits beside the running engine, from the planner's need and what is free now."""
    need, how = engine_need(plan.fit)
    if need is None:
        return True, f"need unknown ({how}): tried side by side"
    free = sum(g.memory_free for g in hardware.gpus) if hardware.gpus else hardware.ram_available
    kv = int(plan.env.get("VLLM_CPU_KVCACHE_SPACE", "0") or 0) * GIB if not hardware.gpus else 0
    total = need + kv
    return total <= free, f"needs {total / GIB:.1f} GiB ({how}), {free / GIB:.1f} GiB free"


def wait_model(gw: str, model: str, want: Callable[[dict[str, Any]], bool], timeout_s: float,
               poll_s: float = 1.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    entry: dict[str, Any] = {}
    while time.monotonic() < deadline:
        entry = managed_entry(gw, model)
        if want(entry):
            return entry
        time.sleep(poll_s)
    raise EngineError(f"`{model}` did not reach the wanted state within {timeout_s:.0f} s: {entry.get('manager')}")


def idle(base_url: str) -> bool:
    """No request running or waiting on a (keyless, loopback) engine, from its own metrics."""
    try:
        text = httpx.get(f"{base_url}/metrics", timeout=5).text
    except httpx.HTTPError:
        return True
    busy = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(("vllm:num_requests_running", "vllm:num_requests_waiting")))
    return busy == 0


def apply(cfg: StackConfig, hardware: HardwareInfo, model: str | None, candidate_python: str, prompts: int | None,
          log_dir: Path, url: str | None = None, min_match: float = 1.0,
          on_status: Callable[[str], None] = lambda _s: None) -> Rollout:
    t0 = time.monotonic()
    gw = gateway_url(cfg.state_dir, url)
    _auth[gw] = admin_headers(gw, cfg.state_dir)
    name = model or _call(gw, "GET", "/admin/models")["default"]
    entry = managed_entry(gw, name)
    if not entry.get("manager"):
        raise RolloutRefused(f"`{name}` is not an engine this gateway runs (no manager state)",
                             hint="apply upgrades on the gateway `vstack up` started")
    if entry["manager"]["state"] != "ready":
        raise RolloutRefused(f"`{name}` is {entry['manager']['state']}, not ready: nothing to roll over",
                             hint=f"`vstack load {name}` first")
    ro = Rollout(name, candidate_python)
    pinned = engine_python(cfg.engine_python)
    cand_cfg = cfg.model_copy(update={"engine_python": candidate_python})
    cand_cfg._origins = cfg._origins
    plan = plan_model(cand_cfg, name, hardware, installed_catalog(candidate_python, cfg.cache_dir), port=0,
                      python=candidate_python)
    fits, why = memory_allows(plan, hardware)
    if not fits:
        raise RolloutRefused(f"the candidate does not fit beside the running engine: {why}; nothing was changed",
                             hint="free memory (unload other models) and run it again")
    ro.step("planned", t0, vllm=f"{plan.vllm.distribution} {plan.vllm.version}", memory=why)
    spec = engine_spec(plan, log_dir / f"upgrade-{name}.engine.log", name=f"upgrade-{name}", port=free_port(plan.host))
    spec.api_key = None  # a loopback bridge the gateway fetches from as a runtime deployment (those carry no key)
    bridge = EngineProcess(spec)
    bridge_id = f"upgrade-bridge-{name}"
    registered = False
    try:
        on_status(f"starting the candidate ({plan.vllm.distribution} {plan.vllm.version}) beside `{name}`")
        bridge.start()
        startup = bridge.wait_ready(cfg.startup_timeout_s)
        ro.step("candidate ready", t0, startup_s=round(startup, 1))
        chosen = ans.chosen(prompts)
        on_status(f"shadow: {len(chosen)} prompts through the gateway (old engine) and to the candidate")
        old = ans.ask(gw, name, chosen, api_key=_client_key())
        new = ans.ask(spec.base_url, plan.served_name, chosen)
        compared = ans.compare_answers(old, new)
        ro.step("shadow", t0, **{k: compared[k] for k in ("prompts", "matched", "differences")})
        if (compared["match_rate"] or 0) < min_match:
            firsts = "; ".join(f"{d['id']} at token {d['token']}" for d in compared["differences"])
            raise RolloutRefused(f"shadow comparison: {compared['matched']} of {compared['prompts']} answers "
                                 f"identical ({firsts}); the old engine keeps serving",
                                 hint="run `vstack upgrade check` for the whole report")
        _call(gw, "POST", "/admin/deployments", {"model_group": name, "kind": "local", "id": bridge_id,
                                                 "api_base": spec.base_url,
                                                 "upstream_model": plan.served_name})
        registered = True
        ro.step("bridge registered", t0)
        on_status(f"reloading `{name}` onto {candidate_python}; the bridge serves meanwhile")
        reloaded = _call(gw, "POST", "/admin/reload", {"engine_python": candidate_python}, timeout=120)
        if name not in reloaded.get("restarted", []):
            raise RolloutRefused(f"the reload did not restart `{name}` ({reloaded}): it already runs that Python, or "
                                 "the gateway could not apply it", hint="`vstack status` shows what each engine runs")
        try:
            before = (entry.get("manager") or {}).get("engine")
            left = [False]  # the restart drains first (still `ready`), stops, starts: seen once it left `ready`

            def restarted(e: dict[str, Any]) -> bool:
                mgr = e.get("manager") or {}
                left[0] = left[0] or mgr.get("state") != "ready"
                return mgr.get("state") == "ready" and (left[0] or mgr.get("engine") != before)

            wait_model(gw, name, restarted, cfg.manager.drain_timeout_s + cfg.startup_timeout_s + 60, poll_s=0.5)
            ro.step("engine restarted on the candidate", t0)
            # The bridge goes only once the group's own deployment takes requests (ready in the routing table,
            # not cooling down from failures of the engine it replaced), else the group is left with none.
            wait_model(gw, name, lambda e: any(d["id"] != bridge_id and d["state"] == "ready" and not
                                               d.get("cooling_down") for d in e.get("deployments", [])), 120, 0.5)
            time.sleep(2)
            ro.step("own deployment routable", t0)
        except StackError as exc:
            on_status(f"the restarted engine failed ({exc.message}); reloading back to {pinned}")
            _call(gw, "POST", "/admin/reload", {"engine_python": pinned}, timeout=120)
            wait_model(gw, name, lambda e: (e.get("manager") or {}).get("state") == "ready",
                       cfg.startup_timeout_s + 120)
            raise RolloutRefused(f"`{name}` failed to start from the candidate ({exc.message}); it serves from "
                                 f"{pinned} again", hint=f"read {log_dir}") from exc
    except StackError as exc:
        if not isinstance(exc, RolloutRefused):
            exc = RolloutRefused(f"the candidate did not take over: {exc.message}; the old engine keeps serving",
                                 hint=exc.hint)
        raise exc from None
    finally:
        if registered:
            with contextlib.suppress(StackError):
                _call(gw, "DELETE", f"/admin/deployments/{bridge_id}")
            deadline = time.monotonic() + cfg.manager.drain_timeout_s
            while time.monotonic() < deadline and not idle(spec.base_url):
                time.sleep(0.5)
        bridge.stop(cfg.stop_grace_s)
    ro.step("bridge stopped", t0)
    return ro


def _client_key() -> str | None:
    import os

    return os.environ.get("VSTACK_API_KEY")
