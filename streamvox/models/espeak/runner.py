"""The embedded default voice: eSpeak NG, a single-stage generator model.

eSpeak NG keeps global synthesis state (its random generator, pitch flutter,
voice-variant settings) that carries from one text into the next, so the same
request would sound slightly different depending on what was spoken before
it. Each request therefore runs in its own process forked from a pristine
copy of the engine core's start-up state (by a small fork server,
`_ForkServer`, so the core itself never forks): every request starts from
the same state, requests cannot leak into each other, and they
synthesise in parallel. The child reads text from a pipe as it arrives and
writes every buffer eSpeak hands to the synthesis callback back at once.

Once a request has its first packet, its child is background work: it runs at
SCHED_IDLE, and only a few background children run at a time (`_BackgroundSlots`),
those whose audio runs out soonest at real-time playback; the others are stopped
(SIGSTOP) until their turn. The CPU stays as busy, but the scheduler sees a few
idle-class tasks instead of hundreds: under EEVDF each runnable SCHED_IDLE task
still has a small weight, and two hundred of them together held the event loop off
the CPU for several milliseconds at a time.

The shared library and its data come from the `espeakng-loader` wheel
(eSpeak NG is GPL-3.0); nothing is downloaded.
"""

from __future__ import annotations

import ctypes
import gc
import heapq
import os
import re
import selectors
import signal
import socket
import struct
import tempfile
import time

import espeakng_loader
import msgspec
import numpy as np

from streamvox.contract import ModelInfo, OutputSink, RequestError, SpeechRequest

_AUDIO_OUTPUT_SYNCHRONOUS = 2
_POS_CHARACTER = 1
_CHARS_UTF8 = 1
_ENDPAUSE = 0x1000
_RATE = 1
_BUFFER_MS = 50
_DEFAULT_WPM = 175
_MIN_WPM, _MAX_WPM = 80, 450
_MAX_CLAUSE_WORDS = 24
# Once a child has written its first audio it becomes background work (`_to_background`): synthesis
# runs far faster than real time, so the rest of it must not delay the event loop, the core, or another
# request's first packet (which that request's child still computes at normal priority).
_BACKGROUND_NICE = 19  # where SCHED_IDLE is refused
# Background children allowed to run at once, per CPU, and how often the running set is chosen again.
# Enough to keep every CPU busy (a child blocks now and then on a full pipe); few enough that their
# scheduler weight stays negligible next to the server's.
_BACKGROUND_RUNNING_PER_CPU = 2
_BACKGROUND_SLICE_S = 0.02
_PR_SET_PDEATHSIG = 1

# OpenAI's voice names, so clients written for OpenAI TTS work unmodified.
OPENAI_VOICE_ALIASES = {
    "alloy": "en-us",
    "ash": "en-us+m3",
    "ballad": "en+m2",
    "coral": "en-us+f2",
    "echo": "en-us+m1",
    "fable": "en",
    "nova": "en-us+f3",
    "onyx": "en-us+m7",
    "sage": "en-us+f4",
    "shimmer": "en-us+f1",
    "verse": "en+m4",
}

_SynthCallback = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.c_void_p)


class _Voice(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("languages", ctypes.c_char_p),
        ("identifier", ctypes.c_char_p),
        ("gender", ctypes.c_ubyte),
        ("age", ctypes.c_ubyte),
        ("variant", ctypes.c_ubyte),
        ("xx1", ctypes.c_ubyte),
        ("score", ctypes.c_int),
        ("spare", ctypes.c_void_p),
    ]


class EspeakLibrary:
    """A thin ctypes binding to the few libespeak-ng calls synthesis needs."""

    def __init__(self) -> None:
        self._lib = ctypes.CDLL(espeakng_loader.get_library_path())
        self._lib.espeak_ListVoices.restype = ctypes.POINTER(ctypes.POINTER(_Voice))
        self.sample_rate = self._lib.espeak_Initialize(
            _AUDIO_OUTPUT_SYNCHRONOUS, _BUFFER_MS, espeakng_loader.get_data_path().encode(), 0
        )
        if self.sample_rate <= 0:
            raise RuntimeError("eSpeak NG failed to initialise")
        self._on_samples = None
        self._callback = _SynthCallback(self._dispatch)  # kept referenced while the library holds it
        self._lib.espeak_SetSynthCallback(self._callback)

    def languages(self) -> list[str]:
        """The language names of the installed voices (eSpeak's voice ids), sorted."""
        voices = self._lib.espeak_ListVoices(None)
        names = set()
        i = 0
        while voices[i]:
            # `languages` is a list of (priority byte, NUL-terminated name); the first is the main one.
            raw = voices[i].contents.languages
            if raw:
                names.add(raw[1:].decode())
            i += 1
        return sorted(names)

    def set_voice(self, name: str) -> bool:
        return self._lib.espeak_SetVoiceByName(name.encode()) == 0

    def voice_works(self, name: str) -> bool:
        """True when the voice loads with its dictionary (eSpeak lists a few that do not)."""
        with tempfile.TemporaryFile() as captured:  # eSpeak reports a missing dictionary on fd 2 only
            saved = os.dup(2)
            os.dup2(captured.fileno(), 2)
            try:
                loaded = self.set_voice(name)
            finally:
                os.dup2(saved, 2)
                os.close(saved)
            captured.seek(0)
            return loaded and not captured.read()

    def set_rate(self, words_per_minute: int) -> None:
        self._lib.espeak_SetParameter(_RATE, words_per_minute, 0)

    def synthesize(self, text: str, on_samples) -> None:
        """Synthesise `text`, calling `on_samples(int16 array) -> bool` per buffer; False aborts."""
        data = text.encode()
        self._on_samples = on_samples
        try:
            self._lib.espeak_Synth(data, len(data) + 1, 0, _POS_CHARACTER, 0, _CHARS_UTF8 | _ENDPAUSE, None, None)
        finally:
            self._on_samples = None

    def _dispatch(self, wav, num_samples: int, _events) -> int:
        if num_samples <= 0 or self._on_samples is None:
            return 0
        samples = np.ctypeslib.as_array(wav, (num_samples,)).copy()
        return 0 if self._on_samples(samples) else 1


_CLAUSE_END = re.compile(r"(?<=[.!?;:,\u3002\uff01\uff1f\uff0c])\s+|\n+")


def split_clauses(text: str) -> list[str]:
    """Split text into clauses at punctuation followed by space, capping clause length in words."""
    clauses = []
    for part in _CLAUSE_END.split(text):
        words = part.split()
        for start in range(0, len(words), _MAX_CLAUSE_WORDS):
            clause = " ".join(words[start : start + _MAX_CLAUSE_WORDS])
            if any(ch.isalnum() for ch in clause):
                clauses.append(clause)
    return clauses



class _Clauses:
    """Cuts incoming text into complete clauses; the unfinished tail waits for more text."""

    def __init__(self) -> None:
        self.pending = ""
        self.words = 0

    def add(self, text: str, final: bool) -> list[str]:
        self.pending += text
        if final:
            complete, self.pending = self.pending, ""
        else:
            cuts = [match.end() for match in _CLAUSE_END.finditer(self.pending)]
            if not cuts:
                return []
            complete, self.pending = self.pending[: cuts[-1]], self.pending[cuts[-1] :]
        clauses = split_clauses(complete)
        self.words += sum(len(clause.split()) for clause in clauses)
        return clauses


# Pipe framing, both directions: 4-byte little-endian length, then the payload.
# Parent -> child: UTF-8 text; an empty payload ends the input.
# Child -> parent: int16 PCM; an empty payload is followed by an 8-byte trailer (words, chunks).
_HEADER = struct.Struct("<I")
_TRAILER = struct.Struct("<II")


def _write_frame(fd: int, payload: bytes) -> None:
    data = _HEADER.pack(len(payload)) + payload
    while data:
        data = data[os.write(fd, data) :]


def _read_exact(fd: int, size: int) -> bytes:
    parts = []
    while size:
        chunk = os.read(fd, size)
        if not chunk:
            raise EOFError
        parts.append(chunk)
        size -= len(chunk)
    return b"".join(parts)


class _ChildSpec(msgspec.Struct):
    """What a waiting child needs to start a request: its first frame on the text pipe."""

    voice: str
    words_per_minute: int
    text: str
    text_complete: bool


def _child_main(espeak: EspeakLibrary, text_fd: int, audio_fd: int) -> None:
    """Wait for a request, then synthesise it clause by clause as its text arrives."""
    size = _HEADER.unpack(_read_exact(text_fd, _HEADER.size))[0]
    spec = msgspec.msgpack.decode(_read_exact(text_fd, size), type=_ChildSpec)
    espeak.set_voice(spec.voice)
    espeak.set_rate(min(max(spec.words_per_minute, _MIN_WPM), _MAX_WPM))
    clauses = _Clauses()
    chunks = 0

    def emit(samples: np.ndarray) -> bool:
        nonlocal chunks
        chunks += 1
        _write_frame(audio_fd, samples.astype("<i2").tobytes())
        if chunks == 1 and final:
            _to_background()
        return True

    final = spec.text_complete
    for clause in clauses.add(spec.text, final):
        espeak.synthesize(clause, emit)
    while not final:
        size = _HEADER.unpack(_read_exact(text_fd, _HEADER.size))[0]
        final = size == 0
        if final and chunks:
            _to_background()  # a streaming-text request stays at normal priority while text still comes
        for clause in clauses.add(_read_exact(text_fd, size).decode() if size else "", final):
            espeak.synthesize(clause, emit)
    _write_frame(audio_fd, b"")
    os.write(audio_fd, _TRAILER.pack(clauses.words, chunks))


def _to_background() -> None:
    """Run this process only when the rest of the server has nothing to run (no privilege needed).

    SCHED_IDLE also lets a waking event loop or engine core preempt it at once, which keeps their
    latency low however many requests are synthesising. The work is the same, so throughput is too.
    """
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        try:
            os.nice(_BACKGROUND_NICE)
        except OSError:
            pass


class _Child:
    """The parent's handle on one request's synthesis process."""

    def __init__(self, pid: int, pidfd: int, text_fd: int, audio_fd: int) -> None:
        self.pid = pid
        self.pidfd = pidfd  # signals go through it: never to a recycled pid
        self.text_fd = text_fd
        self.audio_fd = audio_fd
        self.buffer = bytearray()
        self.input_open = True
        self.fresh = True  # no audio read yet
        self.first_audio_at = 0.0  # monotonic time its first audio was read
        self.samples = 0  # read so far
        self.stopped = False  # SIGSTOPped by `_BackgroundSlots`

    def send_text(self, text: str) -> None:
        if self.input_open:
            _write_frame(self.text_fd, text.encode())

    def end_input(self) -> None:
        if self.input_open:
            _write_frame(self.text_fd, b"")
            self.input_open = False

    def signal(self, signum: int) -> None:
        try:
            signal.pidfd_send_signal(self.pidfd, signum)
        except ProcessLookupError:
            pass

    def close(self) -> None:
        """Kill the process (the fork server reaps it) and close the pipes."""
        self.signal(signal.SIGKILL)
        for fd in (self.text_fd, self.audio_fd, self.pidfd):
            try:
                os.close(fd)
            except OSError:
                pass


class _ForkServer:
    """Forks the synthesis children from a small process of its own, so the engine core never forks.

    A fork write-protects every page of the forking process, and the core writes to its memory all the
    time (pipes, PCM, resampling): forking a child per request from the core cost it a page fault per page
    it touched after every fork (~40k faults a second at c=64 on the 2-vCPU benchmark machine). The fork
    server is forked once, while the core is still single-threaded and holds the pristine eSpeak state;
    for each request it forks a child and passes back its pipes and a pidfd over a Unix socket. It reaps
    the children as they exit (their CPU time adds up in its own), and it dies with the core (and they
    with it).
    """

    def __init__(self, espeak: EspeakLibrary, prctl) -> None:
        self.socket, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        core = os.getpid()
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                self.socket.close()
                _serve_forks(espeak, theirs, prctl, core)
            except BaseException:
                code = 1
            finally:
                os._exit(code)
        theirs.close()
        self.pid = pid
        self._asked = 0  # children asked for and not yet received

    def ask(self) -> None:
        """Ask for a child ahead of need (forking takes milliseconds)."""
        self.socket.sendall(b"f")
        self._asked += 1

    def take(self) -> _Child:
        """The next child asked for (waiting for it if it is not there yet)."""
        if not self._asked:
            self.ask()
        message, fds, _, _ = socket.recv_fds(self.socket, _CHILD_PID.size, 3)
        if len(message) != _CHILD_PID.size or len(fds) != 3:
            raise RuntimeError("the eSpeak fork server stopped")
        self._asked -= 1
        pidfd, text_fd, audio_fd = fds
        os.set_blocking(audio_fd, False)
        return _Child(_CHILD_PID.unpack(message)[0], pidfd, text_fd, audio_fd)

    def close(self) -> None:
        self.socket.close()


_CHILD_PID = struct.Struct("<I")


def _serve_forks(espeak: EspeakLibrary, connection: socket.socket, prctl, core: int) -> None:
    """The fork server's loop: one child per byte received; ends when the core closes the socket."""
    prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != core:
        return
    signal.signal(signal.SIGCHLD, _reap_children)
    gc.collect()
    gc.freeze()  # nothing of its heap changes from here on; children fork from it as it is
    while connection.recv(1):
        while (fds := _fork_child(espeak, connection, prctl)) is None:
            pass
        pid, pidfd, text_write, audio_read = fds
        socket.send_fds(connection, [_CHILD_PID.pack(pid)], [pidfd, text_write, audio_read])
        for fd in (pidfd, text_write, audio_read):
            os.close(fd)


def _reap_children(_signum, _frame) -> None:
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass


def _fork_child(espeak: EspeakLibrary, connection: socket.socket, prctl) -> tuple[int, int, int, int] | None:
    """Fork a child that waits for its request: (pid, pidfd, text pipe, audio pipe), None if it died at once."""
    text_read, text_write = os.pipe()
    audio_read, audio_write = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: synthesise, then leave without running any parent clean-up
        gc.disable()  # short-lived: a collection would touch (copy-on-write) the whole inherited heap
        code = 0
        try:
            # Killed with the fork server (so with the core): a stopped child would not notice.
            prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            connection.close()
            os.close(text_write)
            os.close(audio_read)
            _child_main(espeak, text_read, audio_write)
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    os.close(text_read)
    os.close(audio_write)
    try:
        pidfd = os.pidfd_open(pid)  # the child waits for its request, so it is still there unless it failed
    except ProcessLookupError:
        os.close(text_write)
        os.close(audio_read)
        return None
    return pid, pidfd, text_write, audio_read


class _BackgroundSlots:
    """Lets at most `limit` background children run at once: those whose audio runs out soonest
    (played in real time from its first packet), earliest deadline first.

    Chosen again every `slice_s` (and when a running one leaves); the others are stopped. The
    work is the same, and with `limit` at least the number of CPUs the CPUs stay busy with it.
    """

    def __init__(self, limit: int, sample_rate: int, slice_s: float = _BACKGROUND_SLICE_S) -> None:
        self.limit = limit
        self.rate = sample_rate
        self.slice_s = slice_s
        self.children: dict[str, _Child] = {}
        self.stopped = 0
        self._next_at = 0.0

    def add(self, request_id: str, child: _Child) -> None:
        self.children[request_id] = child  # it is running now
        if len(self.children) - self.stopped > self.limit:
            self._next_at = 0.0

    def remove(self, request_id: str) -> None:
        child = self.children.pop(request_id, None)
        if child is None:
            return
        if child.stopped:
            self.stopped -= 1
        elif self.stopped:
            self._next_at = 0.0  # a slot is free
            self.balance()

    def balance(self) -> None:
        now = time.monotonic()
        if now < self._next_at or len(self.children) - self.stopped <= self.limit and not self.stopped:
            return
        self._next_at = now + self.slice_s
        rate = self.rate
        run = heapq.nsmallest(self.limit, self.children.values(),
                              key=lambda child: child.first_audio_at + child.samples / rate)
        run_pids = {child.pid for child in run}
        for child in self.children.values():
            if child.pid in run_pids:
                if child.stopped:
                    child.signal(signal.SIGCONT)
                    child.stopped = False
                    self.stopped -= 1
            elif not child.stopped:
                child.signal(signal.SIGSTOP)
                child.stopped = True
                self.stopped += 1


class EspeakRunner:
    """Runs each eSpeak NG request in a child process forked from a pristine state."""

    def __init__(self, name: str = "espeak", poll_interval_s: float = 0.0,
                 max_running_background: int | None = None) -> None:
        self._espeak = EspeakLibrary()
        self._languages = [name for name in self._espeak.languages() if self._espeak.voice_works(name)]
        self._espeak.set_voice("en-us")  # the state every child starts from
        voices = sorted(OPENAI_VOICE_ALIASES) + self._languages
        self.info = ModelInfo(
            name=name,
            family="espeak",
            sample_rate=self._espeak.sample_rate,
            voices=voices,
            default_voice="en-us",
            languages=self._languages,
            streaming_text=True,
            native_speed=True,
        )
        self._forks = _ForkServer(self._espeak, ctypes.CDLL(None, use_errno=True).prctl)
        self._forks.ask()  # the first request starts without waiting for a fork
        self._children: dict[str, _Child] = {}
        self._by_fd: dict[int, str] = {}
        self._poll_interval_s = poll_interval_s
        # Children's audio pipes, registered once (epoll): a step costs O(ready pipes), not O(children).
        self._selector = selectors.DefaultSelector()
        # The subset whose first audio has not come yet: the core watches it even while it lets
        # the others' output collect for a moment, so a first packet is never held back.
        self._fresh = selectors.DefaultSelector()
        if max_running_background is None:
            max_running_background = _BACKGROUND_RUNNING_PER_CPU * len(os.sched_getaffinity(0))
        self._background = _BackgroundSlots(max_running_background, self.info.sample_rate)

    def add(self, request: SpeechRequest) -> None:
        voice = request.voice or request.language or self.info.default_voice
        if voice not in self.info.voices:
            param = "voice" if request.voice else "language"
            raise RequestError(f"Unknown {param} '{voice}' for model '{self.info.name}'.", param=param)
        spec = _ChildSpec(OPENAI_VOICE_ALIASES.get(voice, voice), int(round(_DEFAULT_WPM * request.speed)),
                          request.text, request.text_complete)
        child = self._forks.take()
        self._forks.ask()  # the next request starts without waiting for a fork
        _write_frame(child.text_fd, msgspec.msgpack.encode(spec))
        child.input_open = not request.text_complete
        self._children[request.request_id] = child
        self._by_fd[child.audio_fd] = request.request_id
        self._selector.register(child.audio_fd, selectors.EVENT_READ, request.request_id)
        self._fresh.register(child.audio_fd, selectors.EVENT_READ, request.request_id)

    def feed_text(self, request_id: str, text: str) -> None:
        if (child := self._children.get(request_id)) is not None:
            child.send_text(text)

    def end_input(self, request_id: str) -> None:
        if (child := self._children.get(request_id)) is not None and child.input_open:
            child.end_input()
            if not child.fresh:  # the child makes itself background work (`_to_background`)
                self._background.add(request_id, child)

    def release(self, request_id: str) -> None:
        if (child := self._children.pop(request_id, None)) is not None:
            del self._by_fd[child.audio_fd]
            self._selector.unregister(child.audio_fd)
            self._background.remove(request_id)
            if child.fresh:
                self._fresh.unregister(child.audio_fd)
            child.close()

    def has_work(self) -> bool:
        return bool(self._children)

    def close(self) -> None:
        """Stop every request and the fork server."""
        for request_id in list(self._children):
            self.release(request_id)
        self._forks.close()

    def fileno(self) -> int:
        """Readable when a child has written: the core waits on it instead of spinning while children run."""
        return self._selector.fileno()

    def first_output_fileno(self) -> int:
        """Readable when a request that has produced nothing yet writes: its first packet is due."""
        return self._fresh.fileno()

    def step(self, sink: OutputSink) -> None:
        """Forward whatever audio the children have written (waiting up to `poll_interval_s` if none has).

        The core calls this when `fileno()` is readable, so by default it never waits.
        """
        for key, _ in self._selector.select(self._poll_interval_s):
            request_id = key.data
            child = self._children.get(request_id)
            if child is None:  # released earlier in this step
                continue
            try:
                data = os.read(key.fd, 1 << 20)
            except BlockingIOError:
                continue
            child.buffer += data
            if child.fresh and len(child.buffer) > _HEADER.size:
                child.fresh = False
                child.first_audio_at = time.monotonic()
                self._fresh.unregister(key.fd)
                if not child.input_open:  # the child has made itself background work (`_to_background`)
                    self._background.add(request_id, child)
            self._forward(request_id, child, sink, eof=not data)
        self._background.balance()

    def _forward(self, request_id: str, child: _Child, sink: OutputSink, eof: bool) -> None:
        """Send every complete frame in the child's buffer as one delta (fewer, larger deltas under load)."""
        buffer = child.buffer
        frames = []
        finished = None
        while len(buffer) >= _HEADER.size:
            size = _HEADER.unpack_from(buffer)[0]
            if size == 0:
                if len(buffer) >= _HEADER.size + _TRAILER.size:
                    finished = _TRAILER.unpack_from(buffer, _HEADER.size)
                break
            if len(buffer) < _HEADER.size + size:
                break
            frames.append(bytes(buffer[_HEADER.size : _HEADER.size + size]))
            del buffer[: _HEADER.size + size]
        if frames:
            pcm = np.frombuffer(b"".join(frames), dtype="<i2")
            child.samples += len(pcm)
            sink.audio(request_id, pcm.astype(np.float32) / 32768.0)
        if finished is not None:
            self.release(request_id)
            sink.finished(request_id, "stop", *finished)
        elif eof:
            self.release(request_id)
            sink.failed(request_id, RequestError("eSpeak synthesis failed.", code="synthesis_failed"))
