"""eSpeak's synthesis processes: the fork server, the per-request children, their pipes, background slots.

Each request runs in a child forked from a pristine copy of the engine core's
start-up eSpeak state (see `runner.py` for why). The children are forked by a
small fork server (`ForkServer`), so the core itself never forks. A child reads
text from a pipe as it arrives, cuts it into clauses and writes every buffer
eSpeak hands to the synthesis callback back at once.

Once a request has its first packet, its child is background work: it runs at
SCHED_IDLE, and only a few background children run at a time (`BackgroundSlots`),
those whose audio runs out soonest at real-time playback; the others are stopped
(SIGSTOP) until their turn. The CPU stays as busy, but the scheduler sees a few
idle-class tasks instead of hundreds: under EEVDF each runnable SCHED_IDLE task
still has a small weight, and two hundred of them together held the event loop off
the CPU for several milliseconds at a time.
"""

from __future__ import annotations

import gc
import heapq
import os
import signal
import socket
import struct
import time

import msgspec
import numpy as np

from streamvox.contract import WordTimings
from streamvox.models.espeak.library import MAX_WPM, MIN_WPM, EspeakLibrary, SynthEvent
from streamvox.models.espeak.word_timing import ClauseWords, InputWords, last_sound
from streamvox.text_split import TextSplitter

_MAX_CLAUSE_WORDS = 24
# Once a child has written its first audio it becomes background work (`_to_background`): synthesis
# runs far faster than real time, so the rest of it must not delay the event loop, the core, or another
# request's first packet (which that request's child still computes at normal priority).
_BACKGROUND_NICE = 19  # where SCHED_IDLE is refused
# Background children allowed to run at once, per CPU, and how often the running set is chosen again.
# Enough to keep every CPU busy (a child blocks now and then on a full pipe); few enough that their
# scheduler weight stays negligible next to the server's.
BACKGROUND_RUNNING_PER_CPU = 2
_BACKGROUND_SLICE_S = 0.02
_PR_SET_PDEATHSIG = 1

# Pipe framing, both directions: 4-byte little-endian length, then the payload.
# Parent -> child: a msgpack `ChildSpec`, then UTF-8 text; an empty payload ends the input.
# Child -> parent: int16 PCM; a length with its top bit (`_WORDS_FLAG`) set frames a msgpack `WordTimings`
# (after the audio it times); an empty payload is followed by an 8-byte trailer (words, chunks).
_HEADER = struct.Struct("<I")
_TRAILER = struct.Struct("<II")
_WORDS_FLAG = 1 << 31
_CHILD_PID = struct.Struct("<I")


def _write_frame(fd: int, payload: bytes, flags: int = 0) -> None:
    data = _HEADER.pack(len(payload) | flags) + payload
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


class ChildSpec(msgspec.Struct):
    """What a waiting child needs to start a request: its first frame on the text pipe."""

    voice: str
    words_per_minute: int
    text: str
    text_complete: bool
    word_timestamps: bool = False


def _child_main(espeak: EspeakLibrary, text_fd: int, audio_fd: int) -> None:
    """Wait for a request, then synthesise it clause by clause as its text arrives."""
    size = _HEADER.unpack(_read_exact(text_fd, _HEADER.size))[0]
    spec = msgspec.msgpack.decode(_read_exact(text_fd, size), type=ChildSpec)
    espeak.set_voice(spec.voice)
    espeak.set_rate(min(max(spec.words_per_minute, MIN_WPM), MAX_WPM))
    clauses = TextSplitter("clause", max_words=_MAX_CLAUSE_WORDS)
    words = 0
    chunks = 0
    timed = _ClauseTimer(espeak.sample_rate) if spec.word_timestamps else None

    def send(timings: WordTimings | None) -> None:
        if timings is not None:
            _write_frame(audio_fd, msgspec.msgpack.encode(timings), _WORDS_FLAG)

    def emit(samples: np.ndarray) -> bool:
        nonlocal chunks
        chunks += 1
        _write_frame(audio_fd, samples.astype("<i2").tobytes())
        if timed is not None:
            send(timed.heard(samples))
        if chunks == 1 and final:
            _to_background()
        return True

    def speak(text: str) -> None:
        nonlocal words
        if timed is not None:
            timed.input.add(text)
        for clause in clauses.add(text, final):
            words += len(clause.split())
            if timed is None:
                espeak.synthesize(clause, emit)
                continue
            send(timed.start_clause(clause))
            espeak.synthesize(clause, emit, timed.events)
            send(timed.end_clause())

    final = spec.text_complete
    speak(spec.text)
    while not final:
        size = _HEADER.unpack(_read_exact(text_fd, _HEADER.size))[0]
        final = size == 0
        if final and chunks:
            _to_background()  # a streaming-text request stays at normal priority while text still comes
        speak(_read_exact(text_fd, size).decode() if size else "")
    if timed is not None:
        send(timed.end_input())
    _write_frame(audio_fd, b"")
    os.write(audio_fd, _TRAILER.pack(words, chunks))


class _ClauseTimer:
    """A child's word timings: eSpeak's events of each clause, placed in the request's audio and text."""

    def __init__(self, sample_rate: int) -> None:
        self.rate = sample_rate
        self.input = InputWords()
        self.events: list[SynthEvent] = []  # the clause's, appended by `EspeakLibrary.synthesize`
        self._seen = 0  # of `events`
        self._clause: ClauseWords | None = None
        self.samples = 0  # of the request so far
        self.sound_end = 0  # one past the clause's last audible sample
        self.words_end = 0.0  # where the last timed word ends (s)

    def start_clause(self, clause: str) -> WordTimings | None:
        """Before `clause` is spoken: the timings of the words before it that no clause holds, if any."""
        self.events = []
        self._seen = 0
        self.sound_end = self.samples
        skipped, spans = self.input.spans(clause)
        self._clause = ClauseWords(clause, spans, self.input.text, self.samples, self.rate)
        return WordTimings.silent(skipped, self.input.text, round(self.samples / self.rate, 4)) if skipped else None

    def heard(self, samples: np.ndarray) -> WordTimings | None:
        """After a buffer of the clause: the timings its events complete, if any."""
        if end := last_sound(samples):
            self.sound_end = self.samples + end
        self.samples += len(samples)
        if self._clause is None:
            return None
        for event in self.events[self._seen :]:
            self._clause.event(event)
        self._seen = len(self.events)
        return self._sent(self._clause.ready())

    def end_clause(self) -> WordTimings | None:
        """After the clause's last buffer: the timings of its words not yet sent."""
        clause, self._clause = self._clause, None
        return self._sent(clause.end(self.sound_end)) if clause is not None else None

    def end_input(self) -> WordTimings | None:
        """The timings of the words after the last clause's, if any (the input is complete)."""
        if skipped := self.input.rest():
            return WordTimings.silent(skipped, self.input.text, self.words_end)
        return None

    def _sent(self, timings: WordTimings | None) -> WordTimings | None:
        if timings is not None:
            self.words_end = timings.end[-1]
        return timings


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


class Child:
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
        self.stopped = False  # SIGSTOPped by `BackgroundSlots`

    def start(self, spec: ChildSpec) -> None:
        """Hand the waiting child its request."""
        _write_frame(self.text_fd, msgspec.msgpack.encode(spec))
        self.input_open = not spec.text_complete

    def send_text(self, text: str) -> None:
        if self.input_open and text:  # an empty frame would end the input
            _write_frame(self.text_fd, text.encode())

    def end_input(self) -> None:
        if self.input_open:
            _write_frame(self.text_fd, b"")
            self.input_open = False

    def read(self) -> bytes:
        """Read what the child has written into `buffer` (b"" at its end; `BlockingIOError` if nothing)."""
        data = os.read(self.audio_fd, 1 << 20)
        self.buffer += data
        return data

    def has_audio(self) -> bool:
        """True once the buffer holds more than a frame header: the child's first audio has begun."""
        return len(self.buffer) > _HEADER.size

    def take_output(self) -> tuple[bytes, list[WordTimings], tuple[int, int] | None]:
        """The int16 PCM of every complete frame in the buffer, the word timings among them (each after
        the audio it times), and (words, chunks) once the child is done."""
        buffer = self.buffer
        frames = []
        timings = []
        finished = None
        while len(buffer) >= _HEADER.size:
            size = _HEADER.unpack_from(buffer)[0]
            if size == 0:
                if len(buffer) >= _HEADER.size + _TRAILER.size:
                    finished = _TRAILER.unpack_from(buffer, _HEADER.size)
                break
            flags, size = size & _WORDS_FLAG, size & ~_WORDS_FLAG
            if len(buffer) < _HEADER.size + size:
                break
            payload = bytes(buffer[_HEADER.size : _HEADER.size + size])
            if flags:
                timings.append(msgspec.msgpack.decode(payload, type=WordTimings))
            else:
                frames.append(payload)
            del buffer[: _HEADER.size + size]
        return b"".join(frames), timings, finished

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


class ForkServer:
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

    def take(self) -> Child:
        """The next child asked for (waiting for it if it is not there yet)."""
        if not self._asked:
            self.ask()
        message, fds, _, _ = socket.recv_fds(self.socket, _CHILD_PID.size, 3)
        if len(message) != _CHILD_PID.size or len(fds) != 3:
            raise RuntimeError("the eSpeak fork server stopped")
        self._asked -= 1
        pidfd, text_fd, audio_fd = fds
        os.set_blocking(audio_fd, False)
        return Child(_CHILD_PID.unpack(message)[0], pidfd, text_fd, audio_fd)

    def close(self) -> None:
        self.socket.close()


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


class BackgroundSlots:
    """Lets at most `limit` background children run at once: those whose audio runs out soonest
    (played in real time from its first packet), earliest deadline first.

    Chosen again every `slice_s` (and when a running one leaves); the others are stopped. The
    work is the same, and with `limit` at least the number of CPUs the CPUs stay busy with it.
    """

    def __init__(self, limit: int, sample_rate: int, slice_s: float = _BACKGROUND_SLICE_S) -> None:
        self.limit = limit
        self.rate = sample_rate
        self.slice_s = slice_s
        self.children: dict[str, Child] = {}
        self.stopped = 0
        self._next_at = 0.0

    def add(self, request_id: str, child: Child) -> None:
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
