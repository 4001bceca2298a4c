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


def test_every_message_the_plugin_calls_harmless_is_explained() -> None:
    """The startup line quotes vLLM's messages; README's section explains each one."""
    import vllm_kunlun

    start = README.index("## Messages you can ignore")
    section = " ".join(README[start : README.index("\n## ", start + 1)].split())
    quoted = re.findall(r'"([^"]+)"', vllm_kunlun.KNOWN_MESSAGES_LINE)
    assert "Messages you can ignore" in quoted
    assert len(quoted) >= 5
    for message in quoted:
        for piece in message.split(" ... "):
            assert piece in section, piece
    assert vllm_kunlun.KNOWN_MESSAGES_LINE.split(":")[1].strip() in section
