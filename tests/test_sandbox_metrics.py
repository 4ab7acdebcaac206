"""`GET /metrics` of the sandbox server, read with prometheus_client's own text parser, and the
server's stated concurrency: a burst of that many connections is accepted and served, one more
request is refused with 503 and counted."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request

import pytest

from postrl.sandbox.pool import SandboxPool
from postrl.sandbox.runs import SandboxConfig, SandboxUnavailable
from postrl.sandbox.server import SPARE_THREADS, SandboxServer

parser = pytest.importorskip("prometheus_client.parser", reason="pip install -e '.[tracking]'")
WORKERS, QUEUE = 2, 4


@pytest.fixture(scope="module")
def server():
    try:
        pool = SandboxPool(SandboxConfig(workers=WORKERS))
    except SandboxUnavailable as e:
        pytest.skip(str(e))
    srv = SandboxServer(("127.0.0.1", 0), pool, max_queue=QUEUE)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv, f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()
    pool.close()


def post(url: str, code: str) -> int:
    rq = urllib.request.Request(f"{url}/run_code", data=json.dumps({"code": code}).encode())
    try:
        with urllib.request.urlopen(rq, timeout=60) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def scrape(url: str) -> dict[tuple[str, tuple], float]:
    """{(sample name, sorted labels): value} of every sample on /metrics."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as r:
        assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = r.read().decode()
    families = {f.name: f for f in parser.text_string_to_metric_families(text)}
    assert {"postrl_sandbox_requests", "postrl_sandbox_rejected", "postrl_sandbox_run_seconds",
            "postrl_sandbox_queue_depth", "postrl_sandbox_workers"} <= set(families)
    assert families["postrl_sandbox_run_seconds"].type == "histogram"
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families.values() for s in f.samples}


def test_stated_limits_match_the_pool(server):
    srv, _ = server
    assert srv.capacity == WORKERS + QUEUE
    assert srv.max_threads == srv.capacity + SPARE_THREADS
    assert srv.request_queue_size >= 2 * srv.max_threads
    assert srv.socket.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) == 1


def test_metrics_count_requests_runs_queue_workers_and_rejections(server):
    srv, url = server
    before = scrape(url)
    # one over capacity: WORKERS run, QUEUE wait, 1 is refused at once
    n = srv.capacity + 1
    codes: list[int] = []
    threads = [threading.Thread(target=lambda: codes.append(post(url, "import time; time.sleep(1.0)")))
               for _ in range(n)]
    for t in threads:
        t.start()
    deadline, busy = time.monotonic() + 30, None
    while time.monotonic() < deadline:  # watch the gauges while the burst is in flight
        m = scrape(url)
        busy = (m[("postrl_sandbox_workers", (("state", "busy"),))], m[("postrl_sandbox_queue_depth", ())])
        if busy == (WORKERS, QUEUE):
            break
        time.sleep(0.05)
    assert busy == (WORKERS, QUEUE)
    assert m[("postrl_sandbox_workers", (("state", "idle"),))] == 0
    for t in threads:
        t.join()
    assert sorted(codes) == [200] * srv.capacity + [503]
    post(url, "raise SystemExit(3)")
    after = scrape(url)

    def delta(name, labels=()):
        return after.get((name, labels), 0) - before.get((name, labels), 0)

    assert delta("postrl_sandbox_requests_total", (("status", "Success"),)) == srv.capacity
    assert delta("postrl_sandbox_requests_total", (("status", "Failed"),)) == 1
    assert delta("postrl_sandbox_requests_total", (("status", "Overloaded"),)) == 1
    assert delta("postrl_sandbox_rejected_total") == 1
    assert delta("postrl_sandbox_run_seconds_count") == srv.capacity + 1
    assert delta("postrl_sandbox_run_seconds_bucket", (("le", "0.5"),)) == 1  # the quick SystemExit
    assert delta("postrl_sandbox_run_seconds_bucket", (("le", "+Inf"),)) == srv.capacity + 1
    assert delta("postrl_sandbox_run_seconds_sum") >= srv.capacity * 1.0
    assert after[("postrl_sandbox_queue_depth", ())] == 0
    assert after[("postrl_sandbox_workers", (("state", "idle"),))] == WORKERS


def test_a_burst_of_connections_is_accepted_not_reset(server):
    """Every connection of a burst as large as the thread cap is opened before any is served;
    each gets an answer (200 pong), none is reset or refused."""
    srv, _ = server
    port = srv.server_address[1]
    socks = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(srv.max_threads + 8)]
    for s in socks:
        s.sendall(b"GET /v1/ping HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    answers = []
    for s in socks:
        data = b""
        while chunk := s.recv(4096):
            data += chunk
        s.close()
        answers.append(data.split(b"\r\n", 1)[0])
    assert answers == [b"HTTP/1.1 200 OK"] * len(socks)
