"""The one-launch kernels' sources for the lab: as shipped, with variants applied, or as a directory already
written; built with the CUDA compiler and put in place of the shipped build.

A variant is a patch under `variants/`: a `git diff` of `streamvox/models/qwen3_tts/kernels/` with a description
above it. `git apply` applies it to a temporary copy of the kernel sources (never to the tree), so a patch written
against another version of a kernel fails loudly instead of landing elsewhere. A patch written on top of another
names that base on a line `Base: NAME` of its description, and the base must come first.

A source spec, as `kernel_ab.py --patch` and `kernel_stamps.py --patch` take it, is one of:
- patches joined by `+`, applied in order (`variants/a.patch+variants/b.patch`);
- a directory holding every kernel source, already patched (written by `--out` below on a machine with git, for a
  GPU machine without it).

    python tools/kernel_lab/kernel_sources.py PATCHES              # write over the tree's kernels (a serve run)
    python tools/kernel_lab/kernel_sources.py PATCHES --out DIR    # write the patched sources to DIR
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
KERNELS_PATH = Path("streamvox/models/qwen3_tts/kernels")  # as the patches name it, from the repository root
KERNELS = ROOT / KERNELS_PATH
HEADER = "persistent.cuh"
BASE = re.compile(r"^Base: (\S+)$", re.M)


class PatchError(ValueError):
    """A patch that does not apply, or changes something other than the kernel sources."""


def _source_files(directory: Path) -> list[Path]:
    return sorted([*directory.glob("*.cu"), *directory.glob("*.cuh")])


def shipped() -> dict[str, str]:
    """The kernels' sources as they are in the tree: file name -> text."""
    return {p.name: p.read_text() for p in _source_files(KERNELS)}


def base_of(diff: str) -> str | None:
    """The variant a patch is written on top of: its description's `Base: NAME` line (None: the shipped kernel)."""
    start = diff.find("\n--- ")
    m = BASE.search(diff[:start] if start >= 0 else diff)
    return m.group(1) if m else None


def with_bases(patch: Path) -> str:
    """The spec that applies `patch` after the variants it is written on top of (its `Base:` lines), in order."""
    base = base_of(patch.read_text())
    return f"{with_bases(patch.parent / base)}+{patch}" if base else str(patch)


def _git_apply(tree: Path, patch: Path, *args: str) -> str:
    """`git apply ARGS PATCH` run in `tree`, a directory outside any repository (its output; PatchError on
    failure)."""
    env = {**os.environ, "GIT_CEILING_DIRECTORIES": str(tree.parent)}  # never find a repository above `tree`
    run = subprocess.run(["git", "apply", *args, str(patch.resolve())], cwd=tree, env=env, capture_output=True,
                         text=True)
    if run.returncode != 0:
        raise PatchError(f"{patch.name} does not apply: {run.stderr.strip()}")
    return run.stdout


def apply(tree: Path, patch: Path, check: bool = False) -> None:
    """Apply `patch` (or with `check`, only check that it applies) to the kernel sources under `tree`, a copy of
    the repository's layout. Raises PatchError where it does not apply or touches any other file."""
    for row in _git_apply(tree, patch, "--numstat").splitlines():
        path = Path(row.split("\t", 2)[2])
        if path.parent != KERNELS_PATH:
            raise PatchError(f"{patch.name} changes {path}, not a kernel source")
    _git_apply(tree, patch, *(["--check"] if check else []))


def copy_of_kernels(where: Path) -> Path:
    """A copy of the shipped kernel sources under `where`, laid out as in the repository; returns `where`."""
    (where / KERNELS_PATH).mkdir(parents=True, exist_ok=True)
    for p in _source_files(KERNELS):
        shutil.copyfile(p, where / KERNELS_PATH / p.name)
    return where


def patched(spec: str | None) -> dict[str, str]:
    """The kernel sources a spec names (module docstring; None or empty: as shipped): file name -> text."""
    if not spec:
        return shipped()
    if Path(spec).is_dir():
        files = {p.name: p.read_text() for p in _source_files(Path(spec))}
        if set(files) != set(shipped()):
            raise PatchError(f"{spec} holds {sorted(files)}, not the kernel sources {sorted(shipped())}")
        return files
    with tempfile.TemporaryDirectory() as tmp:
        tree = copy_of_kernels(Path(tmp) / "tree")
        applied: list[str] = []
        for path in map(Path, spec.split("+")):
            base = base_of(path.read_text())
            if base and base not in applied:
                raise PatchError(f"{path} is written on top of {base}: give {base}+{path}")
            apply(tree, path)
            applied.append(path.name)
        return {p.name: p.read_text() for p in _source_files(tree / KERNELS_PATH)}


def build(which: str, files: dict[str, str], tag: str):
    """The extension of `which`'s kernel (`talker` or `predictor`) built from `files` by the kernels' own build,
    named by `tag` and a digest of the sources it compiles. The sources go to a directory named by their digest,
    so a second build of them (in this process or another) finds the first one's output up to date."""
    from streamvox.models.qwen3_tts.kernels.build import compile_extension

    source = f"{which}_kernel.cu"
    digest = hashlib.sha256((files[source] + files[HEADER]).encode()).hexdigest()[:12]
    where = Path(tempfile.gettempdir()) / "streamvox_kernel_sources" / digest
    where.mkdir(parents=True, exist_ok=True)
    for file, text in files.items():
        if not (where / file).exists() or (where / file).read_text() != text:
            (where / file).write_text(text)
    return compile_extension(f"streamvox_{tag}_{which}", where / source)


def _build_quietly(which: str, files: dict[str, str] | None, tag: str) -> None:
    try:
        if files is None:  # as shipped, where a frame stepper builds it
            importlib.import_module("streamvox.models.qwen3_tts.kernels.build").build(f"{which}_kernel.cu")
        else:
            build(which, files, tag)
    except Exception:  # the caller's own build reports it
        pass


def build_all(builds: list[tuple[str, dict[str, str] | None, str]]) -> None:
    """Compile every (which, files, tag) at once, one process each (the CUDA compiler is single-threaded: six
    builds take the time of one); `build` then only loads them. Files None: the shipped kernel as a frame stepper
    builds it. Failures are left for the later build to raise."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(len(builds), mp_context=multiprocessing.get_context("spawn")) as pool:
        for f in [pool.submit(_build_quietly, *b) for b in builds]:
            try:
                f.result()
            except Exception:  # a broken pool only costs the time: the builds then run one by one
                pass


def install(which: str, ext) -> None:
    """Make the next `which` kernel (`talker` or `predictor`) built by a frame stepper use `ext`."""
    importlib.import_module(f"streamvox.models.qwen3_tts.kernels.{which}").build = lambda source, defines=(): ext


def main() -> None:
    ap = argparse.ArgumentParser(description="Write the kernel sources with variants applied.")
    ap.add_argument("patches", help="a patch, or patches joined by + applied in order")
    ap.add_argument("--out", type=Path, default=KERNELS,
                    help="where to write the sources (default: over the tree's kernels, for a serve run)")
    args = ap.parse_args()
    files = patched(args.patches)
    args.out.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        target = args.out / name
        if not target.exists() or target.read_text() != text:
            target.write_text(text)
            print(f"wrote {target}")


if __name__ == "__main__":
    main()
