"""The one-launch kernels' edited copies that the GPU benchmarks build (benchmarks/kernel_source.py): patches
apply exactly or fail, the A/B runs' winner is picked by its rules (benchmarks/ab_winner.py), every variant
under benchmarks/variants/ still applies to the kernels as they are, and, where the CUDA compiler is installed,
the shipped, patched and stamped sources compile for the H200 (sm_90a)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import ab_winner  # noqa: E402
import kernel_source  # noqa: E402
from kernel_stamps import stamped_source  # noqa: E402

VARIANTS = sorted((ROOT / "benchmarks" / "variants").glob("*.patch"))
FILES = {"k.cu": "a\nb\nc\nd\ne\nf\n", "persistent.cuh": "h\n"}
DIFF = """A description line, ignored.
--- a/streamvox/models/qwen3_tts/k.cu
+++ b/streamvox/models/qwen3_tts/k.cu
@@ -2,3 +2,3 @@
 b
-c
+C
 d
"""


def test_patch_applies_at_its_line_or_its_one_other_match() -> None:
    assert kernel_source.apply_patch(FILES, DIFF)["k.cu"] == "a\nb\nC\nd\ne\nf\n"
    moved = {"k.cu": "x\ny\n" + FILES["k.cu"], "persistent.cuh": "h\n"}  # two lines added above the hunk
    assert kernel_source.apply_patch(moved, DIFF)["k.cu"] == "x\ny\na\nb\nC\nd\ne\nf\n"


def _build(us: float, ms: float, identical: int = 8, diff: float = 0.0) -> dict:
    return {"alone_us": [us, us + 2, us - 2], "step_ms": [ms] * 3, "identical_codes": identical, "states": 8,
            "worst_rel_diff": diff}


def test_ab_winner_is_the_fastest_variant_that_passes() -> None:
    run = {"kernel": "predictor", "builds": {
        "shipped": _build(1500, 3.05),
        "fast-but-wrong-codes": _build(1300, 2.9, identical=3),
        "fast-but-far": _build(1310, 2.9, diff=0.05),
        "a+b": _build(1450, 3.0),
        "a": _build(1470, 3.01),
        "broken": {"error": "failed"}}}
    name, gain = ab_winner.winner(run, min_gain=1.0, max_diff=0.02)
    assert name == "a+b" and gain == pytest.approx(100 * 50 / 1500)
    assert ab_winner.winner(run, min_gain=4.0, max_diff=0.02) is None  # a+b gains 3.3%
    run["builds"]["a+b"]["step_ms"] = [3.1] * 3  # a slower frame step loses whatever the kernel alone gains
    assert ab_winner.winner(run, min_gain=1.0, max_diff=0.02)[0] == "a"


def test_patch_blank_context_line_may_have_lost_its_space() -> None:
    diff = "+++ b/k.cu\n@@ -1,3 +1,3 @@\n a\n\n-b\n+B\n"
    assert kernel_source.apply_patch({"k.cu": "a\n\nb\n"}, diff)["k.cu"] == "a\n\nB\n"


@pytest.mark.parametrize("text", ["a\nb\nX\nd\n", "b\nc\nd\nb\nc\nd\n"], ids=["no match", "two matches"])
def test_patch_that_does_not_match_exactly_once_fails(text) -> None:
    with pytest.raises(ValueError, match="does not apply"):
        kernel_source.apply_patch({"k.cu": text, "persistent.cuh": ""}, DIFF)


def test_patch_of_another_file_fails() -> None:
    with pytest.raises(ValueError, match="not a kernel source"):
        kernel_source.apply_patch(FILES, DIFF.replace("k.cu", "runner.py"))


def chain(variant: Path) -> str:
    """The variant's patch, after the variant it is written on top of (its `Base:` line) if any."""
    base = kernel_source.base_of(variant.read_text())
    return f"{chain(variant.parent / base)}+{variant}" if base else str(variant)


@pytest.mark.parametrize("variant", VARIANTS, ids=[v.stem for v in VARIANTS])
def test_variant_applies_to_the_kernels_as_they_are(variant) -> None:
    files = kernel_source.patched(chain(variant))
    changed = [name for name, text in kernel_source.shipped().items() if files[name] != text]
    assert changed and all(name.startswith(variant.stem.split("-")[0]) for name in changed)
    stamped_source(files[changed[0]])  # kernel_stamps.py --patch finds its points in it
    if chain(variant) != str(variant):
        with pytest.raises(ValueError, match="written on top of"):
            kernel_source.patched(str(variant))


def _sources() -> list[tuple[str, str, str | None]]:
    """(id, kernel, patches) for every build the benchmarks may make: shipped, stamped, each variant."""
    out = [(f"{k}-{how}", k, None) for k in ("talker", "predictor") for how in ("shipped", "stamped")]
    return out + [(v.stem, v.stem.split("-")[0], chain(v)) for v in VARIANTS]


SOURCES = _sources()


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no CUDA compiler on this machine")
@pytest.mark.parametrize(("which", "patches", "stamped"),
                         [(k, p, i.endswith("stamped")) for i, k, p in SOURCES], ids=[i for i, _, _ in SOURCES])
def test_source_compiles_for_sm90a(tmp_path, which, patches, stamped) -> None:
    from torch.utils.cpp_extension import include_paths

    files = kernel_source.patched(patches)
    name = f"{which}_kernel.cu"
    if stamped:
        files[name] = stamped_source(files[name])[0]
    for file, text in files.items():
        (tmp_path / file).write_text(text)
    includes = [f"-I{p}" for p in [*include_paths(), sysconfig.get_paths()["include"]]]
    run = subprocess.run(["nvcc", "-O3", "-std=c++17", "-gencode=arch=compute_90a,code=sm_90a", "-c", name,
                          "-o", "k.o", "-DTORCH_EXTENSION_NAME=k", "-Xcompiler", "-fPIC", *includes],
                         cwd=tmp_path, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
