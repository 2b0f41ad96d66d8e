"""Reading a request's reference audio from a URL, under the server's `MediaPolicy`.

`ref_audio` is base64 or a `data:` URI by default. With `--allow-ref-audio-urls`
it may also be an `http(s)://` URL, fetched with a byte and time cap; every
address the host name resolves to must be public (not loopback, link-local,
private, multicast, reserved or unspecified) unless `--allow-private-ref-audio-urls`
is given, and the connection goes to the address that was checked (no second
DNS lookup, so DNS rebinding cannot swap it). Redirects are not followed.
`file://` URLs are read only under `--allowed-local-media-path DIR`, after
resolving symlinks; a path that escapes DIR is refused. Either way at most
`MAX_REF_AUDIO_BYTES` are read.
"""

from __future__ import annotations

import http.client
import ipaddress
import os
import socket
import ssl
import threading
import time
import urllib.parse
from pathlib import Path

from streamvox.server.errors import APIError
from streamvox.settings import MediaPolicy

MAX_REF_AUDIO_BYTES = 10 * 1024 * 1024  # a reference audio file, however it arrives


def _ref_error(message: str, code: str = "invalid_value") -> APIError:
    return APIError(400, message, "ref_audio", code)


def _public(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not (ip.is_multicast or ip.is_reserved or ip.is_unspecified)


def resolve_checked(host: str, port: int, allow_private: bool) -> list[tuple]:
    """Every address `host` resolves to; refused unless all are public (or private ones are allowed)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise _ref_error(f"'ref_audio' host '{host}' could not be resolved.", "ref_audio_unreachable") from exc
    if not infos:
        raise _ref_error(f"'ref_audio' host '{host}' has no address.", "ref_audio_unreachable")
    if not allow_private:
        for info in infos:
            if not _public(info[4][0]):
                raise _ref_error(f"'ref_audio' host '{host}' resolves to a non-public address ({info[4][0]}); "
                                 "such URLs are refused.", "ref_audio_forbidden")
    return infos


class _PinnedHTTPConnection(http.client.HTTPConnection):
    """Connects to an address that was already resolved and checked, not to a fresh lookup."""

    def __init__(self, host: str, port: int, address: tuple, timeout: float) -> None:
        super().__init__(host, port, timeout=timeout)
        self._address = address

    def connect(self) -> None:
        family, _, _, _, sockaddr = self._address
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(sockaddr)
        except OSError:
            sock.close()
            raise
        self.sock = sock


class _PinnedHTTPSConnection(_PinnedHTTPConnection):
    default_port = 443

    def connect(self) -> None:
        super().connect()
        self.sock = ssl.create_default_context().wrap_socket(self.sock, server_hostname=self.host)


def _cut_off(connection: http.client.HTTPConnection, cut: threading.Event) -> None:
    """The fetch's time is up: end its connection mid-read. A socket timeout bounds each read alone, so a server
    that sends its headers a line at a time would hold the fetch (and its worker thread) for as long as it likes."""
    cut.set()
    if connection.sock is not None:
        try:
            connection.sock.shutdown(socket.SHUT_RDWR)
        except OSError:  # already closed
            pass


def fetch_url(url: str, policy: MediaPolicy) -> bytes:
    """GET an http(s) URL under the policy: checked addresses, no redirects, capped bytes and time.

    Blocking: call it from a worker thread, never on the event loop.
    """
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise _ref_error("'ref_audio' URLs must be http:// or https:// with a host.")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:
        raise _ref_error("'ref_audio' URL has an invalid port.") from exc
    deadline = time.monotonic() + policy.fetch_timeout_s
    infos = resolve_checked(parts.hostname, port, policy.allow_private_urls)
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    last_error: Exception | None = None
    cut = threading.Event()
    for address in infos:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        kind = _PinnedHTTPSConnection if parts.scheme == "https" else _PinnedHTTPConnection
        connection = kind(parts.hostname, port, address, timeout=remaining)
        watchdog = threading.Timer(remaining, _cut_off, (connection, cut))
        watchdog.daemon = True
        watchdog.start()
        try:
            connection.request("GET", path, headers={"User-Agent": "streamvox", "Accept": "audio/*"})
            response = connection.getresponse()
            if response.status != 200:
                raise _ref_error(f"Fetching 'ref_audio' gave HTTP {response.status} (redirects are not "
                                 "followed).", "ref_audio_fetch_failed")
            length = response.getheader("content-length")
            if length is not None and length.isdigit() and int(length) > MAX_REF_AUDIO_BYTES:
                raise _ref_error(f"'ref_audio' is larger than {MAX_REF_AUDIO_BYTES} bytes.", "ref_audio_too_large")
            data = bytearray()
            while len(data) <= MAX_REF_AUDIO_BYTES:
                if time.monotonic() > deadline:
                    raise _ref_error(f"Fetching 'ref_audio' took longer than {policy.fetch_timeout_s:g} s.",
                                     "ref_audio_timeout")
                chunk = response.read1(65536)
                if not chunk:
                    if cut.is_set():  # the watchdog's doing, not the end of the file
                        break
                    return bytes(data)
                data += chunk
            else:
                raise _ref_error(f"'ref_audio' is larger than {MAX_REF_AUDIO_BYTES} bytes.", "ref_audio_too_large")
        except APIError:
            raise
        except (OSError, http.client.HTTPException) as exc:
            last_error = exc
        finally:
            watchdog.cancel()
            connection.close()
    if isinstance(last_error, TimeoutError) or cut.is_set() or time.monotonic() > deadline:
        raise _ref_error(f"Fetching 'ref_audio' took longer than {policy.fetch_timeout_s:g} s.", "ref_audio_timeout")
    raise _ref_error(f"Fetching 'ref_audio' failed: {last_error}", "ref_audio_fetch_failed")


def read_local_file(url: str, policy: MediaPolicy) -> bytes:
    """Read a `file://` URL that lies under the allowed directory (symlinks resolved)."""
    if not policy.local_media_path:
        raise _ref_error("'ref_audio' file:// URLs are refused: the server has no --allowed-local-media-path.",
                         "ref_audio_forbidden")
    parts = urllib.parse.urlsplit(url)
    if parts.netloc not in ("", "localhost"):
        raise _ref_error("'ref_audio' file:// URLs must name a local path (file:///path).")
    root = Path(policy.local_media_path).resolve()
    try:
        path = Path(urllib.parse.unquote(parts.path)).resolve(strict=True)
    except (OSError, RuntimeError, ValueError) as exc:
        raise _ref_error("'ref_audio' file does not exist.", "ref_audio_not_found") from exc
    if not path.is_relative_to(root):
        raise _ref_error("'ref_audio' file lies outside the allowed media directory.", "ref_audio_forbidden")
    if not path.is_file():
        raise _ref_error("'ref_audio' is not a regular file.", "ref_audio_not_found")
    with open(path, "rb") as file:
        if os.fstat(file.fileno()).st_size > MAX_REF_AUDIO_BYTES:
            raise _ref_error(f"'ref_audio' is larger than {MAX_REF_AUDIO_BYTES} bytes.", "ref_audio_too_large")
        return file.read(MAX_REF_AUDIO_BYTES + 1)


def load_ref_audio_url(url: str, policy: MediaPolicy) -> bytes:
    """The bytes behind an http(s):// or file:// `ref_audio` URL, or a 400 saying why not."""
    if url.startswith("file:"):
        return read_local_file(url, policy)
    if not policy.allow_urls:
        raise _ref_error("'ref_audio' URLs are not fetched (the server runs without --allow-ref-audio-urls); "
                         "send the file as base64 or a data: URI.", "ref_audio_forbidden")
    return fetch_url(url, policy)
