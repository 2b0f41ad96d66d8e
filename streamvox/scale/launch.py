"""`streamvox serve --replicas N`: start (or join) Ray, run the replicas behind Serve's proxy, stop on a signal.

Without `--ray-address` a local Ray instance is started, on loopback only. Ray replaces a loopback
`--node-ip-address` with the machine's outward address (and its servers then listen on every
interface) unless it runs in local-only mode, which `RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0` selects
despite its name; it is read when `ray` is first imported, so it is set before that, and the node's
address is checked afterwards.
"""

from __future__ import annotations

import faulthandler
import json
import logging
import os
import signal
import sys
import time
import urllib.error
import urllib.request
import uuid

from streamvox.scale.options import ScaleOptions
from streamvox.scale.proxy import PROBE_PATH, PROXY_CALLBACK
from streamvox.server.app import ServerSettings

log = logging.getLogger(__name__)

APP_NAME = "streamvox"
LOCAL_ONLY_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
PROXY_CALLBACK_ENV = "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH"


def serve_replicas(settings: ServerSettings, options: ScaleOptions) -> int:
    """Run until SIGINT or SIGTERM; then stop the replicas (letting their requests finish) and Ray."""
    try:
        start_ray(options)
        # After ray.init, which sets its own. SIGINT too: a process started with it ignored (a background job of a
        # non-interactive shell) would otherwise never stop on it.
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, _interrupt)
        token = None
        try:
            token = deploy(settings, options)
            where = options.ray_address or "a local Ray instance on 127.0.0.1"
            print(f"streamvox: {options.replicas} replicas of {settings.model} on Ray Serve ({where}), "
                  f"proxy at http://{options.host}:{options.port}", file=sys.stderr, flush=True)
            while True:
                time.sleep(3600)
        finally:
            # Ray's teardown has no time limit of its own: a stop that stalls past the replicas' drain prints every
            # thread's stack and exits (1), rather than hanging unseen.
            faulthandler.dump_traceback_later(options.graceful_shutdown_timeout_s + 60, exit=True)
            stop(options, deployed_by=token)
    except KeyboardInterrupt:
        return 0


def start_ray(options: ScaleOptions, *, num_cpus: int | None = None, log_to_driver: bool = True) -> None:
    """Join `options.ray_address`, or start a loopback-only local instance (`num_cpus`: at least one a replica)."""
    if options.ray_address is None or _on_loopback(options.ray_address):
        os.environ[LOCAL_ONLY_ENV] = "0"
    import ray

    if options.ray_address is not None:
        ray.init(address=options.ray_address, log_to_driver=log_to_driver)
        return
    ray.init(_node_ip_address="127.0.0.1", include_dashboard=False, log_to_driver=log_to_driver,
             num_cpus=num_cpus or max(os.cpu_count() or 1, options.replicas))
    address = ray.util.get_node_ip_address()
    if address != "127.0.0.1":
        ray.shutdown()
        raise RuntimeError(f"the local Ray instance took address {address}, not loopback: ray was imported before "
                           f"{LOCAL_ONLY_ENV}=0 could be set")


def deploy(settings: ServerSettings, options: ScaleOptions, *, name: str = APP_NAME, route_prefix: str = "/") -> str:
    """Start Serve (its proxies with StreamVox's middleware) if it is not running, then run the replicas.

    Running them again (from any command) is a rolling update of the application. Returns this deployment's
    token, which its replicas report (`stop` compares it)."""
    import ray
    from ray import serve
    from ray.serve.config import HTTPOptions

    from streamvox.scale.deployment import application

    serve.start(http_options=HTTPOptions(host=options.host, port=options.port, request_timeout_s=None),
                proxy_location=options.proxy_location,
                controller_options={"runtime_env": {"env_vars": {PROXY_CALLBACK_ENV: PROXY_CALLBACK}}})
    gpus = options.gpus_per_replica
    if gpus is None:
        has_gpus = ray.cluster_resources().get("GPU", 0) > 0
        gpus = 1 if has_gpus and settings.model != "espeak" and settings.model_options.get("device") != "cpu" else 0
    token = uuid.uuid4().hex
    serve.run(application(settings, options, gpus, token), name=name, route_prefix=route_prefix)
    check_proxy(options)
    return token


def check_proxy(options: ScaleOptions, timeout_s: float = 30.0) -> None:
    """Fail unless this node's Serve proxy runs StreamVox's middleware (a Serve instance started elsewhere
    keeps its own proxies: Serve applies new proxy settings only when it starts)."""
    host = "127.0.0.1" if options.host in ("0.0.0.0", "::", "") else options.host
    url = f"http://{host}:{options.port}{PROBE_PATH}"
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                if json.load(response).get("proxy") == "streamvox":
                    return
        except (urllib.error.URLError, OSError, ValueError):
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"Serve's proxy at {host}:{options.port} does not run StreamVox's proxy middleware, so client "
                f"headers could cut streams short and slow readers would not be cancelled. Serve was started "
                f"without it: stop it (`serve shutdown`), or start every Ray node with "
                f"{PROXY_CALLBACK_ENV}={PROXY_CALLBACK} (docs/scaling.md).")
        time.sleep(0.5)


def stop(options: ScaleOptions, *, name: str = APP_NAME, deployed_by: str | None = None) -> None:
    """Stop the replicas (each drains for up to --graceful-shutdown-timeout-s); a local Ray goes too.

    On a cluster of its own (`--ray-address`), the application is left running when another command has
    deployed it since (a rolling update: that command owns it now)."""
    import ray
    from ray import serve

    from streamvox.scale.deployment import DEPLOYMENT

    try:
        if options.ray_address is None:
            serve.shutdown()
            return
        if deployed_by is not None:
            try:
                handle = serve.get_deployment_handle(DEPLOYMENT, app_name=name)
                current = handle.deployed_by.remote().result(timeout_s=30)
            except Exception as exc:  # gone, or too busy to say: it was ours last we knew
                log.warning("could not ask the replicas who deployed them (%s); deleting the application", exc)
                current = deployed_by
            if current != deployed_by:
                print(f"streamvox: application {name!r} was deployed again since; leaving it running",
                      file=sys.stderr)
                return
        serve.delete(name)
    finally:
        ray.shutdown()


def _on_loopback(address: str) -> bool:
    host = address.rpartition(":")[0] or address
    return host in ("localhost", "::1", "[::1]") or host.startswith("127.")


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt
