"""Doctor check 9: installed package vs source checkout (hashes, CRLF-normalised)."""

from __future__ import annotations

from pathlib import Path

from vllm_kunlun.checks.finding import Context
from vllm_kunlun.doctor.source_sync import check_source_sync, find_checkout

FILES = {
    "__init__.py": "__version__ = '0.1.0'\n",
    "sample/ops.py": "def sample():\n    return 1\n",
    "doctor/schema.json": '{"a": 1}\n',
}


def _tree(root: Path, files: dict[str, str], crlf: bool = False) -> Path:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        data = text.replace("\n", "\r\n") if crlf else text
        p.write_bytes(data.encode())
    return root


def _checkout(tmp_path: Path, files: dict[str, str], crlf: bool = False) -> Path:
    root = tmp_path / "src"
    _tree(root / "vllm_kunlun", files, crlf)
    (root / "setup.py").write_text('setup(name="vllm-kunlun")\n')
    return root


def test_crlf_checkout_matches_lf_install(tmp_path: Path) -> None:
    src = _checkout(tmp_path, FILES, crlf=True)
    installed = _tree(tmp_path / "site-packages" / "vllm_kunlun", FILES)
    (installed / "_native.cpython-311-x86_64-linux-gnu.so").write_bytes(b"\x7fELF")
    (installed / "__pycache__").mkdir()
    (installed / "__pycache__" / "x.pyc").write_bytes(b"junk")
    f = check_source_sync(Context(cwd=str(src)), str(installed))
    assert f.status == "ok", f
    assert "CRLF-normalised" in f.cause


def test_stale_install_names_the_files(tmp_path: Path) -> None:
    src = _checkout(tmp_path, {**FILES, "sample/new.py": "x = 1\n"})
    stale = {**FILES, "sample/ops.py": "def sample():\n    return 0\n", "old.py": ""}
    installed = _tree(tmp_path / "site-packages" / "vllm_kunlun", stale)
    f = check_source_sync(
        Context(cwd=str(src / "vllm_kunlun" / "sample")), str(installed)
    )
    assert f.status == "fail"
    assert f.details["differ"] == ["sample/ops.py"]
    assert f.details["only_in_source"] == ["sample/new.py"]
    assert f.details["only_installed"] == ["old.py"]
    assert "1 differ: sample/ops.py" in f.cause
    assert (
        f.fix
        == f"reinstall from the checkout: cd {src} && pip install --no-build-isolation -e ."
    )


def test_editable_install_is_the_checkout(tmp_path: Path) -> None:
    src = _checkout(tmp_path, FILES)
    f = check_source_sync(Context(cwd=str(src)), str(src / "vllm_kunlun"))
    assert f.status == "ok" and f.cause.startswith("editable install")


def test_not_a_checkout_is_skipped(tmp_path: Path) -> None:
    assert find_checkout(str(tmp_path)) is None
    f = check_source_sync(Context(cwd=str(tmp_path)), str(tmp_path))
    assert f.status == "skip"


def test_other_projects_setup_py_is_not_a_checkout(tmp_path: Path) -> None:
    root = tmp_path / "other"
    _tree(root / "vllm_kunlun", FILES)
    (root / "setup.py").write_text('setup(name="something-else")\n')
    assert find_checkout(str(root)) is None


def test_this_repository_is_an_editable_install() -> None:
    """The real package, run from this checkout (the dev venv installs it editable)."""
    repo = Path(__file__).resolve().parents[3]
    f = check_source_sync(Context(cwd=str(repo / "tests")))
    assert f.details["source"] == str(repo / "vllm_kunlun")
    assert f.status == "ok", f
