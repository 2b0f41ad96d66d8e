"""A smaller run of benchmarks/soak_disconnects.py: random client disconnects mid-stream on every protocol.

After the run the server must be idle (0 active requests, 0 WebSocket
sessions), its RSS back near the post-warm-up value (see the bound below), the engine never
restarted, no unhandled exception logged by the API process, and a new
request must succeed.
"""

from __future__ import annotations

import os

from benchmarks.soak_disconnects import soak
from tests.helpers.server import start_server

REQUESTS = int(os.environ.get("SOAK_REQUESTS", "150"))


def test_random_disconnects_leave_nothing_behind(tmp_path):
    log_path = tmp_path / "server.log"
    with open(log_path, "wb") as log:
        server = start_server(stderr=log)
        try:
            result = soak(server, requests=REQUESTS, concurrency=16, warmup=150, seed=1)
        finally:
            server.stop()
    print(result)
    log_text = log_path.read_text(errors="replace")
    assert result["requests"] == REQUESTS and result["n_client_errors"] == 0, result
    assert result["active_after"] == 0 and result["ws_sessions_after"] == 0, result
    assert result["engine_restarts"] == 0 and result["request_after_ok"], result
    # The brief's bound is 10% (checked by benchmarks/soak_disconnects.py over 1000 requests: 1.015-1.059 in three
    # runs). This shorter run scatters more (1.001 and 1.086 measured): the bound leaves room for that while a leak
    # of the size that matters (>100 KB per request) still fails it.
    assert result["api_rss_ratio"] <= 1.15, result
    assert "Exception in ASGI application" not in log_text, log_text[-3000:]
