"""The kernel lab (tools/kernel_lab/): every variant still applies to the kernels as they are (`git apply --check`,
after its bases), as do the chains `run_kernel_variants.sh` measures; a patch that does not match, or that
touches anything but the kernel sources, is refused without changing the tree; the A/B picker picks the fastest
variant that passes; the stamps find their points; and, where the CUDA compiler is installed, the shipped,
patched and stamped sources compile for the H200 (sm_90a)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LAB = ROOT / "tools" / "kernel_lab"
sys.path.insert(0, str(LAB))

import ab_winner  # noqa: E402
import kernel_sources  # noqa: E402
from kernel_stamps import stamped_source  # noqa: E402

VARIANTS = sorted((LAB / "variants").glob("*.patch"))
KERNEL_OF = {"talker": "talker_kernel.cu", "predictor": "predictor_kernel.cu"}


def test_the_lab_has_its_variants_and_no_patch_engine() -> None:
    assert len(VARIANTS) == 8
    assert not (ROOT / "benchmarks" / "variants").exists()
    assert not hasattr(kernel_sources, "apply_patch")  # `git apply` does the applying


@pytest.mark.parametrize("variant", VARIANTS, ids=[v.stem for v in VARIANTS])
def test_variant_applies_to_the_kernels_as_they_are(tmp_path, variant) -> None:
    tree = kernel_sources.copy_of_kernels(tmp_path / "tree")
    bases = kernel_sources.with_bases(variant).split("+")[:-1]
    for base in bases:
        kernel_sources.apply(tree, Path(base))
    kernel_sources.apply(tree, variant, check=True)  # git apply --check

    files = kernel_sources.patched(kernel_sources.with_bases(variant))
    shipped = kernel_sources.shipped()
    assert set(files) == set(shipped) and {"persistent.cuh", *KERNEL_OF.values()} <= set(files)
    changed = [name for name, text in shipped.items() if files[name] != text]
    assert changed == [KERNEL_OF[variant.stem.split("-")[0]]]
    stamped_source(files[changed[0]])  # kernel_stamps.py --patch finds its points in it
    if bases:
        with pytest.raises(kernel_sources.PatchError, match="written on top of"):
            kernel_sources.patched(str(variant))


def _script_chains() -> list[str]:
    """Every variant chain `run_kernel_variants.sh` passes to kernel_ab.py."""
    script = (LAB / "run_kernel_variants.sh").read_text()
    chains = re.findall(r'"(\$V/[^"]+)"', script)
    return [c.replace("$V", str(LAB / "variants")) for c in chains]


@pytest.mark.parametrize("chain", _script_chains(), ids=lambda c: "+".join(Path(p).stem for p in c.split("+")))
def test_every_chain_the_script_measures_applies(chain) -> None:
    files = kernel_sources.patched(chain)
    assert files != kernel_sources.shipped()


def test_script_chains_cover_every_variant() -> None:
    used = {Path(p).name for chain in _script_chains() for p in chain.split("+")}
    assert len(_script_chains()) == 11 and used == {v.name for v in VARIANTS}


def _edited(variant: Path, old: str, new: str) -> str:
    text = variant.read_text()
    assert old in text
    return text.replace(old, new, 1)


def test_patch_whose_context_does_not_match_is_refused(tmp_path) -> None:
    variant = LAB / "variants" / "talker-grid-128.patch"
    context = next(line for line in variant.read_text().split("\n@@", 1)[1].splitlines()[1:] if line.startswith(" "))
    bad = tmp_path / "bad.patch"
    bad.write_text(_edited(variant, "\n" + context + "\n", "\n" + context + " // not in the kernel\n"))
    before = kernel_sources.shipped()
    with pytest.raises(kernel_sources.PatchError, match="does not apply"):
        kernel_sources.patched(str(bad))
    assert kernel_sources.shipped() == before


def test_patch_of_another_file_is_refused(tmp_path) -> None:
    """Even a patch that would apply (a new file) is refused when it touches anything but the kernel sources."""
    patch = tmp_path / "other.patch"
    patch.write_text("A description.\n\n--- /dev/null\n+++ b/streamvox/models/qwen3_tts/runner_extra.py\n"
                     "@@ -0,0 +1 @@\n+x = 1\n")
    tree = kernel_sources.copy_of_kernels(tmp_path / "tree")
    with pytest.raises(kernel_sources.PatchError, match="not a kernel source"):
        kernel_sources.apply(tree, patch)
    assert not (tree / "streamvox/models/qwen3_tts/runner_extra.py").exists()


def test_sources_written_to_a_directory_serve_as_a_spec(tmp_path) -> None:
    """`kernel_sources.py CHAIN --out DIR` (for a GPU machine without git) writes what `patched(CHAIN)` gives,
    and DIR is then a spec of its own; a directory missing a source is refused."""
    chain = kernel_sources.with_bases(LAB / "variants" / "talker-sums-at-phase-end.patch")
    out = tmp_path / "applied"
    subprocess.run([sys.executable, str(LAB / "kernel_sources.py"), chain, "--out", str(out)], check=True,
                   capture_output=True)
    assert kernel_sources.patched(str(out)) == kernel_sources.patched(chain) != kernel_sources.shipped()
    assert kernel_sources.patched("") == kernel_sources.shipped()  # no winner: as shipped
    (out / "persistent.cuh").unlink()
    with pytest.raises(kernel_sources.PatchError, match="not the kernel sources"):
        kernel_sources.patched(str(out))


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
    del run["builds"]["shipped"]
    assert ab_winner.winner(run, min_gain=1.0, max_diff=0.02) is None  # nothing to compare with


def test_ab_winner_prints_a_chain_that_applies(tmp_path) -> None:
    """The picker's output, one winner a kernel over the runs given, is a spec `kernel_sources.py` applies."""
    talker = {"kernel": "talker", "builds": {
        "shipped": _build(1280, 3.0),
        "talker-grid-128": _build(1260, 2.99),
        "talker-input-in-registers+talker-sums-at-phase-end": _build(1230, 2.95)}}
    handoff = {"kernel": "talker", "builds": {
        "shipped": _build(1280, 3.0), "talker-claimed-chunks": _build(1250, 2.98)}}
    predictor = {"kernel": "predictor", "builds": {  # 0.07% is under the 1% a winner needs
        "shipped": _build(1500, 3.0), "predictor-grid-128": _build(1499, 3.0)}}
    paths = []
    for name, run in [("safe", talker), ("handoff", handoff), ("pred", predictor)]:
        paths.append(tmp_path / f"ab-{name}.json")
        paths[-1].write_text(json.dumps(run))
    out = subprocess.run([sys.executable, str(LAB / "ab_winner.py"), *map(str, paths), str(tmp_path / "missing.json")],
                         check=True, capture_output=True, text=True)
    chain = out.stdout.strip()
    assert [Path(p).name for p in chain.split("+")] == ["talker-input-in-registers.patch",
                                                         "talker-sums-at-phase-end.patch"]
    assert "missing" in out.stderr
    files = kernel_sources.patched(chain)
    assert files["talker_kernel.cu"] != kernel_sources.shipped()["talker_kernel.cu"]


@pytest.mark.parametrize(("which", "points"), [("talker", 4 + 2 * 5), ("predictor", 5 + 2 * 5)])
def test_stamped_kernel_source_has_every_phase(which, points) -> None:
    """kernel_stamps.py finds its points in the kernel as it is now: a stamp before each projection and around
    each grid barrier of the main loop, none elsewhere (the GPU run builds what this checks)."""
    text = kernel_sources.shipped()[KERNEL_OF[which]]
    source, labels = stamped_source(text)
    assert len(labels) == points
    assert sum(label.endswith("waiting at the barrier") for label in labels) == text.count("grid_sync<THREADS>(")
    assert [source.count(f"stamp({i}, stamp_last);") for i in range(points)] == [1] * points
    assert source.count("long long stamp_last = clock64();") == 1
    assert 'm.def("stamps", &read_stamps);' in source and f"stamp_sums[160][{points}]" in source


def _sources() -> list[tuple[str, str, str | None]]:
    """(id, kernel, spec) for every build the lab may make: shipped, stamped, each variant."""
    out = [(f"{k}-{how}", k, None) for k in ("talker", "predictor") for how in ("shipped", "stamped")]
    return out + [(v.stem, v.stem.split("-")[0], kernel_sources.with_bases(v)) for v in VARIANTS]


SOURCES = _sources()


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no CUDA compiler on this machine")
@pytest.mark.parametrize(("which", "spec", "stamped"),
                         [(k, p, i.endswith("stamped")) for i, k, p in SOURCES], ids=[i for i, _, _ in SOURCES])
def test_source_compiles_for_sm90a(tmp_path, which, spec, stamped) -> None:
    from torch.utils.cpp_extension import include_paths

    files = kernel_sources.patched(spec)
    name = KERNEL_OF[which]
    if stamped:
        files[name] = stamped_source(files[name])[0]
    for file, text in files.items():
        (tmp_path / file).write_text(text)
    includes = [f"-I{p}" for p in [*include_paths(), sysconfig.get_paths()["include"]]]
    run = subprocess.run(["nvcc", "-O3", "-std=c++17", "-gencode=arch=compute_90a,code=sm_90a", "-c", name,
                          "-o", "k.o", "-DTORCH_EXTENSION_NAME=k", "-Xcompiler", "-fPIC", *includes],
                         cwd=tmp_path, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
