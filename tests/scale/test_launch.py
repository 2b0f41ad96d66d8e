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


def test_serve_replicas_joins_a_running_cluster_and_leaves_it(request):
    cluster = serve_cluster(request)
    import ray

    address = ray.get_runtime_context().gcs_address
    command = [sys.executable, "-m", "streamvox.cli", "serve", "--replicas", "1", "--ray-address", address,
               "--port", str(cluster.port)]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(process.stderr), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 180
        while not any("1 replicas of espeak on Ray Serve" in line for line in lines):
            assert process.poll() is None, "".join(lines)
            assert time.monotonic() < deadline, "the replica did not come up"
            time.sleep(0.5)
        health = httpx.get(f"{cluster.url}/health", timeout=10)
        assert health.status_code == 200 and health.json()["replica"] == health.headers["x-streamvox-replica"]
        process.send_signal(signal.SIGINT)
        assert process.wait(120) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    gone = httpx.get(f"{cluster.url}/health", timeout=10)  # the app is deleted; Serve's own 404, in our shape
    assert gone.status_code == 404 and gone.json()["error"]["code"] == "replica_unavailable"
