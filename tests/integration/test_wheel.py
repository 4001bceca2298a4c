"""A non-editable wheel carries what the installed plugin needs at run time."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_wheel_ships_patch_set_and_doctor_schema(tmp_path: Path) -> None:
    uv = Path(sys.executable).with_name("uv")
    env = {**os.environ, "VLLM_KUNLUN_BUILD_EXT": "0"}  # contents, not the compile
    proc = subprocess.run(
        [str(uv), "build", "--no-build-isolation", "--wheel", "-o", str(tmp_path)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (wheel,) = tmp_path.glob("vllm_kunlun-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = {
        n.removeprefix("vllm_kunlun/_patches/vllm-0.15.1-torch-2.5.1/")
        for n in names
        if n.startswith("vllm_kunlun/_patches/")
    }
    in_repo = {p.name for p in (REPO / "patches" / "vllm-0.15.1-torch-2.5.1").iterdir()}
    assert shipped == in_repo and "manifest.json" in shipped
    assert "vllm_kunlun/doctor/schema.json" in names
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "kunlun = vllm_kunlun:register" in text
