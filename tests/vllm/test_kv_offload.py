"""The prefix cache kept across sleep (stack.vllm.kv_offload): when the stack turns vLLM's CPU tier on, what it
renders for vLLM 0.26 / 0.32 / 0.33 (their real option dumps), what the installed vLLM makes of it (its own
parser, then its own config: the OffloadingConnector and its byte budget), and its host RAM in the tiers."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from stack.config import load_config
from stack.errors import ConfigError
from stack.hardware import detect
from stack.manager.tiers import Tier, TierModel, assign_tiers
from stack.planner.model_planner import plan_model
from stack.vllm import kv_offload
from stack.vllm.args import render_engine_args
from tests.conftest import load_catalog

GIB = 1024**3
SLEEPS = {"enable_sleep_mode": True}


def decide(mode="auto", engine=SLEEPS, **kw):
    args = {"accelerator": "gpu", "has_option": True, "gpu_kv_bytes": 30 * GIB, "configured_gib": None, **kw}
    return kv_offload.decide(mode, engine, **args)


def test_on_for_gpu_engines_that_sleep_sized_by_default_or_by_the_setting() -> None:
    keep = decide()
    assert keep.enabled and keep.gib == kv_offload.DEFAULT_GIB and keep.host_bytes == 4 * GIB
    assert decide(configured_gib=10).gib == 10
    small = decide(gpu_kv_bytes=2 * GIB)  # no point holding more than the GPU cache it backs
    assert small.gib == 2 and "whole GPU KV cache" in small.reason
    assert kv_offload.engine_options(keep) == {"kv_offloading_size": 4.0, "kv_offloading_backend": "native"}
    assert kv_offload.engine_env(keep) == {kv_offload.KEEP_ENV: "1"}


@pytest.mark.parametrize(("kw", "why"), [
    ({"engine": {}}, "does not sleep"),
    ({"engine": {**SLEEPS, "enable_prefix_caching": False}}, "prefix caching is off"),
    ({"accelerator": "cpu"}, "CPU engine"),
    ({"has_option": False}, "no --kv-offloading-size"),
    ({"engine": {**SLEEPS, "kv_transfer_config": {"kv_connector": "LMCacheConnectorV1"}}}, "its own kv_transfer"),
    ({"mode": False}, "false"),
])  # fmt: skip
def test_off_where_it_cannot_help_or_is_not_ours(kw, why) -> None:
    keep = decide(**kw)
    assert not keep.enabled and why in keep.reason
    assert kv_offload.engine_options(keep) == {} and kv_offload.engine_env(keep) == {}


def test_asked_for_where_it_cannot_run_is_a_config_error_naming_the_fix() -> None:
    with pytest.raises(ConfigError, match="needs a GPU engine") as err:
        decide(True, accelerator="cpu")
    assert "auto" in (err.value.hint or "")
    with pytest.raises(ConfigError, match="kv-offloading-size"):
        decide(True, has_option=False)


def test_a_users_own_size_is_kept_and_counted() -> None:
    keep = decide(engine={**SLEEPS, "kv_offloading_size": 12})
    assert keep.enabled and keep.gib == 12 and "as configured" in keep.reason
    assert kv_offload.host_bytes({"kv_offloading_size": 12}) == 12 * GIB
    assert kv_offload.host_bytes({"kv_offloading_size": 12, "kv_offloading_backend": "lmcache"}) == 0  # its server's
    assert kv_offload.host_bytes({}) == 0


@pytest.mark.parametrize("version", ["0.26", "0.32", "0.33"])
def test_rendered_for_every_known_vllm(version: str) -> None:
    args = render_engine_args(kv_offload.engine_options(decide()), load_catalog(version)).args
    assert args == ["--kv-offloading-size", "4.0", "--kv-offloading-backend", "native"]


def test_the_installed_vllm_parses_it_and_makes_it_an_offloading_connector_with_its_budget() -> None:
    pytest.importorskip("vllm")
    from stack.patches.plugin import installed_vllm

    _dist, version = installed_vllm()  # the dump of the installed version: its options, without a child process
    catalog = load_catalog(f"{version.major}.{version.minor}")
    args = render_engine_args(kv_offload.engine_options(decide()), catalog).args
    # One child process (one import of vLLM): its own serve parser, then its own config translation (CacheConfig
    # -> KVTransferConfig), which is what the engine runs with.
    probe = """
import json, sys
from stack.vllm.introspect import check
parsed = check(["some/model", *sys.argv[1:]])
from vllm.config import CacheConfig, VllmConfig
vc = VllmConfig.__new__(VllmConfig)
vc.cache_config = CacheConfig(kv_offloading_size=float(sys.argv[2]), kv_offloading_backend=sys.argv[4])
vc.kv_transfer_config = None
vc._post_init_kv_transfer_config()
kt = vc.kv_transfer_config
print(json.dumps({"parsed": parsed, "connector": kt.kv_connector, "role": kt.kv_role,
                  "extra": kt.kv_connector_extra_config}))
"""
    env = {**os.environ, "VLLM_USE_SIMPLE_KV_OFFLOAD": "0"}
    out = subprocess.run([sys.executable, "-c", probe, *args], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    made = json.loads(out.stdout.strip().splitlines()[-1])
    assert made == {"parsed": {"ok": True}, "connector": "OffloadingConnector", "role": "kv_both",
                    "extra": {"cpu_bytes_to_use": 4 * GIB}}  # fmt: skip


def test_a_gpu_profile_that_sleeps_gets_the_tier_and_the_patch_switch() -> None:
    cfg = load_config(overrides={"engine": {"enable_sleep_mode": True}, "manager": {"prefix_cache_gib": 6}})
    plan = plan_model(cfg, "rtx4090-qwen2.5-7b", detect(), load_catalog("0.33"), for_launch=False)
    assert plan.engine["kv_offloading_size"] == 6 and plan.prefix_cache_bytes == 6 * GIB
    assert "manager.keep_prefix_cache" in plan.engine_origins["kv_offloading_size"]
    assert plan.env[kv_offload.KEEP_ENV] == "1"
    assert "--kv-offloading-size 6" in plan.display()
    assert any(n.startswith("prefix cache across sleep: 6 GiB") for n in plan.notes)
    # The tier loads back block by block: 64-token blocks (half the bus at vLLM's 16), planned as such
    assert plan.engine["block_size"] == kv_offload.BLOCK_TOKENS == 64 and "--block-size 64" in plan.display()
    assert "keep_prefix_cache" in plan.engine_origins["block_size"] and plan.fit.kv.block_size == 64
    off = load_config(overrides={"engine": {"enable_sleep_mode": True}, "manager": {"keep_prefix_cache": False}})
    plan = plan_model(off, "rtx4090-qwen2.5-7b", detect(), load_catalog("0.33"), for_launch=False)
    assert "kv_offloading_size" not in plan.engine and kv_offload.KEEP_ENV not in plan.env
    assert "block_size" not in plan.engine and plan.fit.kv.block_size == 16  # vLLM's default, as before
    own = load_config(overrides={"engine": {"enable_sleep_mode": True, "block_size": 32},
                                 "manager": {"prefix_cache_gib": 6}})  # fmt: skip
    plan = plan_model(own, "rtx4090-qwen2.5-7b", detect(), load_catalog("0.33"), for_launch=False)
    assert plan.engine["block_size"] == 32 and plan.engine["kv_offloading_size"] == 6  # the profile's own kept


def test_the_prefix_caches_take_their_share_of_the_host_budget_before_level1_weights() -> None:
    models = [TierModel("a", 16 * GIB, True, 4 * GIB), TierModel("b", 16 * GIB, True, 4 * GIB)]
    without = assign_tiers([TierModel(m.name, m.weight_bytes, True) for m in models], 36 * GIB)
    assert [c.tier for c in without.values()] == [Tier.LEVEL1, Tier.LEVEL1]
    tiers = assign_tiers(models, 36 * GIB)  # 8 GiB of caches + 32 GiB of weights > 36
    assert [c.tier for c in tiers.values()] == [Tier.LEVEL1, Tier.LEVEL2]
    assert "prefix caches included" in tiers["a"].reason
