"""The commands README.md and docs/ show, run as a reader copies them.

The commands come out of the docs' code blocks (tests/docs_blocks.py), so a changed
flag, subcommand or output line fails here until the docs follow. Cheap by design: the
parser checks run in this process, every ``--help`` in one child, and only the
commands that must be real processes (``versions``, ``doctor --json``, ``patch status
--root`` on a copy) start one each. ``demo --json`` is checked where an engine runs
anyway (test_e2e_emulation, test_e2e_hybrid; the text mode in test_e2e_w8a8).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, child_env, run_python
from tests.docs_blocks import (
    DOCS,
    README_DOCTOR_MARKER,
    block_after,
    documented_commands,
    documented_serve_lines,
    readme_doctor_rows,
)
from vllm_kunlun.cli import build_parser
from vllm_kunlun.doctor.checks import CHECKS
from vllm_kunlun.versions import VALIDATED

pytestmark = pytest.mark.slow
CONSOLE = str(Path(sys.executable).with_name("vllm-kunlun"))


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """``{"doctor": ..., "patch status": ...}``: every (nested) subcommand parser."""
    found: dict[str, argparse.ArgumentParser] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found[name] = sub
                found.update({f"{name} {k}": v for k, v in _subparsers(sub).items()})
    return found


SUBCOMMANDS = _subparsers(build_parser())


def _placeholders(argv: list[str]) -> list[str]:
    return [re.sub(r"<[^>]+>", "x", a) for a in argv]


def test_the_docs_show_commands() -> None:
    """The parser below is not vacuous: the docs do show these."""
    shown = {tuple(c.argv[:2]) for c in documented_commands()}
    assert {("demo",), ("doctor",), ("patch", "status")} <= shown | {
        a[:1] for a in shown
    }


def test_every_documented_command_parses() -> None:
    parser = build_parser()
    bad = []
    for cmd in documented_commands():
        try:
            parser.parse_args(_placeholders(cmd.argv))
        except SystemExit:
            bad.append(f"{cmd.doc.name}: {cmd.line}")
    assert bad == []


def test_every_documented_vllm_serve_line_parses_with_vllms_own_parser() -> None:
    """docs/deploy.md's and README's ``vllm serve`` lines, through vLLM 0.15.1's own
    ``serve`` argument parser (in a child: building it loads the general plugins,
    whose device guard needs a platform, here host emulation)."""
    lines = [(c.doc.name, c.argv) for c in documented_serve_lines()]
    assert any(doc == "deploy.md" for doc, _ in lines)
    proc = run_python(
        f"""
        import json
        from vllm.entrypoints.cli.serve import ServeSubcommand
        from vllm.utils.argparse_utils import FlexibleArgumentParser

        parser = FlexibleArgumentParser()
        ServeSubcommand().subparser_init(parser.add_subparsers(dest="cmd"))
        bad = []
        for doc, argv in json.loads({json.dumps(json.dumps(lines))}):
            try:
                parser.parse_args([w.replace("<dir>", "d") for w in argv])
            except SystemExit:
                bad.append((doc, " ".join(argv)))
        print("BAD", json.dumps(bad))
        """,
        env={"VLLM_KUNLUN_HOST_EMULATION": "1"},
        fakes=False,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    bad = json.loads(proc.stdout.split("BAD ", 1)[1])
    assert bad == []


def test_every_option_of_every_command_is_documented() -> None:
    text = "\n".join(doc.read_text() for doc in DOCS)
    missing = []
    for name, sub in SUBCOMMANDS.items():
        for action in sub._actions:
            longs = [o for o in action.option_strings if o.startswith("--")]
            if not longs or longs[0] == "--help" or f"`{longs[0]}" in text:
                continue
            if not re.search(rf"vllm-kunlun {name}\b.*{longs[0]}\b", text):
                missing.append(f"vllm-kunlun {name} {longs[0]}")
    assert missing == []


HELP_DRIVER = """
import contextlib, io, json, sys
from vllm_kunlun.cli import main
results = {}
for argv in json.loads(sys.argv[1]):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code
    results[" ".join(argv)] = {"code": code, "out": out.getvalue()}
results["vllm imported"] = "vllm" in sys.modules
print(json.dumps(results))
"""


def test_every_help_exits_0_without_importing_vllm() -> None:
    """``vllm-kunlun ... --help`` for the CLI and every subcommand, in one child."""
    argvs = [["--help"], *([*name.split(), "--help"] for name in SUBCOMMANDS)]
    proc = subprocess.run(
        [sys.executable, "-c", HELP_DRIVER, json.dumps(argvs)],
        env=child_env(fakes=False),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout)
    assert results.pop("vllm imported") is False  # help must stay instant
    for argv, got in results.items():
        assert got["code"] == 0, argv
        prog = " ".join(["vllm-kunlun", *argv.split()[:-1]])
        assert got["out"].startswith(f"usage: {prog}"), (argv, got["out"][:200])
    for name in ("demo", "doctor", "versions", "patch", "tiny-model"):
        assert name in results["--help"]["out"]


def test_versions_text_and_json() -> None:
    """README: ``vllm-kunlun versions [--strict] [--json]``, the validated table."""
    text = subprocess.run(
        [CONSOLE, "versions"],
        env=child_env(fakes=False),
        capture_output=True,
        text=True,
    )
    as_json = subprocess.run(
        [CONSOLE, "versions", "--json"],
        env=child_env(fakes=False),
        capture_output=True,
        text=True,
    )
    assert text.returncode == 0 and as_json.returncode == 0, text.stderr
    rows = json.loads(as_json.stdout)
    assert [r["name"] for r in rows] == [c.name for c in VALIDATED]
    assert all(set(r) == {"name", "installed", "validated", "status"} for r in rows)
    lines = text.stdout.splitlines()
    assert len(lines) == len(VALIDATED)
    assert all(re.match(r"(ok|MISMATCH|MISSING|-) +\S", line) for line in lines)


def test_doctor_json_is_what_the_docs_show() -> None:
    """``vllm-kunlun doctor --json``: only JSON on stdout; the checks, in order, are
    README's sample output and docs/doctor.md's table; README's exit code holds on a
    host like the one it was taken on (no Kunlun device)."""
    proc = subprocess.run(
        [CONSOLE, "doctor", "--json"],
        env=child_env(fakes=False),
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
    )
    doc = json.loads(proc.stdout)
    names = [f["check"] for f in doc["findings"]]
    assert names == [name for name, _ in CHECKS]
    assert proc.returncode == doc["exit_code"]

    rows, summary = readme_doctor_rows()
    assert [check for _, check in rows] == names
    assert re.fullmatch(
        rf"{len(names)} checks: \d+ failed, \d+ warnings?, \d+ skipped", summary
    )
    readme = (REPO / "README.md").read_text()
    stated = re.search(r"\*\*Doctor\*\* \(.*?exit code (\d)\)", readme, re.S)
    assert stated and int(stated.group(1)) == proc.returncode, proc.stdout

    table = re.findall(
        r"^\| (?:\d+|–) \| `(\w+)` \|", (REPO / "docs" / "doctor.md").read_text(), re.M
    )
    assert table == names


HOST_PARTS = (
    # What differs between the machine the docs were run on and this one.
    (re.compile(r"\((\w+) kernels\)"), "(<isa> kernels)"),  # the native sampler's ISA
)


def _normal(text: str, paths: dict[Path, str]) -> list[str]:
    for path, shown in paths.items():
        text = text.replace(str(path), shown)
    for pattern, shown in HOST_PARTS:
        text = pattern.sub(shown, text)
    return text.strip().splitlines()


def _doctor_text(cwd: Path, *args: str, fakes: bool = False) -> tuple[int, str]:
    proc = subprocess.run(
        [CONSOLE, "doctor", *args],
        env=child_env(fakes=fakes),
        capture_output=True,
        text=True,
        timeout=600,
        cwd=cwd,
    )
    return proc.returncode, proc.stdout


def test_the_doctor_output_the_docs_show_is_todays(tmp_path: Path) -> None:
    """Values, not only labels: README's and docs/doctor.md's pasted doctor reports are
    what the doctor prints today, line for line (the checkout's path and the native
    kernel's ISA aside), in the two situations they were taken in."""
    code, out = _doctor_text(REPO)
    shown = {REPO: "/work/main"}
    readme = block_after(REPO / "README.md", README_DOCTOR_MARKER)
    assert _normal(out, shown) == _normal(readme, {}), out
    doctor_md = REPO / "docs" / "doctor.md"
    assert _normal(out, shown) == _normal(
        block_after(doctor_md, "`vllm-kunlun doctor` (exit code 0)"), {}
    )
    assert code == 0

    # The second: a shorthand model path, the fakes on the path (KunlunPlatform active).
    (tmp_path / "models" / "Qwen3.8-27B-W8A8-INT8-Dynamic").mkdir(parents=True)
    command = "vllm-kunlun doctor --model models/Qwen3.8 --tensor-parallel-size 8"
    code, out = _doctor_text(tmp_path, *command.split()[2:], fakes=True)
    expected = block_after(doctor_md, f"`{command}` (exit code 1)")
    assert _normal(out, {tmp_path: "/tmp/doctor-demo"}) == _normal(expected, {}), out
    assert code == 1


def test_each_doctor_check_module_opens_naming_its_checks() -> None:
    """The first line of each check's module names the check as the report does
    (``kv_budget``), not by a number that goes stale when the list changes."""
    unnamed = []
    for name, check in CHECKS:
        doc = sys.modules[check.__module__].__doc__ or ""
        if f"``{name}``" not in doc.split("\n\n")[0]:
            unnamed.append(f"{check.__module__}: {name}")
    assert unnamed == []


def test_patch_status_on_a_copy_prints_what_docs_patches_shows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/patches.md's first ``$ vllm-kunlun patch status --root DIR`` and its output,
    run on a copy of the installed vLLM (paths aside, line for line)."""
    from tests.integration.vllm_tree import copy_tree

    monkeypatch.setenv("TMPDIR", str(tmp_path))  # the lock file goes here
    block = block_after(REPO / "docs" / "patches.md", "### Output")
    first = block.split("\n\n")[0].splitlines()
    command, shown = first[0], first[1:]
    assert command.startswith("$ vllm-kunlun patch status --root ")
    doc_root = command.split()[-1]
    root = copy_tree(tmp_path / "site")
    proc = subprocess.run(
        [CONSOLE, "patch", "status", "--root", str(root)],
        env=child_env(fakes=False),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = proc.stdout.replace(str(root), doc_root).splitlines()
    # The set's directory is the reader's checkout; torch's local version may differ.
    got[0] = re.sub(r" from \S+$", "", got[0])
    shown[0] = re.sub(r" from \S+$", "", shown[0])
    torch_local = re.compile(r"torch 2\.5\.1\S*")
    assert [torch_local.sub("torch 2.5.1", x) for x in got] == [
        torch_local.sub("torch 2.5.1", x) for x in shown
    ]


def test_the_docs_point_nowhere_outside_the_repository() -> None:
    """Every relative link resolves; every quoted path into this repository's top-level
    directories exists (build outputs aside: a directory that is not there yet)."""
    tops = (
        "reference|docs|scripts|benchmarks|tests|patches|vllm_kunlun|csrc|requirements"
    )
    missing = []
    for doc in DOCS:
        text = doc.read_text()
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", text):
            if not (doc.parent / target).exists():
                missing.append(f"{doc.name}: link {target}")
        for quoted in re.findall(rf"`((?:{tops})/[\w./-]+)`", text):
            path = REPO / quoted
            if not (REPO / quoted.split("/")[0]).exists():
                missing.append(f"{doc.name}: `{quoted}` (not in the repository)")
            elif path.suffix and path.parent.exists() and not path.exists():
                missing.append(f"{doc.name}: `{quoted}`")
    assert missing == []


def test_emulation_table_names_every_setting_emulation_makes() -> None:
    """docs/emulation.md's "What it sets" table against the ``_set`` / ``_set_env``
    calls of ``apply_emulation_defaults`` (read from its source)."""
    import ast
    import inspect

    from vllm_kunlun.platforms import emulation_defaults

    tree = ast.parse(inspect.getsource(emulation_defaults.apply_emulation_defaults))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id == "default_worker":  # sets parallel_config.worker_cls
                names.add("worker_cls")
            position = {"_set": 1, "_set_env": 0}.get(node.func.id)
            if position is not None:
                arg = node.args[position]
                assert isinstance(arg, ast.Constant), ast.dump(node)
                names.add(arg.value)
    assert {"worker_cls", "disable_cascade_attn", "VLLM_HOST_IP"} <= names
    doc = (REPO / "docs" / "emulation.md").read_text()
    start = doc.index("| setting | why |")
    table = doc[start : doc.index("\n\n", start)]
    assert sorted(n for n in names if n not in table) == []
