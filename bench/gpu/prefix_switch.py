"""A long shared prefix across a model switch (issue 31, item 1): the first request of model A after a switch
to B and back, with and without the prefix cache kept across sleep, and the switch times beside it.

    python3 -m bench.gpu.prefix_switch --out F.json [--prefix-tokens 8192] [--cycles 3]   (bench/gpu/prefix_switch.sh)
    python3 -m bench.gpu.prefix_switch --out F.json --cuda-graphs --sides keep    one side per device call: with
    python3 -m bench.gpu.prefix_switch --merge KEEP.json OFF.json --out F.json    CUDA graphs each engine compiles
                                                                                  and captures at its first start

Two shipped models (8B and 7B shapes, dummy weights: the timings are the engines', not the answers') behind
one `vstack up`, switched by the manager (sleep level 1, on this one GPU), once with
`manager.keep_prefix_cache: true` (vLLM's KV offloading CPU tier + the runtime patch
keep-prefix-cache-across-sleep) and once with `false` (today's switch). Per side and cycle:
1. A: the session's prefix (--prefix-tokens words of the dummy vocabulary, one token each) + a question, then
   the same prefix + another question (TTFT with the prefix in A's GPU cache, for reference);
2. `vstack switch B`, B's first request (the switch A -> B and its seconds from /admin/models);
3. `vstack switch A` (the switch back, its seconds), then the first request of A with the prefix + a third
   question: its TTFT is the figure (prefix on the GPU: gone; in the CPU tier: loaded; else recomputed).
The engines' own counters say where the prefix came from: vllm:prefix_cache_hits (GPU) and
vllm:external_prefix_cache_hits (the connector's CPU tier). Goals: TTFT after the return >= 5x better with the
tier; switch time <= 1.1x.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from bench.gpu.device import Device, detect
from bench.gpu.profiles import prepare, vstack
from bench.harness.scrape import engine_targets, sample_sums
from bench.harness.waiting import free_port
from stack.manager.client import admin_headers
from stack.vllm import kv_offload

MODEL_A, MODEL_B = "llama-3.1-8b-instruct", "qwen2.5-7b-instruct"
KV_BYTES_A = 32 * 8 * 128 * 2 * 2  # per token: layers x KV heads x head size x (K, V) x bf16 (128 KiB)
CONTEXT_B = 32768  # Qwen2.5-7B's max_position_embeddings
GIB = 1024**3
COUNTERS = ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total",
            "vllm:external_prefix_cache_hits_total", "vllm:external_prefix_cache_queries_total")  # fmt: skip


def prefix(tokens: int, offset: int = 1000) -> str:
    """`tokens` words of the dummy vocabulary (bench.harness.dummy_models: `t<N>` is one token each)."""
    return " ".join(f"t{offset + i}" for i in range(tokens))


def ttft(base: str, served: str, text: str, timeout: float = 600) -> float:
    from openai import OpenAI

    client = OpenAI(base_url=f"{base}/v1", api_key="unused", timeout=timeout, max_retries=0)
    t0 = time.perf_counter()
    for chunk in client.chat.completions.create(model=served, messages=[{"role": "user", "content": text}],
                                                max_tokens=4, stream=True, temperature=0):  # fmt: skip
        if chunk.choices and chunk.choices[0].delta.content:
            return round(time.perf_counter() - t0, 4)
    raise RuntimeError(f"{served}: the stream ended without a token")


def last_switch(base: str, model: str, state_dir: Path) -> dict[str, Any]:
    # the admin token `vstack up` wrote to the run's state_dir (no admin key here: adr/0039)
    for m in httpx.get(f"{base}/admin/models", timeout=10, headers=admin_headers(base, state_dir)).json()["models"]:
        if m["model"] == model:
            return (m.get("manager") or {}).get("last_switch") or {}
    return {}


def counters(base: str, model: str) -> dict[str, float]:
    text = "".join(httpx.get(f"{base}{t['labels']['__metrics_path__']}", timeout=10).text
                   for t in engine_targets(base)  # awake engines only: A's, once it is back
                   if t["labels"].get("model_group") == model)  # fmt: skip
    return sample_sums(text, COUNTERS)


def model_engines(prefix_tokens: int, keep: bool) -> dict[str, dict[str, Any]]:
    """A's context holds the session (prefix + question + answer); B only answers short questions, within its
    checkpoint's 32k. With the tier kept, A's CPU tier holds the whole prefix with a quarter to spare (the
    stack's 4 GiB default holds 32k tokens of this shape exactly: a longer prompt would push its first blocks out)."""
    a: dict[str, Any] = {"max_model_len": prefix_tokens + 1024}
    if keep:
        a[kv_offload.SIZE_KEY] = max(kv_offload.DEFAULT_GIB, math.ceil(a["max_model_len"] * KV_BYTES_A * 1.25 / GIB))
    return {MODEL_A: a, MODEL_B: {"max_model_len": min(prefix_tokens + 1024, CONTEXT_B)}}


def side(cfg: Any, device: Device, work: Path, log_dir: Path, keep: bool, prefix_tokens: int,
         cycles: int, cuda_graphs: bool = False, options: dict[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
    # Eager by default (both sides fit one call). Eager adds tens of ms to every forward, the floor under A's
    # return too: at 8k on an H100 it bounds the gain at 2.3x (2026-11-27); --cuda-graphs measures what serves.
    engine = {"enforce_eager": not cuda_graphs, "enable_prefix_caching": True, **(options or {})}
    run = prepare(cfg, MODEL_A, device, work / ("keep" if keep else "off"), extra_models=[MODEL_B], engine=engine,
                  manager={"models": [MODEL_A, MODEL_B], "min_residency_s": 0, "quiet_s": 0,
                           "queue_timeout_s": 600, "keep_prefix_cache": keep, "idle_ttl_s": 0},
                  model_engine=model_engines(prefix_tokens, keep))  # fmt: skip
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    out: dict[str, Any] = {"keep_prefix_cache": keep, "cycles": []}
    session = prefix(prefix_tokens)
    try:
        up = vstack(run, "up", MODEL_A, "--port", str(port))
        if up.returncode != 0:
            out["error"] = (up.stdout + up.stderr)[-3000:]
            return out
        ttft(base, MODEL_B, "t5 t6")  # B started once (cold), so every switch below is a sleep + wake
        for cycle in range(cycles):
            vstack(run, "switch", MODEL_A)
            row: dict[str, Any] = {"cycle": cycle}
            row["a_first_s"] = ttft(base, MODEL_A, f"{session} t{50 + cycle}")
            row["a_warm_s"] = ttft(base, MODEL_A, f"{session} t{60 + cycle}")  # prefix in A's GPU cache
            time.sleep(1.0)  # the connector's stores of the prefix's last blocks complete
            t = time.perf_counter()
            vstack(run, "switch", MODEL_B)
            row["switch_to_b_cli_s"] = round(time.perf_counter() - t, 3)
            row["switch_to_b"] = last_switch(base, MODEL_B, run.state_dir)
            row["b_first_s"] = ttft(base, MODEL_B, "t7 t8")
            before = counters(base, MODEL_A)
            t = time.perf_counter()
            vstack(run, "switch", MODEL_A)
            row["switch_to_a_cli_s"] = round(time.perf_counter() - t, 3)
            row["switch_to_a"] = last_switch(base, MODEL_A, run.state_dir)
            row["a_return_s"] = ttft(base, MODEL_A, f"{session} t{70 + cycle}")  # the figure
            after = counters(base, MODEL_A)
            row["a_return_hits"] = {k.removeprefix("vllm:").removesuffix("_total"): after[k] - before[k]
                                    for k in COUNTERS}  # fmt: skip
            out["cycles"].append(row)
            print(f"{'keep' if keep else 'off'} cycle {cycle}: {json.dumps(row)}", flush=True)
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        vstack(run, "down", "--all", timeout=300)
        for log in (run.state_dir / "logs").glob("*.log"):
            (log_dir / f"prefix-{'keep' if keep else 'off'}--{log.name}").write_bytes(log.read_bytes()[-400_000:])
    return out


def median(rows: list[dict[str, Any]], key: str, sub: str | None = None) -> float | None:
    values = [(r[key].get(sub) if sub else r[key]) for r in rows if (r.get(key) if not sub else r.get(key, {}))]
    values = [float(v) for v in values if v is not None]
    return round(statistics.median(values), 4) if values else None


def summary(keep: dict[str, Any], off: dict[str, Any]) -> dict[str, Any]:
    k, o = keep.get("cycles", []), off.get("cycles", [])
    out = {
        "a_return_ttft_s": {"keep": median(k, "a_return_s"), "off": median(o, "a_return_s")},
        "a_warm_ttft_s": {"keep": median(k, "a_warm_s"), "off": median(o, "a_warm_s")},
        "switch_to_a_s": {"keep": median(k, "switch_to_a", "seconds"), "off": median(o, "switch_to_a", "seconds")},
        "switch_to_b_s": {"keep": median(k, "switch_to_b", "seconds"), "off": median(o, "switch_to_b", "seconds")},
    }  # fmt: skip
    r, s = out["a_return_ttft_s"], out["switch_to_a_s"]
    out["ttft_gain_x"] = round(r["off"] / r["keep"], 2) if r["keep"] and r["off"] else None
    out["switch_ratio_x"] = round(s["keep"] / s["off"], 3) if s["keep"] and s["off"] else None
    out["goals_met"] = bool(out["ttft_gain_x"] and out["ttft_gain_x"] >= 5 and out["switch_ratio_x"]
                            and out["switch_ratio_x"] <= 1.1)  # fmt: skip
    return out


def merge(files: list[Path]) -> dict[str, Any]:
    """One result from the sides measured in separate calls (same device, prefix and mode), with the summary."""
    parts = [json.loads(f.read_text()) for f in files]
    result: dict[str, Any] = {}
    for f, part in zip(files, parts, strict=True):
        for key in ("device", "prefix_tokens", "cuda_graphs", "engine_options", "models"):
            if key in result and part.get(key) != result[key]:
                raise SystemExit(f"{f}: {key} {part.get(key)!r} differs from {result[key]!r} in {files[0]}: "
                                 "merge sides of one setup only")  # fmt: skip
            result[key] = part.get(key)
        for name in ("keep", "off"):
            if name in part:
                result[name] = part[name]
    missing = [name for name in ("keep", "off") if name not in result]
    if missing:
        raise SystemExit(f"no {' and no '.join(missing)} side in {', '.join(map(str, files))}: measure it with --sides")
    result["summary"] = summary(result["keep"], result["off"])
    return result


def main(argv: list[str] | None = None) -> int:
    from stack.config import load_config

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--prefix-tokens", type=int, default=8192)
    ap.add_argument("--cycles", type=int, default=3)
    ap.add_argument("--work", type=Path, default=Path("/tmp/vstack-gpu-prefix"))
    ap.add_argument("--sides", default="keep,off")
    ap.add_argument("--cuda-graphs", action="store_true", help="engines with CUDA graphs (default: eager)")
    ap.add_argument("--merge", type=Path, nargs="+", metavar="SIDE.json", help="combine sides measured apart")
    ap.add_argument("--engine", action="append", default=[], metavar="KEY=VALUE",
                    help="a vLLM option for both models, e.g. block_size=64 (a YAML value)")  # fmt: skip
    args = ap.parse_args(argv)
    import yaml

    options: dict[str, Any] = {}
    for item in args.engine:
        key, sep, value = item.partition("=")
        if not sep or not key:
            ap.error(f"--engine {item!r}: write KEY=VALUE, e.g. --engine block_size=64")
        options[key.strip()] = yaml.safe_load(value)
    if args.merge:
        result = merge(args.merge)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps(result["summary"], indent=2))
        return 0 if result["summary"]["goals_met"] else 1
    device = detect()
    log_dir = args.out.parent / "prefix-switch-logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    cfg = load_config()
    result: dict[str, Any] = {"device": device.name, "prefix_tokens": args.prefix_tokens,
                              "cuda_graphs": args.cuda_graphs, "engine_options": options,
                              "models": [MODEL_A, MODEL_B]}  # fmt: skip
    for name in args.sides.split(","):
        result[name] = side(cfg, device, args.work, log_dir, name == "keep", args.prefix_tokens, args.cycles,
                            args.cuda_graphs, options)  # fmt: skip
        args.out.write_text(json.dumps(result, indent=2) + "\n")  # what ran so far survives a cut
    if "keep" in result and "off" in result:
        result["summary"] = summary(result["keep"], result["off"])
        print(json.dumps(result["summary"], indent=2), flush=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0 if result.get("summary", {}).get("goals_met") else 1


if __name__ == "__main__":
    sys.exit(main())
