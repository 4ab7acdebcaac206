"""A SandboxFusion-compatible HTTP server over a `SandboxPool`.

    POST /run_code   {code, language, compile_timeout, run_timeout, memory_limit_MB, stdin,
                      files, fetch_files}
                  -> {status: Success|Failed|SandboxError, message, compile_result: null,
                      run_result: {status: Finished|Error|TimeLimitExceeded, execution_time,
                      return_code, stdout, stderr, cpu_time}, files, executor_pod_name, isolation}
    GET  /v1/ping -> "pong"

Under overload (more requests than workers + `max_queue`) it answers at once with HTTP 503 and
status SandboxError instead of queueing without bound; SandboxFusion clients retry those.
"""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from postrl.sandbox.pool import LANGUAGES, RunRequest, RunResult, SandboxPool

MAX_BODY_BYTES = 64 << 20


class BadRequest(ValueError):
    pass


def parse_request(body: dict, max_timeout_s: float = 300.0) -> RunRequest:
    if not isinstance(body, dict) or not isinstance(body.get("code"), str):
        raise BadRequest("field 'code' (string) is required")
    lang = body.get("language", "python")
    if lang not in LANGUAGES:
        raise BadRequest(f"language {lang!r} is not supported here; supported: {', '.join(LANGUAGES)}")
    files = body.get("files") or {}
    fetch = body.get("fetch_files") or []
    if not isinstance(files, dict) or not isinstance(fetch, list):
        raise BadRequest("'files' must be an object and 'fetch_files' a list")
    try:
        timeout = min(float(body.get("run_timeout") or 10.0), max_timeout_s)
        memory = int(body["memory_limit_MB"]) if body.get("memory_limit_MB") else None
    except (TypeError, ValueError):
        raise BadRequest("run_timeout and memory_limit_MB must be numbers") from None
    stdin = body.get("stdin")
    return RunRequest(code=body["code"], language=lang, stdin=stdin if isinstance(stdin, str) else None,
                      files={str(k): v or "" for k, v in files.items()}, fetch_files=[str(f) for f in fetch],
                      timeout_s=max(0.05, timeout), memory_mb=memory)


def to_response(r: RunResult) -> dict:
    run_status = {"finished": "Finished", "timeout": "TimeLimitExceeded"}.get(r.status, "Error")
    if r.status == "error":
        return {"status": "SandboxError", "message": r.message or "sandbox error", "compile_result": None,
                "run_result": None, "executor_pod_name": socket.gethostname(), "files": {},
                "isolation": r.isolation}
    message = "output limit exceeded" if r.status == "output_limit" else r.message
    ok = r.status == "finished" and r.exit_code == 0
    return {
        "status": "Success" if ok else "Failed",
        "message": message,
        "compile_result": None,
        "run_result": {
            "status": run_status, "execution_time": r.wall_s, "cpu_time": r.cpu_s,
            "return_code": r.exit_code if r.status == "finished" else None,
            "stdout": r.stdout, "stderr": r.stderr,
        },
        "executor_pod_name": socket.gethostname(),
        "files": r.files,
        "isolation": r.isolation,
    }


class SandboxServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, addr: tuple[str, int], pool: SandboxPool, max_queue: int | None = None):
        super().__init__(addr, _Handler)
        self.pool = pool
        queue = max_queue if max_queue is not None else (pool.cfg.max_queue or 4 * pool.n_workers)
        self.slots = threading.BoundedSemaphore(pool.n_workers + queue)


class _Handler(BaseHTTPRequestHandler):
    server: SandboxServer
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt: str, *args) -> None:  # quiet: one line per request is noise
        pass

    def _reply(self, code: int, obj) -> None:
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if code == 503:
            self.send_header("Retry-After", "1")
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path.rstrip("/") == "/v1/ping":
            self._reply(200, "pong")
        else:
            self._reply(404, {"detail": "Not Found"})

    def do_POST(self) -> None:
        if self.path.rstrip("/") != "/run_code":
            self._reply(404, {"detail": "Not Found"})
            return
        try:
            size = int(self.headers.get("Content-Length") or 0)
            if size > MAX_BODY_BYTES:
                raise BadRequest("request body too large")
            body = json.loads(self.rfile.read(size) or b"null")
            req = parse_request(body)
        except (BadRequest, ValueError) as e:
            self._reply(422, {"detail": str(e)})
            return
        if not self.server.slots.acquire(blocking=False):
            self._reply(503, {"status": "SandboxError", "message": "overloaded: too many requests in flight; retry",
                              "compile_result": None, "run_result": None, "files": {}})
            return
        try:
            result = self.server.pool.run(req)
        finally:
            self.server.slots.release()
        self._reply(200, to_response(result))


def serve(pool: SandboxPool, host: str = "127.0.0.1", port: int = 8080) -> SandboxServer:
    """A server bound to host:port (port 0 picks a free one); call serve_forever() on it."""
    return SandboxServer((host, port), pool)
