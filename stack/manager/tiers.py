"""Where a sleeping model waits, and how a switch is ordered: pure decisions from the planner's numbers.

Tiers (chosen per model, once, when the manager is built):
    level1  vLLM sleep level 1: the weights wait in pinned host RAM; a wake copies them back at bus speed
    level2  sleep level 2: the weights are dropped; a wake maps empty memory and reloads them from the files
            (the page cache when they were read recently)
    cold    the engine is stopped; the next request starts it
Level 1 while the host RAM budget holds every level-1 model's weights (torch keeps the pinned backup
buffers cached after a wake, so a level-1 model holds them for good, awake or not); then level 2 for the
rest while sleep mode is on; cold where it is not.

Overlap: a switch A -> B may wake B's weights while A goes to sleep (the two copies run in opposite
directions of the bus) when B's weights fit in what is free beside A still awake, with a margin; B's KV
cache is woken once A's memory is verifiably free. Otherwise the sequential order: sleep A, then wake B.

Expected times come from bus figures (measured where we have them, else nominal and said so).
Nothing here does I/O (tests/manager/test_tiers.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

GIB = 1024**3
GB = 1e9


class Tier(StrEnum):
    LEVEL1 = "level1"
    LEVEL2 = "level2"
    COLD = "cold"

    @property
    def sleep_level(self) -> int | None:
        return {Tier.LEVEL1: 1, Tier.LEVEL2: 2}.get(self)


@dataclass(frozen=True)
class TierModel:
    """What the tier choice knows of one model."""

    name: str
    weight_bytes: int | None  # all ranks together (what a level-1 sleep backs up in host RAM); None: unknown
    can_sleep: bool  # its engine runs with sleep mode
    prefix_cache_bytes: int = 0  # its KV offloading CPU tier (stack.vllm.kv_offload): held for the engine's life


@dataclass(frozen=True)
class TierChoice:
    tier: Tier
    reason: str


def _gib(n: int) -> str:
    return f"{n / GIB:.1f} GiB"


def assign_tiers(models: Sequence[TierModel], host_budget: int | None, level: str = "auto") -> dict[str, TierChoice]:
    """Level 1 in the given order (the configured order: the first model is the default one) while the
    host budget holds their weights, then level 2; cold without sleep mode. `level`: "auto", or 1 / 2 to
    force one level (the manager.sleep_level setting). host_budget None: none given, level 1 for all
    (what the manager did before tiers); `vstack up` always gives one. The models' prefix caches (their CPU
    tiers, allocated when the engines start) take their share of the budget first."""
    out: dict[str, TierChoice] = {}
    used = sum(m.prefix_cache_bytes for m in models)
    for m in models:
        if not m.can_sleep:
            out[m.name] = TierChoice(Tier.COLD, "no sleep mode (CPU engine, or sleep off): stopped to switch")
            continue
        if str(level) == "2":
            out[m.name] = TierChoice(Tier.LEVEL2, "manager.sleep_level is 2")
            continue
        if str(level) == "1":
            out[m.name] = TierChoice(Tier.LEVEL1, "manager.sleep_level is 1")
            continue
        if m.weight_bytes is None:
            out[m.name] = TierChoice(Tier.LEVEL2, "weight size unknown: level 1 could overrun host RAM")
            continue
        if host_budget is None:  # a manager built without one (tests, benchmarks): the default before tiers
            out[m.name] = TierChoice(Tier.LEVEL1, "no host RAM budget given: level 1")
            continue
        if used + m.weight_bytes <= host_budget:
            used += m.weight_bytes
            caches = ", prefix caches included" if any(x.prefix_cache_bytes for x in models) else ""
            out[m.name] = TierChoice(Tier.LEVEL1, f"weights {_gib(m.weight_bytes)} in pinned host RAM "
                                                  f"({_gib(used)} of {_gib(host_budget)} budget{caches})")  # fmt: skip
        else:
            out[m.name] = TierChoice(Tier.LEVEL2, f"weights {_gib(m.weight_bytes)} do not fit the host RAM budget "
                                                  f"({_gib(max(0, host_budget - used))} of {_gib(host_budget)} left): "
                                                  "reloaded from the files on wake")  # fmt: skip
    return out


def host_budget(ram_total: int, ram_available: int, engines: int, *, fraction: float,
                per_engine_bytes: int, configured_gib: float | None = None) -> int | None:  # fmt: skip
    """Host RAM the level-1 backups may take: the configured figure, else `fraction` of what is available
    at start minus what each engine process needs besides (its Python, CUDA and tokenizer: a few GiB)."""
    if configured_gib is not None:
        return int(configured_gib * GIB)
    if not ram_total and not ram_available:
        return None
    base = ram_available or ram_total
    return max(0, int(base * fraction) - engines * per_engine_bytes)


# -- the bus ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Bus:
    h2d_gbps: float  # pinned host -> GPU, GB/s
    d2h_gbps: float  # GPU -> pinned host
    map_s_per_gib: float  # cuMemCreate + map + access per GiB woken (weights and KV cache alike)
    reload_gbps: float  # level 2: weights read from the page cache and copied in by vLLM's loader
    cold_s: float  # a cold start to ready, a typical 8B
    source: str


# Map cost derived from the H100's level-2 wake (0.35 s, no copy: only ~70 GiB of weights + KV mapped).
_MAP = 0.35 / 70
H100 = Bus(54.8, 55.2, _MAP, 3.0, 64.5, "measured on the lent H100 2026-11-23 (pinned torch copies); map cost from "
           "its level-2 wake; level-2 reload and cold start estimated (H200 cold start 64.5 s)")  # fmt: skip
BUSES: dict[str, Bus] = {
    "h100": H100,
    "h200": Bus(54.8, 55.2, _MAP, 3.0, 64.5, "assumed as the H100 (same PCIe Gen5 x16 host link): not measured"),
    "a100": Bus(24.0, 24.0, _MAP, 2.5, 64.5, "nominal PCIe Gen4 x16 (32 GB/s) x 0.75: not measured"),
    "l4": Bus(24.0, 24.0, _MAP, 2.5, 64.5, "nominal PCIe Gen4 x16 (32 GB/s) x 0.75: not measured"),
    "rtx4090": Bus(24.0, 24.0, _MAP, 2.5, 64.5, "nominal PCIe Gen4 x16 (32 GB/s) x 0.75: not measured"),
}
UNKNOWN_BUS = Bus(24.0, 24.0, _MAP, 2.5, 64.5, "unknown GPU: PCIe Gen4 x16 assumed, not measured")


def bus_for(label: str, measured: dict[str, float] | None = None) -> Bus:
    """The figures for a GPU (profile name or device name); `measured` (h2d_gbps, d2h_gbps) overrides."""
    key = label.lower().replace("nvidia", "").replace(" ", "").replace("-", "")
    bus = next((b for k, b in BUSES.items() if k in key), UNKNOWN_BUS)
    if measured:
        bus = Bus(measured.get("h2d_gbps", bus.h2d_gbps), measured.get("d2h_gbps", bus.d2h_gbps), bus.map_s_per_gib,
                  bus.reload_gbps, bus.cold_s, "measured in this run")  # fmt: skip
    return bus


@dataclass(frozen=True)
class GpuModel:
    """One model's GPU footprint from the planner (per GPU: what one rank holds)."""

    name: str
    tier: Tier
    need: int  # bytes while awake (gpu_memory_utilization x the device)
    weights: int  # weights per GPU
    residue: int  # what it keeps asleep (CUDA context, activation and graph pools)


def sleep_s(m: GpuModel, bus: Bus) -> float:
    """Time to put `m` away: level 1 copies its weights out; level 2 only unmaps; cold stops the process."""
    if m.tier == Tier.LEVEL1:
        return m.weights / (bus.d2h_gbps * GB)
    if m.tier == Tier.LEVEL2:
        return 0.05
    return 3.0


def wake_weights_s(m: GpuModel, bus: Bus) -> float:
    mapped = m.weights / GIB * bus.map_s_per_gib
    if m.tier == Tier.LEVEL1:
        return mapped + m.weights / (bus.h2d_gbps * GB)
    if m.tier == Tier.LEVEL2:
        return mapped + m.weights / (bus.reload_gbps * GB)
    return bus.cold_s


def wake_kv_s(m: GpuModel, bus: Bus) -> float:
    if m.tier == Tier.COLD:
        return 0.0
    return max(0, m.need - m.weights - m.residue) / GIB * bus.map_s_per_gib


@dataclass(frozen=True)
class Order:
    overlap: bool
    reason: str


def overlap_margin(total: int) -> int:
    """Room kept free beside an overlapped wake: allocation rounding, the CUDA caching allocator's slack."""
    return int(0.5 * GIB + 0.02 * total)


def switch_order(target_weights: int | None, free_beside: int, total: int, *, target_tier: Tier,
                 evicted: Sequence[str], enabled: bool = True, release_only: bool = False,
                 handoff: bool = False) -> Order:  # fmt: skip
    """Overlap B's weight wake with A's sleep only when it cannot run out of memory: B sleeps (level 1 or 2),
    exactly one model is put to sleep for it, B's weight size is known, and B's weights plus a margin fit in
    what is free now, with A still holding all of its memory. Otherwise sequential.

    `release_only` (A's sleep copies nothing: its host copy is kept from an earlier sleep): sequential. There is
    no copy of A's to hide, and the driver clears the memory A releases before B may use it, on the copy
    engines B's weights come in through: beside A's sleep B's weights copy at half the bus, before it B's KV
    cache waits for the clearing instead (H200, README "Switch at bus speed"); sequential was fastest.
    `handoff` (manager.sleep_handoff: A hands its memory to B's KV cache, nothing is cleared): what A's sleep
    costs (unmapping and handing over its pieces, ~0.1 s for an engine at 0.7 of an H200) is hidden under B's
    weight copy into the free memory beside A, so a release-only sleep overlaps too (adr/0035)."""
    if not enabled:
        return Order(False, "overlap off (manager.overlap_wake)")
    if target_tier == Tier.COLD:
        return Order(False, "the target cold-starts")
    if len(evicted) != 1:
        return Order(False, f"{len(evicted)} models give way: sequential")
    if target_weights is None:
        return Order(False, "the target's weight size is unknown")
    margin = overlap_margin(total)
    if target_weights + margin <= free_beside:
        if release_only and not handoff:
            return Order(False, f"{evicted[0]}'s sleep only releases memory (its host copy is kept): sequential")
        handed = " (its memory handed to the KV cache)" if handoff else ""
        return Order(True, f"weights {_gib(target_weights)} + margin {_gib(margin)} fit the {_gib(free_beside)} free "
                           f"beside {evicted[0]}: woken while it sleeps{handed}")  # fmt: skip
    return Order(False, f"weights {_gib(target_weights)} + margin {_gib(margin)} do not fit the {_gib(free_beside)} "
                        f"free beside {evicted[0]}: it sleeps first")  # fmt: skip


@dataclass(frozen=True)
class SwitchEstimate:
    to: str
    frm: str
    tier: Tier
    sequential_s: float
    overlapped_s: float | None  # None: overlap refused (order.reason says why)
    order: Order


def estimate_switch(a: GpuModel, b: GpuModel, total: int, bus: Bus, overlap: bool = True) -> SwitchEstimate:
    """A awake, B asleep (its tier): seconds until B is awake, sequential and (where allowed) overlapped."""
    out, w_in, kv = sleep_s(a, bus), wake_weights_s(b, bus), wake_kv_s(b, bus)
    free = total - a.need - b.residue
    order = switch_order(b.weights, free, total, target_tier=b.tier, evicted=[a.name], enabled=overlap)
    both = max(out, w_in) + kv if order.overlap else None
    return SwitchEstimate(b.name, a.name, b.tier, out + w_in + kv, both, order)
