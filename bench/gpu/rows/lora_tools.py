"""GPU row: LoRA adapters (load on demand, LRU past max_loras/max_cpu_loras) on a real vLLM, one engine
start, with tool choice auto/required/named recorded under LoRA (checked on every profile row instead).
Issue 13; the CPU side is tests/models/test_served_e2e.py.

Needs: a Python with vLLM (the GPU site: PYTHONPATH=/tmp/site, see ../shared/gpu/README.md), torch,
safetensors and httpx; a model folder (config.json + tokenizer; `make_model.py DIR llama8b` gives one,
served with dummy weights) of a family with a tool parser (default: hermes, Qwen2.5's and Qwen3's).
No network, no PEFT: the adapters are written here in PEFT's file format (random, non-zero).

    python3 bench/gpu/rows/lora_tools.py MODEL_DIR --out $OUT/lora_tools.json \
        [--python python3] [--dummy] [--tool-parser hermes] [--adapters 3] [--max-loras 1] [--max-cpu-loras 2]
        [--rank 8] [--port 8123] [--timeout 900] [--extra "--enforce-eager"] [--launcher 'MODULE [ARGS]']

On this CPU machine (a smoke run of the script itself, real SmolLM2 weights):

    VLLM_CPU_KVCACHE_SPACE=1 PYTHONPATH=. python bench/gpu/rows/lora_tools.py \
        ~/.cache/vstack/models/smollm2-135m-instruct --launcher 'stack.entrypoints.run stack.vllm.launcher' \
        --extra "--enforce-eager --dtype float32" --out /tmp/lora_tools.json

What it checks and writes (JSON, one row; exit 1 when a check fails):
- the engine starts with --enable-lora --max-loras N --max-cpu-loras M and the tool parser;
- each adapter loads at runtime (/v1/load_lora_adapter) and answers; with --dummy weights answers are
  noise, so "differs from base" is recorded, not required; every load is timed;
- `vllm:lora_requests_info` shows max_lora=N; a rank above --rank is refused (400) while serving goes on;
- tool_choice named/required/auto with LoRA on: status and whether the call parses, recorded (not a check:
  the profile rows check tools through the gateway);
- latency: the same request on base and on an adapter (p50 of 5), side by side.
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # run as a file: the checkout's bench and stack

from bench.harness.children import Children
from bench.harness.waiting import free_port

# strict: arguments pinned to the schema (vLLM >= 0.32 pins only strict tools by default; 0.26 always did).
TOOL = {"type": "function", "function": {"name": "get_weather", "strict": True, "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}  # fmt: skip


def write_adapter(folder: Path, config: dict, rank: int, seed: int, base: str) -> None:
    """A PEFT LoRA adapter (q_proj, v_proj of every layer) with random non-zero A and B."""
    import torch
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(seed)
    h, layers = config["hidden_size"], config["num_hidden_layers"]
    heads, kv = config["num_attention_heads"], config.get("num_key_value_heads", config["num_attention_heads"])
    head_dim = config.get("head_dim") or h // heads
    tensors = {}
    for i in range(layers):
        for proj, out in (("q_proj", heads * head_dim), ("v_proj", kv * head_dim)):
            key = f"base_model.model.model.layers.{i}.self_attn.{proj}"
            tensors[f"{key}.lora_A.weight"] = (torch.randn(rank, h, generator=g) / h**0.5).to(torch.bfloat16)
            tensors[f"{key}.lora_B.weight"] = (torch.randn(out, rank, generator=g) * 0.02).to(torch.bfloat16)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    (folder / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": 2 * rank, "lora_dropout": 0.0,
        "target_modules": ["q_proj", "v_proj"], "base_model_name_or_path": base, "bias": "none"}))  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model_dir")
    ap.add_argument("--out", default="lora_tools.json")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--dummy", action="store_true", help="--load-format dummy (no weights on the GPU machine)")
    ap.add_argument("--tool-parser", default="hermes")
    ap.add_argument("--adapters", type=int, default=3)
    ap.add_argument("--max-loras", type=int, default=1)
    ap.add_argument("--max-cpu-loras", type=int, default=2)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--port", type=int, default=0, help="default: a free one")
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--extra", default="", help="more `vllm serve` arguments, one string")
    ap.add_argument("--launcher", default="vllm.entrypoints.cli.main",
                    help="what follows `python -m` to run `serve` (vllm-cpu: "
                    "'stack.entrypoints.run stack.vllm.launcher')")
    row = check(ap.parse_args())
    print(json.dumps(row, indent=2))
    return 0 if row["ok"] else 1


def run(device: object, work: Path, log_dir: Path) -> dict:
    """The GPU suite's entry (bench/gpu/suite.py): a Qwen2.5-7B shape (hermes parser) with dummy weights."""
    from bench.harness.dummy_models import fixture_config, write_model

    model = write_model(work / "lora-qwen2.5-7b", fixture_config("Qwen--Qwen2.5-7B-Instruct"))
    args = argparse.Namespace(
        model_dir=str(model), out=str(log_dir / "lora_tools.json"), python=sys.executable, dummy=True,
        tool_parser="hermes", adapters=3, max_loras=1, max_cpu_loras=2, rank=8, port=0, timeout=600,
        extra="--enforce-eager --gpu-memory-utilization 0.5", launcher="vllm.entrypoints.cli.main")
    return check(args)


def check(args: argparse.Namespace) -> dict:
    import httpx

    # A time limit (timeout, the device tool) sends SIGTERM: record it, stop the engine, write the row.
    def _stopped(*_: object) -> None:
        raise TimeoutError("stopped by SIGTERM (time limit)")

    signal.signal(signal.SIGTERM, _stopped)

    config = json.loads((Path(args.model_dir) / "config.json").read_text())
    work = Path(tempfile.mkdtemp(prefix="lora-row-"))
    names = [f"row-a{i + 1}" for i in range(args.adapters)]
    for i, name in enumerate(names):
        write_adapter(work / name, config, args.rank, i + 1, args.model_dir)
    write_adapter(work / "too-big", config, args.rank * 2, 99, args.model_dir)
    args.port = args.port or free_port()
    url = f"http://127.0.0.1:{args.port}"
    launcher = args.launcher.split()
    argv = [args.python, "-m", *launcher, "serve", args.model_dir, "--served-model-name", "base",
            "--host", "127.0.0.1", "--port", str(args.port), "--enable-lora", "--max-loras", str(args.max_loras),
            "--max-cpu-loras", str(args.max_cpu_loras), "--max-lora-rank", str(args.rank), "--max-model-len", "2048",
            "--tool-call-parser", args.tool_parser, "--enable-auto-tool-choice",
            *(["--load-format", "dummy"] if args.dummy else []), *args.extra.split()]  # fmt: skip
    log = Path(args.out).with_suffix(".log")
    row: dict = {"row": "lora_tools", "argv": argv[2 + len(launcher):], "checks": {}}
    t0 = time.monotonic()
    log.unlink(missing_ok=True)
    engines = Children(log.parent, grace=30)
    engine = engines.start(log.stem, argv, {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}, log=log)
    checks = row["checks"]
    try:
        engine.wait_http(f"{url}/health", args.timeout, ok=lambda status: status == 200, interval=1)
        row["startup_s"] = round(time.monotonic() - t0, 1)
        c = httpx.Client(base_url=url, timeout=300)

        def chat(model: str, **extra) -> tuple[dict, float]:
            start = time.perf_counter()
            r = c.post("/v1/chat/completions", json={"model": model, "temperature": 0, "max_tokens": 24,
                                                      **({"max_tokens": 200} if "tools" in extra else {}),
                                                      "messages": [{"role": "user", "content": "Weather in Paris?"}],
                                                      **extra})  # fmt: skip
            return {"status": r.status_code, **r.json()}, time.perf_counter() - start

        base_reply = chat("base", logprobs=True, top_logprobs=2)[0]
        base_text = base_reply["choices"][0]["message"]["content"]
        # Evidence for the tool-choice failure seen with LoRA on dummy weights: degenerate (NaN) logits show up
        # as the same token over and over with NaN / -inf logprobs.
        row["base_text"] = (base_text or "")[:80]
        row["base_logprobs"] = [str(t.get("logprob")) for t in
                                ((base_reply["choices"][0].get("logprobs") or {}).get("content") or [])[:4]]
        loads, answers = {}, {}
        for name in names:
            start = time.perf_counter()
            r = c.post("/v1/load_lora_adapter", json={"lora_name": name, "lora_path": str(work / name)})
            loads[name] = round(time.perf_counter() - start, 3)
            checks[f"load {name}"] = r.status_code == 200
            answers[name] = chat(name)[0]["choices"][0]["message"]["content"]
        row["load_s"] = loads
        row["differs_from_base"] = {n: a != base_text for n, a in answers.items()}
        checks["stable at temperature 0"] = chat(names[0])[0]["choices"][0]["message"]["content"] == answers[names[0]]
        too_big = c.post("/v1/load_lora_adapter", json={"lora_name": "too-big", "lora_path": str(work / "too-big")})
        checks["rank above max refused"] = too_big.status_code >= 400
        checks["serving after a refusal"] = chat("base")[0]["status"] == 200
        metrics = c.get("/metrics").text
        checks["lora_requests_info max_lora"] = f'max_lora="{args.max_loras}"' in metrics
        named, _ = chat("base", tools=[TOOL], tool_choice={"type": "function", "function": {"name": "get_weather"}})
        required, _ = chat("base", tools=[TOOL], tool_choice="required", parallel_tool_calls=False)
        auto, _ = chat("base", tools=[TOOL], tool_choice="auto")
        # Tool choice is checked on every shipped profile (bench/gpu/profiles.py, tool_checks), through the
        # gateway. Here it is recorded with LoRA on, not required: on dummy weights under --enable-lora vLLM
        # 0.26 answered named/required with a 500 (the grammar rejected token 0) and flat logprobs.
        under_lora: dict[str, object] = {}
        for label, reply in (("named", named), ("required", required)):
            calls = ((reply.get("choices") or [{}])[0].get("message") or {}).get("tool_calls") or []
            try:
                parsed = bool(calls) and all("city" in json.loads(call["function"]["arguments"]) for call in calls)
            except ValueError:
                parsed = False
            under_lora[label] = {"status": reply["status"], "parsed": parsed}
        under_lora["auto"] = {"status": auto["status"]}
        row["tools_under_lora"] = under_lora
        row["auto_made_calls"] = bool(auto.get("choices", [{}])[0].get("message", {}).get("tool_calls"))
        lat = {m: statistics.median(chat(m)[1] for _ in range(5)) for m in ("base", names[0])}
        row["latency_p50_s"] = {m: round(v, 4) for m, v in lat.items()}
        row["adapter_over_base"] = round(lat[names[0]] / lat["base"], 3)
    except Exception as exc:  # recorded in the row: the suite shows it
        row["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        engines.stop_all()
    row["ok"] = "error" not in row and all(checks.values())
    Path(args.out).write_text(json.dumps(row, indent=2))
    return row


if __name__ == "__main__":
    sys.exit(main())
