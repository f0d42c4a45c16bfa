"""manager.gpu_placement (adr/0056): each unpinned local GPU engine on the GPUs the models planned before it use
least, pinned with CUDA_VISIBLE_DEVICES, so that on a host of several GPUs models stay resident side by side.
The plans are the planner's own (SmolLM2's, on the hardware profile of a GPU): only the placement is under test."""

from __future__ import annotations

import pytest

from stack.config import load_config
from stack.hardware import detect
from stack.manager.memory import pinned_gpus
from stack.planner.gpu_placement import place_on_gpus
from stack.planner.model_planner import plan_model
from stack.planner.stack_planner import runs_on
from tests.conftest import load_catalog

CATALOG = load_catalog("0.32")
CFG = load_config()


@pytest.fixture(scope="module")
def base():
    plan = plan_model(CFG, "smollm2-135m-instruct", detect(), CATALOG, for_launch=False)
    return plan.model_copy(update={"hardware": plan.hardware.model_copy(update={"accelerator": "gpu"})})


def model(base, name: str, tp: int = 1, **env: str):
    return base.model_copy(update={"profile": name, "served_name": name, "env": {**base.env, **env},
                                   "engine": {**base.engine, "tensor_parallel_size": tp}})  # fmt: skip


def gpus_of(plans) -> dict[str, str | None]:
    return {p.served_name: p.env.get("CUDA_VISIBLE_DEVICES") for p in plans}


def test_two_gpus_spread_three_models_and_the_manager_budgets_them_apart(base) -> None:
    given = [model(base, "a"), model(base, "b"), model(base, "c")]
    plans, note = place_on_gpus(CFG, given, 2, CATALOG, environ={})
    assert gpus_of(plans) == {"a": "0", "b": "1", "c": "0"}  # c: both GPUs hold one model's need, the first
    assert note == ("GPU placement: a on GPU 0, b on GPU 1, c on GPU 0, each on the GPUs the models before it use "
                    "least (manager.gpu_placement: spread; pin one with CUDA_VISIBLE_DEVICES in its env)")  # fmt: skip
    assert plans[1].fingerprint != given[1].fingerprint  # its engine's environment changed: not a kept engine's
    assert "GPU placement: GPU 1" in plans[1].notes[-1]
    assert [pinned_gpus(p.env, 1) for p in plans] == [frozenset({0}), frozenset({1}), frozenset({0})]
    assert runs_on(CFG, plans[1], None, None).detail.endswith("loopback port, GPU 1 (CUDA_VISIBLE_DEVICES)")


def test_a_pinned_engine_keeps_its_gpus_and_the_others_go_around_it(base) -> None:
    given = [model(base, "a", CUDA_VISIBLE_DEVICES="0"), model(base, "b"), model(base, "wide", tp=2)]
    plans, _ = place_on_gpus(CFG, given, 3, CATALOG, environ={})
    assert gpus_of(plans) == {"a": "0", "b": "1", "wide": "0,2"}  # GPUs 2 (empty) and 0 (ties: the lower index)
    assert plans[0] is given[0]  # untouched: the user's pin


def test_a_pinned_engine_counts_on_the_gpus_it_uses_not_every_one_it_lists(base) -> None:
    """vLLM's ranks take the visible devices in order: a one-GPU engine shown GPUs 0 and 1 holds GPU 0 only, as the
    manager budgets it (stack.manager.memory.pinned_gpus), so the next model goes to GPU 1."""
    given = [model(base, "a", CUDA_VISIBLE_DEVICES="0,1"), model(base, "b")]
    plans, _ = place_on_gpus(CFG, given, 2, CATALOG, environ={})
    assert gpus_of(plans) == {"a": "0,1", "b": "1"}
    assert pinned_gpus(plans[0].env, 1) == frozenset({0})


def test_nothing_is_placed_where_placing_would_change_nothing_or_the_user_chose(base) -> None:
    two = [model(base, "a"), model(base, "b")]
    ray = load_config(text='{"manager": {"runtime": "ray"}}')
    first = load_config(text='{"manager": {"gpu_placement": "first"}}')
    everyone = load_config(text='{"env": {"CUDA_VISIBLE_DEVICES": "1"}}')
    for cfg, plans, gpus, environ in ((CFG, two, 1, {}), (CFG, two[:1], 2, {}), (ray, two, 2, {}),
                                      (first, two, 2, {}), (everyone, two, 2, {}),
                                      (CFG, two, 2, {"CUDA_VISIBLE_DEVICES": "2,3"})):  # fmt: skip
        out, note = place_on_gpus(cfg, plans, gpus, CATALOG, environ=environ)
        assert out == plans and note is None
    wide = [model(base, "a", tp=2), model(base, "b", tp=2)]  # each takes every GPU: they share, as unplaced
    assert place_on_gpus(CFG, wide, 2, CATALOG, environ={}) == (wide, None)


def test_a_bad_gpu_placement_value_names_the_key_and_the_choices() -> None:
    from stack.errors import ConfigError

    with pytest.raises(ConfigError, match=r"manager\.gpu_placement") as bad:
        load_config(text='{"manager": {"gpu_placement": "round-robin"}}')
    assert "Input should be 'spread' or 'first' (got 'round-robin')" in bad.value.message
