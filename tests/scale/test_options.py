"""`streamvox serve --replicas N`: the flags, each replica's stream capacity, and Ray only when asked for."""

from __future__ import annotations

import inspect
import subprocess
import sys

import pytest

from streamvox.cli import build_parser
from streamvox.models.qwen3_tts.runtime.runner import Qwen3TTSRunner
from streamvox.scale.options import ESPEAK_STREAMS, QWEN3_DEFAULT_MAX_BATCH, ScaleOptions, scale_options


def options(*argv: str) -> ScaleOptions | None:
    return scale_options(build_parser().parse_args(["serve", *argv]))


def test_without_replicas_there_is_no_scale_and_no_ray():
    assert options() is None
    code = ("import sys; from streamvox.cli import build_parser, _serve; "
            "args = build_parser().parse_args(['serve']); "
            "from streamvox.scale.options import scale_options; assert scale_options(args) is None; "
            "assert not any(m == 'ray' or m.startswith('ray.') for m in sys.modules), 'ray was imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_flags():
    scale = options("--replicas", "3", "--ray-address", "10.0.0.1:6379", "--port", "9000", "--host", "0.0.0.0",
                    "--replica-max-streams", "48", "--replica-max-queued", "100",
                    "--graceful-shutdown-timeout-s", "120", "--max-surge-percent", "50", "--proxy-location", "HeadOnly")
    assert scale == ScaleOptions(replicas=3, ray_address="10.0.0.1:6379", host="0.0.0.0", port=9000,
                                 max_streams=48, max_queued=100, graceful_shutdown_timeout_s=120,
                                 max_surge_percent=50, proxy_location="HeadOnly")


@pytest.mark.parametrize("argv, message", [
    (["--ray-address", "h:6379"], "needs --replicas"),
    (["--replicas", "0"], "at least 1"),
    (["--replicas", "2", "--device", "cuda:1"], "--device is auto, cpu or cuda"),
    (["--replicas", "2", "--replica-max-streams", "0"], "--replica-max-streams must be at least 1"),
    (["--replicas", "2", "--max-surge-percent", "150"], "between 0 and 100"),
])
def test_bad_flags_are_refused(argv, message):
    with pytest.raises(SystemExit, match=message):
        options(*argv)


def test_streams_per_replica_follow_the_engines_capacity():
    scale = ScaleOptions(replicas=2)
    assert scale.streams_per_replica("espeak", {}) == ESPEAK_STREAMS
    assert scale.streams_per_replica("/models/qwen", {"max_batch": None}) == QWEN3_DEFAULT_MAX_BATCH
    assert scale.streams_per_replica("/models/qwen", {"max_batch": 64}) == 64
    assert ScaleOptions(replicas=2, max_streams=8).streams_per_replica("/models/qwen", {"max_batch": 64}) == 8
    assert scale.queued_per_proxy("/models/qwen", {"max_batch": 64}) == 64
    assert ScaleOptions(replicas=2, max_queued=5).queued_per_proxy("espeak", {}) == 5
    # Without --max-batch the runner's own batch is the capacity.
    assert inspect.signature(Qwen3TTSRunner).parameters["max_batch"].default == QWEN3_DEFAULT_MAX_BATCH
