"""A SandboxFusion-compatible HTTP server over a `SandboxPool`.

    POST /run_code   {code, language, compile_timeout, run_timeout, memory_limit_MB, stdin,
                      files, fetch_files}
                  -> {status: Success|Failed|SandboxError, message, compile_result: null,
                      run_result: {status: Finished|Error|TimeLimitExceeded, execution_time,
                      return_code, stdout, stderr, cpu_time}, files, executor_pod_name, isolation}
    GET  /v1/ping -> "pong"
    GET  /metrics -> Prometheus text format (`postrl.sandbox.metrics`)

Capacity. `capacity` = workers (the elastic maximum, when larger) + `max_queue` requests are
accepted at once; one more is answered at once with HTTP 503 and status SandboxError instead of
queueing without bound (SandboxFusion clients retry those). Handler threads are capped at
capacity + `SPARE_THREADS` (so 503s, pings and /metrics are answered while every slot is
taken); connections beyond that wait in the listen backlog, sized `max(128, 2 x threads)`
(the kernel caps it at net.core.somaxconn), and are served as threads free up, not reset.

Bad requests. Whatever the bytes, a request that cannot be run gets a JSON answer
`{"detail": "..."}` naming what is wrong: 400 (malformed HTTP, a body that is not UTF-8 JSON,
a body shorter than its Content-Length), 404, 408 (the body stopped arriving for `io_timeout_s`),
411 (no Content-Length), 413 (over `MAX_BODY_BYTES`), 422 (well-formed JSON with wrong fields),
501 (another method). After an error whose body may be partly unread, the connection is closed.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from postrl.sandbox.metrics import CONTENT_TYPE, ServerMetrics
from postrl.sandbox.pool import SandboxPool
from postrl.sandbox.runs import LANGUAGES, RunRequest, RunResult

MAX_BODY_BYTES = 64 << 20
SPARE_THREADS = 32
"""Handler threads beyond the capacity: for 503 answers, pings and /metrics under full load."""


class BadRequest(ValueError):
    def __init__(self, message: str, code: int = 422):
        super().__init__(message)
        self.code = code


def _text(body: dict, key: str, default: str | None = None) -> str | None:
    """A string field (or None/absent -> default) that is valid Unicode (no lone surrogates)."""
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, str):
        raise BadRequest(f"field '{key}' must be a string, got {type(value).__name__}")
    _unicode(value, f"field '{key}'")
    return value


def _unicode(value: str, what: str) -> None:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise BadRequest(f"{what} holds a lone surrogate at index {e.start}: not valid Unicode text") from None


def _number(body: dict, key: str, default: float | None, upper: float) -> float | None:
    value = body.get(key)
    if value is None or value == 0:  # SandboxFusion clients send 0 / null for "default"
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise BadRequest(f"field '{key}' must be a positive number, got {json.dumps(value)[:40]}")
    return min(float(value), upper)


def _files(body: dict) -> dict[str, str]:
    files = body.get("files") or {}
    if not isinstance(files, dict):
        raise BadRequest(f"field 'files' must be an object of name -> base64 text, got {type(files).__name__}")
    out = {}
    for name, content in files.items():
        _unicode(name, "a name in 'files'")
        if content is not None and not isinstance(content, str):
            raise BadRequest(f"files['{name[:80]}'] must be base64 text, got {type(content).__name__}")
        try:
            base64.b64decode(content or "", validate=True)
        except (binascii.Error, ValueError):
            raise BadRequest(f"files['{name[:80]}'] is not valid base64") from None
        out[name] = content or ""
    return out


def _fetch(body: dict) -> list[str]:
    fetch = body.get("fetch_files") or []
    if not isinstance(fetch, list) or not all(isinstance(f, str) for f in fetch):
        raise BadRequest("field 'fetch_files' must be a list of file names")
    for f in fetch:
        _unicode(f, "a name in 'fetch_files'")
    return fetch


def parse_request(body: object, max_timeout_s: float = 300.0) -> RunRequest:
    """The run a decoded /run_code body asks for; BadRequest (422) naming the first wrong field."""
    if not isinstance(body, dict):
        raise BadRequest(f"the body must be a JSON object, got {type(body).__name__}")
    code = _text(body, "code")
    if code is None:
        raise BadRequest("field 'code' (string) is required")
    lang = _text(body, "language", "python")
    if lang not in LANGUAGES:
        raise BadRequest(f"language {lang[:40]!r} is not supported here; supported: {', '.join(LANGUAGES)}")
    timeout = _number(body, "run_timeout", 10.0, max_timeout_s)
    _number(body, "compile_timeout", None, max_timeout_s)  # nothing is compiled; checked, then unused
    memory = _number(body, "memory_limit_MB", None, 1 << 20)
    return RunRequest(code=code, language=lang, stdin=_text(body, "stdin"), files=_files(body),
                      fetch_files=_fetch(body), timeout_s=max(0.05, timeout),
                      memory_mb=int(memory) if memory is not None else None)


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


def _error_response(message: str) -> dict:
    return {"status": "SandboxError", "message": message, "compile_result": None, "run_result": None, "files": {}}


class SandboxServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, addr: tuple[str, int], pool: SandboxPool, max_queue: int | None = None,
                 io_timeout_s: float = 15.0):
        self.pool = pool
        queue = max_queue if max_queue is not None else (pool.cfg.max_queue or 4 * pool.n_workers)
        self.capacity = max(pool.n_workers, pool.cfg.max_workers) + queue
        """Requests accepted at once (running or waiting for a worker)."""
        self.max_threads = self.capacity + SPARE_THREADS
        self.request_queue_size = max(128, 2 * self.max_threads)  # listen backlog, read by server_activate
        self.io_timeout_s = io_timeout_s
        """Seconds a connection may stay silent (between requests, or inside a body) before it is closed."""
        super().__init__(addr, _Handler)
        self.slots = threading.BoundedSemaphore(self.capacity)
        self.threads = threading.BoundedSemaphore(self.max_threads)
        self.metrics = ServerMetrics(lambda: pool.n_workers, self.capacity)

    def process_request(self, request, client_address) -> None:
        self.threads.acquire()  # at the cap, the accept loop waits: new connections queue in the backlog
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.threads.release()
            raise

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.threads.release()

    def handle_error(self, request, client_address) -> None:
        import sys

        if not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):  # a client that left is no news
            super().handle_error(request, client_address)

    def limits(self) -> str:
        return (f"{self.capacity} requests at once ({self.pool.n_workers} workers + queue), "
                f"{self.max_threads} handler threads, listen backlog {self.request_queue_size}")


class _Handler(BaseHTTPRequestHandler):
    server: SandboxServer
    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        self.timeout = self.server.io_timeout_s
        super().setup()

    def log_message(self, fmt: str, *args) -> None:  # quiet: one line per request is noise
        pass

    def _reply(self, code: int, obj, content_type: str = "application/json") -> None:
        data = obj.encode() if isinstance(obj, str) and content_type != "application/json" else json.dumps(obj).encode()
        try:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            if code == 503:
                self.send_header("Retry-After", "1")
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(data)
        except (ConnectionError, TimeoutError):
            self.close_connection = True

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """http.server's own errors (bad request line, headers, method) as JSON, like ours."""
        self.close_connection = True
        if self.request_version == "HTTP/0.9":  # an unparsable request line: answer in HTTP/1.1 anyway
            self.request_version = "HTTP/1.1"
        short = self.responses.get(code, ("error",))[0]
        self._reply(code, {"detail": message or short})

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/")
        if path == "/v1/ping":
            self._reply(200, "pong")
        elif path == "/metrics":
            self._reply(200, self.server.metrics.render(), CONTENT_TYPE)
        else:
            self._reply(404, {"detail": f"not found: GET {self.path[:200]}"})

    def do_POST(self) -> None:
        try:
            self._post()
        except Exception as e:  # whatever went wrong, the client gets an answer, not a reset
            self.close_connection = True
            self._reply(500, _error_response(f"internal error: {type(e).__name__}: {e}"))

    def _post(self) -> None:
        if self.path.split("?", 1)[0].rstrip("/") != "/run_code":
            self.close_connection = True  # its body is left unread
            self._reply(404, {"detail": f"not found: POST {self.path[:200]}"})
            return
        try:
            req = parse_request(self._json_body())
        except BadRequest as e:
            self.server.metrics.refused("BadRequest")
            if e.code != 422:  # the body's framing or bytes were wrong: more of it may follow
                self.close_connection = True
            self._reply(e.code, {"detail": str(e)})
            return
        if not self.server.slots.acquire(blocking=False):
            self.server.metrics.refused("Overloaded")
            self._reply(503, _error_response("overloaded: too many requests in flight; retry"))
            return
        self._run(req)

    def _run(self, req: RunRequest) -> None:
        metrics = self.server.metrics
        metrics.started()
        code, status, run_s = 200, "SandboxError", None
        try:
            result = self.server.pool.run(req)
            response = to_response(result)
            status, run_s = response["status"], result.wall_s
        except Exception as e:  # a pool fault is the server's error, answered, not a dropped connection
            code, response = 500, _error_response(f"internal error: {type(e).__name__}: {e}")
        finally:
            self.server.slots.release()
            metrics.finished(status, run_s)
        self._reply(code, response)

    def _json_body(self) -> object:
        raw = self._body()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise BadRequest(f"the body is not UTF-8: byte 0x{raw[e.start]:02x} at offset {e.start}", 400) from None
        try:
            return json.loads(text.removeprefix("\ufeff"))
        except json.JSONDecodeError as e:
            raise BadRequest(f"the body is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}", 400) from None
        except RecursionError:
            raise BadRequest("the body is not acceptable JSON: nested too deeply", 400) from None
        except ValueError as e:  # e.g. an integer with more digits than Python converts
            raise BadRequest(f"the body is not acceptable JSON: {e}", 400) from None

    def _body(self) -> bytes:
        """Exactly Content-Length bytes; a missing, malformed or lying length is a BadRequest."""
        lengths = self.headers.get_all("Content-Length") or []
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower() or not lengths:
            self.close_connection = True
            raise BadRequest("Content-Length is required (chunked or unframed bodies are not accepted)", 411)
        if len(set(lengths)) > 1 or not lengths[0].strip().isdigit():
            self.close_connection = True
            raise BadRequest(f"Content-Length must be one non-negative integer, got {', '.join(lengths)[:80]!r}", 400)
        size = int(lengths[0])
        if size > MAX_BODY_BYTES:
            self.close_connection = True
            raise BadRequest(f"the body is {size} bytes; the limit is {MAX_BODY_BYTES}", 413)
        chunks, got = [], 0
        try:
            while got < size:
                chunk = self.rfile.read1(min(size - got, 1 << 20))
                if not chunk:
                    break
                chunks.append(chunk)
                got += len(chunk)
        except TimeoutError:
            self.close_connection = True
            raise BadRequest(f"the body stopped after {got} of {size} bytes (Content-Length) for "
                             f"{self.server.io_timeout_s:g} s", 408) from None
        if got < size:
            self.close_connection = True
            raise BadRequest(f"the body ended after {got} of {size} bytes (Content-Length)", 400)
        return b"".join(chunks)


def serve(pool: SandboxPool, host: str = "127.0.0.1", port: int = 8080) -> SandboxServer:
    """A server bound to host:port (port 0 picks a free one); call serve_forever() on it."""
    return SandboxServer((host, port), pool)
