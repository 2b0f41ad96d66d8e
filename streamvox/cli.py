"""The `streamvox` command: `serve` the API, or `speak` one text to a file."""

from __future__ import annotations

import argparse
import copy
import importlib.util
import logging
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from streamvox.audio.formats import FORMATS, encode_audio, encoded_sample_rate
from streamvox.contract import SpeechRequest
from streamvox.engine.client import AsyncEngine, new_request_id
from streamvox.engine.events import EngineUnavailable
from streamvox.models.registry import DEFAULT_MODEL, POCKETSPHINX
from streamvox.scale.options import add_scale_flags, scale_options
from streamvox.server.audio_out import AudioOut
from streamvox.server.speech_params import MAX_INPUT_CHARS, MAX_SAMPLE_RATE, MIN_SAMPLE_RATE
from streamvox.settings import AgentSettings, MediaPolicy, ServerEnv, ServerSettings

if TYPE_CHECKING:
    import uvicorn

    from streamvox.server.app import AppState


def _serve(args: argparse.Namespace) -> int:
    import uvicorn
    import uvloop

    from streamvox.server.app import build_app

    if args.allowed_local_media_path and not Path(args.allowed_local_media_path).is_dir():
        raise SystemExit(f"streamvox: --allowed-local-media-path {args.allowed_local_media_path!r} is not a directory")
    if args.max_buffered_audio_s <= 0:
        raise SystemExit("streamvox: --max-buffered-audio-s must be positive")
    if not 0 <= args.port <= 65535:
        raise SystemExit("streamvox: --port must be between 0 and 65535")
    media = MediaPolicy(allow_urls=args.allow_ref_audio_urls, allow_private_urls=args.allow_private_ref_audio_urls,
                        local_media_path=args.allowed_local_media_path, fetch_timeout_s=args.ref_audio_fetch_timeout_s)
    origins = tuple(o.strip() for o in (args.allowed_origins or "").split(",") if o.strip())
    agent = AgentSettings(llm=args.llm, llm_url=args.llm_url, llm_model=args.llm_model, llm_api_key=args.llm_api_key,
                          asr=args.asr, max_tokens=args.llm_max_tokens, context_tokens=args.llm_context_tokens,
                          temperature=args.llm_temperature, seed=args.llm_seed)
    if args.llm and args.llm_url:
        raise SystemExit("streamvox: give --llm or --llm-url, not both")
    try:
        env = ServerEnv.from_env()
    except ValueError as error:
        raise SystemExit(f"streamvox: {error}") from None
    settings = ServerSettings(model=args.model, model_options=_model_options(args), api_key=args.api_key,
                              exit_on_engine_crash=args.exit_on_engine_crash, agent=agent,
                              max_buffered_audio_s=args.max_buffered_audio_s,
                              engine_restart_backoff_max_s=args.engine_restart_backoff_max_s,
                              media=media, allowed_origins=origins, voices_dir=args.voices_dir, env=env)
    if (scale := scale_options(args)) is not None:
        from streamvox.scale.launch import serve_replicas

        return serve_replicas(settings, scale)  # (the port may be Ray Serve's already: a running cluster's)
    _check_listen(args.host, args.port)
    app = build_app(settings)
    config = uvicorn.Config(app, host=args.host, port=args.port, loop="uvloop", ws="websockets-sansio",
                            log_level=args.log_level, log_config=_log_config(), ws_max_size=16 * 1024 * 1024,
                            ws_per_message_deflate=False,  # compressing base64 audio costs loop time
                            timeout_graceful_shutdown=args.graceful_shutdown_timeout_s)  # a client not reading
    server = uvicorn.Server(config)
    state = app.state.streamvox
    state.request_exit = lambda: setattr(server, "should_exit", True)
    try:
        load_failure = uvloop.run(_load_then_serve(server, state))
    except KeyboardInterrupt:  # SIGINT: uvicorn re-raises it once it has shut down gracefully
        return 0
    if load_failure is not None:
        print(f"streamvox: cannot load model {args.model!r}: {load_failure}", file=sys.stderr)
        return 2
    exit_code = state.engine_exit_code
    if exit_code is not None:
        print(f"streamvox: the engine process exited ({exit_code}); exiting for the supervisor", file=sys.stderr)
        return 3
    return 0


def _check_listen(host: str, port: int) -> None:
    """Exit (status 1) with one line if the address cannot be bound, before a model takes minutes to load (the
    bind itself is uvicorn's, after the load)."""
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            probe.bind((host, port))
        except OSError as error:
            raise SystemExit(f"streamvox: cannot listen on {host} port {port}: {error.strerror or error}") from None


async def _load_then_serve(server: uvicorn.Server, state: AppState) -> str | None:
    """Load the model (start the engine), then serve. A model that cannot load ends it here, before the server
    starts, with the one line the engine core sent (returned) rather than uvicorn's lifespan traceback."""
    try:
        await state.engine.start()
    except EngineUnavailable as error:
        await state.engine.shutdown()
        return str(error)
    except BaseException:  # Ctrl+C while the model loads: the core ignores it, so it is stopped here
        await state.engine.shutdown()
        raise
    state.engine_started = True
    await server.serve()
    return None


def _log_config() -> dict:
    """uvicorn's logging, and the root logger's, with each line about a request tagged `[x-request-id]`."""
    from uvicorn.config import LOGGING_CONFIG

    from streamvox.server.middleware import RequestIdLogFilter

    config = copy.deepcopy(LOGGING_CONFIG)
    config["filters"] = {"request_id": {"()": RequestIdLogFilter}}
    formatters = config["formatters"]
    formatters["default"]["fmt"] = "%(levelprefix)s %(request_tag)s%(message)s"
    formatters["access"]["fmt"] = '%(levelprefix)s %(request_tag)s%(client_addr)s - "%(request_line)s" %(status_code)s'
    formatters["streamvox"] = {"format": "%(levelname)s:%(name)s:%(request_tag)s%(message)s"}
    config["handlers"]["streamvox"] = {"class": "logging.StreamHandler", "formatter": "streamvox",
                                       "stream": "ext://sys.stderr"}
    for handler in config["handlers"].values():
        handler["filters"] = ["request_id"]
    config["root"] = {"handlers": ["streamvox"], "level": "WARNING"}
    return config


async def _speak_async(args: argparse.Namespace) -> np.ndarray:
    engine = AsyncEngine(args.model, model_options=_model_options(args), restart_on_crash=False)
    await engine.start()
    try:
        request = SpeechRequest(request_id=new_request_id("cli"), text=args.text, voice=args.voice,
                                speed=args.speed, sample_rate=args.sample_rate)
        async with AudioOut(engine, request, None) as out:
            parts = [pcm async for pcm in out.deltas()]
        if (error := out.result.error) is not None:
            raise SystemExit(f"streamvox: {error.message}")
        return np.concatenate(parts) if parts else np.zeros(0, np.float32)
    finally:
        await engine.shutdown()


def _speak(args: argparse.Namespace) -> int:
    """The server's limits hold here too, and every argument is checked before the speech is made."""
    import uvloop

    output = Path(args.output)
    fmt = args.format or (output.suffix.lstrip(".") or "wav")
    if fmt not in FORMATS:
        raise SystemExit(f"streamvox: unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
    if not args.text.strip():
        raise SystemExit("streamvox: TEXT is empty")
    if len(args.text) > MAX_INPUT_CHARS:
        raise SystemExit(f"streamvox: TEXT is longer than {MAX_INPUT_CHARS} characters")
    if not MIN_SAMPLE_RATE <= args.sample_rate <= MAX_SAMPLE_RATE:
        raise SystemExit(f"streamvox: --sample-rate must be between {MIN_SAMPLE_RATE} and {MAX_SAMPLE_RATE}")
    if output.is_dir() or not output.parent.is_dir():
        raise SystemExit(f"streamvox: cannot write {args.output}: " + (
            "it is a directory" if output.is_dir() else f"no directory {str(output.parent)!r}"))
    pcm = uvloop.run(_speak_async(args))
    try:
        output.write_bytes(encode_audio(pcm, args.sample_rate, fmt))
    except OSError as error:
        raise SystemExit(f"streamvox: cannot write {args.output}: {error.strerror}") from None
    rate = encoded_sample_rate(args.sample_rate, fmt)
    print(f"wrote {args.output}: {len(pcm) / args.sample_rate:.2f} s of {fmt} at {rate} Hz")
    return 0


def _model_options(args: argparse.Namespace) -> dict:
    options = {"device": args.device, "dtype": args.dtype, "max_batch": args.max_batch}
    if args.aligner is not None:
        options["aligner"] = _check_aligner(args.aligner)
    return options


def _check_aligner(aligner: str) -> str:
    """`--aligner`: "pocketsphinx" with its extra installed, a forced-aligner checkpoint directory, or a repo id
    (fetched, and checked, where the model loads)."""
    if aligner == POCKETSPHINX:
        if importlib.util.find_spec("pocketsphinx") is None:
            raise SystemExit("streamvox: --aligner pocketsphinx needs the 'align' extra: "
                             "pip install 'streamvox[align]'")
        return aligner
    from streamvox.models.alignment.qwen3_aligner.config import NotAForcedAligner, load_aligner_config

    path = Path(aligner)
    if path.is_dir():
        try:
            load_aligner_config(path)
        except NotAForcedAligner as error:
            raise SystemExit(f"streamvox: --aligner: {error}; give 'pocketsphinx' or a Qwen3-ForcedAligner-0.6B "
                             "directory or repo id") from None
    elif path.exists() or aligner.count("/") != 1 or aligner.startswith((".", "/", "~")):
        raise SystemExit(f"streamvox: --aligner {aligner!r} is neither 'pocketsphinx', a directory, nor a Hugging "
                         "Face repo id (owner/name) of Qwen3-ForcedAligner-0.6B")
    return aligner


def _add_model_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=DEFAULT_MODEL,
                        help="'espeak' (embedded, default) or a Qwen3-TTS directory / Hugging Face repo id")
    parser.add_argument("--device", default="auto", help="Qwen3-TTS: cpu, cuda, cuda:N (default: cuda if present)")
    parser.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16", "float16"),
                        help="Qwen3-TTS talker precision (default: bfloat16 on CUDA, float32 on the CPU)")
    parser.add_argument("--max-batch", type=int, default=None, help="Qwen3-TTS: concurrent requests in the AR stage")
    parser.add_argument("--aligner", default=None, metavar="pocketsphinx|DIR_OR_REPO",
                        help="word timestamps for a model without its own (Qwen3-TTS): 'pocketsphinx' aligns "
                             "English speech on the CPU (the 'align' extra); a Qwen3-ForcedAligner-0.6B directory or "
                             "Hugging Face repo id runs on the model's device; eSpeak times its words itself")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="streamvox", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="serve the speech API")
    _add_model_flags(serve)
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on every route")
    serve.add_argument("--exit-on-engine-crash", action="store_true",
                       help="exit with status 3 when the engine process dies (default: restart it)")
    serve.add_argument("--engine-restart-backoff-max-s", type=float, default=30.0,
                       help="longest wait between restarts of an engine that keeps failing (default 30)")
    serve.add_argument("--max-buffered-audio-s", type=float, default=300.0,
                       help="seconds of audio queued for a client that stops reading before its request is "
                            "cancelled (default 300)")
    serve.add_argument("--allow-ref-audio-urls", action="store_true",
                       help="let 'ref_audio' be an http(s) URL (public addresses only)")
    serve.add_argument("--allow-private-ref-audio-urls", action="store_true",
                       help="with --allow-ref-audio-urls: also loopback, link-local and private addresses")
    serve.add_argument("--ref-audio-fetch-timeout-s", type=float, default=10.0,
                       help="time limit for fetching a 'ref_audio' URL (default 10)")
    serve.add_argument("--allowed-local-media-path", default=None, metavar="DIR",
                       help="let 'ref_audio' be a file:// URL of a file under DIR")
    serve.add_argument("--allowed-origins", default=None, metavar="LIST",
                       help="comma-separated WebSocket Origins allowed besides no Origin and same-host ('*': any)")
    serve.add_argument("--voices-dir", default=None, metavar="DIR",
                       help="where cloned voices (POST /v1/audio/voices) are kept "
                            "(default: $XDG_DATA_HOME/streamvox/voices or ~/.local/share/streamvox/voices)")
    serve.add_argument("--log-level", default="info")
    agent = serve.add_argument_group("voice agent (/v1/realtime)")
    agent.add_argument("--llm", default=None, metavar="DIR_OR_REPO",
                       help="thinker LLM run by vLLM in this server (needs the 'llm' extra)")
    agent.add_argument("--llm-url", default=None, metavar="URL",
                       help="thinker: an external OpenAI-compatible endpoint, e.g. http://host:8001/v1")
    agent.add_argument("--llm-model", default=None, help="model name at --llm-url (default: its first model)")
    agent.add_argument("--llm-api-key", default=None, help="bearer key for --llm-url")
    agent.add_argument("--llm-max-tokens", type=int, default=256, help="longest reply, in tokens")
    agent.add_argument("--llm-context-tokens", type=int, default=2048,
                       help="conversation history budget; the oldest turns are dropped past it")
    agent.add_argument("--llm-temperature", type=float, default=0.7)
    agent.add_argument("--llm-seed", type=int, default=None)
    agent.add_argument("--asr", default=None, metavar="DIR_OR_REPO",
                       help="Whisper-family speech recogniser run by vLLM, for input audio turns")
    add_scale_flags(serve)
    serve.set_defaults(run=_serve)

    speak = commands.add_parser("speak", help="synthesise TEXT into an audio file")
    speak.add_argument("text")
    speak.add_argument("-o", "--output", required=True)
    _add_model_flags(speak)
    speak.add_argument("--voice", default=None)
    speak.add_argument("--format", choices=FORMATS, default=None, help="default: from the file name, else wav")
    speak.add_argument("--speed", type=float, default=1.0)
    speak.add_argument("--sample-rate", type=int, default=24000)
    speak.set_defaults(run=_speak)
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING)
    args = build_parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
