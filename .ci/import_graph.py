"""The stack's import graph between its layers (top-level packages and modules of `stack`), from grimp (the
graph import-linter checks), written as Graphviz DOT and as a Mermaid diagram for adr/0010.

    .venv/bin/python .ci/import_graph.py            # writes adr/0010-import-graph.dot and .mmd, and the
                                                    # mermaid block of adr/0010-layers-and-composition-root.md
tests/test_layers.py fails when what is written there is not what this script would write.
"""

from __future__ import annotations

from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[1]
ORDER = ["errors", "engine_env", "config", "hardware", "models", "vllm", "planner", "engine", "manager", "gateway",
         "assemble", "load", "patches", "cli", "entrypoints"]


def edges() -> set[tuple[str, str]]:
    graph = grimp.build_graph("stack")
    out = set()
    for module in graph.modules:
        for imported in graph.find_modules_directly_imported_by(module):
            a, b = module.split(".")[1:2], imported.split(".")[1:2]
            if a and b and a != b and a[0] in ORDER and b[0] in ORDER:
                out.add((a[0], b[0]))
    return out


ADR = ROOT / "adr" / "0010-layers-and-composition-root.md"
FENCE = "```mermaid\n"


def render() -> tuple[dict[Path, str], list[tuple[str, str]], int]:
    """{file: the text it should hold}, the edges against the order, and the number of edges."""
    found = sorted(edges(), key=lambda e: (ORDER.index(e[0]), ORDER.index(e[1])))
    rank = {name: i for i, name in enumerate(ORDER)}
    siblings = [{"errors", "engine_env"}, {"hardware", "models", "vllm"}, {"load", "patches"}]
    against = [(a, b) for a, b in found if rank[a] < rank[b] and not any({a, b} <= group for group in siblings)]
    dot = ["digraph stack {", "  rankdir=BT; node [shape=box, fontname=Helvetica];"]
    dot += [f'  "{a}" -> "{b}"{" [color=red]" if (a, b) in against else ""};' for a, b in found]
    dot.append("}")
    mmd = "\n".join(["graph BT"] + [f"  {a} --> {b}" for a, b in found]) + "\n"
    adr = ADR.read_text()
    start = adr.index(FENCE) + len(FENCE)
    adr = adr[:start] + mmd + adr[adr.index("```", start):]
    files = {ROOT / "adr" / "0010-import-graph.dot": "\n".join(dot) + "\n",
             ROOT / "adr" / "0010-import-graph.mmd": mmd, ADR: adr}
    return files, against, len(found)


def main() -> None:
    files, against, count = render()
    for path, text in files.items():
        path.write_text(text)
    print(f"{count} edges between layers; against the order: {against or 'none'}")


if __name__ == "__main__":
    main()
