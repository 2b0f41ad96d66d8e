"""Keeps the engine core process running: spawn it, watch it, restart it with backoff, shut it down.

The supervisor owns the core process and the ZMQ sockets to it. It hands
each message from the core to `on_message`, and tells `on_exit` when a core
has exited (before any restart), so the client can fail what that core held.
The client marks a new core ready (`mark_ready`) once it has told it what it
must know (the cloned voices). A core whose model cannot load sends one line
saying why through a pipe of its own and exits: the first start then raises
`ModelLoadFailed` with that line; a restart logs it.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import tempfile
import time
import uuid
from collections.abc import Callable
from multiprocessing.connection import Connection

import zmq

from streamvox.engine import messages as m
from streamvox.engine.core import run_engine_core
from streamvox.engine.events import EngineUnavailable

log = logging.getLogger(__name__)

_MAX_MESSAGES_PER_WAKEUP = 256


class ModelLoadFailed(EngineUnavailable):
    """The engine core could not load its model; the message is one line with the cause and the fix."""


class EngineSupervisor:
    """The engine core process of one `AsyncEngine`, and its restarts."""

    def __init__(
        self,
        model: str,
        model_options: dict,
        *,
        on_message: Callable[[list[zmq.Frame]], None],
        on_exit: Callable[[], None],
        restart_on_crash: bool = True,
        start_timeout_s: float = 600.0,
        restart_backoff_initial_s: float = 0.5,
        restart_backoff_max_s: float = 30.0,
        stable_after_s: float = 30.0,
    ) -> None:
        self.model = model
        self.model_options = model_options  # keyword arguments of `streamvox.models.registry.load_runner`
        self.on_message = on_message
        self.on_exit = on_exit
        self.restart_on_crash = restart_on_crash
        self.start_timeout_s = start_timeout_s
        self.on_core_exit: Callable[[int | None], None] | None = None  # instead of restarting: e.g. exit the server
        self.process: multiprocessing.process.BaseProcess | None = None
        self._load_failures: Connection | None = None  # the running core's: one line if its model cannot load
        self.load_failure: str | None = None  # that line, from the last core that exited
        self._ready = asyncio.Event()
        self._core_exited = asyncio.Event()
        self._closing = False
        self._ipc_dir = tempfile.mkdtemp(prefix="streamvox-")
        self._context = zmq.Context()
        self._outbox: zmq.Socket | None = None
        self._inbox: zmq.Socket | None = None
        self.restarts = 0
        # Restart backoff: the first restart after a core that ran for `stable_after_s` is immediate; each
        # further quick failure doubles the wait (initial, 2x, 4x, ... up to the max), so an engine that
        # fails at start does not spin.
        self.restart_backoff_initial_s = restart_backoff_initial_s
        self.restart_backoff_max_s = restart_backoff_max_s
        self.stable_after_s = stable_after_s
        self.consecutive_failures = 0
        self.next_restart_at: float | None = None  # monotonic time of the pending restart, while backing off
        self._spawned_at = 0.0
        self._ever_ready = False

    @property
    def is_ready(self) -> bool:
        return self._ready.is_set() and self.process is not None and self.process.is_alive()

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    @property
    def restart_in_s(self) -> float | None:
        """Seconds until the next restart attempt while backing off, else None."""
        if self.next_restart_at is None:
            return None
        return max(0.0, self.next_restart_at - time.monotonic())

    async def start(self) -> None:
        """Start the core process and wait until it is ready."""
        await self._spawn()
        await self.wait_ready()

    async def wait_ready(self) -> None:
        """Wait for the core to be marked ready; fail at once if the core exits first."""
        ready = asyncio.ensure_future(self._ready.wait())
        exited = asyncio.ensure_future(self._core_exited.wait())
        try:
            await asyncio.wait({ready, exited}, timeout=self.start_timeout_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            ready.cancel()
            exited.cancel()
        if self._ready.is_set():
            return
        if self._core_exited.is_set():
            if self.load_failure is not None:
                raise ModelLoadFailed(self.load_failure)
            raise EngineUnavailable("engine core exited before its model was ready; its log above says why")
        raise EngineUnavailable(f"engine core did not become ready in {self.start_timeout_s} s")

    def mark_ready(self, model_name: str) -> None:
        self._ever_ready = True
        self._ready.set()
        log.info("engine core ready: model %s (pid %s)", model_name, self.pid)

    def send(self, message: m.CoreInput) -> None:
        """To the running core; dropped while none runs (its requests have failed already)."""
        if self._outbox is not None:
            self._outbox.send(m.input_encoder.encode(message))

    async def shutdown(self) -> None:
        """Stop the core (asking a ready one first, then killing) and close the transport; no restart follows.
        The core ignores SIGINT and SIGTERM: this is how it stops."""
        self._closing = True
        process = self.process
        if process is not None and process.is_alive():
            if self._ready.is_set():  # a core still loading its model reads no messages
                self.send(m.Shutdown())
                await asyncio.to_thread(process.join, 5)
            if process.is_alive():
                process.kill()
                await asyncio.to_thread(process.join, 5)
        if process is not None and process.exitcode is not None:
            try:
                asyncio.get_running_loop().remove_reader(process.sentinel)
            except (ValueError, OSError):
                pass

    def close(self) -> None:
        """Close the sockets, the load-failure pipe and the ZMQ context (after `shutdown`)."""
        self._close_sockets()
        if self._load_failures is not None:
            self._load_failures.close()
            self._load_failures = None
        self._context.term()

    async def _spawn(self) -> None:
        tag = uuid.uuid4().hex[:8]
        input_address = f"ipc://{self._ipc_dir}/in-{tag}"
        output_address = f"ipc://{self._ipc_dir}/out-{tag}"
        self._outbox = self._context.socket(zmq.PUSH)
        self._outbox.bind(input_address)
        self._inbox = self._context.socket(zmq.PULL)
        self._inbox.bind(output_address)
        self._ready.clear()
        self._core_exited.clear()
        self.load_failure = None
        self._spawned_at = time.monotonic()
        context = multiprocessing.get_context("spawn")
        self._load_failures, failures_out = context.Pipe(duplex=False)
        self.process = context.Process(
            target=run_engine_core, args=(self.model, self.model_options, input_address, output_address, failures_out),
            daemon=True)
        await asyncio.to_thread(self.process.start)  # spawning pickles and forks: keep it off the loop
        failures_out.close()  # the core holds its own end
        loop = asyncio.get_running_loop()
        loop.add_reader(self.process.sentinel, self._on_process_exit, self.process)
        loop.add_reader(self._inbox.getsockopt(zmq.FD), self._on_inbox_readable)
        self._on_inbox_readable()  # messages may already be queued: the FD only signals new edges

    def _on_process_exit(self, process: multiprocessing.process.BaseProcess) -> None:
        asyncio.get_running_loop().remove_reader(process.sentinel)
        if process is not self.process:
            return
        self._ready.clear()
        self.load_failure = self._read_load_failure()
        self._core_exited.set()
        self.on_exit()
        self._close_sockets()
        asyncio.create_task(self._after_exit(process))

    async def _after_exit(self, process: multiprocessing.process.BaseProcess) -> None:
        await asyncio.to_thread(process.join)
        if self._closing or not self._ever_ready:
            return  # a failed first start: `wait_ready` reports it; restarting would only loop
        if self.load_failure is not None:
            log.error("engine core could not load its model: %s", self.load_failure)
        else:
            log.error("engine core exited with code %s", process.exitcode)
        if self.on_core_exit is not None:
            self.on_core_exit(process.exitcode)
        elif self.restart_on_crash:
            if time.monotonic() - self._spawned_at >= self.stable_after_s:
                self.consecutive_failures = 0
            delay = 0.0 if self.consecutive_failures == 0 else min(
                self.restart_backoff_initial_s * 2 ** (self.consecutive_failures - 1), self.restart_backoff_max_s)
            self.consecutive_failures += 1
            if delay > 0:
                log.error("engine core failed %d times in a row; restarting in %.1f s",
                          self.consecutive_failures, delay)
                self.next_restart_at = time.monotonic() + delay
                try:
                    await asyncio.sleep(delay)
                finally:
                    self.next_restart_at = None
                if self._closing:
                    return
            self.restarts += 1
            await self._spawn()

    def _read_load_failure(self) -> str | None:
        """The line an exited core sent before exiting, if any (it is in the pipe already: no wait)."""
        pipe, self._load_failures = self._load_failures, None
        if pipe is None:
            return None
        try:
            return pipe.recv() if pipe.poll() else None
        except (EOFError, OSError):
            return None
        finally:
            pipe.close()

    def _close_sockets(self) -> None:
        if self._inbox is not None:
            asyncio.get_running_loop().remove_reader(self._inbox.getsockopt(zmq.FD))
        for socket in (self._outbox, self._inbox):
            if socket is not None:
                socket.close(linger=0)
        self._outbox = self._inbox = None

    def _on_inbox_readable(self) -> None:
        """Drain a bounded batch of core messages; reschedule while more are queued.

        The ZMQ socket's file descriptor is edge-triggered, so after a batch we
        look at ZMQ_EVENTS ourselves rather than wait for the next edge.
        """
        inbox = self._inbox
        if inbox is None:
            return
        for _ in range(_MAX_MESSAGES_PER_WAKEUP):
            try:
                frames = inbox.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            self.on_message(frames)
        if inbox.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            asyncio.get_running_loop().call_soon(self._on_inbox_readable)
