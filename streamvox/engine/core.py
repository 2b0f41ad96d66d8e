"""The engine core: a busy loop in its own process that drives a model runner.

The loop drains control messages from the front end, then runs one runner
step when there is work, so a cancellation lands within one step. It blocks
on the socket only while the runner is idle.
"""

from __future__ import annotations

import logging
import os
import traceback

import numpy as np
import zmq

from streamvox.engine import messages as m
from streamvox.models.base import RequestError, Runner

log = logging.getLogger(__name__)

_IDLE_POLL_MS = 500  # also how often an idle core checks that its parent is alive


class EngineCore:
    """Owns the runner and the core side of the ZMQ transport; also the runner's output sink."""

    def __init__(self, runner: Runner, input_address: str, output_address: str) -> None:
        self.runner = runner
        self._context = zmq.Context()
        self._inbox = self._context.socket(zmq.PULL)
        self._inbox.connect(input_address)
        self._outbox = self._context.socket(zmq.PUSH)
        self._outbox.connect(output_address)
        self._parent = os.getppid()

    # OutputSink

    def audio(self, request_id: str, pcm: np.ndarray) -> None:
        header = m.output_encoder.encode(m.AudioDelta(request_id))
        self._outbox.send_multipart([header, np.ascontiguousarray(pcm, dtype="<f4")], copy=False)

    def finished(self, request_id: str, reason: str, input_tokens: int, output_tokens: int) -> None:
        self._send(m.Finished(request_id, reason, input_tokens, output_tokens))

    def failed(self, request_id: str, error: RequestError) -> None:
        self._send(m.Failed(request_id, error.message, error.code, error.param))

    # loop

    def run(self) -> None:
        self._send(m.Ready(self.runner.info))
        while True:
            timeout = 0 if self.runner.has_work() else _IDLE_POLL_MS
            if self._inbox.poll(timeout):
                if not self._drain_inbox():
                    return
            elif timeout and os.getppid() != self._parent:
                return  # the front end is gone
            if self.runner.has_work():
                self.runner.step(self)

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
                        self.runner.add(request)
                    except RequestError as error:
                        self.failed(request.request_id, error)
                case m.FeedText(request_id=request_id, text=text):
                    self.runner.feed_text(request_id, text)
                case m.EndInput(request_id=request_id):
                    self.runner.end_input(request_id)
                case m.Cancel(request_id=request_id):
                    self.runner.release(request_id)
                case m.AddVoice():
                    self._add_voice(message)
                case m.RemoveVoice(name=name):
                    if (remove := getattr(self.runner, "remove_voice", None)) is not None:
                        remove(name)
                case m.Shutdown():
                    return False

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
        self._outbox.send(m.output_encoder.encode(message))

    def close(self) -> None:
        self._inbox.close(linger=0)
        self._outbox.close(linger=1000)
        self._context.term()


def run_engine_core(model: str, model_options: dict, input_address: str, output_address: str) -> None:
    """Process entry point: load the model, then serve until shutdown or a crash."""
    from streamvox.models import load_runner

    logging.basicConfig(level=logging.INFO, format="%(asctime)s engine %(levelname)s %(message)s")
    core = None
    try:
        # Fault injection for tests of the restart backoff: while this file exists, the core fails at start.
        fault_file = os.environ.get("STREAMVOX_FAULT_ENGINE_START_FILE")
        if fault_file and os.path.exists(fault_file):
            raise RuntimeError(f"injected start failure ({fault_file} exists)")
        core = EngineCore(load_runner(model, **model_options), input_address, output_address)
        core.run()
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
