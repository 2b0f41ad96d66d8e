"""The wheel carries what a non-editable install needs at run time besides Python modules: every kernel source
(and every file a kernel source `#include "..."`s, which the CUDA compiler looks for beside it) and the server's
static files. The wheel is built from a copy of the package (no VCS, no egg-info to borrow a file list from), so
only `pyproject.toml`'s package data decides what goes in; built offline with the environment's setuptools."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path, PurePosixPath

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "streamvox"
QUOTED_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
CUDA = (".cu", ".cuh")


def build_wheel(tmp: Path, pyproject: str | None = None) -> dict[str, bytes]:
    """The files of a wheel built from a copy of the project (`pyproject`: that text in place of the project's
    own): name -> content."""
    src = tmp / "src"
    shutil.copytree(PACKAGE, src / "streamvox", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in ("README.md", "LICENSE"):
        shutil.copyfile(ROOT / name, src / name)
    (src / "pyproject.toml").write_text(pyproject or (ROOT / "pyproject.toml").read_text())
    run = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                          "-q", "-w", str(tmp / "dist"), str(src)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    (wheel,) = (tmp / "dist").glob("streamvox-*.whl")
    with zipfile.ZipFile(wheel) as z:
        return {name: z.read(name) for name in z.namelist()}


def missing_includes(wheel: dict[str, bytes]) -> list[str]:
    """Files that a `.cu`/`.cuh` in the wheel includes with quotes (looked up beside it) but the wheel lacks."""
    missing = []
    for name in sorted(n for n in wheel if n.endswith(CUDA)):
        for include in QUOTED_INCLUDE.findall(wheel[name].decode()):
            wanted = str(PurePosixPath(name).parent / include)
            if wanted not in wheel:
                missing.append(wanted)
    return missing


def package_files(*patterns: str) -> set[str]:
    return {str(p.relative_to(PACKAGE.parent).as_posix()) for pattern in patterns for p in PACKAGE.rglob(pattern)}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> dict[str, bytes]:
    return build_wheel(tmp_path_factory.mktemp("wheel"))


def test_wheel_carries_every_kernel_source_and_what_it_includes(wheel) -> None:
    kernels = package_files("*.cu", "*.cuh")
    assert {"streamvox/models/qwen3_tts/kernels/persistent.cuh",
            "streamvox/models/qwen3_tts/kernels/talker_kernel.cu",
            "streamvox/models/qwen3_tts/kernels/predictor_kernel.cu"} <= kernels
    assert kernels <= set(wheel)
    assert all(wheel[name] == (PACKAGE.parent / name).read_bytes() for name in kernels)
    assert missing_includes(wheel) == []


def test_wheel_carries_the_static_files(wheel) -> None:
    static = package_files("server/static/*")
    assert "streamvox/server/static/index.html" in static
    assert static <= set(wheel)


def test_a_header_left_out_of_package_data_is_caught(tmp_path) -> None:
    """The include check is not vacuous: without `*.cuh` in package data, the kernels' shared header is missing."""
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert ', "models/qwen3_tts/kernels/*.cuh"' in pyproject
    without = build_wheel(tmp_path, pyproject.replace(', "models/qwen3_tts/kernels/*.cuh"', ""))
    assert "streamvox/models/qwen3_tts/kernels/talker_kernel.cu" in without
    assert missing_includes(without) == ["streamvox/models/qwen3_tts/kernels/persistent.cuh"] * 2
