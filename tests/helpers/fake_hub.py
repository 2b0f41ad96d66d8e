"""A stand-in for the Hugging Face Hub on a loopback port (point HF_ENDPOINT at `url`): it serves the model
repositories it is given from local directories, the way `huggingface_hub.snapshot_download` fetches them, and
answers every other repository as the Hub answers one that does not exist."""

from __future__ import annotations

import hashlib
import json
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

COMMIT = "0123456789abcdef0123456789abcdef01234567"


class FakeHub:
    def __init__(self, repos: dict[str, Path] | None = None) -> None:
        self.repos = {name: Path(path) for name, path in (repos or {}).items()}
        self.requests: list[str] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> FakeHub:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # quiet
                pass

            def do_GET(self) -> None:
                self._answer(body=True)

            def do_HEAD(self) -> None:
                self._answer(body=False)

            def _answer(self, body: bool) -> None:
                path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
                hub.requests.append(f"{self.command} {path}")
                if path.startswith("/api/models/"):  # /api/models/{owner}/{name}/(revision|tree)/{revision}
                    parts = path.split("/")
                    repo = "/".join(parts[3:5])
                    if repo not in hub.repos:
                        return self._not_found()
                    files = {p.relative_to(hub.repos[repo]).as_posix(): p.read_bytes()
                             for p in sorted(hub.repos[repo].rglob("*")) if p.is_file()}
                    if parts[5:6] == ["tree"]:
                        answer = [{"type": "file", "path": name, "size": len(data),
                                   "oid": hashlib.sha1(data).hexdigest()} for name, data in files.items()]
                    else:
                        answer = {"id": repo, "modelId": repo, "sha": COMMIT, "private": False,
                                  "siblings": [{"rfilename": name} for name in files]}
                    return self._send(json.dumps(answer).encode(), "application/json", body)
                parts = path.lstrip("/").split("/")  # {owner}/{name}/resolve/{revision}/{file...}
                repo = "/".join(parts[:2])
                if len(parts) < 5 or parts[2] != "resolve" or repo not in hub.repos:
                    return self._not_found()
                file = hub.repos[repo] / "/".join(parts[4:])
                if not file.is_file():
                    return self._not_found("EntryNotFound")
                data = file.read_bytes()
                headers = {"X-Repo-Commit": COMMIT, "ETag": f'"{hashlib.sha256(data).hexdigest()}"'}
                return self._send(data, "application/octet-stream", body, headers)

            def _not_found(self, code: str = "RepoNotFound") -> None:
                data = json.dumps({"error": "Repository not found"}).encode()
                self._send(data, "application/json", True, {"X-Error-Code": code}, status=404)

            def _send(self, data: bytes, kind: str, body: bool, headers: dict | None = None,
                      status: int = 200) -> None:
                self.send_response(status)
                for name, value in {"Content-Type": kind, "Content-Length": str(len(data)), **(headers or {})}.items():
                    self.send_header(name, value)
                self.end_headers()
                if body:
                    self.wfile.write(data)

        return Handler
