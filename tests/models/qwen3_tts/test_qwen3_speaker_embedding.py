"""A request's own x-vector (`SpeechRequest.speaker_embedding`) on Qwen3-TTS (tiny random checkpoints)."""

from __future__ import annotations

import numpy as np
import pytest

from streamvox.contract import RequestError, SamplingParams, SpeechRequest
from streamvox.models.qwen3_tts.model.checkpoint import Qwen3TTSModel
from streamvox.models.qwen3_tts.runtime.runner import Qwen3TTSRunner
from tests.helpers.qwen3_harness import FrameLog, make_signal, pcm_bytes, run_solo
from tests.helpers.qwen3_tiny import build_tiny_checkpoint

GREEDY = SamplingParams(temperature=0, max_new_tokens=8)


@pytest.fixture(scope="module")
def base_model(tmp_path_factory):
    return Qwen3TTSModel.from_pretrained(build_tiny_checkpoint(tmp_path_factory.mktemp("base"), "base", seed=5))


def test_an_x_vector_speaks_like_the_reference_audio_it_came_from(base_model):
    log = FrameLog()
    runner = Qwen3TTSRunner(base_model, None, on_frame=log)
    size = base_model.cfg.speaker_encoder.enc_dim
    assert runner.info.speaker_embedding_size == size
    audio = make_signal(16000, 0.5)
    x_vector = base_model.speaker_embedding(audio, 16000).float().cpu().numpy().astype("<f4")
    cloned = run_solo(runner, log, SpeechRequest(request_id="ref", text="Hi there.", ref_audio=pcm_bytes(audio),
                                                 ref_sample_rate=16000, sampling=GREEDY))
    given = run_solo(runner, log, SpeechRequest(request_id="xv", text="Hi there.", speaker_embedding=x_vector.tobytes(),
                                                sampling=GREEDY))
    assert given == cloned and given


def test_a_wrong_x_vector_is_refused(base_model, tmp_path):
    runner = Qwen3TTSRunner(base_model, None)
    size = base_model.cfg.speaker_encoder.enc_dim

    def err(embedding: np.ndarray) -> RequestError:
        with pytest.raises(RequestError) as e:
            runner.add(SpeechRequest(request_id="b", text="Hi.", speaker_embedding=embedding.astype("<f4").tobytes()))
        return e.value

    assert err(np.zeros(size + 1)).param == "speaker_embedding"
    assert f"{size} float32" in err(np.zeros(3)).message
    assert err(np.full(size, np.nan)).param == "speaker_embedding"
    custom = Qwen3TTSRunner(Qwen3TTSModel.from_pretrained(build_tiny_checkpoint(tmp_path, "custom_voice", seed=11)),
                            None)
    assert custom.info.speaker_embedding_size == 0
    with pytest.raises(RequestError) as e:
        custom.add(SpeechRequest(request_id="c", text="Hi.", speaker_embedding=np.zeros(size, "<f4").tobytes()))
    assert e.value.param == "speaker_embedding"
