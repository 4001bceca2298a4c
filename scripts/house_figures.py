"""The house in figures: rooms, arrows between them, loops, per the imports in the code.

Why: a structural review compares before and after; these are the figures it quotes
(issue notes, docs/architecture.md), computed the way tests/unit/test_architecture.py
reads imports (every import statement at any depth, lazy ones included).

    python scripts/house_figures.py [PACKAGE_DIR]      # default: vllm_kunlun
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

FOUNDATION = {"envs", "versions", "logger"}


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def room(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return parts[0]
    return "foundation" if parts[1] in FOUNDATION else parts[1]


def imports(root: Path) -> dict[str, set[str]]:
    """module -> the plugin modules it imports (``from pkg import sub`` resolved to the
    submodule when there is one)."""
    pkg = root.name
    files = {module_name(p, root): p for p in root.rglob("*.py")}
    out: dict[str, set[str]] = {}
    for mod, path in files.items():
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                # ``from pkg import sub`` names the submodule; the package itself
                # only when some name is not a submodule (a function, a class).
                subs = [f"{node.module}.{a.name}" for a in node.names]
                names = [n for n in subs if n in files]
                if len(names) < len(subs):
                    names.append(node.module)
            else:
                continue
            for name in names:
                while name and name not in files:
                    name = name.rpartition(".")[0]
                if name.startswith(pkg) and name != mod:
                    found.add(name)
        out[mod] = found
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    result: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                result.append(sorted(comp))

    sys.setrecursionlimit(10_000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return result


def main() -> None:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "vllm_kunlun").resolve()
    graph = imports(root)
    rooms: dict[str, int] = defaultdict(int)
    for mod in graph:
        rooms[room(mod)] += 1
    arrows: dict[str, set[str]] = defaultdict(set)
    for mod, targets in graph.items():
        for t in targets:
            if room(t) != room(mod):
                arrows[room(mod)].add(room(t))
    n_arrows = sum(len(v) for v in arrows.values())
    upward = sum(
        len(v - {"foundation"}) for k, v in arrows.items() if k != "foundation"
    )
    print(f"files: {len(graph)}")
    print(
        f"rooms: {len(rooms)} ({', '.join(f'{r} {n}' for r, n in sorted(rooms.items()))})"
    )
    print(f"arrows between rooms: {n_arrows} ({upward} not to the foundation)")
    for comp in cycles(dict(arrows)):
        print(f"layer loop: {' <-> '.join(comp)}")
    file_loops = cycles(graph)
    print(f"file-level cycles: {len(file_loops)}")
    for comp in file_loops:
        print(f"  {' <-> '.join(comp)}")


if __name__ == "__main__":
    main()
