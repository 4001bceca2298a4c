"""The doctor's ``vendor_contract`` check: the vendor op API contract (ops/contract.py) against the installed vendor
libraries' real signatures.

The deployment log's "11 missing ops, 3 keyword mismatches" (docs/deployment-log.md, D9) (kunlun_ops 0.1.58 under a
newer plugin source) only showed up as crashes deep in model execution. Here each declared
function is looked up and each keyword we pass is matched against what the function
accepts. Vendor functions come in three kinds, read in this order:
torch custom ops (``torch.ops.ns.op``, also found there when the module itself has no such
attribute: argument names from the schema), Python functions
(``inspect.signature``), pybind11 builtins (no ``inspect`` signature: the signature line
pybind11 writes at the top of ``__doc__``). A function none of these describe is listed
as unverifiable, never guessed.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from vllm_kunlun.checks.finding import Context, Finding
from vllm_kunlun.hardware.device import probe_devices
from vllm_kunlun.ops import vendor
from vllm_kunlun.versions import VALIDATED

Contract = Mapping[str, Mapping[str, Sequence[str]]]
Loader = Callable[[str], tuple[ModuleType | None, str]]


@dataclass(frozen=True)
class Accepts:
    """The keywords a callable accepts, and how we know."""

    names: frozenset[str]
    var_keyword: bool
    source: str


def _from_torch_op(fn: Any) -> Accepts | None:
    schemas = []
    if hasattr(fn, "_schema"):  # an OpOverload
        schemas = [fn._schema]
    elif hasattr(fn, "overloads") and hasattr(fn, "_qualified_op_name"):
        schemas = [getattr(fn, name)._schema for name in fn.overloads()]
    if not schemas:
        return None
    names = {a.name for s in schemas for a in s.arguments}
    return Accepts(frozenset(names), False, "torch op schema")


def _from_signature(fn: Any) -> Accepts | None:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    params = sig.parameters.values()
    return Accepts(
        frozenset(p.name for p in params if p.kind in kinds),
        any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params),
        "inspect.signature",
    )


_PYBIND_LINE = re.compile(r"^\s*(?:\d+\.\s*)?[\w.]+\((?P<args>.*)\)\s*->", re.MULTILINE)


def _split_args(text: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur)
    return [p.strip() for p in parts]


def _from_pybind_doc(fn: Any) -> Accepts | None:
    """pybind11 puts ``name(a: T, b: T = d) -> R`` (one line per overload) in ``__doc__``.

    Arguments declared without ``py::arg`` are named ``argN`` and are positional only.
    """
    doc = getattr(fn, "__doc__", None) or ""
    lines = list(_PYBIND_LINE.finditer(doc))
    if not lines:
        return None
    names: set[str] = set()
    var_kw = False
    for m in lines:
        for part in _split_args(m.group("args")):
            name = part.split(":")[0].split("=")[0].strip()
            if name.startswith("**"):
                var_kw = True
            elif (
                name and not name.startswith("*") and not re.fullmatch(r"arg\d+", name)
            ):
                names.add(name)
    return Accepts(frozenset(names), var_kw, "pybind11 signature in __doc__")


def accepted_keywords(fn: Any) -> Accepts | None:
    for reader in (_from_torch_op, _from_signature, _from_pybind_doc):
        found = reader(fn)
        if found is not None:
            return found
    return None


@dataclass
class ContractReport:
    checked: int = 0
    missing: list[str] = field(default_factory=list)
    mismatches: list[str] = field(default_factory=list)
    unverifiable: list[str] = field(default_factory=list)
    unavailable: dict[str, str] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)


def compare_contract(
    contract: Contract, load: Loader = vendor.try_load
) -> ContractReport:
    report = ContractReport()
    for module_name, functions in contract.items():
        module, why = load(module_name)
        if module is None:
            report.unavailable[module_name] = why
            continue
        report.versions[module_name] = str(getattr(module, "__version__", "unknown"))
        for fn_name, kwargs in functions.items():
            report.checked += 1
            qual = f"{module_name}.{fn_name}"
            fn = vendor.resolve(module, fn_name)
            if fn is None:
                report.missing.append(qual)
                continue
            if not kwargs:
                continue
            accepts = accepted_keywords(fn)
            if accepts is None:
                report.unverifiable.append(qual)
                continue
            if accepts.var_keyword:
                continue
            for kw in kwargs:
                if kw not in accepts.names:
                    report.mismatches.append(
                        f"{qual}({kw}=): no such keyword; accepts "
                        f"{', '.join(sorted(accepts.names)) or 'no keywords'} "
                        f"({accepts.source})"
                    )
    return report


def _default_contract() -> Contract:
    from vllm_kunlun.ops.contract import VENDOR_CONTRACT

    return VENDOR_CONTRACT


def _validated(name: str) -> str:
    for c in VALIDATED:
        if c.name == name:
            return c.validated or "the vendor build"
    return "the validated version"


def check_vendor_contract(
    ctx: Context,
    contract: Contract | None = None,
    load: Loader = vendor.try_load,
    on_kunlun: bool | None = None,
) -> Finding:
    contract = _default_contract() if contract is None else contract
    declared = sum(len(f) for f in contract.values())
    report = compare_contract(contract, load)
    if on_kunlun is None:
        on_kunlun = probe_devices().count > 0
    details: dict[str, Any] = {
        "declared_ops": declared,
        "checked_ops": report.checked,
        "missing": report.missing,
        "keyword_mismatches": report.mismatches,
        "unverifiable": report.unverifiable,
        "unavailable_modules": report.unavailable,
        "vendor_versions": report.versions,
    }
    problems = []
    if report.missing:
        problems.append(
            f"{len(report.missing)} missing op(s): {', '.join(report.missing)}"
        )
    if report.mismatches:
        problems.append(
            f"{len(report.mismatches)} keyword mismatch(es): "
            + "; ".join(report.mismatches)
        )
    if on_kunlun and report.unavailable:
        problems.append(
            "not importable: "
            + "; ".join(f"{m} ({why})" for m, why in report.unavailable.items())
        )
    if problems:
        libs = sorted({q.split(".")[0] for q in report.missing + report.mismatches})
        libs += sorted(set(report.unavailable) - set(libs)) if on_kunlun else []
        wanted = ", ".join(f"{lib} {_validated(lib)}" for lib in libs)
        installed = ", ".join(f"{m} {v}" for m, v in sorted(report.versions.items()))
        return Finding(
            "vendor_contract",
            "fail",
            (f"{installed}: " if installed else "") + "; ".join(problems),
            f"install the vendor libraries this plugin version was written for ({wanted}),"
            " or use the vllm-kunlun release that matches the installed ones",
            details,
        )
    if report.checked == 0:
        if declared == 0:
            return Finding(
                "vendor_contract",
                "ok",
                "the plugin declares no vendor ops (ops/contract.py is empty)",
                details=details,
            )
        return Finding(
            "vendor_contract",
            "skip",
            f"{declared} declared vendor op(s) not checkable here: "
            + "; ".join(report.unavailable.values()),
            "run the doctor on the Kunlun host (or in its container)",
            details,
        )
    if report.unverifiable:
        return Finding(
            "vendor_contract",
            "warn",
            f"{report.checked} declared vendor op(s) present; keywords unverifiable for "
            f"{', '.join(report.unverifiable)} (no readable signature)",
            "check those calls against the vendor documentation of "
            + ", ".join(f"{m} {v}" for m, v in sorted(report.versions.items())),
            details,
        )
    return Finding(
        "vendor_contract",
        "ok",
        f"{report.checked} declared vendor op(s) present with the keywords we pass",
        details=details,
    )
