"""Starting and joining Ray: the local cluster stays on loopback, and `streamvox serve --replicas` joins one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import httpx

from tests.helpers.ray_serve import serve_cluster

# 127.0.0.1, ::1 and ::ffff:127.0.0.1 as /proc/net/tcp* write them
LOOPBACK = {"0100007F", "00000000000000000000000001000000", "0000000000000000FFFF00000100007F"}


def _descendants(root: int) -> set[int]:
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    parents[int(entry)] = int(stat.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
    found, frontier = set(), {root}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier}
        found |= frontier
    return found


def _socket_inodes(pids: set[int]) -> set[str]:
    inodes = set()
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[len("socket:["):-1])
        except OSError:
            continue
    return inodes


def test_the_local_cluster_listens_on_loopback_only(request):
    serve_cluster(request)  # before `import ray`: launch sets up local-only mode first
    import ray

    assert ray.util.get_node_ip_address() == "127.0.0.1"
    ours = _socket_inodes(_descendants(os.getpid()) | {os.getpid()})
    listening = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as lines:
            for line in list(lines)[1:]:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in ours:  # LISTEN, by this process or what it started
                    listening.append(fields[1].split(":")[0])
    assert listening and set(listening) <= LOOPBACK, listening


class Command:
    """`streamvox serve --replicas 1` joining the session's cluster, with its stderr collected."""

    def __init__(self, cluster, address: str) -> None:
        command = [sys.executable, "-m", "streamvox.cli", "serve", "--replicas", "1", "--ray-address", address,
                   "--port", str(cluster.port)]
        # Started with SIGINT ignored, as a non-interactive shell starts a background job: it must still stop on it.
        self.process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True,
                                        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
        self.lines: list[str] = []
        threading.Thread(target=lambda: self.lines.extend(self.process.stderr), daemon=True).start()

    def wait_for(self, text: str, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while not any(text in line for line in self.lines):
            assert self.process.poll() is None or any(text in line for line in self.lines), "".join(self.lines)
            assert time.monotonic() < deadline, f"no {text!r} from the command"
            time.sleep(0.3)

    def interrupt(self) -> int:
        """SIGINT, then its exit status. A stop that stalls exits by itself after the drain plus 60 s (120 s
        here), printing its threads' stacks: they are in the failure's message."""
        self.process.send_signal(signal.SIGINT)
        try:
            return self.process.wait(180)
        except subprocess.TimeoutExpired:
            raise AssertionError("the command did not stop:\n" + "".join(self.lines[-200:])) from None

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def _replica(cluster) -> str:
    health = httpx.get(f"{cluster.url}/health", timeout=10)
    assert health.status_code == 200 and health.json()["replica"] == health.headers["x-streamvox-replica"]
    return health.json()["replica"]


def test_serve_replicas_joins_a_running_cluster_and_hands_over_in_a_rolling_update(request):
    cluster = serve_cluster(request)
    import ray

    address = ray.get_runtime_context().gcs_address
    first = Command(cluster, address)
    second = None
    try:
        first.wait_for("1 replicas of espeak on Ray Serve")
        before = _replica(cluster)
        second = Command(cluster, address)  # the same application again: Serve rolls it over
        second.wait_for("1 replicas of espeak on Ray Serve")
        assert _replica(cluster) != before
        assert first.interrupt() == 0  # the application is the second command's now: it stays
        first.wait_for("was deployed again since; leaving it running")
        _replica(cluster)
        assert second.interrupt() == 0
    finally:
        first.kill()
        if second is not None:
            second.kill()
    gone = httpx.get(f"{cluster.url}/health", timeout=10)  # the app is deleted; Serve's own 404, in our shape
    assert gone.status_code == 404 and gone.json()["error"]["code"] == "replica_unavailable"
