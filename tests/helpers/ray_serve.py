"""One local Ray cluster, on loopback, with Serve, shared by the replica tests (streamvox.scale).

It starts on first use and stops when the test session ends. Each test module deploys its own
application on it (`ServeCluster.deploy`) and deletes it afterwards.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from streamvox.scale import launch
from streamvox.scale.options import ScaleOptions
from streamvox.server.app import ServerSettings
from tests.helpers.server import free_port

# Two replicas of one app and one of another at a time, one CPU each (the machine may have fewer).
CLUSTER_CPUS = 4


@dataclass
class ServeCluster:
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def headers(self) -> dict[str, str]:
        return {}

    def options(self, **overrides) -> ScaleOptions:
        return dataclasses.replace(ScaleOptions(replicas=2, port=self.port, health_check_period_s=2.0), **overrides)

    def deploy(self, settings: ServerSettings, name: str = launch.APP_NAME, route_prefix: str = "/",
               **overrides) -> ScaleOptions:
        options = self.options(**overrides)
        launch.deploy(settings, options, name=name, route_prefix=route_prefix)
        return options

    def delete(self, name: str = launch.APP_NAME) -> None:
        from ray import serve

        serve.delete(name)


_cluster: ServeCluster | None = None


def serve_cluster(request) -> ServeCluster:
    """The session's cluster (`request`: any fixture's request, for the end-of-session stop)."""
    global _cluster
    if _cluster is None:
        cluster = ServeCluster(free_port())
        options = cluster.options()
        launch.start_ray(options, num_cpus=CLUSTER_CPUS, log_to_driver=False)
        _cluster = cluster
        request.config.add_cleanup(_stop)
    return _cluster


def _stop() -> None:
    global _cluster
    if _cluster is not None:
        launch.stop(_cluster.options())
        _cluster = None


def health_by_replica(url: str, count: int, timeout: float = 60.0,
                      accept: Callable[[dict[str, dict]], bool] | None = None) -> dict[str, dict]:
    """`/health` of `count` different replicas (as the proxy spreads the requests), by replica name.

    With `accept`, keep asking until the replicas seen so far (the last answer of each) satisfy it."""
    seen: dict[str, dict] = {}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            response = httpx.get(f"{url}/health", timeout=10)
        except httpx.HTTPError:
            time.sleep(0.2)
            continue
        name = response.headers.get("x-streamvox-replica")
        if response.status_code == 200 and name:
            seen[name] = response.json()
            if len(seen) >= count and (accept is None or accept(seen)):
                return seen
        else:
            time.sleep(0.2)
    raise TimeoutError(f"saw {len(seen)} healthy replicas of {count}: {sorted(seen)}")


def parent_pid(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[1])


def is_running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def proxy_pid() -> int:
    """This node's Serve proxy process."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                    if b"ProxyActor" in cmdline.read():
                        return int(entry)
            except OSError:
                continue
    raise LookupError("no Serve proxy process")
