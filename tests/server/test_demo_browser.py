"""The browser demos in a real headless Chromium: /demo (WS /v1/realtime) and demos/gradio_app.py.

Chromium is the Debian package (`apt-get install chromium`, /usr/bin/chromium), driven by
Playwright's Python package; no browser is downloaded. Headless Chromium has no sound card: it
renders a real AudioContext into a fake output stream at real-time pace, which these tests check
(the context is "running" and its clock advances with the wall clock). Screenshots go to
artifacts/ (gitignored).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import playwright.sync_api as playwright_sync  # noqa: E402
import pytest

from tests.helpers.realtime_clients import reference_pcm
from tests.helpers.server import free_port, start_server

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "artifacts"
CHROMIUM = os.environ.get("STREAMVOX_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--autoplay-policy=no-user-gesture-required",
]
PHRASE = "Hello! This is StreamVox, speaking to you in real time, one audio delta at a time."
RATE = 24000



@pytest.fixture(scope="module", autouse=True)
def chromium_present() -> None:
    """A missing browser fails these tests (never a silent skip): .ci/run installs Debian's chromium."""
    if not shutil.which(CHROMIUM):
        pytest.fail(f"no Chromium at {CHROMIUM}: apt-get install chromium")


def fnv1a(data: bytes) -> int:
    value = 0x811C9DC5
    for byte in data:
        value = ((value ^ byte) * 0x01000193) & 0xFFFFFFFF
    return value


@pytest.fixture(scope="module")
def browser() -> Iterator:
    with playwright_sync.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser) -> Iterator:
    context = browser.new_context(viewport={"width": 1100, "height": 900})
    page = context.new_page()
    page.set_default_timeout(30_000)
    yield page
    context.close()


def stats(page) -> dict:
    return page.evaluate("() => ({...window.streamvox.player})")


def connect_demo(page, server, query: str = "") -> None:
    page.goto(f"{server.url}/demo{query}")
    page.click("#connect")
    page.wait_for_function("() => window.streamvox.connected || document.getElementById('status')"
                           ".textContent.startsWith('failed')")
    assert page.evaluate("window.streamvox.connected"), page.text_content("#status")


def audio_clock(page) -> dict:
    """The player's AudioContext: its class, state and how far its clock moves in 0.5 s of wall time."""
    return page.evaluate("""async () => {
        const ctx = window.streamvoxPlayer.context;
        const t0 = ctx.currentTime, w0 = performance.now();
        await new Promise((r) => setTimeout(r, 500));
        return {offline: ctx instanceof OfflineAudioContext, realtime: ctx instanceof AudioContext,
                state: ctx.state, rate: ctx.sampleRate,
                advanced: ctx.currentTime - t0, wall: (performance.now() - w0) / 1000};
    }""")


def watch_playback(page, drained: int, timeout: float = 60.0) -> list[tuple[float, dict]]:
    """Poll the player's counters every 50 ms until `drained` streams have played out."""
    samples = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        s = stats(page)
        samples.append((time.monotonic(), s))
        if s["drained"] >= drained:
            return samples
        time.sleep(0.05)
    raise AssertionError(f"playback did not finish: {samples[-1][1] if samples else None}")


def assert_played_in_real_time(samples: list[tuple[float, dict]]) -> None:
    """While a stream played, the worklet consumed samples at the audio clock's rate, and steadily."""
    playing = [(t, s["streamPlayed"]) for t, s in samples if s["state"] == "playing" and s["streamPlayed"] > 0]
    assert len(playing) >= 5, f"too few observations while playing: {playing}"
    played = [p for _, p in playing]
    assert played == sorted(played) and played[-1] > played[0], played
    (t0, p0), (t1, p1) = playing[0], playing[-1]
    rate = (p1 - p0) / (t1 - t0)
    assert 0.6 * RATE < rate < 1.4 * RATE, f"played {rate:.0f} samples/s, expected about {RATE}"


def test_demo_page_streams_and_plays_realtime_audio(espeak_server, page):
    connect_demo(page, espeak_server)
    clock = audio_clock(page)
    assert clock["realtime"] and not clock["offline"], clock
    assert clock["state"] == "running" and clock["rate"] == RATE, clock
    assert 0.5 * clock["wall"] < clock["advanced"] < 1.5 * clock["wall"], clock

    page.fill("#text", PHRASE)
    page.select_option("#voice", "alloy")
    page.click("#speak")
    page.wait_for_function("() => window.streamvox.player.streamReceived > 0")
    samples = watch_playback(page, drained=1)
    final = samples[-1][1]
    timing = page.evaluate("window.streamvox.timing")

    assert page.evaluate("window.streamvox.lastStatus") == "completed"
    assert page.evaluate("window.streamvox.errors") == []
    # Every sample that arrived was played, none was lost, and the jitter buffer never ran dry.
    reference = reference_pcm(espeak_server, PHRASE, "alloy")
    assert final["streamBytes"] == len(reference) and final["streamHash"] == fnv1a(reference)
    assert final["streamReceived"] == len(reference) // 2
    assert final["streamChunks"] >= 2  # streamed as several deltas, not one clip
    assert final["streamPlayed"] == final["streamReceived"]
    assert final["filled"] and final["underruns"] == 0 and final["underrunSamples"] == 0
    received = [s["streamReceived"] for _, s in samples]
    assert received == sorted(received) and received[-1] > 0
    assert_played_in_real_time(samples)
    # Live numbers on the page match the stream.
    assert timing["status"] == "completed"
    assert abs(timing["audioSeconds"] - len(reference) / 2 / RATE) < 1e-6
    assert 0 < timing["ttfpMs"] < 5000, timing
    assert timing["playbackStartMs"] - timing["ttfpMs"] < 750, timing  # the 150 ms buffer, not seconds
    assert 0 < timing["rtf"] < 1, timing
    assert page.text_content("#ttfp").endswith(" ms") and page.text_content("#rtf") != "-"
    assert page.text_content("#duration") == f"{timing['audioSeconds']:.2f} s"

    # A second phrase on the same connection plays too, and barge-in (Stop) ends a response as cancelled.
    page.fill("#text", PHRASE + " " + PHRASE + " " + PHRASE)
    page.click("#speak")
    page.wait_for_function("() => window.streamvox.player.streamPlayed > 4800")
    page.click("#stop")
    page.wait_for_function("() => window.streamvox.responses >= 2")
    page.wait_for_function("() => window.streamvox.player.state === 'idle'", timeout=5000)
    assert page.evaluate("window.streamvox.lastStatus") in ("cancelled", "completed")
    stopped = stats(page)
    assert stopped["underruns"] == 0 and stopped["streamPlayed"] < 10 * RATE, stopped
    time.sleep(1.0)  # deltas still in flight when Stop was pressed are dropped, not played
    after = stats(page)
    assert after["state"] == "idle" and after["streamPlayed"] == stopped["streamPlayed"], (stopped, after)

    ARTIFACTS.mkdir(exist_ok=True)
    page.fill("#text", PHRASE)
    page.click("#speak")
    watch_playback(page, drained=stats(page)["drained"] + 1)
    page.screenshot(path=str(ARTIFACTS / "demo.png"), full_page=True)


def test_player_counts_underruns_when_starved(espeak_server, page):
    """The underrun counter is not vacuous: audio fed slower than real time underruns; fed ahead, it does not."""
    connect_demo(page, espeak_server)
    result = page.evaluate("""async () => {
        const player = window.streamvoxPlayer;
        const chunk = new Uint8Array(2 * 2400);  // 100 ms of silence
        const wait = (ms) => new Promise((r) => setTimeout(r, ms));
        const drained = () => new Promise((resolve) => { player.onDrained = resolve; });
        const before = player.stats.underruns;
        player.begin();
        let done = drained();
        for (let i = 0; i < 6; i++) { player.pushPCM16(chunk.slice()); await wait(250); }
        player.end(); await done;
        const starved = {underruns: player.stats.underruns - before, played: player.stats.streamPlayed};
        player.begin();
        done = drained();
        for (let i = 0; i < 6; i++) player.pushPCM16(chunk.slice());
        player.end(); await done;
        return {starved, ahead: {underruns: player.stats.underruns - before - starved.underruns,
                                 played: player.stats.streamPlayed}};
    }""")
    assert result["starved"]["underruns"] >= 2, result
    assert result["starved"]["played"] == 6 * 2400, result
    assert result["ahead"] == {"underruns": 0, "played": 6 * 2400}, result


def test_demo_page_api_key_via_subprotocol(page):
    server = start_server(api_key="demo-secret")
    try:
        assert httpx.get(f"{server.url}/demo/").status_code == 200  # the page itself needs no key
        assert httpx.get(f"{server.url}/v1/audio/voices").status_code == 401
        page.goto(f"{server.url}/demo?api_key=wrong")
        page.click("#connect")
        page.wait_for_function("() => document.getElementById('status').textContent.startsWith('failed')")
        assert not page.evaluate("window.streamvox.connected")

        connect_demo(page, server, "?api_key=demo-secret")
        assert page.locator("#voice option").count() > 10  # GET /v1/audio/voices with the key
        page.click("#speak")
        watch_playback(page, drained=1)
        final = stats(page)
        assert page.evaluate("window.streamvox.lastStatus") == "completed"
        assert final["streamReceived"] > RATE and final["streamPlayed"] == final["streamReceived"]
    finally:
        server.stop()


def test_text_stream_accepts_browser_key_subprotocol(page):
    server = start_server(api_key="demo-secret")
    try:
        page.goto(f"{server.url}/demo/")
        opened = page.evaluate("""(url) => new Promise((resolve) => {
            const ws = new WebSocket(url, ["openai-insecure-api-key.demo-secret"]);
            ws.onopen = () => { ws.close(); resolve(true); };
            ws.onerror = () => resolve(false);
        })""", f"{server.ws_url}/v1/audio/speech/stream")
        assert opened
    finally:
        server.stop()


def start_gradio(log: Path, *args: str, timeout: float = 180.0) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    with log.open("wb") as out:
        process = subprocess.Popen([sys.executable, str(ROOT / "demos" / "gradio_app.py"), "--port", str(port), *args],
                                   env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"gradio_app.py exited with {process.returncode}: {log.read_text()[-3000:]}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return process, url
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    stop_gradio(process)
    raise AssertionError(f"the Gradio demo did not start: {log.read_text()[-3000:]}")


def stop_gradio(process: subprocess.Popen) -> bool:
    """SIGTERM the app, as a supervisor would; True when it exited (and stopped its server) by itself."""
    if process.poll() is not None:
        return True
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(30)
        return True
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        return False


def test_gradio_demo_renders_connects_and_plays(page):
    """The one documented command (it starts its own server), loaded in Chromium: both tabs stream and play."""
    log = ARTIFACTS / "gradio_app.log"
    ARTIFACTS.mkdir(exist_ok=True)
    process, url = start_gradio(log)
    try:
        page.goto(url)
        page.wait_for_selector("#svx-speak")
        page.wait_for_function("() => typeof window.svxDemo === 'object' && typeof window.StreamVox === 'object'")
        assert page.locator("#svx-ref-audio").count() == 0 or not page.locator("#svx-ref-audio").is_visible()
        assert page.text_content("#svx-connection") == "not connected"

        # Text stream tab: Speak sends the text box and input.done.
        page.click("#svx-speak")
        page.wait_for_function("() => window.streamvox.utterances >= 1")
        watch_playback(page, drained=1)
        final = stats(page)
        assert page.evaluate("window.streamvox.lastStatus") == "stop"
        assert page.evaluate("window.streamvox.errors") == []
        assert final["contextState"] == "running" and final["underruns"] == 0
        assert final["streamReceived"] > RATE and final["streamPlayed"] == final["streamReceived"]
        assert page.text_content("#svx-ttfp").endswith(" ms") and page.text_content("#svx-rtf") != "-"
        assert page.text_content("#svx-connection") == "connected: /v1/audio/speech/stream"

        # Streamed in as typed: complete words go out before Speak is pressed, and audio starts.
        page.check("#svx-as-you-type input")
        box = page.locator("#svx-text textarea")
        box.fill("")
        box.press_sequentially("Typing streams words to the server, ", delay=20)
        typed_audio = "() => window.streamvoxPlayer.stream === 2 && window.streamvox.player.streamReceived > 0"
        page.wait_for_function(typed_audio, timeout=20_000)
        assert page.evaluate("window.streamvox.utterances") == 1  # its input.done is not sent yet
        box.press_sequentially("and the rest follows when I press speak.", delay=20)
        page.click("#svx-speak")
        page.wait_for_function("() => window.streamvox.utterances >= 2")
        watch_playback(page, drained=2)
        final = stats(page)
        assert page.evaluate("window.streamvox.lastStatus") == "stop"
        assert final["underruns"] == 0, final  # running dry while text was still being typed is a wait
        assert final["streamReceived"] > 2 * RATE and final["streamPlayed"] == final["streamReceived"]

        # Stop (barge-in) ends the utterance and the playback; audio still in flight is dropped.
        page.uncheck("#svx-as-you-type input")
        box.fill(PHRASE + " " + PHRASE + " " + PHRASE)
        page.click("#svx-speak")
        page.wait_for_function("() => window.streamvoxPlayer.stream === 3 && "
                               "window.streamvox.player.streamPlayed > 4800",
                               timeout=20_000)
        page.click("#svx-stop")
        page.wait_for_function("() => window.streamvox.player.state === 'idle'", timeout=5000)
        page.wait_for_function("() => window.streamvox.utterances >= 3")
        stopped = stats(page)
        time.sleep(1.0)
        assert stats(page)["streamPlayed"] == stopped["streamPlayed"] < 10 * RATE
        assert page.evaluate("window.streamvox.lastStatus") in ("cancelled", "stop")

        # Realtime tab.
        page.get_by_role("tab", name="Realtime").click()
        page.click("#svx-rt-speak")
        page.wait_for_function("() => window.streamvox.responses >= 1")
        samples = watch_playback(page, drained=3)
        final = samples[-1][1]
        assert page.evaluate("window.streamvox.lastStatus") == "completed"
        assert final["streamReceived"] > RATE and final["streamPlayed"] == final["streamReceived"]
        assert final["underruns"] == 0
        page.screenshot(path=str(ARTIFACTS / "gradio.png"), full_page=True)
    finally:
        exited = stop_gradio(process)
    assert exited, "gradio_app.py did not exit on SIGTERM"
    server_url = next(line.split(" at ")[1].strip() for line in log.read_text().splitlines()
                      if line.startswith("streamvox serve is running at "))
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{server_url}/health", timeout=2)  # the server it started is gone too


def test_gradio_demo_offers_voice_upload_only_for_cloning_models():
    sys.path.insert(0, str(ROOT / "demos"))
    try:
        import gradio_app
    finally:
        sys.path.remove(str(ROOT / "demos"))
    info = {"model": "m", "voices": ["alloy"], "default_voice": "alloy", "voice_cloning": False}
    for cloning in (False, True):
        demo, launch = gradio_app.build_demo({**info, "voice_cloning": cloning}, "http://127.0.0.1:1", None)
        config = demo.get_config_file()
        ids = {c["id"]: c for c in config["components"]}
        group = next(c for c in config["components"] if c["props"].get("elem_id") == "svx-cloning")
        assert group["props"]["visible"] is cloning
        audio = next(c for c in config["components"] if c["props"].get("elem_id") == "svx-ref-audio")
        assert audio["id"] in ids and "StreamVox" in launch["head"] and "svxDemo" in launch["head"]
