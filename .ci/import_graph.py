"""The stack's import graph between its layers (top-level packages and modules of `stack`), from grimp (the
graph import-linter checks), written as Graphviz DOT and as a Mermaid diagram for adr/0010; around it the
benchmarks (`bench`, over `harness`) and `tests`, which use the stack as a whole (adr/0024); and the
gateway's rooms (adr/0028) as a second Mermaid diagram in adr/0010.

    .venv/bin/python .ci/import_graph.py            # writes adr/0010-import-graph.dot and .mmd, and the
                                                    # mermaid block of adr/0010-layers-and-composition-root.md
tests/test_layers.py fails when what is written there is not what this script would write.
"""

from __future__ import annotations

from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[1]
ORDER = ["errors", "engine_env", "model_convert", "counts",
         "config", "hardware", "models", "vllm", "tracing", "planner", "engine",
         "manager", "gateway", "assemble", "load", "patches", "tune", "upgrade", "cli", "entrypoints"]


OUTER = ["harness", "bench", "tests"]  # drawn around the stack; their imports of it go to the box "stack"


def group(module: str) -> str | None:
    """The layer of a stack module, or `harness` / `bench` / `tests`; None for the root packages themselves."""
    parts = module.split(".")
    if parts[0] == "stack":
        return parts[1] if len(parts) > 1 and parts[1] in ORDER else None
    if parts[0] == "bench":
        return "harness" if parts[1:2] == ["harness"] else "bench"
    return "tests" if parts[0] == "tests" else None


# The gateway's rooms (adr/0028), bottom up; the floor's modules drawn as one box.
ROOMS = ["floor", "request_fields", "upstreams", "tenants", "routing", "http", "console", "engines", "app"]
FLOOR = {"registry", "openai_errors", "metrics", "schemas", "log_health"}


def room(module: str) -> str | None:
    parts = module.split(".")
    if parts[:2] != ["stack", "gateway"] or len(parts) < 3:
        return None
    return "floor" if parts[2] in FLOOR else parts[2] if parts[2] in ROOMS else None


def room_edges(graph: grimp.ImportGraph) -> list[tuple[str, str]]:
    out = set()
    for module in graph.modules:
        for imported in graph.find_modules_directly_imported_by(module):
            a, b = room(module), room(imported)
            if a and b and a != b:
                out.add((a, b))
    return sorted(out, key=lambda e: (ROOMS.index(e[0]), ROOMS.index(e[1])))


def edges(graph: grimp.ImportGraph) -> set[tuple[str, str]]:
    out = set()
    for module in graph.modules:
        for imported in graph.find_modules_directly_imported_by(module):
            a, b = group(module), group(imported)
            if a and b and a != b:
                out.add((a, "stack" if a in OUTER and b in ORDER else b))
    return out


ADR = ROOT / "adr" / "0010-layers-and-composition-root.md"
FENCE = "```mermaid\n"


def render() -> tuple[dict[Path, str], list[tuple[str, str]], int]:
    """{file: the text it should hold}, the edges against the order, and the number of edges."""
    graph = grimp.build_graph("stack", "bench", "tests", cache_dir=None)  # a stale cache drew a removed edge
    every = edges(graph)
    found = sorted((e for e in every if e[0] in ORDER), key=lambda e: (ORDER.index(e[0]), ORDER.index(e[1])))
    outer = sorted((e for e in every if e[0] in OUTER), key=lambda e: (OUTER.index(e[0]), e[1]))
    rank = {name: i for i, name in enumerate(ORDER + OUTER)} | {"stack": -1}
    siblings = [{"errors", "engine_env", "model_convert", "counts"}, {"hardware", "models", "vllm"},
                {"load", "patches"}]
    # tests -> bench is the one allowed upward edge (tests/gpu test the GPU suite's code: .importlinter)
    against = [(a, b) for a, b in found + outer if rank[a] < rank[b] and (a, b) != ("tests", "bench")
               and not any({a, b} <= g for g in siblings)]
    dot = ["digraph stack {", "  rankdir=BT; compound=true; node [shape=box, fontname=Helvetica];",
           '  subgraph cluster_stack { label="stack";']
    dot += [f'    "{a}" -> "{b}"{" [color=red]" if (a, b) in against else ""};' for a, b in found]
    dot.append("  }")
    dot += [f'  "{a}" -> "errors" [lhead=cluster_stack];' if b == "stack" else
            f'  "{a}" -> "{b}"{" [style=dashed]" if (a, b) == ("tests", "bench") else ""};' for a, b in outer]
    dot.append("}")
    mmd = "\n".join(["graph BT", "  subgraph stack"] + [f"    {a} --> {b}" for a, b in found] + ["  end"]
                    + [f"  {a} -.-> {b}" if (a, b) == ("tests", "bench") else f"  {a} --> {b}" for a, b in outer])
    mmd += "\n"
    rooms = room_edges(graph)
    against += [(a, b) for a, b in rooms if ROOMS.index(a) < ROOMS.index(b)]
    rooms_mmd = "\n".join(["graph BT", "  subgraph gateway", *(f"    {a} --> {b}" for a, b in rooms), "  end"]) + "\n"
    adr, end = ADR.read_text(), 0
    for block in (mmd, rooms_mmd):  # the ADR's first mermaid block is the layers', the second the rooms'
        start = adr.index(FENCE, end) + len(FENCE)
        end = adr.index("```", start)
        adr = adr[:start] + block + adr[end:]
        end = start + len(block) + 3
    files = {ROOT / "adr" / "0010-import-graph.dot": "\n".join(dot) + "\n",
             ROOT / "adr" / "0010-import-graph.mmd": mmd, ADR: adr}
    return files, against, len(found) + len(outer) + len(rooms)


def main() -> None:
    files, against, count = render()
    for path, text in files.items():
        path.write_text(text)
    print(f"{count} edges between layers; against the order: {against or 'none'}")


if __name__ == "__main__":
    main()
