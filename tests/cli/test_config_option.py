"""`--config` is read the same way by every command: given before the command (`vstack --config X plan
M`) or after it (`vstack config validate --config X`), the command uses that file."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from stack.cli import app

runner = CliRunner()

# Every command that reads the configuration, with the arguments it needs to get that far.
COMMANDS = [
    ["up"], ["down"], ["status"], ["switch", "m"], ["load", "m"], ["unload", "m"], ["models"], ["models", "list"],
    ["models", "pull", "m"], ["config", "validate"], ["config", "render"], ["plan", "smollm2-135m-instruct"],
    ["bench", "load"], ["tune"], ["version"], ["hw"],
]


@pytest.fixture
def broken(tmp_path: Path) -> Path:
    path = tmp_path / "broken.yaml"
    path.write_text("no_such_key_anywhere: 1\n")
    return path


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
@pytest.mark.parametrize("where", ["before", "after"])
def test_every_command_reads_the_config_it_is_given(command: list[str], where: str, broken: Path,
                                                    tmp_path: Path) -> None:  # fmt: skip
    args = ["--config", str(broken), *command] if where == "before" else [*command, "--config", str(broken)]
    result = runner.invoke(app, args, env={"VSTACK_STATE_DIR": str(tmp_path / "state"), "COLUMNS": "300"})
    assert result.exit_code == 2, result.output
    assert "no_such_key_anywhere" in result.output and str(broken) in result.output


GPU = "hardware:\n  test-gpu:\n    accelerator: gpu\n    memory_gib: 24\n"


@pytest.mark.parametrize("where", ["before", "after"])
def test_plan_uses_the_config_file(where: str, tmp_path: Path) -> None:
    config = tmp_path / "gpu.yaml"
    config.write_text(GPU)
    plan = ["plan", "smollm2-135m-instruct", "--gpu", "test-gpu", "--json"]
    args = ["--config", str(config), *plan] if where == "before" else [*plan, "--config", str(config)]
    assert runner.invoke(app, args).exit_code == 0
    without = runner.invoke(app, plan)
    assert without.exit_code == 2 and "unknown hardware 'test-gpu'" in without.output


def test_config_validate_takes_a_profile_file(tmp_path: Path) -> None:
    profile = tmp_path / "mine.yaml"
    profile.write_text("name: my-smol\nhardware: cpu\nmodel: smollm2-135m-instruct\nengine: {max_model_len: 2048}\n")
    result = runner.invoke(app, ["config", "validate", str(profile)], env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    assert "my-smol" in result.output and "(1 checked)" in result.output
    profile.write_text("hardware: cpu\nmodel: no-such-model\n")
    bad = runner.invoke(app, ["config", "validate", str(profile)], env={"COLUMNS": "300"})
    assert bad.exit_code == 2 and "no-such-model" in bad.output
