"""Load-test scenarios (loadtests/scenarios/*.yaml): who sends what, how fast, for how long, against which SLO.

A scenario says the shape of the traffic (prompt and output length distributions, streaming share, model
mix), the load (concurrent users or a request rate, ramp, stages, duration) and optionally an SLO. The same
file drives Locust (`vstack bench load`) and `vllm bench serve` (`vstack tune`). Every error names the
file, the key and a fix.
"""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from stack.config.slo import parse_slo
from stack.errors import ConfigError
from stack.files import PACKAGE_DIR, shipped_folder

SCENARIO_ENV = "VSTACK_SCENARIO"  # the locustfile reads its scenario file from here
MODELS_ENV = "VSTACK_LOAD_MODELS"  # the model mix `vstack bench load` decided (JSON), over the scenario's


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Distribution(_Strict):
    """A token-count distribution; samples are rounded and clamped to [min, max]."""

    dist: Literal["fixed", "uniform", "normal", "lognormal"] = "fixed"
    value: int | None = Field(None, ge=1, description="fixed: the count")
    mean: float | None = Field(None, gt=0)
    stddev: float | None = Field(None, ge=0)
    min: int = Field(1, ge=1)
    max: int = Field(1_000_000, ge=1)

    @model_validator(mode="before")
    @classmethod
    def _plain_number(cls, data: Any) -> Any:
        return {"dist": "fixed", "value": data} if isinstance(data, int) and not isinstance(data, bool) else data

    @model_validator(mode="after")
    def _complete(self) -> Distribution:
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) is larger than max ({self.max})")
        needs = {"fixed": ("value",), "uniform": (), "normal": ("mean", "stddev"), "lognormal": ("mean", "stddev")}
        missing = [k for k in needs[self.dist] if getattr(self, k) is None]
        if missing:
            raise ValueError(f"dist {self.dist!r} needs {' and '.join(missing)}")
        if self.dist == "uniform" and self.max == 1_000_000:
            raise ValueError("dist 'uniform' needs max (and min)")
        return self

    @property
    def center(self) -> int:
        if self.dist == "fixed":
            return int(self.value or 1)
        if self.dist == "uniform":
            return (self.min + self.max) // 2
        return round(self.mean or 1)

    @property
    def spread(self) -> float:
        """Half-width relative to the center of a uniform range with the same spread (vllm bench's range ratio)."""
        if self.dist == "fixed":
            return 0.0
        if self.dist == "uniform":
            return (self.max - self.min) / (self.max + self.min)
        return min(0.99, (self.stddev or 0) * math.sqrt(3) / max(1.0, self.mean or 1))

    def sample(self, rng: random.Random) -> int:
        if self.dist == "fixed":
            x = float(self.value or 1)
        elif self.dist == "uniform":
            x = rng.uniform(self.min, self.max)
        elif self.dist == "normal":
            x = rng.gauss(self.mean or 1, self.stddev or 0)
        else:  # lognormal with the given mean and stddev of the value itself
            mean, sd = self.mean or 1, self.stddev or 0
            sigma2 = math.log(1 + (sd / mean) ** 2)
            x = rng.lognormvariate(math.log(mean) - sigma2 / 2, math.sqrt(sigma2))
        return max(self.min, min(self.max, round(x)))


class Stage(_Strict):
    duration_s: float = Field(gt=0)
    users: int = Field(ge=1)


class Load(_Strict):
    users: int = Field(4, ge=1, description="concurrent simulated clients")
    rate: float | None = Field(None, gt=0, description="requests/s over all users; none: back to back")
    ramp_s: float = Field(0, ge=0, description="seconds to start all users")
    duration_s: float = Field(60, gt=0)
    think_time_s: float = Field(0, ge=0, description="pause between a user's requests (closed loop)")
    stages: list[Stage] = Field(default_factory=list, description="users over time; replaces users/duration")

    @model_validator(mode="after")
    def _rate_or_think(self) -> Load:
        if self.rate is not None and self.think_time_s:
            raise ValueError("set either rate (open loop) or think_time_s (closed loop), not both")
        return self

    @property
    def peak_users(self) -> int:
        return max([self.users, *(s.users for s in self.stages)])

    @property
    def total_s(self) -> float:
        return sum(s.duration_s for s in self.stages) if self.stages else self.duration_s


class Requests(_Strict):
    stream: float = Field(1.0, ge=0, le=1, description="share of requests that stream")
    prompt_tokens: Distribution = Field(default_factory=lambda: Distribution(value=128))
    output_tokens: Distribution = Field(default_factory=lambda: Distribution(value=64))
    shared_prefix_tokens: int = Field(0, ge=0, description="a system prompt every request shares")
    ignore_eos: bool = Field(True, description="generate exactly max_tokens (vLLM's ignore_eos)")
    temperature: float = Field(0.0, ge=0, le=2)
    timeout_s: float = Field(300, gt=0)


class Target(_Strict):
    api_key_env: str | None = Field("VSTACK_API_KEY", description="env variable with the API key, if set")


# The tune's quality guard (stack.tune.quality_guard): the least share of the fixed prompts' greedy answers a
# candidate that changes numerics must keep identical to the baseline's.
MIN_EXACT_MATCH = 0.5


class TuneSettings(_Strict):
    """How `vstack tune` measures a candidate with `vllm bench serve` (goodput: stack.tune.rate_search)."""

    mode: Literal["goodput", "capacity"] = Field(
        "goodput", description="goodput: highest open-loop rate meeting the SLO; capacity: closed loop, users")
    num_prompts: int | None = Field(None, ge=1, description="capacity: default enough for the duration, >= 4x users")
    warmups: int | None = Field(None, ge=0, description="requests before each measurement, not counted "
                                                       "(default: 0 capacity, 8 goodput)")
    burstiness: float = Field(1.0, gt=0, description="goodput: 1 Poisson; < 1 burstier; > 1 more even")
    min_requests: int = Field(200, ge=1, description="goodput: requests per probe at least (stable p95)")
    probe_s: float = Field(20, gt=0, description="goodput: seconds of arrivals per probe at least")
    max_requests: int = Field(2000, ge=1, description="goodput: requests per probe at most")
    tolerance: float = Field(0.1, gt=0, lt=1, description="goodput: bisect until the bracket is this narrow")
    grow: float = Field(1.25, gt=1, le=4, description="goodput: above a rate that held, offer this much more")
    max_probes: int = Field(8, ge=1, description="goodput: probes per candidate besides the repeats")
    repeats: int = Field(1, ge=0, description="goodput: extra measurements of the winning rate")
    rate_start: float | None = Field(None, gt=0, description="goodput: first rate (default: the capacity)")
    rate_min: float = Field(0.05, gt=0, description="goodput: give up below this rate")
    min_exact_match: float = Field(MIN_EXACT_MATCH, ge=0, le=1, description="quality guard: a candidate that "
                                   "changes numerics (fp8, speculative decoding) and keeps fewer of the fixed "
                                   "prompts' greedy answers identical to the baseline's is not chosen")
    keep_pace: float = Field(0.85, ge=0, le=1, description="goodput: a probe counts only if the engine served at "
                             "least this share of the offered rate (arrivals plus drain)")


class Scenario(_Strict):
    name: str
    description: str = ""
    target: Target = Field(default_factory=Target)
    models: dict[str, float] = Field(default_factory=dict, description="model -> weight; empty: the first listed")
    load: Load = Field(default_factory=Load)
    requests: Requests = Field(default_factory=Requests)
    slo: list[str] = Field(default_factory=list)
    tune: TuneSettings = Field(default_factory=TuneSettings)
    source: str = Field("<inline>", exclude=True)

    @field_validator("slo", mode="before")
    @classmethod
    def _slo(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = [value]
        if isinstance(value, list):
            parse_slo([str(v) for v in value])  # an SloError is a ValueError: pydantic reports it at `slo`
        return value

    @field_validator("models")
    @classmethod
    def _weights(cls, value: dict[str, float]) -> dict[str, float]:
        bad = [k for k, w in value.items() if w <= 0]
        if bad:
            raise ValueError(f"weights must be > 0 (check {', '.join(bad)})")
        return value

    def num_prompts(self) -> int:
        if self.tune.num_prompts:
            return self.tune.num_prompts
        by_rate = int(self.load.rate * self.load.total_s) if self.load.rate else 0
        return max(by_rate, 4 * self.load.peak_users, 10)


# What to do about a bad value, by key path ("*" matches any one key).
FIXES = {
    "name": "give the scenario a name, e.g. `name: chat-short`",
    "load.users": "set load.users to the number of concurrent simulated clients, e.g. `users: 4`",
    "load.rate": "set load.rate to requests per second over all users (> 0), or remove it for back-to-back requests",
    "load.duration_s": "set load.duration_s to the test length in seconds, e.g. `duration_s: 60`",
    "load.ramp_s": "set load.ramp_s to the seconds over which users start (0 = all at once)",
    "load": "keep either load.rate or load.think_time_s",
    "requests.stream": "requests.stream is the share of streamed requests, from 0 to 1 (e.g. 0.8)",
    "requests.prompt_tokens": "write a count (`prompt_tokens: 256`) or a distribution, e.g. "
                              "`{dist: normal, mean: 256, stddev: 64, min: 16, max: 1024}`",
    "requests.output_tokens": "write a count (`output_tokens: 128`) or a distribution, e.g. "
                              "`{dist: uniform, min: 32, max: 256}`",
    "models": "map model names to weights, e.g. `models: {smollm2-135m-instruct: 1}`",
    "slo": "write clauses like `slo: ['p95_ttft_ms<800', 'output_tokens_per_s>=50']`",
}


def _fix_for(loc: tuple[str, ...]) -> str | None:
    for end in range(len(loc), 0, -1):
        key = ".".join(loc[:end])
        if key in FIXES:
            return FIXES[key]
    return None


def _allowed_keys(loc: tuple[str, ...]) -> list[str]:
    model: Any = Scenario
    for part in loc:
        field = getattr(model, "model_fields", {}).get(part)
        if field is None:
            return []
        annotation = field.annotation
        model = annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None
        if model is None:
            return []
    return list(getattr(model, "model_fields", {}))


def _problems(exc: ValidationError, source: str) -> tuple[list[str], str | None]:
    from stack.config.origins import suggest

    lines, fixes = [], []
    for err in exc.errors():
        loc = tuple(str(p) for p in err["loc"] if not str(p).startswith("function-"))
        key = ".".join(loc) or "(top level)"
        if err["type"] == "extra_forbidden":
            allowed = [k for k in _allowed_keys(loc[:-1]) if k != "source"]
            near = suggest(loc[-1], allowed)
            lines.append(f"{source}: {key}: unknown key{near}")
            fixes.append(f"remove {key!r} or use one of: {', '.join(allowed)}")
            continue
        message = "required key is missing" if err["type"] == "missing" else err["msg"].removeprefix("Value error, ")
        given = err.get("input")
        shown = "" if err["type"] == "missing" or isinstance(given, dict | list) else f" (got {given!r})"
        lines.append(f"{source}: {key}: {message}{shown}")
        fix = _fix_for(loc)
        if fix:
            fixes.append(fix)
    return lines, "; ".join(dict.fromkeys(fixes)) or None


def parse_scenario(data: Any, source: str = "<inline>") -> Scenario:
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: a scenario must be a mapping (name:, load:, requests:, slo:)",
                          hint="see loadtests/scenarios/chat.yaml for the layout")
    try:
        return Scenario.model_validate({**data, "source": source})
    except ValidationError as exc:
        lines, hint = _problems(exc, source)
        raise ConfigError(lines, hint=hint) from None


def load_scenario_file(path: Path) -> Scenario:
    from stack.config.loader import display_path, read_yaml

    shown = display_path(path)
    data = read_yaml(path, label=shown)
    return parse_scenario(data, shown)


def scenarios_dir() -> Path:
    """The shipped scenarios: loadtests/scenarios of the checkout, or their copy in the wheel."""
    return loadtests_dir() / "scenarios"


def loadtests_dir() -> Path:
    """loadtests/ (the locustfile and the scenarios) of a source checkout, else the copy the wheel packages as
    stack/_loadtests: found the way the built-in configs/ are (stack.files.shipped_folder)."""
    found = shipped_folder("loadtests", "locustfile.py")
    if found is None:
        raise ConfigError(f"no loadtests/ (locustfile.py and scenarios/) found next to {PACKAGE_DIR} "
                          f"(nor {PACKAGE_DIR / '_loadtests'})",
                          hint="reinstall vllm-stack, or run from a checkout that has loadtests/; "
                               "a scenario can also be given as a path to its YAML file")
    return found


def find_scenario(name: str) -> Path:
    """A path to a YAML file, or the name of one in loadtests/scenarios."""
    as_path = Path(name).expanduser()
    if as_path.suffix in (".yaml", ".yml") or as_path.is_file():
        if not as_path.is_file():
            raise ConfigError(f"{name}: scenario file not found", hint="check the path, or give a scenario name")
        return as_path
    folder = scenarios_dir()
    for suffix in (".yaml", ".yml"):
        if (folder / f"{name}{suffix}").is_file():
            return folder / f"{name}{suffix}"
    from stack.config.origins import suggest

    known = sorted(p.stem for p in folder.glob("*.y*ml"))
    raise ConfigError(f"unknown scenario {name!r}{suggest(name, known)}",
                      hint=f"one of: {', '.join(known)}, or a path to a YAML file")


def load_scenario(name: str) -> Scenario:
    return load_scenario_file(find_scenario(name))
