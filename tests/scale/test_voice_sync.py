"""Replicas share one voice store: a voice uploaded through one replica is spoken by every replica, and a
deleted one is gone from all. First against a stand-in engine, then with the tiny Qwen3-TTS Base checkpoint."""

from __future__ import annotations

import asyncio
import base64
import io
from types import SimpleNamespace

import httpx
import numpy as np
import pytest
import soundfile

from streamvox.engine.client import EngineUnavailable, VoiceSample
from streamvox.scale.voice_sync import VoiceSync
from streamvox.server.app import ServerSettings
from streamvox.server.routes.voices import VoiceStore
from tests.helpers.ray_serve import serve_cluster


class Engine:
    """The parts of `AsyncEngine` a sync uses."""

    def __init__(self) -> None:
        self.is_ready = True
        self.info = SimpleNamespace(voice_cloning=True)
        self.voices: dict[str, dict] = {}
        self.added: list[tuple[str, float]] = []
        self.removed: list[str] = []
        self.unavailable = False

    async def add_voice(self, sample: VoiceSample) -> None:
        if self.unavailable:
            raise EngineUnavailable("restarting")
        self.voices[sample.name] = sample.meta
        self.added.append((sample.name, float(sample.pcm[0])))

    def remove_voice(self, name: str) -> None:
        self.voices.pop(name, None)
        self.removed.append(name)


def sample(name: str, value: float) -> VoiceSample:
    return VoiceSample(name, np.full(1600, value, np.float32), 16000, None, {"name": name})


def test_a_replica_follows_the_shared_store(tmp_path):
    other_replica = VoiceStore(tmp_path)
    engine = Engine()
    state = SimpleNamespace(engine=engine, voice_store=VoiceStore(tmp_path))
    sync = VoiceSync(state)
    listings = []
    entries = state.voice_store.entries
    state.voice_store.entries = lambda: listings.append(1) or entries()

    async def run():
        await sync.refresh()  # an empty store
        other_replica.save(sample("anna", 0.25))
        await sync.refresh()
        assert engine.added == [("anna", 0.25)] and len(listings) == 2
        await sync.refresh()
        await sync.refresh()
        assert len(listings) == 2  # unchanged: one stat each, no listing
        other_replica.delete("anna")
        other_replica.save(sample("anna", 0.5))  # deleted and stored again under the same name
        other_replica.save(sample("bob", 0.75))
        await sync.refresh()
        assert engine.removed == ["anna"] and engine.added[1:] == [("anna", 0.5), ("bob", 0.75)]
        other_replica.delete("bob")
        await sync.refresh()
        assert engine.removed == ["anna", "bob"] and set(engine.voices) == {"anna"}

    asyncio.run(run())


def test_voices_the_engine_restored_itself_are_not_added_again(tmp_path):
    VoiceStore(tmp_path).save(sample("anna", 0.25))
    engine = Engine()
    engine.voices["anna"] = {"name": "anna"}  # loaded from the store when its core started
    sync = VoiceSync(SimpleNamespace(engine=engine, voice_store=VoiceStore(tmp_path)))
    VoiceStore(tmp_path).save(sample("bob", 0.5))
    asyncio.run(sync.refresh())
    assert engine.added == [("bob", 0.5)] and engine.removed == []


def test_a_sync_cut_short_by_an_engine_restart_is_done_again(tmp_path):
    VoiceStore(tmp_path).save(sample("anna", 0.25))
    engine = Engine()
    engine.unavailable = True
    sync = VoiceSync(SimpleNamespace(engine=engine, voice_store=VoiceStore(tmp_path)))
    asyncio.run(sync.refresh())
    assert engine.voices == {}
    engine.unavailable = False
    asyncio.run(sync.refresh())
    assert set(engine.voices) == {"anna"}


# The tiny Qwen3-TTS Base checkpoint on two replicas.

TEXT = "Hello there, this is a test."
SPEAK = {"input": TEXT, "language": "english", "temperature": 0, "max_new_tokens": 10, "response_format": "pcm"}


@pytest.fixture(scope="module")
def base_replicas(request, tmp_path_factory):
    from benchmarks.build_tiny_qwen3 import build

    root = tmp_path_factory.mktemp("base")
    model = build(root / "tiny-base", "base", seed=22)
    cluster = serve_cluster(request)
    settings = ServerSettings(model=str(model), model_options={"device": "cpu", "dtype": "auto", "max_batch": 4},
                              voices_dir=str(root / "voices"))
    cluster.deploy(settings, max_streams=4, max_queued=8)
    yield cluster
    cluster.delete()


def _wav() -> bytes:
    t = np.arange(int(1.5 * 16000)) / 16000
    rng = np.random.default_rng(5)
    pcm = (0.3 * np.sin(2 * np.pi * 180 * t) * (1 + 0.5 * np.sin(2 * np.pi * 3 * t))
           + 0.02 * rng.standard_normal(t.size)).astype(np.float32)
    out = io.BytesIO()
    soundfile.write(out, pcm, 16000, format="WAV")
    return out.getvalue()


def _on_each_replica(url: str, make) -> dict[str, httpx.Response]:
    """`make()` (a request through the proxy) until both replicas have answered it."""
    answers: dict[str, httpx.Response] = {}
    for _ in range(40):
        response = make()
        answers[response.headers["x-streamvox-replica"]] = response
        if len(answers) == 2:
            return answers
    raise AssertionError(f"only {sorted(answers)} answered")


def test_an_uploaded_voice_works_through_every_replica_and_a_delete_removes_it_from_all(base_replicas):
    url = base_replicas.url
    wav = _wav()
    inline = {**SPEAK, "ref_audio": base64.b64encode(wav).decode(), "ref_text": "Hi there, friend."}
    reference = httpx.post(f"{url}/v1/audio/speech", json=inline, timeout=300)
    assert reference.status_code == 200

    created = httpx.post(f"{url}/v1/audio/voices", timeout=300, files={"audio": ("a.wav", wav, "audio/wav")},
                         data={"name": "anna", "consent": "true", "ref_text": "Hi there, friend."})
    assert created.status_code == 201, created.text
    uploaded_through = created.headers["x-streamvox-replica"]
    spoken = _on_each_replica(url, lambda: httpx.post(f"{url}/v1/audio/speech", json={**SPEAK, "voice": "anna"},
                                                      timeout=300))
    assert uploaded_through in spoken
    for response in spoken.values():
        assert response.status_code == 200 and response.content == reference.content
    listed = _on_each_replica(url, lambda: httpx.get(f"{url}/v1/audio/voices", timeout=60))
    assert all(r.json()["voices"] == ["anna"] for r in listed.values())
    assert httpx.post(f"{url}/v1/audio/voices", timeout=300, files={"audio": ("a.wav", wav, "audio/wav")},
                      data={"name": "anna", "consent": "true"}).status_code == 409  # on either replica

    deleted = httpx.delete(f"{url}/v1/audio/voices/anna", timeout=60)
    assert deleted.status_code == 200
    refused = _on_each_replica(url, lambda: httpx.post(f"{url}/v1/audio/speech", json={**SPEAK, "voice": "anna"},
                                                       timeout=300))
    for response in refused.values():
        assert response.status_code == 400 and response.json()["error"]["param"] == "voice"
    listed = _on_each_replica(url, lambda: httpx.get(f"{url}/v1/audio/voices", timeout=60))
    assert all(r.json()["voices"] == [] for r in listed.values())
    assert httpx.delete(f"{url}/v1/audio/voices/anna", timeout=60).status_code == 404
