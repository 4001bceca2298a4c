"""README facts that code owns: the validated table, the variables, the commands."""

from __future__ import annotations

import re
from pathlib import Path

from vllm_kunlun import envs
from vllm_kunlun.versions import VALIDATED

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()


def test_validated_versions_in_readme_match_the_code_table() -> None:
    rows = dict(re.findall(r"^\| ([\w_, -]+?) \| ([\w. ]+?) \|", README, re.M))
    for c in VALIDATED:
        if c.name == "vllm-kunlun":
            continue
        if c.validated is None:
            assert any(c.name in k and v == "vendor builds" for k, v in rows.items()), c
        else:
            assert rows.get(c.name) == c.validated, c.name


def test_every_variable_is_documented() -> None:
    missing = [name for name in envs.registry() if f"`{name}`" not in README]
    assert missing == []


def test_ci_runs_the_readme_test_command() -> None:
    assert "scripts/test.sh" in README
    ci = (REPO / ".ci" / "run").read_text()
    assert re.search(r"^exec scripts/test\.sh$", ci, re.M)
