"""Edited copies of a one-launch kernel's source (`kernel_stamps.py`: a stamped copy; `kernel_ab.py`: a variant
from `benchmarks/variants/*.patch`), built with the CUDA compiler and put in place of the shipped build.

A patch is a unified diff (`git diff` output) of files in `streamvox/models/qwen3_tts/`. It is applied here, in
Python, rather than by `patch` or `git`: the GPU machine may have neither, and one exact rule (every hunk's
context and removed lines must match the source, found at the hunk's line or, failing that, at exactly one other
place) makes a patch written against another version of a kernel fail loudly instead of landing elsewhere.

To serve a variant (`gpu_bench.py --serve` builds the kernels from the tree), write it over the tree's kernel
sources, on a copy of the tree such as the GPU machine's:

    python benchmarks/kernel_source.py benchmarks/variants/talker-grid-128.patch+benchmarks/variants/...
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import re
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KERNELS = ROOT / "streamvox" / "models" / "qwen3_tts" / "kernels"
HEADER = "persistent.cuh"
BASE = re.compile(r"^Base: (\S+)$", re.M)
HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+\d+(?:,(\d+))? @@")


def shipped() -> dict[str, str]:
    """The kernels' sources as they are in the tree: file name -> text."""
    return {p.name: p.read_text() for p in sorted(KERNELS.glob("*.cu")) + [KERNELS / HEADER]}


def _apply_hunk(lines: list[str], start: int, body: list[str], name: str) -> list[str]:
    """`lines` with one hunk (its lines, each with its ' ', '-' or '+' mark) applied near line index `start`."""
    old = [s[1:] for s in body if s[:1] in (" ", "-")]
    new = [s[1:] for s in body if s[:1] in (" ", "+")]
    if lines[start:start + len(old)] != old:
        found = [i for i in range(len(lines) - len(old) + 1) if lines[i:i + len(old)] == old]
        if len(found) != 1:
            raise ValueError(f"{name}: a hunk at line {start + 1} does not apply ({len(found)} matches elsewhere)")
        start = found[0]
    return lines[:start] + new + lines[start + len(old):]


def apply_patch(files: dict[str, str], diff: str) -> dict[str, str]:
    """`files` (name -> text) with the unified diff `diff` applied; text before the first file header (a
    description) is ignored. Raises ValueError where a hunk does not match or names a file not in `files`."""
    out = dict(files)
    name, lines, shift = None, [], 0
    rows = diff.split("\n")
    i = 0
    while i < len(rows):
        row = rows[i]
        if row.startswith("+++ "):
            if name is not None:
                out[name] = "\n".join(lines)
            name = Path(row[4:].split("\t")[0].strip()).name
            if name not in out:
                raise ValueError(f"the patch changes {name}, not a kernel source")
            lines, shift = out[name].split("\n"), 0
        elif (m := HUNK.match(row)) and name is not None:
            old_n, new_n = (int(c) if c is not None else 1 for c in m.group(2, 3))
            body = []
            i += 1
            while (old_n or new_n) and i < len(rows):  # the hunk's lines, as many as its header counts
                mark = rows[i][:1] or " "  # an empty line: a blank context line whose space was stripped
                if mark in " -+":
                    body.append(mark + rows[i][1:])
                    old_n -= mark != "+"
                    new_n -= mark != "-"
                i += 1  # (a "\ No newline at end of file" line counts for neither)
            before = len(lines)
            lines = _apply_hunk(lines, int(m.group(1)) - 1 + shift, body, name)
            shift += len(lines) - before
            continue
        i += 1
    if name is None:
        raise ValueError("no file in the patch")
    out[name] = "\n".join(lines)
    return out


def base_of(diff: str) -> str | None:
    """The variant a patch is written on top of: its description's `Base: NAME` line (None: the shipped kernel)."""
    m = BASE.search(diff[:diff.find("\n--- ")])
    return m.group(1) if m else None


def patched(patches: str | None) -> dict[str, str]:
    """The shipped sources with `patches` applied in order (paths joined by +; None: as shipped). A patch whose
    description has a line `Base: NAME` is written on top of variant NAME, which must come before it."""
    files, applied = shipped(), []
    for path in patches.split("+") if patches else []:
        diff = Path(path).read_text()
        base = base_of(diff)
        if base and base not in applied:
            raise ValueError(f"{path} is written on top of {base}: give {base}+{path}")
        files = apply_patch(files, diff)
        applied.append(Path(path).name)
    return files


def build(which: str, files: dict[str, str], tag: str):
    """The extension of `which`'s kernel (`talker` or `predictor`) built from `files` by `kernel_build`, named by
    `tag` and a digest of the sources it compiles. The sources go to a directory named by their digest, so a
    second build of them (in this process or another) finds the first one's output up to date."""
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
    builds it (`kernel_build.build`). Failures are left for the later build to raise."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(len(builds), mp_context=multiprocessing.get_context("spawn")) as pool:
        for f in [pool.submit(_build_quietly, *b) for b in builds]:
            try:
                f.result()
            except Exception:  # a broken pool only costs the time: the builds then run one by one
                pass


def install(which: str, ext) -> None:
    """Make the next `{which}_kernel` built by a frame stepper use `ext`."""
    importlib.import_module(f"streamvox.models.qwen3_tts.{which}_kernel").build = lambda source: ext


def main() -> None:
    ap = argparse.ArgumentParser(description="Write the kernel sources with a variant applied over the tree's.")
    ap.add_argument("patches", help="a patch, or patches joined by + applied in order")
    files = patched(ap.parse_args().patches)
    for name, text in files.items():
        if text != (KERNELS / name).read_text():
            (KERNELS / name).write_text(text)
            print(f"wrote {KERNELS / name}")


if __name__ == "__main__":
    main()
