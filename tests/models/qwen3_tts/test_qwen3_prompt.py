"""The talker's prompt: the part a request's language and speaker decide is built once per pair and kept
(`PromptBuilder._lead`); a prompt from the kept part must equal one built from nothing, whatever was
built before it, and voices must not bleed into each other."""

from __future__ import annotations

import pytest
import torch

from streamvox.models.qwen3_tts.model.checkpoint import Qwen3TTSModel
from streamvox.models.qwen3_tts.model.prompt import PromptBuilder, VoiceSpec
from tests.helpers.qwen3_tiny import build_tiny_checkpoint

TEXT = "Hello world, this is streaming speech!"


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("prompt")
    return {task: build_tiny_checkpoint(root / task, task, seed=4) for task in ("custom_voice", "base")}


def _custom_voice_specs(model: Qwen3TTSModel) -> list[VoiceSpec]:
    c = model.cfg.talker
    speakers = list(c.spk_id.values())[:2]
    langs = [None, *[int(v) for v in list(c.codec_language_id.values())[:2]]]
    instruct = model.tokenizer.instruct_ids("Speak softly.")
    return [VoiceSpec("custom_voice", lang, speaker_id=spk, non_streaming=ns, instruct_ids=ids)
            for lang in langs for spk in speakers for ns in (True, False) for ids in (None, instruct)]


def test_prompts_from_kept_leads_equal_fresh_ones(checkpoints):
    model = Qwen3TTSModel.from_pretrained(checkpoints["custom_voice"])
    shared = PromptBuilder(model)
    track = model.tokenizer.text_ids(TEXT)
    specs = _custom_voice_specs(model)
    first = [shared.build(s, track, True).embeds for s in specs]
    again = [shared.build(s, track, True).embeds for s in reversed(specs)][::-1]
    for spec, a, b in zip(specs, first, again, strict=True):
        fresh_model = Qwen3TTSModel.from_pretrained(checkpoints["custom_voice"])
        fresh = PromptBuilder(fresh_model).build(spec, track, True).embeds
        assert torch.equal(a, fresh) and torch.equal(b, fresh), spec
    # every (language, speaker, mode, instructions) gives its own prompt: nothing was served from another's lead
    assert len({tuple(e.flatten().tolist()) for e in first}) == len(specs)


def test_x_vector_voices_are_built_each_time(checkpoints):
    model = Qwen3TTSModel.from_pretrained(checkpoints["base"])
    prompts = PromptBuilder(model)
    track = model.tokenizer.text_ids(TEXT)
    h = model.cfg.talker.hidden_size
    a, b = (torch.randn(h, generator=torch.Generator().manual_seed(s)) for s in (1, 2))
    pa = prompts.build(VoiceSpec("base", None, speaker_embedding=a), track, True).embeds
    pb = prompts.build(VoiceSpec("base", None, speaker_embedding=b), track, True).embeds
    pa2 = prompts.build(VoiceSpec("base", None, speaker_embedding=a), track, True).embeds
    assert not torch.equal(pa, pb)
    assert torch.equal(pa, pa2)
