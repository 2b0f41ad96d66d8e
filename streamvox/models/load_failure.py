"""Why a model could not load, in one line that names the cause and the fix.

The engine core loads its model in a child process; when that fails, `streamvox serve` prints this line and
exits, instead of the chained tracebacks of `huggingface_hub` and the loaders. Only a failure this module
does not recognise keeps its traceback (in the core's log), since no line could say what to do about it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

_LOCAL = "pass --model a local checkpoint directory"


@dataclass(frozen=True)
class LoadFailure:
    message: str  # one line: the cause, then the fix
    recognised: bool  # False: the cause is a guess; the traceback is worth reading


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def missing_checkpoint_files(directory: Path) -> list[str]:
    """The files of a Qwen3-TTS checkpoint (the one family loaded from a directory) that `directory` lacks."""
    missing = [name for name in ("config.json",) if not (directory / name).is_file()]
    if not any(directory.glob("*.safetensors")) and not (directory / "model.safetensors.index.json").is_file():
        missing.append("model.safetensors")
    if not (directory / "tokenizer.json").is_file():
        missing += [name for name in ("vocab.json", "merges.txt") if not (directory / name).is_file()]
    codec = directory / "speech_tokenizer"
    if codec.is_dir():
        missing += [f"speech_tokenizer/{name}" for name in ("config.json",) if not (codec / name).is_file()]
        if not any(codec.glob("*.safetensors")):
            missing.append("speech_tokenizer/model.safetensors")
    return missing


def _hub_failure(model: str, exc: BaseException) -> str | None:
    try:
        from huggingface_hub import constants
        from huggingface_hub.errors import (
            GatedRepoError,
            HFValidationError,
            LocalEntryNotFoundError,
            RepositoryNotFoundError,
            RevisionNotFoundError,
        )
    except ImportError:
        return None
    for error in _chain(exc):
        if isinstance(error, GatedRepoError):
            return (f"the Hugging Face repository is gated: accept its terms on its page and log in "
                    f"(`hf auth login` or HF_TOKEN), or {_LOCAL}")
        if isinstance(error, RepositoryNotFoundError):
            return (f"it is neither a local directory nor a Hugging Face repository (a private one needs "
                    f"`hf auth login` or HF_TOKEN): check the name, e.g. Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice, "
                    f"or {_LOCAL}")
        if isinstance(error, RevisionNotFoundError):
            return f"the Hugging Face repository has no such revision: check the name, or {_LOCAL}"
        if isinstance(error, HFValidationError):
            return ("it is neither a local directory nor a Hugging Face repo id (owner/name): check the path, or "
                    "pass 'espeak' or a repo id such as Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice")
        if isinstance(error, LocalEntryNotFoundError):
            if constants.HF_HUB_OFFLINE:
                return (f"it is not in the local Hugging Face cache ({constants.HF_HUB_CACHE}) and HF_HUB_OFFLINE "
                        f"is set, so it cannot be downloaded: unset HF_HUB_OFFLINE to download it, or {_LOCAL}")
            return (f"cannot reach the Hugging Face Hub ({constants.ENDPOINT}) to download it, and it is not in the "
                    f"local cache: check the network (or HTTPS_PROXY, HF_ENDPOINT), or {_LOCAL} "
                    f"(`hf download {model} --local-dir DIR` where the Hub is reachable)")
    return None


def explain_load_failure(model: str, exc: BaseException) -> LoadFailure:
    """One line for why `model` (a directory, a repo id or 'espeak') failed to load with `exc`."""
    directory = Path(model)
    if directory.is_dir() and (missing := missing_checkpoint_files(directory)):
        return LoadFailure(f"the directory is not a complete Qwen3-TTS checkpoint: it lacks {', '.join(missing)}; "
                           f"download the whole checkpoint into it (`hf download REPO --local-dir {model}`), or "
                           f"pass --model the repo id", True)
    if not directory.is_dir() and (hub := _hub_failure(model, exc)) is not None:
        return LoadFailure(hub, True)
    for error in _chain(exc):
        if isinstance(error, MemoryError) or type(error).__name__ == "OutOfMemoryError":
            return LoadFailure(f"not enough memory to load it ({type(error).__name__}): use a smaller "
                               f"checkpoint, --dtype bfloat16, or another --device", True)
    first_line = (str(exc).strip().splitlines() or [""])[0]
    return LoadFailure(f"{type(exc).__name__}: {first_line}" if first_line else type(exc).__name__, False)
