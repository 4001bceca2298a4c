"""A declared file patch set: unified diffs plus a manifest of file digests.

Why: changes to an installed vLLM must be reviewable (plain unified diffs that ``git
apply`` also understands), and checkable (the sha256 of every target file before and
after the whole set). This module only reads and validates a set and applies its hunks
to text in memory; it never touches the files of an installed package (see
``engine``). It imports neither torch nor vLLM, so the patch CLI works even when the
installed vLLM cannot be imported.

Layout of a set directory::

    manifest.json    {"name", "vllm", "torch", "patches": [file names, in order],
                      "files": {target: {"before": sha256, "after": sha256}}}
    NN-name.patch    "Key: value" header lines, then one unified diff of one file

Hunks apply with exact context only (no fuzz, no offset search): with the file's
sha256 checked first, the position of every hunk is known.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from vllm_kunlun import envs
from vllm_kunlun.file_patches.errors import PatchSetError

SET_DIR_NAME = "vllm-0.15.1-torch-2.5.1"
MANIFEST = "manifest.json"
HEADER_KEYS = ("Patch", "Target", "Why", "Unnecessary-from")

# Limits on what a set may be: the shipped manifest is about 2 KB and 3 levels deep,
# each patch about 2 KB. A hostile set (a 200,000-deep manifest would make json raise
# RecursionError, a huge file would be read whole) is refused, naming the limit.
MANIFEST_MAX_BYTES = 1 << 20
MANIFEST_MAX_DEPTH = 8
PATCH_MAX_BYTES = 4 << 20

_JSON_STRING_RE = re.compile(r'"(?:[^"\\]|\\.)*"', re.S)
_NOT_BRACKET_RE = re.compile(r"[^\[\]{}]+")

_HUNK_RE = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


class HunkMismatch(ValueError):
    """A hunk's expected lines are not where the diff says they are."""


@dataclass(frozen=True)
class Hunk:
    old_start: int
    old_lines: tuple[str, ...]
    new_start: int
    new_lines: tuple[str, ...]


@dataclass(frozen=True)
class Patch:
    id: str
    target: str
    """Path relative to the directory that contains the ``vllm`` package."""
    why: str
    unnecessary_from: str
    hunks: tuple[Hunk, ...]
    source: Path


@dataclass(frozen=True)
class FileDigest:
    before: str
    after: str


@dataclass(frozen=True)
class PatchSet:
    name: str
    vllm_version: str
    torch_version: str
    directory: Path
    patches: tuple[Patch, ...]
    files: dict[str, FileDigest]

    @property
    def targets(self) -> list[str]:
        """Target files in the order their first patch appears."""
        return list(dict.fromkeys(p.target for p in self.patches))

    def patches_for(self, target: str) -> list[Patch]:
        return [p for p in self.patches if p.target == target]


def _bad(source: Path, reason: str) -> PatchSetError:
    return PatchSetError(
        source,
        reason,
        "restore the patch set from the vllm-kunlun source (git checkout -- patches/) "
        "or reinstall vllm-kunlun",
    )


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def default_set_dir() -> Path:
    """``VLLM_KUNLUN_PATCH_DIR``; else ``patches/<set>`` of the source checkout
    (editable installs); else the copy a wheel carries in ``vllm_kunlun/_patches``."""
    configured = envs.VLLM_KUNLUN_PATCH_DIR
    if configured:
        return Path(configured)
    package = Path(__file__).resolve().parents[1]
    checkout = package.parent / "patches" / SET_DIR_NAME
    if checkout.is_dir():
        return checkout
    return package / "_patches" / SET_DIR_NAME


def _parse_header(lines: list[str], source: Path) -> dict[str, str]:
    fields: dict[str, str] = {}
    key = None
    for line in lines:
        if line.startswith("#") or not line.strip():
            continue
        if line[0] in " \t" and key is not None:
            fields[key] += " " + line.strip()
            continue
        name, sep, value = line.partition(":")
        if not sep or name not in HEADER_KEYS:
            raise _bad(
                source,
                f"unexpected header line {line!r}; a header line is "
                f"'<key>: <value>' with key one of {', '.join(HEADER_KEYS)}",
            )
        key = name
        fields[key] = value.strip()
    missing = [k for k in HEADER_KEYS if not fields.get(k)]
    if missing:
        raise _bad(source, f"header lacks {', '.join(missing)}")
    return fields


def _strip_prefix(path: str, prefix: str) -> str:
    path = path.split("\t")[0].strip()
    return path[len(prefix) :] if path.startswith(prefix) else path


def split_lines(text: str) -> list[str]:
    """Lines with their newline; unlike str.splitlines, only "\\n" ends a line."""
    parts = text.split("\n")
    lines = [part + "\n" for part in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


def _parse_hunks(lines: list[str], source: Path) -> list[Hunk]:
    hunks: list[Hunk] = []
    i = 0
    while i < len(lines):
        m = _HUNK_RE.match(lines[i])
        if not m:
            raise _bad(source, f"expected a hunk header, got {lines[i]!r}")
        # An omitted count means 1.
        old_n = int(m.group(2)) if m.group(2) is not None else 1
        new_n = int(m.group(4)) if m.group(4) is not None else 1
        old: list[str] = []
        new: list[str] = []
        tag = ""
        i += 1
        while i < len(lines):
            line = lines[i]
            if line.startswith("\\"):
                # "\ No newline at end of file": the previous line has no newline.
                if tag in (" ", "-"):
                    old[-1] = old[-1].removesuffix("\n")
                if tag in (" ", "+"):
                    new[-1] = new[-1].removesuffix("\n")
                i += 1
                continue
            if (len(old) >= old_n and len(new) >= new_n) or line.startswith("@@"):
                break
            # An empty context line whose leading space an editor stripped.
            tag, body = (" ", line) if line == "\n" else (line[:1], line[1:])
            if tag not in (" ", "-", "+"):
                raise _bad(source, f"bad line in hunk: {line!r}")
            if tag != "+":
                old.append(body)
            if tag != "-":
                new.append(body)
            i += 1
        if len(old) != old_n or len(new) != new_n:
            raise _bad(
                source,
                f"hunk {m.group(0)} declares {old_n}/{new_n} lines, "
                f"has {len(old)}/{len(new)}",
            )
        hunks.append(Hunk(int(m.group(1)), tuple(old), int(m.group(3)), tuple(new)))
    if not hunks:
        raise _bad(source, "the diff has no hunks")
    return hunks


def parse_patch(text: str, source: Path) -> Patch:
    """Parse one ``.patch`` file: header fields, then a unified diff of one file."""
    lines = split_lines(text)
    starts = [i for i, line in enumerate(lines) if line.startswith("--- ")]
    if (
        not starts
        or starts[0] + 1 >= len(lines)
        or not lines[starts[0] + 1].startswith("+++ ")
    ):
        raise _bad(source, "no unified diff ('--- a/...', '+++ b/...')")
    begin = starts[0]
    header = _parse_header([ln.rstrip("\n") for ln in lines[:begin]], source)
    old_path = _strip_prefix(lines[begin][4:], "a/")
    new_path = _strip_prefix(lines[begin + 1][4:], "b/")
    target = header["Target"]
    if old_path != target or new_path != target:
        raise _bad(
            source,
            f"header Target {target!r} but the diff is of {old_path!r} -> "
            f"{new_path!r}; one patch file changes one file",
        )
    return Patch(
        id=header["Patch"],
        target=target,
        why=header["Why"],
        unnecessary_from=header["Unnecessary-from"],
        hunks=tuple(_parse_hunks(lines[begin + 2 :], source)),
        source=source,
    )


def _require(value: object, kind: type, what: str, source: Path) -> None:
    """Refuse a manifest field of the wrong JSON type, naming the type it has."""
    if not isinstance(value, kind):
        raise _bad(source, f"{what}, got a {type(value).__name__}: {value!r}")


def _check_manifest(
    raw: object, source: Path
) -> tuple[str, str, str, list[str], dict[str, FileDigest]]:
    """The manifest's fields, each checked for its type; the error names the field."""
    if not isinstance(raw, dict):
        raise _bad(
            source, f"the manifest is a JSON {type(raw).__name__}, not an object"
        )
    missing = [k for k in ("name", "vllm", "torch", "patches", "files") if k not in raw]
    if missing:
        raise _bad(source, f"the manifest lacks {', '.join(missing)}")
    for key in ("name", "vllm", "torch"):
        if not isinstance(raw[key], str) or not raw[key]:
            raise _bad(source, f"'{key}' must be a non-empty string, got {raw[key]!r}")
    names = raw["patches"]
    _require(names, list, "'patches' must be a list of patch file names", source)
    if not names:
        raise _bad(source, "'patches' is empty: a patch set has at least one patch")
    for entry in names:
        _require(entry, str, "'patches' entries must be file names", source)
        if not entry or "/" in entry or "\\" in entry or entry in (".", ".."):
            raise _bad(
                source,
                f"'patches' entry {entry!r} is not a plain file name in the set "
                "directory",
            )
    digests = raw["files"]
    _require(digests, dict, "'files' must map each target to {before, after}", source)
    files: dict[str, FileDigest] = {}
    for target, digest in digests.items():
        if not (
            isinstance(digest, dict)
            and all(isinstance(digest.get(k), str) for k in ("before", "after"))
        ):
            raise _bad(
                source,
                f'\'files\' entry {target!r} must be {{"before": sha256, "after": '
                f"sha256}}, got {digest!r}",
            )
        files[target] = FileDigest(digest["before"], digest["after"])
    return raw["name"], raw["vllm"], raw["torch"], list(names), files


def _read_limited(path: Path, limit: int, what: str) -> str:
    """UTF-8 text of ``path``, refused (naming the limit) past ``limit`` bytes.

    Reads at most ``limit + 1`` bytes, so a huge or endless file costs nothing.
    """
    with path.open("rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise _bad(
            path,
            f"the {what} is larger than the limit of {limit} bytes; a patch set "
            "is a few KB",
        )
    return data.decode("utf-8")


def _check_depth(text: str, source: Path) -> None:
    """Refuse JSON nested deeper than MANIFEST_MAX_DEPTH, before json parses it.

    Brackets inside strings do not count. Malformed text is left to json to report.
    """
    depth = deepest = 0
    brackets = _NOT_BRACKET_RE.sub("", _JSON_STRING_RE.sub("", text))
    for ch in brackets:
        if ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    if deepest > MANIFEST_MAX_DEPTH:
        raise _bad(
            source,
            f"the manifest is nested {deepest} levels deep; the limit is "
            f"{MANIFEST_MAX_DEPTH} (a patch set manifest is 3 deep)",
        )


def load_patch_set(directory: Path | None = None) -> PatchSet:
    """Read and validate a set; raises PatchSetError naming the file and the problem."""
    directory = Path(directory) if directory is not None else default_set_dir()
    manifest_path = directory / MANIFEST
    if not manifest_path.is_file():
        raise PatchSetError(
            manifest_path,
            "patch set manifest not found",
            "install vllm-kunlun from its source checkout (pip install -e .), or "
            f"point VLLM_KUNLUN_PATCH_DIR (or --patches) at patches/{SET_DIR_NAME}",
        )
    try:
        text = _read_limited(manifest_path, MANIFEST_MAX_BYTES, "manifest")
        _check_depth(text, manifest_path)
        raw = json.loads(text)
    except RecursionError as exc:  # belt and braces: _check_depth refuses it first
        raise _bad(
            manifest_path,
            f"the manifest is nested too deep to parse (the limit is "
            f"{MANIFEST_MAX_DEPTH} levels)",
        ) from exc
    except (OSError, ValueError) as exc:
        raise _bad(manifest_path, f"malformed manifest ({exc})") from exc
    name, vllm_version, torch_version, names, files = _check_manifest(
        raw, manifest_path
    )
    patches = []
    for file_name in names:
        path = directory / file_name
        if not path.is_file():
            raise _bad(manifest_path, f"lists {file_name}, which is missing")
        try:
            text = _read_limited(path, PATCH_MAX_BYTES, "patch file")
        except UnicodeDecodeError as exc:
            raise _bad(
                path, f"not UTF-8 text (byte {exc.start}: {exc.reason})"
            ) from exc
        except OSError as exc:
            raise _bad(path, f"cannot read it ({exc.strerror or exc})") from exc
        patches.append(parse_patch(text, path))
    ids = [p.id for p in patches]
    if len(set(ids)) != len(ids):
        raise _bad(manifest_path, f"duplicate patch ids in {ids}")
    for patch in patches:
        parts = Path(patch.target).parts
        if patch.target.startswith("/") or ".." in parts or parts[:1] != ("vllm",):
            raise _bad(
                patch.source,
                f"Target {patch.target!r} is not a path inside the vllm package "
                "(vllm/...)",
            )
    targets = {p.target for p in patches}
    if targets != set(files):
        raise _bad(
            manifest_path,
            f"'files' lists {sorted(files)} but the patches change {sorted(targets)}",
        )
    return PatchSet(name, vllm_version, torch_version, directory, tuple(patches), files)


def apply_hunks(text: str, hunks: Sequence[Hunk], reverse: bool = False) -> str:
    """Apply (or un-apply) hunks with exact context; raises HunkMismatch."""
    lines = split_lines(text)
    offset = 0
    for h in hunks:
        if reverse:
            start, want, put = h.new_start, h.new_lines, h.old_lines
        else:
            start, want, put = h.old_start, h.old_lines, h.new_lines
        # A hunk with no old lines names the line after which it inserts.
        at = (start if not want else start - 1) + offset
        if tuple(lines[at : at + len(want)]) != want:
            raise HunkMismatch(
                f"expected lines not found at line {at + 1}: {''.join(want[:3])!r}..."
            )
        lines[at : at + len(want)] = put
        offset += len(put) - len(want)
    return "".join(lines)


def apply_file_patches(
    text: str, patches: Sequence[Patch], reverse: bool = False
) -> str:
    """All patches of one file in set order (reverse order when un-applying)."""
    for patch in reversed(patches) if reverse else patches:
        text = apply_hunks(text, patch.hunks, reverse=reverse)
    return text


def hunks_present(text: str, patch: Patch, patched: bool) -> bool:
    """Whether every hunk's patched (or pristine) block occurs somewhere in ``text``.

    Only a hint for a drifted file (which of its patches still look applied).
    """
    return all(
        "".join(h.new_lines if patched else h.old_lines) in text for h in patch.hunks
    )
