"""Greedy codes of our talker equal the upstream `qwen-tts` reference on tiny random checkpoints.

The reference runs in a subprocess with the reference venv's python (see
scripts/setup_reference_venv.sh and STREAMVOX_REF_PYTHON). Our side runs through the
engine runner (`max_new_tokens` = frames; the reference is given frames + 1 tokens, as its
last generated id never becomes a frame).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from streamvox.contract import SamplingParams, SpeechRequest
from streamvox.models.qwen3_tts.model.checkpoint import Qwen3TTSModel
from streamvox.models.qwen3_tts.runtime.runner import Qwen3TTSRunner
from tests.helpers.qwen3_harness import FrameLog, make_signal, pcm_bytes, run_reference, run_solo
from tests.helpers.qwen3_tiny import build_tiny_checkpoint

FRAMES = 12
GREEDY = SamplingParams(temperature=0, max_new_tokens=FRAMES)
TEXT = "Hello world, this is streaming speech!"
REF_CODES = torch.randint(0, 256, (5, 16), generator=torch.Generator().manual_seed(7)).tolist()
# Longer than transcript + text: the in-context prompt pads the text track (the other branch upstream).
REF_CODES_LONG = torch.randint(0, 256, (24, 16), generator=torch.Generator().manual_seed(8)).tolist()


def _runner(model_dir, reference_codes=None) -> tuple[Qwen3TTSRunner, FrameLog]:
    log = FrameLog()
    enc = (lambda pcm, sr: torch.tensor(reference_codes)) if reference_codes is not None else None
    model = Qwen3TTSModel.from_pretrained(model_dir)
    return Qwen3TTSRunner(model, None, reference_encoder=enc, on_frame=log), log


def _check(ours: list, ref: list, label: str) -> None:
    assert len(ref) >= 3, f"{label}: reference stopped too early to compare anything"
    assert len(ours) == len(ref), f"{label}: {len(ours)} frames vs reference {len(ref)}"
    first = next((i for i, (a, b) in enumerate(zip(ours, ref, strict=True)) if a != b), None)
    assert ours == ref, f"{label}: first differing frame {first}"


SR = 16000
REF_PCM = make_signal(SR, 1.2)
SIG24 = make_signal(24000, 0.8, seed=3)
INSTRUCT = "A warm and gentle voice."

CASES = {
    "custom_voice": [
        dict(task="custom_voice", text=TEXT, speaker="alice", language="english", max_frames=FRAMES),
        dict(task="custom_voice", text=TEXT, speaker="Bob", language="auto", instruct="Speak softly, please.",
             max_frames=FRAMES),
        dict(task="custom_voice", text=TEXT, speaker="dylan", language="chinese", max_frames=FRAMES),
        dict(task="custom_voice", text=TEXT, speaker="alice", language="english", max_frames=FRAMES,
             non_streaming_mode=False),
    ],
    "voice_design": [
        dict(task="voice_design", text=TEXT, instruct=INSTRUCT, language="english", max_frames=FRAMES),
        dict(task="voice_design", text=TEXT, instruct="", max_frames=FRAMES),
    ],
    "base": [
        dict(task="base", text=TEXT, language="english", ref_audio=REF_PCM.tolist(), ref_sr=SR,
             max_frames=FRAMES),
        dict(task="base", text=TEXT, language="english", ref_audio=REF_PCM.tolist(), ref_sr=SR,
             ref_text="Hi there, friend.", ref_codes=REF_CODES, max_frames=FRAMES),
        dict(task="base", text="Hi.", language="auto", ref_audio=REF_PCM.tolist(), ref_sr=SR,
             ref_text="Hi there, this is a longer transcript.", ref_codes=REF_CODES, max_frames=FRAMES),
        dict(task="base", text="Hi.", language="english", ref_audio=REF_PCM.tolist(), ref_sr=SR,
             ref_text="Hello.", ref_codes=REF_CODES_LONG, max_frames=FRAMES),
    ],
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("qwen3")
    return {task: build_tiny_checkpoint(root / task, task, seed=i)
            for i, task in enumerate(("custom_voice", "voice_design", "base"))}


@pytest.fixture(scope="module")
def reference(checkpoints):
    """Reference codes for every case, from one reference subprocess."""
    jobs = [dict(model_dir=checkpoints[t], cases=CASES[t]) for t in CASES]
    jobs[-1]["speaker_embedding_of"] = {"pcm": SIG24.tolist()}
    return dict(zip(CASES, run_reference(jobs), strict=True))


def test_custom_voice_parity(checkpoints, reference):
    ref = reference["custom_voice"]["codes"]
    runner, log = _runner(checkpoints["custom_voice"])
    ours = [
        run_solo(runner, log, SpeechRequest(request_id="a", text=TEXT, voice="alice", language="english",
                                            sampling=GREEDY)),
        run_solo(runner, log, SpeechRequest(request_id="b", text=TEXT, voice="Bob", language="Auto",
                                            instructions="Speak softly, please.", sampling=GREEDY)),
        run_solo(runner, log, SpeechRequest(request_id="c", text=TEXT, voice="dylan", language="chinese",
                                            sampling=GREEDY)),
        # Streaming-text mode: text arrives word by word; upstream's non_streaming_mode=False.
        run_solo(runner, log, SpeechRequest(request_id="d", text=TEXT, voice="alice", language="english",
                                            sampling=GREEDY), words=True),
    ]
    for i, (o, r) in enumerate(zip(ours, ref, strict=True)):
        _check(o, r, f"custom_voice case {i}")
    # The cases really differ from each other (the prompt pieces matter).
    assert len({str(o) for o in ours}) == 4


def test_voice_design_parity(checkpoints, reference):
    ref = reference["voice_design"]["codes"]
    runner, log = _runner(checkpoints["voice_design"])
    ours = [
        run_solo(runner, log, SpeechRequest(request_id="a", text=TEXT, instructions=INSTRUCT,
                                            language="english", sampling=GREEDY)),
        run_solo(runner, log, SpeechRequest(request_id="b", text=TEXT, sampling=GREEDY)),
    ]
    for i, (o, r) in enumerate(zip(ours, ref, strict=True)):
        _check(o, r, f"voice_design case {i}")


def test_speaker_embedding_parity(checkpoints, reference):
    runner, _ = _runner(checkpoints["base"])
    emb = runner.model.speaker_embedding(SIG24, 24000)
    np.testing.assert_allclose(emb.numpy(), np.asarray(reference["base"]["speaker_embedding"]),
                               rtol=1e-4, atol=1e-4)


def test_base_xvector_and_in_context_parity(checkpoints, reference):
    ref = reference["base"]["codes"]
    runner, log = _runner(checkpoints["base"], REF_CODES)
    audio = pcm_bytes(REF_PCM)
    ours = [
        run_solo(runner, log, SpeechRequest(request_id="x", text=TEXT, language="english", ref_audio=audio,
                                            ref_sample_rate=SR, sampling=GREEDY)),
        run_solo(runner, log, SpeechRequest(request_id="i", text=TEXT, language="english", ref_audio=audio,
                                            ref_sample_rate=SR, ref_text="Hi there, friend.",
                                            sampling=GREEDY)),
        run_solo(runner, log, SpeechRequest(request_id="j", text="Hi.", ref_audio=audio, ref_sample_rate=SR,
                                            ref_text="Hi there, this is a longer transcript.",
                                            sampling=GREEDY)),
    ]
    long_runner, long_log = _runner(checkpoints["base"], REF_CODES_LONG)
    ours.append(run_solo(long_runner, long_log, SpeechRequest(
        request_id="k", text="Hi.", language="english", ref_audio=audio, ref_sample_rate=SR,
        ref_text="Hello.", sampling=GREEDY)))
    for i, (o, r) in enumerate(zip(ours, ref, strict=True)):
        _check(o, r, f"base case {i}")
