"""The gate's rules: one profile's pinned and candidate results -> pass or fail, with each reason in words.

Failing reasons carry a kind, so the report and the exit code say what failed: `start` (the candidate did not
come up), `options` (its parser refuses the profile), `patches` (a ledger patch no longer applies), `answers`
(the fixed prompts answered differently), `slo` (no rate met the SLO on the candidate), `goodput` (it met the
SLO at a lower rate than the pinned one, beyond the tolerance). Start time and the KV cache are reported and
warned about, never gating: both move with the machine's load and with compile caches.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Kind = Literal["start", "options", "patches", "answers", "slo", "goodput"]
MIN_MATCH = 1.0  # every answer identical: an upgrade keeps its answers (--min-match lowers it)
GOODPUT_TOLERANCE = 0.15  # the candidate may lose this share of the pinned goodput (a probe's noise on 2 cores)
SLOWER_START = 1.5  # a start this much slower is warned about


@dataclass
class Reason:
    kind: Kind
    text: str


@dataclass
class Verdict:
    passed: bool
    reasons: list[Reason] = field(default_factory=list)  # why it fails (empty when it passes)
    warnings: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"passed": self.passed, "reasons": [{"kind": r.kind, "text": r.text} for r in self.reasons],
                "warnings": self.warnings}


def judge(pinned: dict[str, Any], candidate: dict[str, Any], answers: dict[str, Any] | None,
          options_error: str | None, patches: dict[str, Any] | None, min_match: float = MIN_MATCH,
          tolerance: float = GOODPUT_TOLERANCE, goodput_checked: bool = True) -> Verdict:
    """pinned/candidate: SideResult.as_dict(); answers: stack.upgrade.answers.compare_answers."""
    reasons: list[Reason] = []
    warnings: list[str] = []
    if options_error:
        reasons.append(Reason("options", f"the candidate's vLLM refuses the profile's command: {options_error}"))
    for p in (patches or {}).get("patches", []):
        if p["blocks"]:
            reasons.append(Reason("patches", f"patch {p['id']}: {p['state']} on the candidate ({p['detail']})"))
    if not pinned.get("started"):
        reasons.append(Reason("start", f"the pinned engine did not start ({pinned.get('error')}): nothing to compare"))
    if not candidate.get("started"):
        reasons.append(Reason("start", f"the candidate engine did not start: {candidate.get('error')}"))
    if reasons and not candidate.get("started"):
        return Verdict(False, reasons, warnings)
    if answers is not None:
        rate = answers.get("match_rate")
        if rate is None or rate < min_match:
            firsts = [f"{d['id']} at token {d['token']} ({d.get('pinned_token')!r} -> {d.get('candidate_token')!r})"
                      for d in answers["differences"]]
            reasons.append(Reason("answers", f"{answers['matched']} of {answers['prompts']} answers identical "
                                             f"(floor {min_match:.0%}); first divergences: {'; '.join(firsts)}"))
    if goodput_checked and candidate.get("error") is None:
        mine, theirs = candidate.get("goodput_rps"), pinned.get("goodput_rps")
        if not mine:
            reasons.append(Reason("slo", "the candidate met the SLO at no offered rate "
                                         f"({candidate.get('goodput_note') or 'no search'}); pinned: "
                                         f"{theirs or 0:g} req/s"))
        elif theirs and mine < theirs * (1 - tolerance):
            reasons.append(Reason("goodput", f"goodput {mine:g} req/s vs {theirs:g} pinned "
                                             f"({mine / theirs - 1:+.0%}, tolerance -{tolerance:.0%})"))
    elif goodput_checked:
        reasons.append(Reason("slo", f"the candidate failed during its measurement: {candidate['error']}"))
    s_pin, s_cand = pinned.get("startup_s"), candidate.get("startup_s")
    if s_pin and s_cand and s_cand > SLOWER_START * s_pin:
        warnings.append(f"the candidate started in {s_cand:.0f} s vs {s_pin:.0f} s pinned")
    kv_warning = kv_drift(pinned, candidate)
    if kv_warning:
        warnings.append(kv_warning)
    for p in (patches or {}).get("patches", []):
        if p["state"] == "already upstream":
            warnings.append(f"patch {p['id']} is already upstream in the candidate: drop it from the ledger")
    return Verdict(not reasons, reasons, warnings)


def kv_drift(pinned: dict[str, Any], candidate: dict[str, Any], limit: float = 0.05) -> str | None:
    """The planner's KV estimate agrees with one version and not the other: its model needs a look."""
    plan = candidate.get("kv_tokens_planner")
    a, b = pinned.get("kv_tokens_vllm"), candidate.get("kv_tokens_vllm")
    if not plan or not a or not b or a == b:
        return None
    off = b / plan - 1
    return (f"vLLM's own KV cache changed: {a:,} -> {b:,} tokens (planner {plan:,}, {off:+.1%} off the candidate's)"
            if abs(off) > limit or abs(b / a - 1) > limit else None)
