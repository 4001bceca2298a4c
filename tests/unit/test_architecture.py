"""docs/architecture.md's import rules, enforced: each package of vllm_kunlun imports
only the layers the document allows (every import statement, at any depth)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "vllm_kunlun"
DOC = REPO / "docs" / "architecture.md"
FOUNDATION = {"envs", "versions", "logger"}


def _group(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "vllm_kunlun"  # the entry points
    return "foundation" if parts[1] in FOUNDATION else parts[1]


def _module_of(path: Path) -> str:
    rel = path.relative_to(REPO).with_suffix("").parts
    return ".".join(rel[:-1] if rel[-1] == "__init__" else rel)


def documented_table() -> list[tuple[str, set[str]]]:
    """The table in docs/architecture.md, in its order: | `layer` | may import | ..."""
    rows = []
    for line in DOC.read_text().splitlines():
        m = re.match(r"\|\s*`([\w_]+)/?`\s*\|\s*([^|]*)\|", line)
        if m:
            rows.append((m.group(1), set(re.findall(r"`([\w_]+)/?`", m.group(2)))))
    return rows


def documented_rules() -> dict[str, set[str]]:
    return {
        layer: allowed | {layer, "foundation"} for layer, allowed in documented_table()
    }


def imports() -> list[tuple[str, str, str]]:
    """(importing group, imported group, where) for every plugin-internal import."""
    found = []
    for path in PACKAGE.rglob("*.py"):
        src = _group(_module_of(path))
        for node in ast.walk(ast.parse(path.read_text())):
            names: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
                if node.module == "vllm_kunlun":
                    names = [f"vllm_kunlun.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            for name in names:
                if name.startswith("vllm_kunlun."):
                    dst = _group(name)
                    if dst != src:
                        found.append(
                            (src, dst, f"{path.relative_to(REPO)}:{node.lineno}")
                        )
    return found


def test_every_package_is_in_the_table() -> None:
    rules = documented_rules()
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    assert packages | {"foundation", "vllm_kunlun"} == set(rules)


def test_imports_follow_the_documented_layers() -> None:
    rules = documented_rules()
    offenders = [
        f"{where}: {src} imports {dst}"
        for src, dst, where in imports()
        if dst not in rules[src]
    ]
    assert offenders == []


def test_the_foundation_imports_nothing_of_the_plugin() -> None:
    assert [w for s, d, w in imports() if s == "foundation" and d != "foundation"] == []


def test_every_layer_imports_only_layers_above_it_in_the_table() -> None:
    """The table is the layers' order: a row may name only rows above it, so the
    allowed imports cannot form a loop and none runs up the layers."""
    seen: set[str] = set()
    wrong = []
    for layer, allowed in documented_table():
        wrong += [f"{layer} may import {x}, listed below it" for x in allowed - seen]
        seen.add(layer)
    assert wrong == []


def test_the_import_graph_has_no_loop() -> None:
    """The imports themselves, not just the rules: a depth-first walk of the
    layer-to-layer arrows finds no cycle."""
    arrows: dict[str, set[str]] = {}
    for src, dst, _ in imports():
        arrows.setdefault(src, set()).add(dst)
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> list[str]:
        state[node] = 1
        for nxt in sorted(arrows.get(node, ())):
            if state.get(nxt) == 1:
                return [*path, node, nxt]
            if nxt not in state and (loop := visit(nxt, [*path, node])):
                return loop
        state[node] = 2
        return []

    loops = [loop for n in sorted(arrows) if n not in state and (loop := visit(n, []))]
    assert loops == []


HOUSE_TESTS = {
    "test_architecture.py",
    "test_child_processes.py",  # the test helpers' own contract (tests/conftest.py)
    "test_entry_points.py",
    "test_readme.py",
    "test_register.py",
    "test_vendor_isolation.py",
}


def test_unit_tests_are_laid_out_like_the_package() -> None:
    """tests/unit/<layer>/ per layer of the table (benchmarks/ for the scripts of
    benchmarks/); only the house-wide tests sit in tests/unit itself."""
    unit = REPO / "tests" / "unit"
    folders = {p.name for p in unit.iterdir() if (p / "__init__.py").is_file()}
    assert folders - set(documented_rules()) - {"benchmarks"} == set()
    assert {p.name for p in unit.glob("test_*.py")} == HOUSE_TESTS


_OTHER_PROJECTS = ("flashinfer's", "vLLM's tree", "upstream's")
_CITED = re.compile(r"\b((?:docs|tests|benchmarks|scripts)/[\w./-]*\w\.(?:md|py|sh))\b")


def test_every_file_the_code_and_docs_cite_is_in_the_repository() -> None:
    """A reader must be able to follow a reference: each ``docs/...md``,
    ``tests/...py`` or script path named in the package, the tests, the benchmarks,
    the docs or the README exists, and nothing points outside the repository."""
    sources = [REPO / "README.md", *(REPO / "docs").glob("*.md")]
    for top in ("vllm_kunlun", "tests", "benchmarks", "scripts"):
        sources += [p for p in (REPO / top).rglob("*") if p.suffix in {".py", ".sh"}]
    missing, outside = [], []
    for path in sources:
        if path == Path(__file__).resolve():
            continue
        text = path.read_text()
        rel = path.relative_to(REPO)
        if "shared/reference" in text or "../shared" in text:
            outside.append(str(rel))
        for m in _CITED.finditer(text):
            cited = m.group(1)
            around = text[max(0, m.start() - 40) : m.end() + 20]
            if any(other in around for other in _OTHER_PROJECTS):
                continue  # a file of another project, named as such
            here = (path.parent / cited).resolve()
            if not (REPO / cited).exists() and not here.exists():
                missing.append(f"{rel}: {cited}")
    assert outside == []
    assert missing == []


_PACKAGES = sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file())
# A path inside the package, named from the repository root or from the package
# (``ops/int8/seam.py``), not as the tail of a longer path (``vllm/attention/layer.py``).
_PACKAGE_PATH = re.compile(
    r"(?<![\w/.-])((?:vllm_kunlun|" + "|".join(_PACKAGES) + r")/[\w/]*\w\.py)\b"
)
_DOTTED = re.compile(r"(?<![\w.])vllm_kunlun((?:\.\w+)+)")


def _is_module(parts: list[str]) -> bool:
    path = PACKAGE.joinpath(*parts)
    if path.with_suffix(".py").is_file() or (path / "__init__.py").is_file():
        return True
    return any(path.parent.glob(f"{path.name}.*.so"))  # the native extension


def test_every_plugin_module_the_code_and_docs_name_exists() -> None:
    """Moved or renamed modules are cited by their new names: each package path
    (``ops/gdn/patches.py``, ``vllm_kunlun/checks/budget.py``) and each dotted module
    name (``vllm_kunlun.ops.sampling.rejection``, a trailing attribute allowed) in the
    package, the tests, the benchmarks, the scripts, the docs or the README exists."""
    sources = [REPO / "README.md", *(REPO / "docs").glob("*.md")]
    for top in ("vllm_kunlun", "tests", "benchmarks", "scripts"):
        sources += [p for p in (REPO / top).rglob("*") if p.suffix in {".py", ".sh"}]
    entry_names = set(dir(__import__("vllm_kunlun")))
    stale = []
    for path in sources:
        text = path.read_text()
        rel = path.relative_to(REPO)
        for m in _PACKAGE_PATH.finditer(text):
            cited = m.group(1).removeprefix("vllm_kunlun/")
            if Path(cited).name.startswith("modeling_"):
                continue  # transformers' models/<family>/modeling_<family>.py
            if not (PACKAGE / cited).is_file():
                stale.append(f"{rel}: {m.group(1)}")
        for m in _DOTTED.finditer(text):
            parts = m.group(1).lstrip(".").split(".")
            known = 0
            while known < len(parts) and _is_module(parts[: known + 1]):
                known += 1
            if known == 0 and parts[0].islower() and parts[0] not in entry_names:
                stale.append(f"{rel}: vllm_kunlun.{'.'.join(parts)}")
            elif (
                0 < known < len(parts) - 1
                and parts[known].islower()
                and PACKAGE.joinpath(*parts[:known]).is_dir()
            ):  # a submodule that is not there, followed by more names
                stale.append(f"{rel}: vllm_kunlun.{'.'.join(parts)}")
    assert stale == [], "\n".join(stale)


def test_no_module_opens_with_a_check_number() -> None:
    """The doctor's checks are named (``doctor/checks.py``'s list), not numbered: a
    number goes stale when the list changes."""
    numbered = [
        str(p.relative_to(REPO))
        for p in PACKAGE.rglob("*.py")
        if re.match(r'\s*(?:"""|\'\'\')\s*Checks? \d+', p.read_text())
    ]
    assert numbered == []
