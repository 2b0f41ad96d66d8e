"""Real `streamvox serve` processes on real ports, as tests and benchmarks start them."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass

import httpx


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Server:
    process: subprocess.Popen
    port: int
    api_key: str | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def metric(self, name: str) -> float:
        text = httpx.get(f"{self.url}/metrics", headers=self.headers()).text
        for line in text.splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
        raise KeyError(name)

    def wait_healthy(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited with {self.process.returncode}")
            try:
                if httpx.get(f"{self.url}/health", headers=self.headers(), timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise TimeoutError("server did not become healthy")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_server(*args: str, api_key: str | None = None, env: dict | None = None, stderr=None,
                 timeout: float = 120.0) -> Server:
    """`stderr`: a file to send the server's stderr to (default: inherited); `timeout`: seconds to wait for
    /health (a GPU model's start-up compiles and captures CUDA graphs)."""
    port = free_port()
    command = [sys.executable, "-m", "streamvox.cli", "serve", "--port", str(port), "--log-level", "warning", *args]
    if api_key:
        command += ["--api-key", api_key]
    process = subprocess.Popen(command, env={**os.environ, **(env or {})}, stderr=stderr)
    server = Server(process, port, api_key)
    try:
        server.wait_healthy(timeout)
    except Exception:
        server.stop()
        raise
    return server
