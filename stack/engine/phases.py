"""Where a start is, from the lines it logs: the gateway's own status lines (planning, fetching, converting,
re-attaching) and vLLM's (loading weights, compiling, capturing graphs, API server up). `vstack up` and
`vstack reload` show these phases with their times (stack.cli.progress); the startup benchmark times them.

The patterns are vLLM's log lines from 0.26 to 0.33 (GPU and CPU builds); a line no pattern knows keeps the
phase it was in, so a new vLLM wording makes the display coarser, never wrong.
"""

from __future__ import annotations

import re

# (phase, pattern): the phase a line puts a start in. Order is the order of a start.
GATEWAY_PHASES: list[tuple[str, re.Pattern[str]]] = [
    ("fetching the model", re.compile(r"^downloading \S+ from the Hugging Face Hub")),
    ("converting the model", re.compile(r"converting the model from")),
    ("re-attached", re.compile(r"re-attached pid \d+")),
]
ENGINE_PHASES: list[tuple[str, re.Pattern[str]]] = [
    ("engine starting", re.compile(r"==> vstack: starting |vLLM API server version|api_utils\.py.*version \d")),
    ("engine starting", re.compile(r"Initializing a V1 LLM engine")),
    ("loading weights", re.compile(r"Starting to load model|Initializing model|Loading safetensors|Loading weights")),
    ("loading weights", re.compile(r"Loading weights took|Model loading took")),
    ("compiling", re.compile(r"Warming up model for the compilation|Dynamo bytecode transform|Compiling a graph"
                             r"|Directly load AOT compil|saved AOT compiled|torch\.compile takes")),
    ("KV cache", re.compile(r"KV cache size|GPU KV cache size|Available KV cache memory|for KV cache")),
    ("capturing graphs", re.compile(r"Capturing CUDA graph|Capturing cudagraphs|Graph capturing")),
    ("API server starting", re.compile(r"init engine \(profile|Starting vLLM (API )?server on|Supported tasks")),
    ("API server starting", re.compile(r"Application startup complete")),
]
ORDER = ["planning", "fetching the model", "converting the model", "gateway starting", "re-attached", "engine starting",
         "loading weights", "compiling", "KV cache", "capturing graphs", "API server starting", "ready"]


def phase_of(lines: list[str], patterns: list[tuple[str, re.Pattern[str]]], current: str) -> str:
    """The phase after these lines, starting from `current`: the latest phase a line names; a start never
    goes back (a line that mentions an earlier phase's words later on does not move it)."""
    at = ORDER.index(current) if current in ORDER else -1
    for line in lines:
        for phase, pattern in patterns:
            if ORDER.index(phase) >= at and pattern.search(line):
                current, at = phase, ORDER.index(phase)
    return current


def this_start(text: str) -> str:
    """The part of an (appended) engine log written by its last start."""
    at = text.rfind("==> vstack: starting ")
    return text[at:] if at >= 0 else text


VLLM_TIME = re.compile(r"(?:INFO|WARNING|DEBUG|ERROR) (\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)")


def phase_starts(text: str, year: int) -> dict[str, float]:
    """Each engine phase's first line, as a Unix time from vLLM's own timestamps (local time, 1 s
    resolution), for the lines of one start (`this_start`): where a start's seconds went."""
    import time as _time

    starts: dict[str, float] = {}
    phase, pending = "", ""
    for line in this_start(text).splitlines():
        new = phase_of([line], ENGINE_PHASES, phase)
        if new != phase:
            phase, pending = new, (new if new not in starts else "")
        stamp = VLLM_TIME.search(line)
        if pending and stamp:  # a line without vLLM's stamp (ours) is dated by the next one with it
            mo, d, h, mi, sec = (int(x) for x in stamp.groups())
            starts[pending], pending = _time.mktime((year, mo, d, h, mi, sec, 0, 0, -1)), ""
    return starts
