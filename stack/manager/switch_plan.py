"""`vstack plan --models A,B,C --gpu G`: the tier each model will sleep in and its expected switch times.

Each model is planned by the fit planner on the GPU profile (weights, memory need); the tiers come from
the host RAM budget (stack.manager.tiers.assign_tiers, as the manager decides them at `vstack up`), the
times from the bus figures of that GPU. The switches are those of a round: A -> B -> C -> A.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from stack.manager.tiers import (
    GIB,
    GpuModel,
    Tier,
    TierModel,
    assign_tiers,
    bus_for,
    estimate_switch,
    host_budget,
    wake_kv_s,
    wake_weights_s,
)
from stack.planner.decisions import Fit
from stack.vllm import kv_offload


@dataclass(frozen=True)
class HostRam:
    total: int
    available: int
    source: str  # "--host-ram-gib" or "this machine"


def switch_plan(plans: list[Fit], gpu: str, host: HostRam, *, fraction: float = 0.7, per_engine_gib: float = 3.0,
                budget_gib: float | None = None, sleep_level: str = "auto", overlap: bool = True,
                measured: dict[str, float] | None = None, keep_prefix: Literal["auto"] | bool = "auto",
                prefix_gib: float | None = None) -> dict[str, Any]:  # fmt: skip
    """Tiers and expected switch seconds for models planned on one GPU profile (all sleep-capable); each model's
    prefix cache across sleep (manager.keep_prefix_cache, stack.vllm.kv_offload) in the host RAM budget."""
    budget = host_budget(host.total, host.available, len(plans), fraction=fraction,
                         per_engine_bytes=int(per_engine_gib * GIB), configured_gib=budget_gib)  # fmt: skip
    keeps = {p.model: kv_offload.decide(keep_prefix, {"enable_sleep_mode": True}, accelerator="gpu", has_option=True,
                                        gpu_kv_bytes=p.budget.kv * p.kv.tp, configured_gib=prefix_gib)
             for p in plans}  # fmt: skip
    choices = assign_tiers([TierModel(p.model, p.weights.total_bytes, True, keeps[p.model].host_bytes)
                            for p in plans], budget, sleep_level)  # fmt: skip
    bus = bus_for(gpu, measured)
    total = plans[0].budget.total if plans else 0
    models = [GpuModel(p.model, choices[p.model].tier, p.budget.requested, p.budget.weights,
                       p.budget.runtime) for p in plans]  # fmt: skip
    rows = []
    for i, m in enumerate(models):
        prev = models[i - 1] if len(models) > 1 else None
        est = estimate_switch(prev, m, total, bus, overlap) if prev is not None else None
        rows.append({
            "model": m.name, "tier": str(m.tier), "why": choices[m.name].reason,
            "weights_gib": round(plans[i].weights.total_bytes / GIB, 2), "need_gib": round(m.need / GIB, 2),
            "prefix_cache_gib": round(keeps[m.name].host_bytes / GIB, 2), "prefix_cache": keeps[m.name].reason,
            "wake_s": round(wake_weights_s(m, bus) + wake_kv_s(m, bus), 3) if m.tier != Tier.COLD else None,
            "from": None if est is None else est.frm,
            "switch_sequential_s": None if est is None else round(est.sequential_s, 3),
            "switch_overlapped_s": None if est is None or est.overlapped_s is None else round(est.overlapped_s, 3),
            "order": None if est is None else est.order.reason,
        })  # fmt: skip
    return {
        "gpu": gpu, "host_ram_gib": round((host.available or host.total) / GIB, 1), "host_ram_source": host.source,
        "level1_budget_gib": None if budget is None else round(budget / GIB, 1),
        "bus": {"h2d_gbps": bus.h2d_gbps, "d2h_gbps": bus.d2h_gbps, "map_ms_per_gib": round(bus.map_s_per_gib * 1e3, 2),
                "reload_gbps": bus.reload_gbps, "source": bus.source},
        "models": rows,
    }  # fmt: skip
