"""The engine core: a loop in its own process that drives a model runner.

The loop drains control messages from the front end, then runs one runner
step when there is work, so a cancellation lands within one step. A runner
whose work happens elsewhere (eSpeak's child processes) exposes `fileno()`:
the core then sleeps until that fd or the socket is readable instead of
spinning, and blocks on the socket alone while the runner is idle.

Audio is paced on the way out (`pacer.Pacer`): a request's first delta goes
at once; later audio is merged while the client still has plenty of audio
ahead of its playback. This is the one place output is post-processed, off the
server's event loop, with one stateful processor per request: a request with
`speed` other than 1.0 whose model lacks `ModelInfo.native_speed` is
time-stretched here as its audio arrives, before pacing (the pacer counts the
audio the client will play); a request whose `SpeechRequest.sample_rate`
differs from the model's is resampled as its deltas leave (few, large calls).
Word timings leave right after the audio they cover (`word_gate.WordGate`).
Everything one loop iteration produces leaves as one ZMQ message
(`messages.Outputs`).
"""
from __future__ import annotations

import logging
import math
import os
import signal
import time
import traceback
from multiprocessing.connection import Connection

import msgspec
import numpy as np
import zmq

from streamvox.audio.resample import Resampler
from streamvox.audio.time_stretch import TimeStretcher
from streamvox.contract import RequestError, Runner, SpeechRequest, WordTimings
from streamvox.engine import messages as m
from streamvox.engine.pacer import Pacer
from streamvox.engine.word_gate import WordGate
from streamvox.settings import EngineEnv

log = logging.getLogger(__name__)

_IDLE_POLL_MS = 500  # also how often an idle core checks that its parent is alive
# With `first_output_fileno()`, output of requests already streaming is read at most this often, so one
# step forwards many buffers (fewer wakeups and messages); first packets and control messages still wake
# the core at once.
_BATCH_WINDOW_S = 0.002
_CORE_NICE = 5
LOAD_FAILED_EXIT = 2  # the core's exit status when its model could not load


class FrontEndGone(Exception):
    """The server process that started this core has exited."""


class EngineCore:
    """Owns the runner and the core side of the ZMQ transport; also the runner's output sink."""

    def __init__(self, runner: Runner, input_address: str, output_address: str) -> None:
        self.runner = runner
        self._context = zmq.Context()
        self._inbox = self._context.socket(zmq.PULL)
        self._inbox.connect(input_address)
        self._outbox = self._context.socket(zmq.PUSH)
        # A send blocks once the front end stops reading; time out now and then to see whether it is gone.
        self._outbox.setsockopt(zmq.SNDTIMEO, _IDLE_POLL_MS)
        self._outbox.connect(output_address)
        self._parent = os.getppid()
        self.pacer = Pacer(runner.info.sample_rate)
        self._now = time.monotonic()
        self._audio: list[tuple[str, np.ndarray]] = []  # this iteration's outgoing deltas
        self._ended: list[m.Finished | m.Failed] = []
        self._resamplers: dict[str, Resampler] = {}  # requests whose output rate is not the model's
        self._stretchers: dict[str, TimeStretcher] = {}  # requests whose speed the core applies
        self.words_gate = WordGate()  # word timings of the requests that asked for them

    # OutputSink

    def audio(self, request_id: str, pcm: np.ndarray) -> None:
        if (stretcher := self._stretchers.get(request_id)) is not None and not len(pcm := stretcher.process(pcm)):
            return  # the stretcher holds it back for now: the request's first packet is still to come
        if self.pacer.add(request_id, pcm, self._now, self._audio):
            self._send_outputs()  # a first packet leaves now, even in the middle of a long step

    def words(self, request_id: str, timings: WordTimings) -> None:
        self.words_gate.add(request_id, timings)

    def finished(self, request_id: str, reason: str, input_tokens: int, output_tokens: int) -> None:
        if (stretcher := self._stretchers.pop(request_id, None)) is not None and len(tail := stretcher.flush()):
            self.pacer.add(request_id, tail, self._now, self._audio)
        self.pacer.end(request_id, self._now, self._audio)
        self._ended.append(m.Finished(request_id, reason, input_tokens, output_tokens))

    def failed(self, request_id: str, error: RequestError) -> None:
        self._stretchers.pop(request_id, None)
        self.pacer.end(request_id, self._now, self._audio)
        self._ended.append(m.Failed(request_id, error.message, error.code, error.param))

    def _send_outputs(self) -> None:
        if not self._audio and not self._ended and not self.words_gate.waiting:
            return
        if self._resamplers:
            self._resample()
        words = self._due_words()
        if not self._audio and not self._ended and not words:
            return
        header = m.output_encoder.encode(m.Outputs([request_id for request_id, _ in self._audio], self._ended,
                                                   words))
        frames = [header, *(np.ascontiguousarray(pcm, dtype="<f4") for _, pcm in self._audio)]
        self._push(frames)
        self._audio = []
        self._ended = []

    def _due_words(self) -> list[m.RequestWords]:
        """The word timings whose audio leaves with this message (or before it); an ended request's rest."""
        gate, due = self.words_gate, []
        for request_id, pcm in self._audio:
            gate.sent(request_id, len(pcm))
        gate.take_due(due)
        for end in self._ended:
            gate.close(end.request_id, due if isinstance(end, m.Finished) else None)
        return [m.RequestWords(request_id, timings) for request_id, timings in due]

    def _resample(self) -> None:
        """This iteration's deltas at their requests' output rates; a finished request's resampler tail goes last."""
        audio = []
        for request_id, pcm in self._audio:
            if (resampler := self._resamplers.get(request_id)) is not None:
                pcm = resampler.process(pcm)
                if not resampler.produced:
                    # soxr holds back its first ~1000 input samples: the request's next audio is its first
                    # packet again, sent at once rather than paced.
                    self.pacer.restart(request_id)
            if len(pcm):
                audio.append((request_id, pcm))
        for end in self._ended:
            resampler = self._resamplers.pop(end.request_id, None)
            if resampler is not None and isinstance(end, m.Finished) and len(tail := resampler.flush()):
                audio.append((end.request_id, tail))
        self._audio = audio

    # loop

    def run(self) -> None:
        self._send(m.Ready(self.runner.info))
        runner_fd = self.runner.fileno() if hasattr(self.runner, "fileno") else None
        first_fd = self.runner.first_output_fileno() if hasattr(self.runner, "first_output_fileno") else None
        poller = zmq.Poller()  # everything
        poller.register(self._inbox, zmq.POLLIN)
        if runner_fd is not None:
            poller.register(runner_fd, zmq.POLLIN)
        urgent = None  # control messages and first packets only
        if runner_fd is not None and first_fd is not None:
            poller.register(first_fd, zmq.POLLIN)
            urgent = zmq.Poller()
            urgent.register(self._inbox, zmq.POLLIN)
            urgent.register(first_fd, zmq.POLLIN)
        last_step = 0.0
        while True:
            has_work = self.runner.has_work()
            now = time.monotonic()
            current = poller
            if not has_work:
                timeout = _IDLE_POLL_MS / 1000
            elif runner_fd is None:
                timeout = 0.0
            else:
                timeout = min(_IDLE_POLL_MS / 1000, self.pacer.timeout_s(now))
                quiet = last_step + _BATCH_WINDOW_S - now
                if urgent is not None and quiet > 0:
                    current, timeout = urgent, min(timeout, quiet)
            events = dict(current.poll(math.ceil(timeout * 1000)))
            self._now = time.monotonic()
            if self._inbox in events:
                if not self._drain_inbox():
                    return
            elif not events and not has_work and os.getppid() != self._parent:
                return  # the front end is gone
            if self.runner.has_work() and (runner_fd is None or current is urgent or len(events) > (
                    self._inbox in events)):
                self.runner.step(self)
                last_step = self._now
            self.pacer.flush_due(self._now, self._audio)
            self._send_outputs()

    def _drain_inbox(self) -> bool:
        """Apply every queued control message; False on shutdown."""
        while True:
            try:
                raw = self._inbox.recv(zmq.NOBLOCK)
            except zmq.Again:
                return True
            message = m.input_decoder.decode(raw)
            match message:
                case m.AddRequest(request=request):
                    try:
                        self._add_request(request)
                    except RequestError as error:
                        self.failed(request.request_id, error)
                case m.FeedText(request_id=request_id, text=text):
                    self.runner.feed_text(request_id, text)
                case m.EndInput(request_id=request_id):
                    self.runner.end_input(request_id)
                case m.Cancel(request_id=request_id):
                    self.runner.release(request_id)
                    self.pacer.drop(request_id)
                    self._resamplers.pop(request_id, None)
                    self._stretchers.pop(request_id, None)
                    self.words_gate.close(request_id, None)
                case m.AddVoice():
                    self._add_voice(message)
                case m.RemoveVoice(name=name):
                    if (remove := getattr(self.runner, "remove_voice", None)) is not None:
                        remove(name)
                case m.Shutdown():
                    return False

    def _add_request(self, request: SpeechRequest) -> None:
        info = self.runner.info
        rate = request.sample_rate
        if rate is not None and not 1000 <= rate <= 384000:
            raise RequestError(f"Unsupported output sample rate {rate}.", param="sample_rate")
        if not 0.25 <= request.speed <= 4.0:
            raise RequestError(f"Unsupported speed {request.speed}.", param="speed")
        if request.word_timestamps and not info.word_timestamps:
            raise RequestError(f"Model '{info.name}' gives no word timings.", param="word_timestamps")
        if rate is not None and rate != info.sample_rate:
            self._resamplers[request.request_id] = Resampler(info.sample_rate, rate)
        time_scale = 1.0
        if request.speed != 1.0 and not info.native_speed:
            self._stretchers[request.request_id] = TimeStretcher(info.sample_rate, request.speed)
            time_scale = 1.0 / request.speed  # the stretched audio's seconds per second of the model's
            request = msgspec.structs.replace(request, speed=1.0)  # the model speaks at its own rate
        if request.word_timestamps:
            self.words_gate.open(request.request_id, rate or info.sample_rate, time_scale)
        try:
            self.runner.add(request)
        except RequestError:
            self._resamplers.pop(request.request_id, None)
            self._stretchers.pop(request.request_id, None)
            self.words_gate.close(request.request_id, None)
            raise

    def _add_voice(self, message: m.AddVoice) -> None:
        add = getattr(self.runner, "add_voice", None)
        if add is None or not self.runner.info.voice_cloning:
            self._send(m.VoiceResult(message.token, message.name, "model does not support voice cloning",
                                     "voice_cloning_unsupported"))
            return
        try:
            add(message.name, message.pcm, message.sample_rate, message.ref_text)
        except RequestError as error:
            self._send(m.VoiceResult(message.token, message.name, error.message, error.code, error.param))
        else:
            self._send(m.VoiceResult(message.token, message.name))

    def _send(self, message: m.CoreOutput) -> None:
        self._send_outputs()  # keep order: anything queued for the front end goes first
        self._push([m.output_encoder.encode(message)])

    def _push(self, frames: list) -> None:
        """Send to the front end; raise `FrontEndGone` if it died (its messages would queue, then block, forever)."""
        while True:
            try:
                # Copied: cheaper than zero-copy at these sizes, whose release is tracked by pyzmq's garbage thread.
                self._outbox.send_multipart(frames, copy=True)
                return
            except zmq.Again:
                if os.getppid() != self._parent:
                    raise FrontEndGone from None

    def close(self) -> None:
        self._inbox.close(linger=0)
        self._outbox.close(linger=1000)
        self._context.term()


def _load_runner(model: str, model_options: dict, load_failures: Connection | None) -> Runner:
    """The model's runner; if it cannot load, one line saying why goes to `load_failures` (the supervisor)
    and the process exits with LOAD_FAILED_EXIT."""
    from streamvox.models.load_failure import explain_load_failure
    from streamvox.models.registry import load_runner

    try:
        # Fault injection for tests of the restart backoff: while this file exists, the core fails at start.
        fault_file = EngineEnv.from_env().fault_engine_start_file
        if fault_file and os.path.exists(fault_file):
            raise RuntimeError(f"injected start failure ({fault_file} exists)")
        return load_runner(model, **model_options)
    except Exception as exc:
        failure = explain_load_failure(model, exc)
        if not failure.recognised:
            log.error("loading model %r failed:\n%s", model, traceback.format_exc())
        if load_failures is not None:
            load_failures.send(failure.message)
            load_failures.close()
        else:
            log.error("cannot load model %r: %s", model, failure.message)
        raise SystemExit(LOAD_FAILED_EXIT) from None


def run_engine_core(model: str, model_options: dict, input_address: str, output_address: str,
                    load_failures: Connection | None = None) -> None:
    """Process entry point: load the model, then serve until shutdown or a crash."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s engine %(levelname)s %(message)s")
    for client in ("httpx", "httpx2"):  # a line per HTTP request of a model download: the progress bar says it
        logging.getLogger(client).setLevel(logging.WARNING)
    # The server's event loop is the latency-critical process: when the CPUs are contended, it gets the larger
    # share (its lag is what every stream's timing rests on). The core still gets every idle cycle. Measured on
    # the 2-core benchmark machine (200 SSE streams / c=64): nice 10 read 11.6 ms lag p99 but 211 ms TTFP p50;
    # nice 0 16-18 ms and 47-245 ms (noisy); nice 5 11.8-14.6 ms and 60-93 ms.
    try:
        os.nice(_CORE_NICE)
    except OSError:
        pass
    # The server stops the core (a Shutdown message, then SIGKILL). A signal to the whole process group (Ctrl+C in
    # a terminal, systemd stopping the unit) reaches the core too, and must not end it while the server drains.
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)
    runner = _load_runner(model, model_options, load_failures)
    core = None
    try:
        core = EngineCore(runner, input_address, output_address)
        core.run()
    except FrontEndGone:
        log.warning("the server process is gone; the engine core exits")
    except Exception as exc:  # report, then exit non-zero so the front end notices
        log.error("engine core crashed:\n%s", traceback.format_exc())
        if core is not None:
            core._send(m.CoreCrashed(f"{type(exc).__name__}: {exc}"))
        else:
            context = zmq.Context.instance()
            outbox = context.socket(zmq.PUSH)
            outbox.connect(output_address)
            outbox.send(m.output_encoder.encode(m.CoreCrashed(f"{type(exc).__name__}: {exc}")))
            outbox.close(linger=1000)
        raise SystemExit(1) from exc
    finally:
        if core is not None:
            core.close()
