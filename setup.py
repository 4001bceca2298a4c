"""Packaging for vllm-kunlun: the single source of metadata and entry points.

The native extension (csrc/) builds against the torch installed in the environment, so
install with ``--no-build-isolation`` (scripts/setup.sh does). Set
VLLM_KUNLUN_BUILD_EXT=0 to skip it; the plugin then says once at run time what is
missing and how to fix it.
"""

import importlib.util
import os
import sys

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))


def _load_envs():
    # envs.py is the one place that reads VLLM_KUNLUN_* variables; load it by path so
    # setup.py does not import the package (which needs vLLM).
    spec = importlib.util.spec_from_file_location(
        "_vllm_kunlun_envs", os.path.join(HERE, "vllm_kunlun", "envs.py")
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _read_version():
    with open(os.path.join(HERE, "vllm_kunlun", "versions.py")) as f:
        for line in f:
            if line.startswith("__version__"):
                return line.split("=")[1].strip().strip('"')
    raise RuntimeError("vllm_kunlun/versions.py has no __version__")


def _read_readme():
    with open(os.path.join(HERE, "README.md")) as f:
        return f.read()


def _compiler_has_openmp() -> bool:
    """Whether the C++ compiler takes -fopenmp and has omp.h (preprocessing only)."""
    import shlex
    import subprocess

    cxx = shlex.split(os.environ.get("CXX") or "c++")
    try:
        probe = subprocess.run(
            [*cxx, "-fopenmp", "-x", "c++", "-E", "-"],
            input="#include <omp.h>\n",
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return probe.returncode == 0


def _ext_modules_and_cmdclass():
    if not _load_envs().VLLM_KUNLUN_BUILD_EXT:
        print("vllm-kunlun: VLLM_KUNLUN_BUILD_EXT=0, native extension not built")
        return [], {}
    import torch
    from torch.utils.cpp_extension import BuildExtension, CppExtension

    flags = ["-O2", "-g0"]
    # at::parallel_for (the native sampler's rows) runs on torch's own intra-op pool
    # only when compiled with OpenMP like torch; its OpenMP calls then bind to the
    # runtime torch already loaded (not linked here: a second runtime would be a second
    # pool, whose threads fight torch's spinning ones for the cores). A torch built
    # without OpenMP keeps at::parallel_for inside libtorch.
    if "OpenMP" in torch.__config__.parallel_info().split("ATen parallel backend:")[-1]:
        if _compiler_has_openmp():
            flags.append("-fopenmp")
        else:
            print(
                "vllm-kunlun: the C++ compiler has no OpenMP (omp.h); the native "
                "sampler's rows will run on one thread"
            )
    ext = CppExtension(
        name="vllm_kunlun._native",
        sources=["csrc/weak_ref_tensor.cpp", "csrc/sampling_cpu.cpp"],
        extra_compile_args=flags,
    )
    return [ext], {"build_ext": BuildExtension.with_options(use_ninja=True)}


class BuildPyWithPatches(build_py):
    """Ship patches/ inside the wheel as vllm_kunlun/_patches, so that
    `vllm-kunlun patch apply` works from a non-editable install too."""

    def run(self):
        super().run()
        if self.editable_mode:
            return  # the source checkout's patches/ is found directly
        src = os.path.join(HERE, "patches")
        self.copy_tree(src, os.path.join(self.build_lib, "vllm_kunlun", "_patches"))


ext_modules, cmdclass = _ext_modules_and_cmdclass()
cmdclass["build_py"] = BuildPyWithPatches

setup(
    name="vllm-kunlun",
    version=_read_version(),
    description="vLLM platform plugin for Kunlun P800 XPUs (vllm 0.15.1, torch 2.5.1)",
    long_description=_read_readme(),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.10,<3.13",
    packages=find_packages(include=["vllm_kunlun", "vllm_kunlun.*"]),
    package_data={"vllm_kunlun": ["py.typed", "doctor/schema.json"]},
    # The stack (vllm, torch, transformers) is pinned in requirements/*.lock and
    # installed by scripts/setup.sh: vllm must go in with --no-deps, which package
    # metadata cannot express.
    install_requires=[],
    # Only the benchmarks' --plot draws (benchmarks/plots.py); the plugin never
    # imports it. requirements/dev.lock pins it for the tests.
    extras_require={"bench": ["matplotlib>=3.8"]},
    ext_modules=ext_modules,
    cmdclass=cmdclass,
    entry_points={
        "vllm.platform_plugins": ["kunlun = vllm_kunlun:register"],
        "vllm.general_plugins": [
            "kunlun_runtime_fixes = vllm_kunlun:register_runtime_fixes"
        ],
        "console_scripts": ["vllm-kunlun = vllm_kunlun.cli:main"],
    },
)
