"""Tiers and switch order as pure decisions (stack.manager.tiers): every path with plain numbers."""

from __future__ import annotations

import pytest

from stack.manager.tiers import (
    BUSES,
    GIB,
    UNKNOWN_BUS,
    GpuModel,
    Tier,
    TierModel,
    assign_tiers,
    bus_for,
    estimate_switch,
    host_budget,
    switch_order,
)


def models(*gib: float | None, sleep: bool = True) -> list[TierModel]:
    return [TierModel(f"m{i}", None if g is None else int(g * GIB), sleep) for i, g in enumerate(gib)]


def tiers(choices) -> list[str]:
    return [str(c.tier) for c in choices.values()]


def test_level1_while_the_host_budget_holds_the_weights_then_level2():
    out = assign_tiers(models(16, 6, 15, 2), host_budget=int(24 * GIB))
    # 16 + 6 = 22 fit; 15 does not (2 left); the 2 GiB model still fits the 2 GiB left: first fit, in order.
    assert tiers(out) == ["level1", "level1", "level2", "level1"]
    assert "do not fit the host RAM budget" in out["m2"].reason and "2.0 GiB of 24.0 GiB left" in out["m2"].reason
    assert "24.0 GiB budget" in out["m3"].reason


def test_no_sleep_mode_means_cold_whatever_the_ram():
    out = assign_tiers(models(1, 1, sleep=False), host_budget=int(100 * GIB))
    assert tiers(out) == ["cold", "cold"]
    assert "no sleep mode" in out["m0"].reason


def test_forced_levels_and_unknown_sizes():
    assert tiers(assign_tiers(models(100, 100), int(GIB), level="1")) == ["level1", "level1"]
    assert tiers(assign_tiers(models(1, 1), int(100 * GIB), level="2")) == ["level2", "level2"]
    out = assign_tiers(models(None, 1), int(100 * GIB))
    assert tiers(out) == ["level2", "level1"] and "unknown" in out["m0"].reason
    # a manager built without a budget keeps what it did before tiers: level 1
    assert tiers(assign_tiers(models(100), None)) == ["level1"]


def test_host_budget_from_ram_engines_and_setting():
    expected = int(120 * GIB * 0.7) - 12 * GIB
    assert host_budget(128 * GIB, 120 * GIB, 4, fraction=0.7, per_engine_bytes=3 * GIB) == expected
    assert host_budget(128 * GIB, 120 * GIB, 4, fraction=0.7, per_engine_bytes=3 * GIB, configured_gib=10) == 10 * GIB
    assert host_budget(0, 0, 2, fraction=0.7, per_engine_bytes=0) is None
    assert host_budget(8 * GIB, 8 * GIB, 4, fraction=0.5, per_engine_bytes=3 * GIB) == 0  # never negative


def test_overlap_allowed_only_when_the_weights_fit_beside_the_awake_model():
    total = 80 * GIB
    ok = switch_order(6 * GIB, 16 * GIB, total, target_tier=Tier.LEVEL1, evicted=["a"])
    assert ok.overlap and "woken while it sleeps" in ok.reason
    no = switch_order(15 * GIB, 16 * GIB, total, target_tier=Tier.LEVEL1, evicted=["a"])  # 15 + 2.1 margin > 16
    assert not no.overlap and "it sleeps first" in no.reason
    release = switch_order(6 * GIB, 16 * GIB, total, target_tier=Tier.LEVEL1, evicted=["a"], release_only=True)
    assert not release.overlap and "only releases memory" in release.reason
    handed = switch_order(6 * GIB, 16 * GIB, total, target_tier=Tier.LEVEL1, evicted=["a"], release_only=True,
                          handoff=True)  # fmt: skip
    assert handed.overlap and "its memory handed to the KV cache" in handed.reason


@pytest.mark.parametrize("kwargs, why", [
    ({"target_tier": Tier.COLD, "evicted": ["a"]}, "cold-starts"),
    ({"target_tier": Tier.LEVEL1, "evicted": ["a", "b"]}, "2 models give way"),
    ({"target_tier": Tier.LEVEL1, "evicted": ["a"], "enabled": False}, "overlap off"),
])  # fmt: skip
def test_overlap_refused(kwargs, why):
    order = switch_order(GIB, 100 * GIB, 100 * GIB, **kwargs)
    assert not order.overlap and why in order.reason
    assert not switch_order(None, 100 * GIB, 100 * GIB, target_tier=Tier.LEVEL1, evicted=["a"]).overlap


def test_bus_figures_measured_nominal_or_unknown():
    assert bus_for("h100-80gb") is BUSES["h100"] and "measured" in BUSES["h100"].source
    assert bus_for("NVIDIA H200") is BUSES["h200"] and "not measured" in BUSES["h200"].source
    assert bus_for("tpu") is UNKNOWN_BUS
    run = bus_for("h100", {"h2d_gbps": 50.0})
    assert run.h2d_gbps == 50.0 and run.d2h_gbps == BUSES["h100"].d2h_gbps and run.source == "measured in this run"


def test_expected_switch_8b_to_3b_on_an_h100():
    bus = BUSES["h100"]
    total = int(79 * GIB)
    a = GpuModel("8b", Tier.LEVEL1, need=int(0.7 * total), weights=int(15 * GIB), residue=GIB)
    b = GpuModel("3b", Tier.LEVEL1, need=int(0.7 * total), weights=int(6 * GIB), residue=GIB)
    est = estimate_switch(a, b, total, bus)
    assert est.order.overlap and est.overlapped_s is not None
    # sequential: 8B out (15 GiB / 55.2 GB/s) + 3B in + maps; overlapped: the longer of the two copies
    out, w_in = 15 * GIB / 55.2e9, 6 * GIB / 54.8e9 + 6 * bus.map_s_per_gib
    kv = (int(0.7 * total) - 7 * GIB) / GIB * bus.map_s_per_gib  # the KV cache is mapped after A is out
    assert est.sequential_s == pytest.approx(out + w_in + kv, rel=1e-3)
    assert est.overlapped_s == pytest.approx(max(out, w_in) + kv, rel=1e-3)
    assert estimate_switch(b, a, total, bus).order.overlap  # 3B -> 8B at 0.7: 15 GiB fit in the 22.7 GiB free
    big = GpuModel("3b", Tier.LEVEL1, need=int(0.9 * total), weights=int(6 * GIB), residue=GIB)
    back = estimate_switch(big, a, total, bus)  # at 0.9 of the GPU: 15 GiB do not fit in the 6.9 GiB free
    assert not back.order.overlap and back.overlapped_s is None
    cold = estimate_switch(a, GpuModel("x", Tier.COLD, need=total, weights=GIB, residue=0), total, bus)
    assert cold.sequential_s > 60 and cold.overlapped_s is None
