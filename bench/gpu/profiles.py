"""Profile rows: a shipped GPU profile served through the project's own code, checked end to end.

For one profile: dummy-weight model folders of the real shape, a config overlay (below), then
`vstack --config OVERLAY up PROFILE` (gateway -> engine), the official `openai` client through the gateway
(a streamed chat, a json_schema answer), the engine's series on /metrics/engines/<id>, the planner's KV
tokens next to the engine's logged `KV cache size`, and `vstack down` with the GPU memory back (NVML).

The overlay is the documented test-only override (README "GPU suite"): every model's `source.path` points at
its dummy folder, `engine.load_format: dummy`, its own state/cache folders. A profile for a smaller card
(an RTX 4090 on an H200) is held to that card: the hardware profile's usable memory becomes this GPU's, and
gpu_memory_utilization is scaled so that utilization x this GPU = the profile's utilization x the card. The
planner then sees the card's budget exactly (same bytes), and vLLM gets the same bytes to use.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from bench.gpu.device import Device
from bench.harness.dummy_models import fixture_config, write_model
from bench.harness.scrape import engine_metrics_text, engine_targets
from bench.harness.stack_cli import Vstack
from bench.harness.waiting import free_port

ROOT = Path(__file__).resolve().parents[2]
GIB = 1024**3
VLLM_DEFAULT_UTILIZATION = 0.92
KV_PATTERNS = {
    "kv_tokens": r"KV cache size: ([\d,]+) tokens",
    "max_concurrency": r"Maximum concurrency for [\d,]+ tokens per request: ([\d.]+)x",
    "kv_gib": r"Available KV cache memory: ([\d.]+) GiB",
    "weights_gib": r"Model loading took ([\d.]+) ?GiB",
    "torch_peak_gib": r"torch peak memory increase: ([\d.]+) ?GiB",
    "non_torch_gib": r"non-torch forward increase memory: ([\d.]+) ?GiB",
    "cudagraph_gib": r"Estimated CUDA graph memory: ([\d.]+) GiB",
    "non_kv_gib": r"Total non KV cache memory: ([\d.]+) ?GiB",
}
JSON_SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
               "additionalProperties": False}


def parse_engine_log(text: str) -> dict[str, float]:
    found: dict[str, float] = {}
    for key, pattern in KV_PATTERNS.items():
        m = re.search(pattern, text)
        if m:
            found[key] = float(m.group(1).replace(",", ""))
    return found


def fixture_for(hub_id: str | None) -> str:
    """stack/planner/known_configs/<org>--<repo>.json names a model's config by its Hub id."""
    if not hub_id:
        raise ValueError("the model has no Hub id: no config fixture to take its shape from")
    return hub_id.replace("/", "--")


@dataclass
class ProfileRun:
    """Everything one profile row needs, decided before anything starts."""

    profile: str
    hardware: str
    model: str
    served: str
    overlay: Path
    state_dir: Path
    held_to: str  # "" or "RTX 4090 (23.6 GiB of the 139.8 GiB H200)"
    engine_overrides: dict[str, Any] = field(default_factory=dict)


def gpu_profiles(cfg: Any) -> list[str]:
    return sorted(n for n, p in cfg.profiles.items() if cfg.hardware[p.hardware].accelerator == "gpu")


def prepare(cfg: Any, profile: str, device: Device, work: Path, extra_models: list[str] | None = None,
            engine: dict[str, Any] | None = None, manager: dict[str, Any] | None = None,
            model_engine: dict[str, dict[str, Any]] | None = None) -> ProfileRun:
    """Dummy model folders and the overlay for `profile` (and `extra_models`, for switching) on `device`.
    `engine`: vLLM options for every model; `model_engine`: per model name, options over those (a context
    one model's checkpoint allows and the other's does not)."""
    from stack.config.resolve import resolve_profile

    if profile in cfg.profiles:
        hw_name = cfg.profiles[profile].hardware
    else:  # a model, served on the hardware profile this GPU matches
        from stack.hardware import detect, match_profile

        hw_name = match_profile(detect(), cfg)[0].name
    resolved = resolve_profile(cfg, profile, hw_name)
    hw = resolved.hardware
    overrides: dict[str, Any] = {"load_format": "dummy", **(engine or {})}
    hardware_patch: dict[str, Any] = {}
    card = hw.planner.usable_memory_gib or (hw.memory_gib or 0) * 0.985
    device_gib = device.cuda_total / GIB
    held_to = ""
    scaled_down = hw.accelerator == "gpu" and hw.gpu_count > device.count > 0
    # A profile scaled down to under half its GPUs keeps this GPU's memory: its card x so few GPUs cannot hold
    # the context it was written for (70B bf16 on 2 x A100 80 GB), which the planner refuses before starting.
    # From half on (tensor parallel 4 of 8: 4 x 80 GB for 141 GB of weights) the card's memory per GPU holds it,
    # and the row is held to it as the card would run (issue 57).
    card_per_gpu = not scaled_down or device.count * 2 >= hw.gpu_count
    if card < device_gib - 0.05 and card_per_gpu:
        util = float(overrides.get("gpu_memory_utilization") or resolved.engine.get("gpu_memory_utilization")
                     or VLLM_DEFAULT_UTILIZATION)
        overrides["gpu_memory_utilization"] = round(util * card / device_gib, 6)
        hardware_patch = {"name": hw.name, "planner": {"usable_memory_gib": round(device_gib, 4)}}
        held_to = f"{hw.name}: {util:g} x {card:g} GiB of the {device_gib:.1f} GiB {device.name}"
        # vLLM picks its batch defaults from the GPU it runs on (8192/1024 on an H200, 2048/256 below 70 GiB
        # or on A100s): take the emulated card's, as vLLM would there, unless the profile sets them.
        for key, value in (("max_num_batched_tokens", hw.planner.default_max_num_batched_tokens),
                           ("max_num_seqs", hw.planner.default_max_num_seqs)):
            if resolved.engine.get(key) is None and key not in overrides:
                overrides[key] = value
    kv_dtype = str(overrides.get("kv_cache_dtype") or resolved.engine.get("kv_cache_dtype") or "auto")
    model_dtype = str(fixture_config(fixture_for(resolved.model.source.hub)).get("torch_dtype", ""))
    if device.hopper and kv_dtype.startswith("fp8") and model_dtype == "float16" and "dtype" not in overrides:
        # FlashAttention 3 (Hopper) writes an fp8 cache's attention output only in bf16: an fp16 checkpoint
        # with an fp8 KV cache fails there (not on the Ada/Ampere card the profile is for). Same bytes.
        overrides["dtype"] = "bfloat16"
        held_to = (held_to + "; " if held_to else "") + "dtype bfloat16 (FA3 on Hopper: fp8 KV needs bf16)"
    if scaled_down:
        hardware_patch = {"name": hw.name, "planner": {"usable_memory_gib": round(device_gib, 4)}}
        # An 8-GPU profile on the GPUs at hand: tensor parallel over all of them, per-GPU memory as the card's.
        overrides["tensor_parallel_size"] = device.count
        # On the hardware it scales, not stack-wide: a stack-level value would apply to every shipped profile,
        # and the single-GPU ones are refused by validation (tensor parallel 2 on one GPU).
        hardware_patch["engine"] = {"tensor_parallel_size": device.count}
        per_gpu = f"{card:g} GiB per GPU (the card's)" if held_to else f"{device_gib:.1f} GiB per GPU"
        held_to = (held_to + "; " if held_to else "") + f"tensor parallel {device.count} of {hw.gpu_count}, {per_gpu}"
    engine_env: dict[str, str] = {}
    if hardware_patch and device.hopper and not str(hw.compute_capability or "").startswith("9."):
        # The card's kernels too, not only its memory: vLLM would serve 4-bit weights through Machete here
        # (Hopper only, 16-bit zero points) but through Marlin on the Ada/Ampere card the profile is for.
        # With Machete disabled vLLM takes the next kernel in its list, Marlin, as on the card; the planner
        # keeps the card's compute capability.
        engine_env["VLLM_DISABLED_KERNELS"] = "MacheteLinearKernel"
        held_to += "; the card's kernels (Machete off: Marlin)"
    if hw.accelerator != "cpu":
        # vLLM's profile result (torch peak, non-torch increase) is logged at debug level only: the row keeps
        # every term of vLLM's budget beside the planner's.
        engine_env["VLLM_LOGGING_LEVEL"] = "DEBUG"
    models = [resolved.model.name, *(extra_models or [])]
    model_patch = {}
    for name in models:
        entry = cfg.models[name]
        folder = write_model(work / "models" / name, fixture_config(fixture_for(entry.source.hub)))
        model_patch[name] = {"name": name, "source": {"path": str(folder)},
                             **({"engine": model_engine[name]} if name in (model_engine or {}) else {})}  # fmt: skip
    state = work / f"state-{profile}"
    overlay = {
        "state_dir": str(state), "cache_dir": str(work / "cache"), "startup_timeout_s": 420,
        "engine": {k: v for k, v in overrides.items() if k not in hardware_patch.get("engine", {})},
        "models": model_patch,
        **({"hardware": {hw.name: hardware_patch}} if hardware_patch else {}),
        # The switching benches measure models taking turns on one GPU: on a host of several, not spread apart
        # (manager.gpu_placement, adr/0056), unless the bench asks.
        **({"manager": {"gpu_placement": "first", **manager}} if manager else {}),
        # CPU (the driver's own test): one fixed KV space, so that the planner and the engine see the same.
        **({"env": {"VLLM_CPU_KVCACHE_SPACE": "1"}} if hw.accelerator == "cpu" else {"env": engine_env}),
    }
    path = work / f"overlay-{profile}.yaml"
    path.write_text(yaml.safe_dump(overlay, sort_keys=False))
    return ProfileRun(profile, hw.name, resolved.model.name, resolved.served_name, path, state, held_to, overrides)


def planner_prediction(run: ProfileRun, profile: str | None = None) -> dict[str, Any]:
    """What `vstack up` plans for this profile here: the same config, the same detected hardware."""
    from stack.config import load_config
    from stack.config.resolve import resolve_profile
    from stack.hardware import detect, match_profile
    from stack.planner import fit_profile

    cfg = load_config(run.overlay)
    info = detect()
    hw_profile, _ = match_profile(info, cfg)
    resolved = resolve_profile(cfg, profile or run.profile, hw_profile.name)
    folder = Path(cfg.models[resolved.model.name].source.path or "")
    plan = fit_profile(resolved, info, cfg=cfg, model_dir=folder)
    return {"kv_tokens": plan.kv_tokens, "max_model_len": plan.max_model_len,
            "max_concurrency": round(plan.max_concurrency, 2), "budget_gib": plan.budget.as_gib(),
            "weights_gib": round(plan.budget.weights / GIB, 2), "kv_gib": round(plan.budget.kv / GIB, 2),
            "decisions": plan.engine_updates}


def vstack(run: ProfileRun, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return Vstack(config=run.overlay)(*args, timeout=timeout)


def chat_checks(base: str, served: str) -> dict[str, Any]:
    """A streamed chat and a json_schema answer through the gateway, with the official client."""
    from openai import OpenAI

    client = OpenAI(base_url=f"{base}/v1", api_key="unused", timeout=300, max_retries=0)
    out: dict[str, Any] = {}
    t0 = time.perf_counter()
    chunks, first, finish = 0, None, None
    stream = client.chat.completions.create(model=served, messages=[{"role": "user", "content": "t7 t8 t9"}],
                                            max_tokens=16, stream=True)
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            chunks += 1
            first = first or time.perf_counter() - t0
        if chunk.choices and chunk.choices[0].finish_reason:
            finish = chunk.choices[0].finish_reason
    out["chat_ok"] = chunks > 0 and finish is not None
    out["chat"] = {"content_chunks": chunks, "first_token_s": round(first or -1, 3), "finish_reason": finish}
    resp = client.chat.completions.create(
        model=served, messages=[{"role": "user", "content": "t3 t4"}], max_tokens=64, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "answer", "schema": JSON_SCHEMA,
                                                                "strict": True}})
    text = resp.choices[0].message.content or ""
    try:
        value = json.loads(text)
        out["json_ok"] = isinstance(value, dict) and isinstance(value.get("ok"), bool) and set(value) == {"ok"}
    except ValueError:
        out["json_ok"] = False
    out["json_answer"] = text[:200]
    out.update(tool_checks(client, served))
    return out


# The city is an enum so the grammar closes the string: a free string over random weights and a 150k-word
# vocabulary almost never picks the closing quote, and the call was cut at max_tokens (unparseable JSON).
# A `required` call spelled char by char is ~74 tokens; with parallel_tool_calls=false the grammar admits one
# call (vLLM 0.32+ itself, 0.26 through the ledger's single-tool-call-grammar patch; before it, further calls
# ran on and a call cut at max_tokens made the parser drop them all). The budget is headroom for a random walk
# through the grammar's whitespace (tests/gpu/test_driver_cpu.py walks it 20 times).
MAX_TOOL_TOKENS = 600
WEATHER = {"type": "function", "function": {"name": "get_weather", "strict": True, "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Tokyo"]}},
    "required": ["city"], "additionalProperties": False}}}  # fmt: skip


def tool_checks(client: Any, served: str) -> dict[str, Any]:
    """Tool calling as the shipped profile serves it (its model family's parser): a named and a `required`
    choice give a call whose arguments parse with the schema's key (vLLM holds them to the schema with
    structured outputs, so even random weights must); `auto` is accepted. Through the gateway."""
    out: dict[str, Any] = {"tools": {}}
    for label, choice in (("named", {"type": "function", "function": {"name": "get_weather"}}),
                          ("required", "required"), ("auto", "auto")):
        try:
            resp = client.chat.completions.create(
                model=served, messages=[{"role": "user", "content": "t5 t6"}], temperature=0,
                max_tokens=16 if label == "auto" else MAX_TOOL_TOKENS,  # auto is free text: only accepted
                tools=[WEATHER], tool_choice=choice, **({} if label == "auto" else {"parallel_tool_calls": False}))
        except Exception as exc:  # the status and message go into the row
            out["tools"][label] = f"{type(exc).__name__}: {str(exc)[:200]}"
            continue
        calls = resp.choices[0].message.tool_calls or []
        if label == "auto":
            out["tools"][label] = f"accepted ({len(calls)} calls)"
            continue
        try:
            ok = bool(calls) and all(set(json.loads(c.function.arguments)) == {"city"} for c in calls)
        except ValueError:
            ok = False
        out["tools"][label] = "ok" if ok else f"no parseable call: {str(calls)[:160]}"
    out["tools_ok"] = out["tools"].get("named") == "ok" and out["tools"].get("required") == "ok" and \
        str(out["tools"].get("auto", "")).startswith("accepted")
    return out


def metrics_check(base: str) -> dict[str, Any]:
    """The engine's own vllm:* series, scraped through the gateway (/metrics/targets -> /metrics/engines/ID)."""
    targets = engine_targets(base)
    text = engine_metrics_text(base)
    series = sorted({line.split("{")[0].split(" ")[0] for line in text.splitlines() if line.startswith("vllm:")})
    wanted = ("vllm:num_requests_running", "vllm:prompt_tokens_total", "vllm:generation_tokens_total")
    gateway = httpx.get(f"{base}/metrics", timeout=10).text
    return {"metrics_ok": all(w in series for w in wanted) and "vstack_gateway" in gateway,
            "metrics": {"targets": len(targets), "vllm_series": len(set(series)),
                        "missing": [w for w in wanted if w not in series]}}


def run_profile(cfg: Any, profile: str, device: Device, work: Path, log_dir: Path) -> dict[str, Any]:
    """One profile row. Never raises: a failure is recorded in the row with the log's end."""
    row: dict[str, Any] = {"row": profile, "kind": "profile"}
    run, baseline = None, device.used_bytes()
    try:
        run = prepare(cfg, profile, device, work)
        row.update(hardware=run.hardware, model=run.model, held_to=run.held_to, overrides=run.engine_overrides)
        row["planner"] = planner_prediction(run)
        port = free_port()
        t0 = time.perf_counter()
        up = vstack(run, "up", profile, "--port", str(port))
        row["started_s"] = round(time.perf_counter() - t0, 1)
        row["up_exit"] = up.returncode
        if up.returncode != 0:
            row["error"] = (up.stdout + up.stderr)[-3000:]
            return row
        base = f"http://127.0.0.1:{port}"
        row.update(chat_checks(base, run.served))
        row.update(metrics_check(base))
        engine_log = run.state_dir / "logs" / f"{run.served}.log"
        row["vllm"] = parse_engine_log(engine_log.read_text(errors="replace")) if engine_log.is_file() else {}
        row["used_gib"] = [round(u / GIB, 2) for u in device.used_bytes()]
    except Exception as exc:  # the row records it; the suite goes on with the next one
        row["error"] = f"{type(exc).__name__}: {exc}"[-3000:]
    finally:
        if run is not None:
            down = vstack(run, "down", "--all", timeout=300)
            row["down_exit"] = down.returncode
            row["stopped_clean"], row["memory_after"] = device.wait_released(baseline)
            for log in (run.state_dir / "logs").glob("*.log"):
                (log_dir / f"{profile}--{log.name}").write_bytes(log.read_bytes()[-400_000:])
    finish_kv(row)
    return row


def finish_kv(row: dict[str, Any]) -> None:
    predicted = (row.get("planner") or {}).get("kv_tokens")
    actual = (row.get("vllm") or {}).get("kv_tokens")
    if predicted and actual:
        row["kv_error"] = round(predicted / actual - 1, 4)
