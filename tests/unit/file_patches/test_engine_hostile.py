"""The patch engine and ``vllm-kunlun patch`` against hostile trees and sets.

A synthetic tree (``vllm/__init__.py``, ``vllm/_version.py`` and three small target
files) and a three-patch set written here: the engine never imports vLLM, so this is
a complete tree for it, and each test costs milliseconds. Expected digests come from
hashlib on literal bytes, never from the engine.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from tests.conftest import REPO, child_env
from vllm_kunlun import cli
from vllm_kunlun.file_patches import engine, fsops, patchset
from vllm_kunlun.file_patches.errors import LockBusy, PatchRefused, PatchSetError

PRISTINE = "one\ntwo\nthree\n"
TARGETS = ("vllm/a.py", "vllm/sub/b.py", "vllm/sub/c.py")
TORCH = (engine.installed_torch_version() or "2.5.1").split("+")[0]


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _patched(target: str) -> str:
    return PRISTINE.replace("two", f"two {target}")


def write_set(directory: Path) -> Path:
    directory.mkdir(parents=True)
    names = []
    for i, target in enumerate(TARGETS, 1):
        name = f"0{i}-demo.patch"
        names.append(name)
        (directory / name).write_text(
            f"Patch: 0{i}-demo\nTarget: {target}\nWhy: a test\nUnnecessary-from: never\n"
            f"--- a/{target}\n+++ b/{target}\n@@ -1,3 +1,3 @@\n one\n-two\n"
            f"+two {target}\n three\n"
        )
    manifest = {
        "name": "demo_set",
        "vllm": "0.15.1",
        "torch": TORCH,
        "patches": names,
        "files": {
            t: {"before": _sha(PRISTINE), "after": _sha(_patched(t))} for t in TARGETS
        },
    }
    (directory / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return directory


@pytest.fixture
def site(tmp_path: Path) -> Path:
    root = tmp_path / "site"
    (root / "vllm" / "sub").mkdir(parents=True)
    (root / "vllm" / "__init__.py").write_text("")
    (root / "vllm" / "_version.py").write_text("__version__ = version = '0.15.1'\n")
    for target in TARGETS:
        (root / target).write_text(PRISTINE)
    return root


@pytest.fixture
def pset(tmp_path: Path) -> Path:
    return write_set(tmp_path / "set")


def states(root: Path) -> list[str]:
    out = []
    for t in TARGETS:
        text = (root / t).read_text()
        out.append({PRISTINE: "pristine", _patched(t): "patched"}.get(text, "other"))
    return out


def leftovers(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob(f"*{fsops.TMP_SUFFIX}"))


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = cli.main(["patch", *args])
    out, err = capsys.readouterr()
    return code, out, err


# --- the lock ----------------------------------------------------------------------


def test_lock_lives_beside_the_package_whatever_tmpdir(
    site: Path, pset: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Two runs with different TMPDIR (two containers sharing one site-packages
    volume) contend on one lock."""
    (tmp_path / "t1").mkdir()
    (tmp_path / "t2").mkdir()
    package = site / "vllm"
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "t1"))
    first = fsops.lock_path(package)
    assert first == site / fsops.LOCK_NAME
    with fsops.tree_lock(package, exclusive=True):
        monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "t2"))
        assert fsops.lock_path(package) == first
        with pytest.raises(LockBusy, match=f"pid {os.getpid()}"):
            engine.apply(site, pset, lock_timeout=0)
    assert not any(p.name == fsops.LOCK_NAME for p in package.rglob("*"))


def test_symlink_at_the_lock_path_is_not_followed(site: Path, pset: Path) -> None:
    victim = site.parent / "victim.conf"
    victim.write_text("precious\n")
    os.symlink(victim, fsops.lock_path(site / "vllm"))
    with pytest.raises(LockBusy, match="symbolic link") as err:
        engine.apply(site, pset)
    assert "remove" in err.value.fix
    assert victim.read_text() == "precious\n"
    assert states(site) == ["pristine"] * 3


def test_hard_link_at_the_lock_path_is_not_truncated(site: Path, pset: Path) -> None:
    victim = site.parent / "victim.conf"
    victim.write_text("precious\n")
    os.link(victim, fsops.lock_path(site / "vllm"))
    engine.apply(site, pset)  # a regular file: it may serve as the lock ...
    assert victim.read_text() == "precious\n"  # ... but is never rewritten
    assert states(site) == ["patched"] * 3


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_lock_path_that_is_not_a_file_is_refused(
    site: Path, pset: Path, kind: str
) -> None:
    path = fsops.lock_path(site / "vllm")
    os.mkfifo(path) if kind == "fifo" else path.mkdir()
    with pytest.raises(LockBusy, match="refusing to use the lock file"):
        engine.apply(site, pset, lock_timeout=0)
    assert states(site) == ["pristine"] * 3


def test_lock_on_a_read_only_tree(
    site: Path, pset: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Writers get a clear error; a status still answers (nobody can write there)."""
    lock = fsops.lock_path(site / "vllm")
    real_open = os.open

    def ro_open(path: object, flags: int, *a: object) -> int:
        if Path(str(path)) == lock and flags & os.O_CREAT:
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        if Path(str(path)) == lock and not lock.exists():
            raise FileNotFoundError(errno.ENOENT, "No such file", str(path))
        return real_open(path, flags, *a)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", ro_open)
    with pytest.raises(LockBusy, match="cannot create the lock file") as err:
        engine.apply(site, pset)
    assert "writable tree" in err.value.fix
    assert engine.status(site, pset).applied == 0


@pytest.mark.parametrize("raw", ["nan", "inf", "-1", "soon"])
def test_lock_timeout_must_be_finite_seconds(
    capsys: pytest.CaptureFixture[str], raw: str
) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["patch", "status", "--lock-timeout", raw])
    assert exc.value.code == 2
    assert "--lock-timeout" in capsys.readouterr().err
    with pytest.raises(ValueError):
        fsops.check_timeout(float(raw) if raw != "soon" else float("nan"))


# --- leftovers of a killed run ------------------------------------------------------


def _plant_leftovers(site: Path) -> list[Path]:
    planted = [
        site / "vllm" / f".a.py.x1{fsops.TMP_SUFFIX}",
        site / "vllm" / "sub" / f".b.py.x2{fsops.TMP_SUFFIX}",
    ]
    for p in planted:
        p.write_text("half a file")
    return planted


def test_leftovers_are_reported_by_status_and_verify(
    site: Path, pset: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    planted = _plant_leftovers(site)
    report = engine.status(site, pset)
    assert report.leftovers == sorted(planted)
    _, problems = engine.verify(site, pset)
    assert any("leftover temp file" in p for p in problems)

    code, out, _ = run_cli(
        capsys, "status", "--root", str(site), "--patches", str(pset)
    )
    assert code == 1  # the documented "drift" exit
    assert str(planted[0]) in out and "leftover" in out.splitlines()[-1]
    code, out, _ = run_cli(
        capsys, "status", "--json", "--root", str(site), "--patches", str(pset)
    )
    assert code == 1
    assert json.loads(out)["leftovers"] == [str(p) for p in sorted(planted)]
    code, out, _ = run_cli(
        capsys, "verify", "--root", str(site), "--patches", str(pset)
    )
    assert code == 1 and "NOT verified" in out


def test_apply_and_revert_remove_leftovers_first(
    site: Path, pset: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    planted = _plant_leftovers(site)
    dry = engine.apply(site, pset, dry_run=True)
    assert dry.removed == [str(p) for p in sorted(planted)]
    assert all(p.exists() for p in planted)  # a dry run writes and removes nothing
    code, out, _ = run_cli(capsys, "apply", "--root", str(site), "--patches", str(pset))
    assert code == 0 and "removed leftover temp file" in out
    assert leftovers(site) == [] and states(site) == ["patched"] * 3
    _plant_leftovers(site)
    out2 = engine.revert(site, pset)
    assert len(out2.removed) == 2 and leftovers(site) == []
    assert states(site) == ["pristine"] * 3
    _plant_leftovers(site)
    assert len(engine.revert(site, pset).removed) == 2  # also when nothing to revert


def test_a_killed_apply_is_reported_and_a_rerun_completes_it(
    site: Path, pset: Path
) -> None:
    """SIGKILL between writing the second temp file and renaming it: no rollback can
    run. Every file is still whole (pristine or patched); status says so and lists the
    temp file; the next apply removes it and completes the set."""
    code = f"""
        import os, signal
        from vllm_kunlun.file_patches import engine
        real, calls = os.replace, []
        def replace(src, dst):
            calls.append(dst)
            if len(calls) == 2:
                os.kill(os.getpid(), signal.SIGKILL)
            real(src, dst)
        os.replace = replace
        engine.apply({str(site)!r}, {str(pset)!r})
    """
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=child_env(fakes=False),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert states(site) == ["patched", "pristine", "pristine"]
    assert len(leftovers(site)) == 1
    report = engine.status(site, pset)
    assert report.summary_line() == "demo_set: 1/3 applied, 1 leftover temp file(s)"
    again = engine.apply(site, pset)
    assert sorted(again.changed) == ["vllm/sub/b.py", "vllm/sub/c.py"]
    assert states(site) == ["patched"] * 3 and leftovers(site) == []


# --- no tracebacks on hostile trees -------------------------------------------------


@pytest.mark.parametrize("kind", ["directory", "symlink loop", "fifo"])
def test_target_that_is_not_a_regular_file(
    site: Path, pset: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    target = site / TARGETS[1]
    target.unlink()
    if kind == "directory":
        target.mkdir()
    elif kind == "symlink loop":
        os.symlink(target.name, target)
    else:
        os.mkfifo(target)
    args = ("--root", str(site), "--patches", str(pset))
    code, out, _ = run_cli(capsys, "status", "--json", *args)
    assert code == 1  # drift: the file is neither side of the manifest
    data = json.loads(out)
    bad = next(f for f in data["files"] if f["target"] == TARGETS[1])
    assert bad["state"] == "unreadable" and bad["problem"]
    code, out, _ = run_cli(capsys, "apply", "--json", *args)
    assert code == 2
    error = json.loads(out)["error"]
    assert error["type"] == "PatchRefused" and error["file"] == str(target)
    assert "nothing was changed" in error["reason"]
    code, out, err = run_cli(capsys, "verify", *args)
    assert code == 1 and "Traceback" not in err
    assert (site / TARGETS[0]).read_text() == PRISTINE


def test_root_that_is_a_symlink_loop(
    tmp_path: Path, pset: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    loop = tmp_path / "loop"
    os.symlink(loop, loop)
    code, out, _ = run_cli(capsys, "status", "--json", "--root", str(loop))
    assert code == 2
    assert json.loads(out)["error"]["type"] == "PatchRefused"


@pytest.mark.parametrize(
    ("patches", "message"),
    [
        ("01-demo.patch", "'patches' must be a list of patch file names, got a str"),
        ([], "'patches' is empty"),
        (
            [{"file": "01-demo.patch"}],
            "'patches' entries must be file names, got a dict",
        ),
        (["../01-demo.patch"], "not a plain file name"),
    ],
)
def test_malformed_manifest_is_a_refusal_in_json(
    site: Path,
    pset: Path,
    capsys: pytest.CaptureFixture[str],
    patches: object,
    message: str,
) -> None:
    manifest = json.loads((pset / "manifest.json").read_text())
    manifest["patches"] = patches
    (pset / "manifest.json").write_text(json.dumps(manifest))
    for action in ("status", "apply", "verify"):
        code, out, _ = run_cli(
            capsys, action, "--json", "--root", str(site), "--patches", str(pset)
        )
        assert code == 2
        error = json.loads(out)["error"]
        assert error["type"] == "PatchSetError" and message in error["reason"]
    assert states(site) == ["pristine"] * 3


def snapshot(top: Path) -> dict[str, object]:
    """Every path under ``top``: file bytes, link target, or "dir" (links not followed)."""
    out: dict[str, object] = {}
    for path in sorted(top.rglob("*")):
        rel = str(path.relative_to(top))
        if path.is_symlink():
            out[rel] = ("link", os.readlink(path))
        elif path.is_dir():
            out[rel] = "dir"
        elif path.is_file():
            out[rel] = path.read_bytes()
        else:
            out[rel] = "special"
    return out


def _deep_manifest(pset: Path) -> str:
    return "[" * 200_000 + "]" * 200_000


def _deep_field(pset: Path) -> str:
    manifest = json.loads((pset / "manifest.json").read_text())
    nested: object = "x"
    for _ in range(patchset.MANIFEST_MAX_DEPTH):
        nested = [nested]
    manifest["comment"] = nested  # one level below the top object: limit + 1
    return json.dumps(manifest)


def _huge_manifest(pset: Path) -> str:
    manifest = json.loads((pset / "manifest.json").read_text())
    manifest["comment"] = "x" * patchset.MANIFEST_MAX_BYTES
    return json.dumps(manifest)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (_deep_manifest, "nested 200000 levels deep; the limit is 8"),
        (_deep_field, "nested 9 levels deep; the limit is 8"),
        (_huge_manifest, f"larger than the limit of {1 << 20} bytes"),
    ],
    ids=["200000-deep", "deep-field", "huge"],
)
def test_hostile_manifest_is_one_line_naming_file_and_limit(
    site: Path,
    pset: Path,
    capsys: pytest.CaptureFixture[str],
    make: object,
    message: str,
) -> None:
    """A manifest json cannot parse (RecursionError) or should not read whole: a
    refusal (exit 2) naming the manifest and the limit, valid JSON under --json, and
    nothing on disk changes."""
    manifest = pset / "manifest.json"
    manifest.write_text(make(pset))  # type: ignore[operator]
    before = snapshot(site.parent)
    args = ("--root", str(site), "--patches", str(pset))
    for action in ("status", "apply", "revert", "verify"):
        code, out, err = run_cli(capsys, action, "--json", *args)
        assert code == 2, (action, err[-2000:])
        error = json.loads(out)["error"]
        assert error["type"] == "PatchSetError", error
        assert error["file"] == str(manifest) and message in error["reason"]
        code, out, err = run_cli(capsys, action, *args)
        assert code == 2 and out == ""
        assert err.count("\n") == 1 and "Traceback" not in err
        assert err.startswith(f"vllm-kunlun patch {action}: {manifest}: ")
        assert message in err and "Fix:" in err
    assert snapshot(site.parent) == before


def test_brackets_inside_manifest_strings_do_not_count_as_depth(
    site: Path, pset: Path
) -> None:
    manifest = json.loads((pset / "manifest.json").read_text())
    manifest["comment"] = "[{" * 100 + '\\"[[[' * 10
    (pset / "manifest.json").write_text(json.dumps(manifest))
    engine.apply(site, pset)
    assert states(site) == ["patched"] * 3


def test_huge_patch_file_is_refused_naming_the_limit(site: Path, pset: Path) -> None:
    bad = pset / "02-demo.patch"
    bad.write_text("# " + "x" * patchset.PATCH_MAX_BYTES + "\n" + bad.read_text())
    with pytest.raises(PatchSetError, match="larger than the limit") as err:
        engine.apply(site, pset)
    assert err.value.file == str(bad)
    assert states(site) == ["pristine"] * 3


def test_non_utf8_patch_is_named(
    site: Path, pset: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = pset / "02-demo.patch"
    bad.write_bytes(bad.read_bytes().replace(b"a test", b"a \xff test"))
    code, out, err = run_cli(
        capsys, "status", "--root", str(site), "--patches", str(pset)
    )
    assert code == 2 and out == ""
    assert f"{bad}: not UTF-8 text" in err


def test_target_outside_the_package_is_refused(site: Path, pset: Path) -> None:
    patch = pset / "01-demo.patch"
    patch.write_text(patch.read_text().replace("vllm/a.py", "../etc/a.py"))
    manifest = json.loads((pset / "manifest.json").read_text())
    manifest["files"]["../etc/a.py"] = manifest["files"].pop("vllm/a.py")
    (pset / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(PatchSetError, match="not a path inside the vllm package"):
        engine.status(site, pset)


# --- symlinks out of --root ----------------------------------------------------------


def _link_out(site: Path, outside: Path, kind: str) -> Path:
    """Move one part of the tree to ``outside`` and leave a symlink in its place;
    plant a temp file and bytecode there that a run would delete. Returns the link."""
    if kind == "package dir":
        link = site / "vllm"
    elif kind == "target's dir":
        link = site / "vllm" / "sub"
    elif kind == "target file":
        link = site / TARGETS[0]
    else:  # __pycache__
        link = site / "vllm" / "sub" / "__pycache__"
        link.mkdir()
    moved = outside / link.name
    link.rename(moved)
    os.symlink(moved, link)
    if moved.is_dir():
        (moved / f".b.py.x9{fsops.TMP_SUFFIX}").write_text("not ours to delete")
        (moved / "b.cpython-311.pyc").write_bytes(b"not ours to delete")
    return link


@pytest.mark.parametrize(
    "kind", ["package dir", "target's dir", "target file", "__pycache__"]
)
def test_symlink_out_of_root_is_refused_before_any_change(
    site: Path,
    pset: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    kind: str,
) -> None:
    """A planted link would make a root run write, delete (leftover temp files,
    stale bytecode) or lock outside the tree: refused first, every file as it was,
    inside and outside."""
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    link = _link_out(site, outside, kind)
    tree, away = snapshot(site), snapshot(outside)
    want = f"{link} is a symlink to {os.readlink(link)}, outside --root {site}"
    args = ("--root", str(site), "--patches", str(pset))
    for action in ("apply", "revert"):
        for extra in (("--dry-run",), ()):
            code, out, err = run_cli(capsys, action, "--json", *extra, *args)
            assert code == 2, (action, extra, out, err[-2000:])
            error = json.loads(out)["error"]
            assert error["type"] == "PatchRefused" and error["file"] == str(link)
            assert error["reason"].startswith(want), error["reason"]
            assert "nothing was changed" in error["reason"]
        code, _, err = run_cli(capsys, action, *args)
        assert code == 2 and want in err
        with pytest.raises(PatchRefused, match="outside --root"):
            (engine.apply if action == "apply" else engine.revert)(site, pset)
    assert snapshot(site) == tree
    assert snapshot(outside) == away


def test_symlink_that_stays_inside_root_is_allowed(site: Path, pset: Path) -> None:
    sub = site / "vllm" / "sub"
    sub.rename(site / "vllm" / "real_sub")
    os.symlink("real_sub", sub)
    engine.apply(site, pset)
    assert states(site) == ["patched"] * 3
    assert sub.is_symlink()
    engine.revert(site, pset)
    assert states(site) == ["pristine"] * 3


# --- fix hints carry the user's arguments (issue 16, item 2) ------------------------


def test_fix_hints_carry_root_and_patches(
    site: Path, pset: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ("--root", str(site), "--patches", str(pset))
    want = f"Fix: vllm-kunlun patch apply --root {site} --patches {pset}"
    code, out, _ = run_cli(capsys, "status", *args)
    assert code == 0 and out.rstrip().endswith(want)
    code, out, _ = run_cli(capsys, "verify", *args)
    assert code == 1 and want in out
    # a drifted file: reinstall, then the same apply command
    (site / TARGETS[0]).write_text("edited\n")
    code, out, _ = run_cli(capsys, "status", *args)
    assert code == 1
    assert out.rstrip().endswith(
        f"then vllm-kunlun patch apply --root {site} --patches {pset}"
    )
    assert f"environment that holds {site}" in out
    code, _, err = run_cli(capsys, "apply", *args)
    assert code == 2 and f"`vllm-kunlun patch apply --root {site} --patches" in err


def test_fix_hint_quotes_a_root_with_spaces(
    tmp_path: Path, site: Path, pset: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spaced = tmp_path / "my site"
    site.rename(spaced)
    code, out, _ = run_cli(
        capsys, "status", "--root", str(spaced), "--patches", str(pset)
    )
    assert code == 0
    assert out.rstrip().endswith(f"apply --root '{spaced}' --patches {pset}")


def test_engine_start_warning_carries_the_root(
    site: Path, pset: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VLLM_KUNLUN_PATCH_DIR", str(pset))
    monkeypatch.setattr(engine, "_warned", False)
    messages: list[str] = []
    engine.warn_if_not_applied(lambda m, *a: messages.append(m % a), root=site)
    assert len(messages) == 1
    assert messages[0].endswith(f"Fix: vllm-kunlun patch apply --root {site}")
