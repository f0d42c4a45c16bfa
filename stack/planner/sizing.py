"""Sizing: the engine settings a profile leaves unset (GPU count, KV cache dtype, context length, concurrent
sequences, memory share) decided, each with its reason, or a refusal that gives the numbers.

Order matters and follows what constrains what: the GPU count (tensor_parallel_size) decides how much
memory is left after the weights; the KV cache dtype decides how many tokens that memory holds; those two
decide max_model_len; and max_num_seqs follows from the KV cache's size.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from stack.config.schema import HardwareProfile
from stack.config.vllm_rules import field_rules
from stack.planner.allocator import rounding_bytes
from stack.planner.decisions import Decision, Fit, Request
from stack.planner.errors import FitError
from stack.planner.kv_layout import cache_dtype_bytes, in_flight_tokens
from stack.planner.lora_memory import describe as describe_lora
from stack.planner.lora_memory import lora_gpu_bytes
from stack.planner.machine import Machine
from stack.planner.memory import (
    GIB,
    KvGeometry,
    block_size_for,
    cpu_budget,
    gpu_budget,
)
from stack.planner.model_meta import ModelShape
from stack.planner.weight_tensors import weight_tensor_sizes
from stack.planner.weights import Weights, machete_zero_point_bytes
from stack.vllm import cpu_rules
from stack.vllm.cpu_dtype import planned_cpu_dtype
from stack.vllm.cpu_rules import CPU_KV_ENV

TP_CHOICES = (1, 2, 4, 8, 16)
# A context shorter than this is not worth serving: refuse instead.
MIN_CONTEXT = 1024
# max_num_seqs is capped at the number of sequences of this length the KV cache holds.
TYPICAL_SEQUENCE = 512


def gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


@dataclass
class FitInput:
    shape: ModelShape
    weights: Weights
    hardware: HardwareProfile
    machine: Machine
    engine: dict[str, Any]
    origins: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    request: Request = field(default_factory=Request)
    model_label: str = "the model"
    alternatives: list[str] = field(default_factory=list)  # quantized variants in the configuration
    vllm_defaults: Mapping[str, Any] = field(default_factory=dict)  # the engine's option catalogue's, when read

    def given(self, key: str) -> bool:
        return self.engine.get(key) is not None

    @property
    def utilization(self) -> float:
        """The share of each GPU vLLM will take: the profile's gpu_memory_utilization, else vLLM's default."""
        return float(self.engine.get("gpu_memory_utilization") or vllm_default(self, "gpu_memory_utilization"))

    def kept(self, key: str, reason: str) -> Decision:
        return Decision(key, self.engine[key], reason, "profile", self.origins.get(key, ""))


def vllm_default(inp: FitInput, key: str) -> float:
    """vLLM's default for an option the profile leaves unset: from the engine's option catalogue where the plan
    read one (`vstack up`, `vstack config validate`), else from the config classes of the vLLM beside the CLI
    (`vstack plan MODEL` asks no engine)."""
    value = inp.vllm_defaults.get(key)
    if value is None and (rule := field_rules().get(key)) is not None:
        value = rule.default
    if value is None:
        raise FitError(f"vLLM's default {key} is unknown: no vLLM is installed beside vstack to read it from",
                       hint=f"set {key} in the hardware profile's `engine:`, or install vLLM (./install.sh)")
    return float(value)


class _Fit:
    """One candidate: a tensor-parallel size and a KV cache dtype, with its budget."""

    def __init__(self, inp: FitInput, tp: int, kv_dtype: str, num_seqs: int) -> None:
        shape, hw, engine = inp.shape, inp.hardware, inp.engine
        self.tp, self.kv_dtype, self.num_seqs = tp, kv_dtype, num_seqs
        engine_dtype = engine.get("dtype")
        if inp.machine.accelerator == "cpu":  # the stack decides a CPU engine's dtype (stack.vllm.cpu_dtype)
            engine_dtype = planned_cpu_dtype(engine_dtype)
        dtype_bytes = cache_dtype_bytes(kv_dtype, engine_dtype, shape.dtype_bytes)
        self.kv = KvGeometry(shape, dtype_bytes, block_size_for(shape, inp.machine.accelerator,
                                                                 engine.get("block_size")), tp)
        self.batched = int(engine.get("max_num_batched_tokens") or hw.planner.default_max_num_batched_tokens)
        self.in_flight = in_flight_tokens(self.batched, engine, inp.machine.accelerator)
        self.weights = inp.weights.on_load(engine.get("quantization"))
        if inp.machine.accelerator != "cpu":
            self.weights += machete_zero_point_bytes(shape, hw.compute_capability)
            # memory_allocated counts the caching allocator's blocks: per rank, so times tp here
            self.weights += tp * rounding_bytes(weight_tensor_sizes(shape, engine.get("quantization"), tp))
        self.lora = lora_gpu_bytes(shape, engine, tp)  # adapter slots, per GPU: counted with the weights
        if inp.machine.accelerator == "cpu":
            self.budget = cpu_budget(weights_total=self.weights + self.lora, kv_space=_cpu_kv_space(inp),
                                     ram_total=inp.machine.ram_total,
                                     host_overhead_gib=hw.planner.host_overhead_gib)
        else:
            self.budget = gpu_budget(
                shape=shape, weights_total=self.weights + self.lora * tp, total_per_gpu=inp.machine.memory_per_gpu,
                utilization=inp.utilization,
                tp=tp, batched_tokens=self.batched, num_seqs=num_seqs,
                runtime_gib=hw.planner.runtime_overhead_gib, enforce_eager=bool(engine.get("enforce_eager")),
                device=f"per GPU ({tp} of {max(tp, inp.machine.gpu_count)})" if tp > 1 else "per GPU")

    @property
    def kv_bytes(self) -> int:
        return self.budget.kv

    def holds(self, length: int, concurrency: int) -> bool:
        return self.kv_bytes > 0 and self.kv.bytes_per_request(length, self.in_flight) * concurrency <= self.kv_bytes

    def longest(self, concurrency: int) -> int:
        if self.kv_bytes <= 0:
            return 0
        step = 1024 if self.holds(MIN_CONTEXT, concurrency) else self.kv.block_size
        return self.kv.longest_fitting(self.kv_bytes, concurrency, self.in_flight, step)


def _cpu_kv_space(inp: FitInput) -> int:
    if CPU_KV_ENV in inp.env:
        return int(float(inp.env[CPU_KV_ENV]) * GIB)
    if inp.given("kv_cache_memory_bytes"):
        return int(inp.engine["kv_cache_memory_bytes"])
    rule = inp.hardware.cpu_kv_cache
    assert rule is not None  # a CPU profile always has one (schema default)
    return cpu_rules.kv_cache_gib(inp.machine.ram_available, rule) * GIB  # the launcher's own rule


def _target_length(inp: FitInput) -> int:
    """The length a fit must hold: asked for, set by the profile, or (for choosing GPUs) a useful minimum."""
    if inp.request.context:
        return inp.request.context
    if inp.given("max_model_len"):
        return int(inp.engine["max_model_len"])
    return min(inp.shape.max_context, 4096)


def _tp_candidates(inp: FitInput) -> list[int]:
    if inp.given("tensor_parallel_size"):
        return [int(inp.engine["tensor_parallel_size"])]
    count = inp.request.gpus or inp.machine.gpu_count or 1
    # One data-parallel rank's share of the GPUs (each rank spans tensor x pipeline parallel GPUs of its own).
    count = max(1, count // (int(inp.engine.get("data_parallel_size") or 1)
                             * int(inp.engine.get("pipeline_parallel_size") or 1)))  # fmt: skip
    return [tp for tp in TP_CHOICES if tp <= count and inp.shape.num_attention_heads % tp == 0] or [1]


def _kv_dtypes(inp: FitInput) -> list[str]:
    if inp.given("kv_cache_dtype"):
        return [str(inp.engine["kv_cache_dtype"])]
    return ["auto", "fp8"] if inp.hardware.fp8 and inp.machine.accelerator == "gpu" else ["auto"]


def _default_seqs(inp: FitInput) -> int:
    if inp.given("max_num_seqs"):
        return int(inp.engine["max_num_seqs"])
    return inp.hardware.planner.default_max_num_seqs


def _with(inp: FitInput, **engine: Any) -> FitInput:
    return replace(inp, engine={**inp.engine, **engine})


def _gpu_counts(inp: FitInput, fit: _Fit) -> list[tuple[int, int, str]]:
    """Every larger GPU count (one node: at most 8) the weights fit on, each with the longest context it holds
    and why: (GPUs, max_model_len, the reason in figures per GPU)."""
    length, concurrency, heads = _target_length(inp), inp.request.concurrency, inp.shape.num_attention_heads
    out = []
    for tp in (t for t in TP_CHOICES if fit.tp < t <= 8 and heads % t == 0):
        wider = next((w for kv in _kv_dtypes(inp) if (w := _Fit(inp, tp, kv, fit.num_seqs)).holds(MIN_CONTEXT, 1)),
                     None)  # fmt: skip
        if wider is None:
            continue
        longest = min(wider.longest(concurrency), inp.shape.max_context)
        if not _explicit_length(inp):  # nothing asked: the longest it holds, up to the model's own context
            whole = longest == inp.shape.max_context
            context, held = longest, ("the model's whole context" if whole else
                                      f"the longest it holds for {concurrency} request(s) at once")  # fmt: skip
        elif wider.holds(length, concurrency):
            context, held = length, f"holds the {length} asked for"
        else:
            context, held = longest, f"short of the {length} asked for"
        fp8 = ", fp8 KV cache" if wider.kv_dtype.startswith("fp8") else ""
        out.append((tp, context, f"{gib(wider.budget.weights)} of weights per GPU leaves {gib(wider.kv_bytes)} of "
                                 f"KV cache per GPU{fp8}: {held}"))  # fmt: skip
    return out


def _refuse_weights(inp: FitInput, fit: _Fit) -> FitError:
    """Not even the weights (plus vLLM's overhead) fit: say by how much, and every GPU count that would, each
    with the context it holds (issue 50: it said only the smallest count that holds the asked context)."""
    length = _target_length(inp)
    options = list(inp.alternatives)
    counts = _gpu_counts(inp, fit)
    gpus = (lambda n: f"tensor_parallel_size {n}") if inp.given("tensor_parallel_size") else (lambda n: f"{n} GPUs")
    options += [f"{gpus(tp)} (max_model_len {longest})" for tp, longest, _ in counts]
    if inp.hardware.fp8 and not inp.engine.get("quantization") and inp.shape.quantization.bits >= 16:
        fp8 = _with(inp, quantization="fp8")
        if _Fit(fp8, fit.tp, fit.kv_dtype, fit.num_seqs).holds(length, 1):
            options.append("quantization fp8 (weights quantized on load)")
    advice = ", ".join(options[:-1]) + " or " + options[-1] if len(options) > 1 else (options or ["a larger GPU"])[0]
    overhead = fit.budget.non_kv - fit.budget.weights
    where = "on one GPU" if fit.tp == 1 else f"per GPU over {fit.tp} GPUs"
    lines = [f"{gpus(tp)}: max_model_len {longest} ({why})" for tp, longest, why in counts]
    flag = " (`vstack plan ... --gpus N` shows each plan)" if counts else ""
    return FitError(f"weights need {gib(fit.weights)}; {inp.machine.describe(fit.tp)}: use {advice}",
                    hint=f"{inp.model_label} needs {gib(fit.budget.weights)} of weights {where} plus about "
                    f"{gib(overhead)} of vLLM overhead before any KV cache; {gib(fit.budget.requested)} is available "
                    f"per GPU" + (f". The GPU counts that fit{flag}:\n  " + "\n  ".join(lines) if lines else ""))


def _refuse_context(inp: FitInput, fit: _Fit, length: int, concurrency: int) -> FitError:
    need = fit.kv.bytes_per_request(length, fit.in_flight) * concurrency
    longest = fit.longest(concurrency)
    who = f"{concurrency} requests of {length} tokens need" if concurrency > 1 else f"a {length}-token context needs"
    with_fp8 = " (with an fp8 KV cache)" if fit.kv_dtype.startswith("fp8") else ""
    device = inp.machine.describe(fit.tp).split(" has ")[0].split(" have ")[0]
    msg = (f"{who} {gib(need)} of KV cache{with_fp8}; after the weights ({gib(fit.budget.weights)}) and vLLM's "
           f"overhead ({gib(fit.budget.non_kv - fit.budget.weights)}) {gib(max(0, fit.kv_bytes))} is left on "
           f"{device}")
    options = [f"max_model_len {longest}" if longest >= MIN_CONTEXT else None]
    if inp.hardware.fp8 and fit.kv_dtype == "auto" and not inp.given("kv_cache_dtype"):
        options.append("kv_cache_dtype fp8")
    if inp.machine.accelerator == "gpu":
        # Headroom between what vLLM is allowed and what is free before it starts.
        highest = int((inp.machine.free_per_gpu - GIB // 4) / fit.budget.total * 100) / 100
        if highest > inp.utilization:
            options.append(f"gpu_memory_utilization {highest}")
    options += inp.alternatives
    options.append("more GPUs" if inp.machine.accelerator == "gpu" else f"a larger {CPU_KV_ENV}")
    return FitError(msg, hint="use " + " or ".join(o for o in options if o))


def _explicit_length(inp: FitInput) -> bool:
    return bool(inp.request.context or inp.given("max_model_len"))


def _choose(inp: FitInput) -> _Fit:
    """The smallest tensor-parallel size (then the KV cache dtype) that holds the target length; when no
    length was asked for, one that holds at least MIN_CONTEXT tokens."""
    length, concurrency = _target_length(inp), inp.request.concurrency
    if length > inp.shape.max_context:
        # Where the length was asked for: the file and key (or the command line), so that it can be fixed there.
        origin = "--context" if inp.request.context else inp.origins.get("max_model_len") or "max_model_len"
        raise FitError(f"{inp.model_label} has a context of {inp.shape.max_context} tokens; {length} was asked for "
                       f"({origin})", hint=f"ask for at most {inp.shape.max_context}: set max_model_len to "
                       f"{inp.shape.max_context} or less there, or remove it (the planner picks one)")  # fmt: skip
    seqs = _default_seqs(inp)
    fits = [_Fit(inp, tp, kv_dtype, seqs) for tp in _tp_candidates(inp) for kv_dtype in _kv_dtypes(inp)]
    targets = [length] if _explicit_length(inp) else [length, MIN_CONTEXT]
    for target in targets:
        for fit in fits:
            if fit.holds(target, concurrency):
                return fit
    widest = fits[-1]
    if inp.machine.accelerator == "cpu":
        raise _refuse_ram(inp, widest) or _refuse_context(inp, widest, length, concurrency)
    if not widest.holds(MIN_CONTEXT, 1):
        raise _refuse_weights(inp, widest)
    raise _refuse_context(inp, widest, length, concurrency)


def _refuse_ram(inp: FitInput, fit: _Fit) -> FitError | None:
    m = inp.machine
    need = fit.budget.requested
    if m.ram_available and need > m.ram_available:
        return FitError(
            f"weights need {gib(fit.weights)}, the KV cache {gib(fit.kv_bytes)} and vLLM's processes about "
            f"{gib(fit.budget.runtime)}: {gib(need)} in all, and {gib(m.ram_available)} of RAM is free",
            hint=f"use a smaller model, or a smaller {CPU_KV_ENV}")
    return None


def decide(inp: FitInput) -> Fit:
    fit = _choose(inp)
    if inp.machine.accelerator == "cpu" and (error := _refuse_ram(inp, fit)):
        raise error
    decisions = [_decide_tp(inp, fit), _decide_kv_dtype(inp, fit)]
    length, length_decision = _decide_length(inp, fit)
    decisions.append(length_decision)
    seqs_decision = _decide_seqs(inp, fit, length)
    if seqs_decision.value != fit.num_seqs:  # fewer sequences: a smaller sampler peak, more KV cache
        fit = _Fit(inp, fit.tp, fit.kv_dtype, int(seqs_decision.value))
    decisions.append(seqs_decision)
    decisions += _decide_memory(inp, fit)
    tokens, concurrency = fit.kv.capacity(fit.kv_bytes, length, fit.in_flight)
    notes = _notes(inp, fit)
    return Fit(inp.model_label, inp.hardware.name, inp.shape, inp.weights, fit.budget, fit.kv, length,
                tokens, concurrency, [d for d in decisions if d is not None], notes)


def _decide_tp(inp: FitInput, fit: _Fit) -> Decision | None:
    if inp.machine.accelerator == "cpu":
        return None
    if inp.given("tensor_parallel_size"):
        return inp.kept("tensor_parallel_size", f"set; weights take {gib(fit.budget.weights)} per GPU")
    if fit.tp == 1:
        reason = f"the weights ({gib(fit.weights)}) fit on one GPU"
    else:
        reason = (f"the smallest that fits: {gib(fit.weights)} of weights over {fit.tp} GPUs is "
                  f"{gib(fit.budget.weights)} each")
    return Decision("tensor_parallel_size", fit.tp, reason, "planner")


def _decide_kv_dtype(inp: FitInput, fit: _Fit) -> Decision | None:
    if inp.given("kv_cache_dtype"):
        return inp.kept("kv_cache_dtype", f"set; {fit.kv.bytes_per_token} bytes per token")
    if fit.kv_dtype == "fp8":
        length = _target_length(inp)
        return Decision("kv_cache_dtype", "fp8", f"only an fp8 KV cache holds {inp.request.concurrency} x "
                        f"{length} tokens here ({fit.kv.bytes_per_token} bytes per token instead of "
                        f"{fit.kv.bytes_per_token * 2})", "planner")
    return None  # "auto" is vLLM's default: nothing to set


def _decide_length(inp: FitInput, fit: _Fit) -> tuple[int, Decision]:
    concurrency = inp.request.concurrency
    if inp.given("max_model_len"):
        length = int(inp.engine["max_model_len"])
        if not fit.holds(length, concurrency):
            raise _refuse_context(inp, fit, length, concurrency)
        _, fitting = fit.kv.capacity(fit.kv_bytes, length, fit.in_flight)
        return length, inp.kept("max_model_len", f"set; {fitting:.1f} requests of this length fit at once")
    wanted = inp.request.context or inp.shape.max_context
    if fit.holds(wanted, concurrency):
        why = "asked for" if inp.request.context else "the model's own"
        return wanted, Decision("max_model_len", wanted, f"{why}; {concurrency} request(s) of this length fit "
                                f"in the {gib(fit.kv_bytes)} KV cache", "planner")
    longest = min(fit.longest(concurrency), inp.shape.max_context)
    if longest < MIN_CONTEXT:
        raise _refuse_context(inp, fit, MIN_CONTEXT, concurrency)
    return longest, Decision("max_model_len", longest, f"the model's own {inp.shape.max_context} does not fit: "
                             f"the {gib(fit.kv_bytes)} KV cache holds {concurrency} request(s) of at most "
                             f"{longest} tokens", "planner")


def _decide_seqs(inp: FitInput, fit: _Fit, length: int) -> Decision:
    default = inp.hardware.planner.default_max_num_seqs
    if inp.given("max_num_seqs"):
        return inp.kept("max_num_seqs", "set")
    tokens, _ = fit.kv.capacity(fit.kv_bytes, length, fit.in_flight)
    holds = tokens // TYPICAL_SEQUENCE
    floor = max(inp.request.concurrency, 8)
    if holds >= default:
        return Decision("max_num_seqs", default, f"vLLM's default on this device; the KV cache holds "
                        f"{holds} sequences of {TYPICAL_SEQUENCE} tokens", "vllm")
    value = max(floor, 1 << max(0, holds.bit_length() - 1))
    return Decision("max_num_seqs", value, f"the KV cache holds about {holds} sequences of {TYPICAL_SEQUENCE} "
                    f"tokens; more would only wait for blocks, and each reserves sampler memory "
                    f"(vLLM's default is {default})", "planner")


def _decide_memory(inp: FitInput, fit: _Fit) -> list[Decision]:
    if inp.machine.accelerator == "cpu":
        if CPU_KV_ENV in inp.env:
            return [Decision(CPU_KV_ENV, inp.env[CPU_KV_ENV], "set", "profile", "env")]
        if inp.given("kv_cache_memory_bytes"):
            return [inp.kept("kv_cache_memory_bytes", "set")]
        rule = inp.hardware.cpu_kv_cache
        return [Decision(CPU_KV_ENV, fit.kv_bytes // GIB,
                         f"{rule.fraction_of_free:.0%} of the {gib(inp.machine.ram_available)} of RAM free, "
                         f"within {rule.min_gib}-{rule.max_gib} GiB (never vLLM's 92% of all RAM)"
                         if rule else "", "planner")]
    util = inp.utilization
    requested, free = fit.budget.requested, inp.machine.free_per_gpu
    if requested > free:
        where = "free now" if inp.machine.detected else (
            f"free once the CUDA context{' and desktop' if inp.hardware.planner.reserved_gib > 1 else ''} "
            f"take {inp.hardware.planner.reserved_gib} GiB")
        raise FitError(f"gpu_memory_utilization {util} asks vLLM for {gib(requested)} per GPU, but only "
                       f"{gib(free)} is {where}; vLLM refuses to start",
                       hint=f"set gpu_memory_utilization to {int(free / fit.budget.total * 100) / 100} or lower")
    if inp.given("gpu_memory_utilization"):
        return [inp.kept("gpu_memory_utilization", f"{gib(requested)} of {gib(fit.budget.total)} per GPU")]
    return [Decision("gpu_memory_utilization", util, f"vLLM's default: {gib(requested)} of "
                     f"{gib(fit.budget.total)} per GPU", "vllm")]


def _notes(inp: FitInput, fit: _Fit) -> list[str]:
    notes = []
    if inp.engine.get("quantization") and fit.weights != inp.weights.total_bytes:
        notes.append(f"weights quantized to {inp.engine['quantization']} on load: "
                     f"{gib(inp.weights.total_bytes)} on disk, {gib(fit.weights)} on the GPU")
    lora = describe_lora(inp.shape, inp.engine, fit.tp)
    if lora:
        notes.append(lora)
    if inp.shape.is_mla and fit.tp > 1:
        notes.append("MLA keeps the whole latent KV cache on every GPU: more GPUs do not add KV capacity per rank")
    if inp.shape.num_kv_heads < fit.tp and not inp.shape.is_mla:
        notes.append(f"{inp.shape.num_kv_heads} KV heads over {fit.tp} GPUs: vLLM replicates KV heads")
    return notes
