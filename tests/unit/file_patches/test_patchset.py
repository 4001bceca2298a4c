"""The patch set format: parsing, exact-context hunks, and the shipped set itself."""

from __future__ import annotations

import base64
import importlib.metadata
import json
import shutil
from pathlib import Path

import pytest

from vllm_kunlun.file_patches.errors import PatchSetError
from vllm_kunlun.file_patches.patchset import (
    HunkMismatch,
    apply_hunks,
    default_set_dir,
    load_patch_set,
    parse_patch,
)

SET_DIR = Path(__file__).resolve().parents[3] / "patches" / "vllm-0.15.1-torch-2.5.1"

HEADER = """# comment
Patch: 01-demo
Target: pkg/mod.py
Why: a reason that
  continues here
Unnecessary-from: never
"""

DIFF = """--- a/pkg/mod.py
+++ b/pkg/mod.py
@@ -1,4 +1,5 @@
 a
-b
+B
+b2
 c
 d
@@ -8,3 +9,3 @@
 h
 i
-j
\\ No newline at end of file
+J
\\ No newline at end of file
"""

ORIGINAL = "a\nb\nc\nd\ne\nf\ng\nh\ni\nj"
PATCHED = "a\nB\nb2\nc\nd\ne\nf\ng\nh\ni\nJ"


def _patch(text: str = HEADER + DIFF):
    return parse_patch(text, Path("demo.patch"))


def test_header_fields_and_continuation_lines() -> None:
    p = _patch()
    assert (p.id, p.target, p.unnecessary_from) == ("01-demo", "pkg/mod.py", "never")
    assert p.why == "a reason that continues here"
    assert len(p.hunks) == 2


def test_hunks_apply_and_unapply_exactly() -> None:
    p = _patch()
    assert apply_hunks(ORIGINAL, p.hunks) == PATCHED
    assert apply_hunks(PATCHED, p.hunks, reverse=True) == ORIGINAL


def test_context_must_match_exactly_at_the_stated_line() -> None:
    p = _patch()
    with pytest.raises(HunkMismatch, match="line 1"):
        apply_hunks(ORIGINAL.replace("a\n", "A\n"), p.hunks)
    # Same lines one line further down: no offset search, no fuzz.
    with pytest.raises(HunkMismatch):
        apply_hunks("x\n" + ORIGINAL, p.hunks)
    with pytest.raises(HunkMismatch):
        apply_hunks(PATCHED, p.hunks)  # already applied


def test_only_newline_ends_a_line() -> None:
    # A form feed inside a line must not split it (str.splitlines would).
    text = "a\nb\x0cstill b\nc\nd\n"
    diff = "--- a/pkg/mod.py\n+++ b/pkg/mod.py\n@@ -2,1 +2,1 @@\n-b\x0cstill b\n+z\n"
    p = _patch(HEADER + diff)
    assert apply_hunks(text, p.hunks) == "a\nz\nc\nd\n"


def test_insertion_hunk_with_no_old_lines() -> None:
    diff = "--- a/pkg/mod.py\n+++ b/pkg/mod.py\n@@ -2,0 +3,1 @@\n+new\n"
    p = _patch(HEADER + diff)
    assert apply_hunks("a\nb\nc\n", p.hunks) == "a\nb\nnew\nc\n"
    assert apply_hunks("a\nb\nnew\nc\n", p.hunks, reverse=True) == "a\nb\nc\n"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (HEADER.replace("Why: a reason that\n  continues here\n", "") + DIFF, "Why"),
        (
            HEADER.replace("Target: pkg/mod.py", "Target: pkg/other.py") + DIFF,
            "one file",
        ),
        (HEADER + "Colour: blue\n" + DIFF, "unexpected header line"),
        (HEADER, "no unified diff"),
        (HEADER + DIFF.replace("@@ -1,4 +1,5 @@", "@@ -1,4 +1,6 @@"), "declares"),
    ],
)
def test_malformed_patches_name_the_file(text: str, message: str) -> None:
    with pytest.raises(PatchSetError, match=message) as err:
        _patch(text)
    assert err.value.file == "demo.patch"
    assert "Fix:" in str(err.value)


def test_missing_manifest_names_the_fix(tmp_path: Path) -> None:
    with pytest.raises(PatchSetError, match="manifest not found") as err:
        load_patch_set(tmp_path)
    assert "VLLM_KUNLUN_PATCH_DIR" in err.value.fix


def test_manifest_and_patches_must_agree(tmp_path: Path) -> None:
    shutil.copytree(SET_DIR, tmp_path / "set")
    manifest = json.loads((tmp_path / "set" / "manifest.json").read_text())
    manifest["files"]["vllm/not_patched.py"] = {"before": "0", "after": "1"}
    (tmp_path / "set" / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(PatchSetError, match="not_patched"):
        load_patch_set(tmp_path / "set")


def test_default_dir_follows_the_variable(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("VLLM_KUNLUN_PATCH_DIR", raising=False)
    assert default_set_dir() == SET_DIR
    monkeypatch.setenv("VLLM_KUNLUN_PATCH_DIR", str(tmp_path))
    assert default_set_dir() == tmp_path


# --- the shipped set ---------------------------------------------------------------


def test_shipped_set_is_well_formed() -> None:
    ps = load_patch_set(SET_DIR)
    assert (ps.name, ps.vllm_version, ps.torch_version) == (
        "patch_torch251",
        "0.15.1",
        "2.5.1",
    )
    assert [p.id for p in ps.patches] == sorted(p.id for p in ps.patches)
    assert len(ps.patches) == 7
    for p in ps.patches:
        assert p.source.name == f"{p.id}.patch"
        assert len(p.why) > 80 and p.unnecessary_from
        assert p.target.startswith("vllm/") and p.target.endswith(".py")
        # Every changed region says which patch it is, for someone reading vLLM.
        added = "".join("".join(h.new_lines) for h in p.hunks)
        assert f"vllm-kunlun patch_torch251/{p.id[:2]}" in added


def _record_sha256(dist: str) -> dict[str, str]:
    files = importlib.metadata.distribution(dist).files or []
    out = {}
    for f in files:
        if f.hash is not None and f.hash.mode == "sha256":
            raw = base64.urlsafe_b64decode(
                f.hash.value + "=" * (-len(f.hash.value) % 4)
            )
            out[str(f)] = raw.hex()
    return out


def test_manifest_before_digests_are_the_vllm_wheel_files() -> None:
    """Independent source: the sha256 pip recorded when it installed vLLM 0.15.1."""
    if importlib.metadata.version("vllm") != "0.15.1":
        pytest.skip("needs the vLLM 0.15.1 wheel's RECORD")
    record = _record_sha256("vllm")
    ps = load_patch_set(SET_DIR)
    for target, digest in ps.files.items():
        assert record[target] == digest.before, target
        assert digest.after != digest.before
