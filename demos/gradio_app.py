"""StreamVox live demo in Gradio: type text, pick a voice, hear it while it streams.

    python demos/gradio_app.py                                  # starts its own `streamvox serve`
    python demos/gradio_app.py --server-url http://127.0.0.1:8000   # uses a running server

Audio does not go through Gradio (gr.Audio streaming buffers for seconds): the page connects
to the StreamVox server itself, over `WS /v1/audio/speech/stream` (the "Text stream" tab; text
may be streamed in as you type) or `WS /v1/realtime` (the "Realtime" tab), and plays the PCM16
deltas through the AudioWorklet player of `/demo` with a small jitter buffer. TTFP, RTF and the
audio duration update live. A reference-audio upload appears only when the served model
supports voice cloning (`voice_cloning` in GET /v1/audio/voices).
"""

from __future__ import annotations

import argparse
import atexit
import base64
import html
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

STATIC_DIR = Path(__file__).resolve().parents[1] / "streamvox" / "realtime" / "static"
GLUE_JS = Path(__file__).with_name("gradio_demo.js")
MAX_REF_AUDIO_BYTES = 10 * 1024 * 1024


def _player_js() -> str:
    try:
        from streamvox.server.demo_page import STATIC_DIR as package_static
    except ImportError:
        package_static = STATIC_DIR
    return (package_static / "streamvox.js").read_text()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_healthy(url: str, api_key: str | None, timeout: float, process: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise SystemExit(f"streamvox serve exited with {process.returncode}")
        try:
            if httpx.get(f"{url}/health", headers=_headers(api_key), timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"the StreamVox server at {url} did not become healthy within {timeout:.0f} s")


def start_server(model: str | None, api_key: str | None, page_origins: list[str],
                 timeout: float = 180.0) -> tuple[subprocess.Popen, str]:
    """Run `streamvox serve` on a free local port until this process exits.

    The Gradio page is served from another port, so its origins must be allowed for WebSockets.
    """
    port = _free_port()
    command = [sys.executable, "-m", "streamvox.cli", "serve", "--port", str(port), "--log-level", "warning",
               "--allowed-origins", ",".join(page_origins)]
    if model:
        command += ["--model", model]
    if api_key:
        command += ["--api-key", api_key]
    process = subprocess.Popen(command)

    def stop() -> None:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()

    atexit.register(stop)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, api_key, timeout, process)
    except SystemExit:
        stop()
        raise
    return process, url


def _headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def server_info(server_url: str, api_key: str | None) -> dict:
    """Voices and capabilities of the served model (GET /v1/audio/voices, GET /v1/models)."""
    headers = _headers(api_key)
    voices = httpx.get(f"{server_url}/v1/audio/voices", headers=headers, timeout=10).raise_for_status().json()
    models = httpx.get(f"{server_url}/v1/models", headers=headers, timeout=10).raise_for_status().json()["data"]
    model = models[0] if models else {}
    return {
        "model": voices.get("model") or model.get("id", ""),
        "voices": voices.get("voices", []),
        "default_voice": voices.get("default_voice"),
        "voice_cloning": bool(voices.get("voice_cloning", model.get("voice_cloning", False))),
    }


def ref_audio_payload(path: str | None) -> str:
    """An uploaded reference clip as a data URI for `session.config.ref_audio` ("" when none)."""
    if not path:
        return ""
    data = Path(path).read_bytes()
    if len(data) > MAX_REF_AUDIO_BYTES:
        import gradio as gr

        raise gr.Error("Reference audio is larger than 10 MiB.")
    suffix = Path(path).suffix.lstrip(".").lower() or "wav"
    return f"data:audio/{suffix};base64,{base64.b64encode(data).decode()}"


STATS_HTML = """
<div id="svx-panel" class="svx-panel">
  <table>
    <tr><th>Connection</th><td id="svx-connection">not connected</td></tr>
    <tr><th>TTFP (first text to first audio)</th><td id="svx-ttfp">-</td></tr>
    <tr><th>Playback start</th><td id="svx-playstart">-</td></tr>
    <tr><th>RTF (generation time / audio duration)</th><td id="svx-rtf">-</td></tr>
    <tr><th>Audio duration</th><td id="svx-duration">-</td></tr>
    <tr><th>Status</th><td id="svx-status">-</td></tr>
    <tr><th>Samples received / played</th><td id="svx-samples">-</td></tr>
    <tr><th>Jitter buffer</th><td id="svx-buffered">-</td></tr>
    <tr><th>Underruns</th><td id="svx-underruns">-</td></tr>
    <tr><th>AudioContext</th><td id="svx-context">-</td></tr>
  </table>
</div>
"""

CSS = """
.svx-panel table { width: 100%; border-collapse: collapse; }
.svx-panel th, .svx-panel td { text-align: left; padding: 2px 8px; font-weight: normal; }
.svx-panel td { font-variant-numeric: tabular-nums; font-weight: 600; }
"""


def build_demo(info: dict, browser_server_url: str, api_key: str | None, jitter_ms: int = 150):
    """The Blocks app and the launch() keyword arguments (head scripts, CSS, theme) it needs."""
    import gradio as gr

    config = {"serverUrl": browser_server_url, "apiKey": api_key or "", "model": info["model"], "jitterMs": jitter_ms}
    # `</` cannot end the inline scripts early: JSON escapes it, the JS files contain no `</script`.
    config_json = json.dumps(config).replace("</", "<\\/")
    head = (f"<script>window.SVX_CONFIG = {config_json};</script>\n"
            f"<script>{_player_js()}</script>\n<script>{GLUE_JS.read_text()}</script>")
    voices = info["voices"]
    default_voice = "alloy" if "alloy" in voices else info["default_voice"]
    args = "(text, voice, speed, ref, refText)"

    with gr.Blocks(title="StreamVox live demo", analytics_enabled=False) as demo:
        gr.Markdown(f"# StreamVox live demo\nModel **{html.escape(info['model'])}** at "
                    f"`{html.escape(browser_server_url)}`. Audio streams straight from the server into an "
                    "AudioWorklet player; Gradio only hosts the page.")
        with gr.Row():
            with gr.Column(scale=3):
                voice = gr.Dropdown(voices, value=default_voice, label="Voice", elem_id="svx-voice")
                speed = gr.Slider(0.25, 4.0, value=1.0, step=0.05, label="Speed (text stream)")
                ref_b64 = gr.Textbox(visible=False)
                with gr.Group(visible=info["voice_cloning"], elem_id="svx-cloning"):
                    ref_audio = gr.Audio(label="Reference voice (cloning)", type="filepath",
                                         sources=["upload", "microphone"], elem_id="svx-ref-audio")
                    ref_text = gr.Textbox(label="Transcript of the reference audio (optional)")
                with gr.Tab("Text stream", elem_id="svx-tab-stream"):
                    text = gr.Textbox("Hello! This is StreamVox. You hear this while it is still being made.",
                                      lines=4, label="Text", elem_id="svx-text")
                    as_you_type = gr.Checkbox(False, label="Stream the text in as I type (sends complete words)",
                                              elem_id="svx-as-you-type")
                    with gr.Row():
                        speak = gr.Button("Speak", variant="primary", elem_id="svx-speak")
                        stop = gr.Button("Stop", elem_id="svx-stop")
                with gr.Tab("Realtime", elem_id="svx-tab-realtime"):
                    rt_text = gr.Textbox("Hello from the OpenAI Realtime API of StreamVox.", lines=3,
                                         label="Text (spoken back by the echo responder)", elem_id="svx-rt-text")
                    with gr.Row():
                        rt_speak = gr.Button("Speak (realtime)", variant="primary", elem_id="svx-rt-speak")
                        rt_stop = gr.Button("Stop", elem_id="svx-rt-stop")
            with gr.Column(scale=2):
                gr.HTML(STATS_HTML, elem_id="svx-stats")

        inputs = [text, voice, speed, ref_b64, ref_text]
        speak_js = f"{args} => {{ window.svxDemo.speak{args}; }}"
        if info["voice_cloning"]:
            speak.click(ref_audio_payload, [ref_audio], [ref_b64]).then(None, inputs, None, js=speak_js)
            ref_audio.change(ref_audio_payload, [ref_audio], [ref_b64])
        else:
            speak.click(None, inputs, None, js=speak_js)
        text.input(None, [text, voice, speed, as_you_type, ref_b64, ref_text], None,
                   js="(text, voice, speed, on, ref, refText) => { window.svxDemo.typed(text, voice, speed, on, ref, "
                      "refText); }")
        stop.click(None, None, None, js="() => { window.svxDemo.stop(); }")
        rt_speak.click(None, [rt_text, voice], None,
                       js="(text, voice) => { window.svxDemo.speakRealtime(text, voice); }")
        rt_stop.click(None, None, None, js="() => { window.svxDemo.stop(); }")

    theme = gr.themes.Default(font=["system-ui", "sans-serif"], font_mono=["ui-monospace", "monospace"])
    return demo, {"head": head, "css": CSS, "theme": theme}


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--server-url", default=None,
                        help="a running StreamVox server (e.g. http://127.0.0.1:8000); default: start one")
    parser.add_argument("--browser-server-url", default=None,
                        help="the server URL as the browser sees it, when it differs from --server-url")
    parser.add_argument("--model", default=None, help="model for the server this demo starts (default: espeak)")
    parser.add_argument("--api-key", default=os.environ.get("STREAMVOX_API_KEY"),
                        help="the server's API key (it reaches the browser: the demo is for trusted use)")
    parser.add_argument("--host", default="127.0.0.1", help="where Gradio listens")
    parser.add_argument("--port", type=int, default=7860)
    parser.add_argument("--wait-s", type=float, default=60.0, help="how long to wait for --server-url to be healthy")
    parser.add_argument("--jitter-ms", type=int, default=150, help="playback jitter buffer")
    args = parser.parse_args(argv)

    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    # Ctrl+C or SIGTERM end Gradio's serving loop; atexit then stops the server this demo started.
    # (Explicit: a background job of a non-interactive shell starts with SIGINT ignored.)
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _interrupt)
    server_url = args.server_url
    if server_url is None:
        hosts = {args.host, "127.0.0.1", "localhost"} - {"0.0.0.0", "::"}
        _, server_url = start_server(args.model, args.api_key, [f"http://{h}:{args.port}" for h in sorted(hosts)])
        print(f"streamvox serve is running at {server_url}", flush=True)
    server_url = server_url.rstrip("/")
    wait_healthy(server_url, args.api_key, args.wait_s)
    info = server_info(server_url, args.api_key)
    demo, launch_kwargs = build_demo(info, (args.browser_server_url or server_url).rstrip("/"), args.api_key,
                                     args.jitter_ms)
    demo.launch(server_name=args.host, server_port=args.port, ssr_mode=False, footer_links=[], **launch_kwargs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
