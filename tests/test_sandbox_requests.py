"""Malformed and hostile requests to the sandbox server, sent as raw bytes: each gets a 4xx JSON
answer naming what is wrong, never a dropped connection, and the server keeps serving."""

from __future__ import annotations

import json
import socket
import threading

import pytest

from postrl.sandbox.pool import SandboxPool
from postrl.sandbox.runs import SandboxConfig, SandboxUnavailable
from postrl.sandbox.server import MAX_BODY_BYTES, SandboxServer

IO_TIMEOUT_S = 1.0


@pytest.fixture(scope="module")
def port():
    try:
        pool = SandboxPool(SandboxConfig(workers=1))
    except SandboxUnavailable as e:
        pytest.skip(str(e))
    srv = SandboxServer(("127.0.0.1", 0), pool, max_queue=2, io_timeout_s=IO_TIMEOUT_S)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv.server_address[1]
    srv.shutdown()
    srv.server_close()
    pool.close()


def exchange(port: int, raw: bytes, half_close: bool = False) -> tuple[int, dict | str, dict]:
    """Send `raw`, read one whole response; (status, decoded JSON body, headers)."""
    with socket.create_connection(("127.0.0.1", port), timeout=20) as s:
        s.sendall(raw)
        if half_close:
            s.shutdown(socket.SHUT_WR)
        data = b""
        while b"\r\n\r\n" not in data or data.startswith(b"HTTP/1.1 100 "):
            if data.startswith(b"HTTP/1.1 100 ") and b"\r\n\r\n" in data:
                data = data.split(b"\r\n\r\n", 1)[1]  # an interim 100 Continue: the answer follows
                continue
            chunk = s.recv(65536)
            assert chunk, f"connection closed without an answer; got {data!r}"
            data += chunk
        head, body = data.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:])}
        while len(body) < int(headers["content-length"]):
            chunk = s.recv(65536)
            assert chunk, "connection closed mid-answer"
            body += chunk
    status = int(lines[0].split()[1])
    assert lines[0].startswith("HTTP/1.1 ")
    assert headers["content-type"] == "application/json"
    return status, json.loads(body), headers


def post(body: bytes, extra: str = "", length: int | None = None) -> bytes:
    size = len(body) if length is None else length
    return (f"POST /run_code HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{extra}"
            f"Content-Length: {size}\r\n\r\n").encode() + body


BAD_BODIES = [  # (body bytes, status, words the detail must hold)
    (b"[" * 200_000, 400, "nested too deeply"),
    (b'{"code": ', 400, "not valid JSON"),
    (b'{"code": "\xff\xfe"}', 400, "not UTF-8: byte 0xff"),
    (b'{"code": "x", "run_timeout": 1' + b"1" * 5000 + b"}", 400, "not acceptable JSON"),
    (b"", 400, "not valid JSON"),
    (b'{"code": "\\ud800"}', 422, "field 'code' holds a lone surrogate"),
    (b"[1, 2]", 422, "must be a JSON object, got list"),
    (b'"print(1)"', 422, "must be a JSON object, got str"),
    (b"null", 422, "must be a JSON object, got NoneType"),
    (b'{"code": 5}', 422, "field 'code' must be a string, got int"),
    (b'{"language": "python"}', 422, "field 'code' (string) is required"),
    (b'{"code": "1", "language": ["python"]}', 422, "field 'language' must be a string"),
    (b'{"code": "1", "language": "cobol"}', 422, "'cobol' is not supported"),
    (b'{"code": "1", "stdin": 5}', 422, "field 'stdin' must be a string"),
    (b'{"code": "1", "files": ["a"]}', 422, "field 'files' must be an object"),
    (b'{"code": "1", "files": {"a": 5}}', 422, "files['a'] must be base64 text"),
    (b'{"code": "1", "files": {"a": "!!not base64"}}', 422, "files['a'] is not valid base64"),
    (b'{"code": "1", "fetch_files": "out.txt"}', 422, "field 'fetch_files' must be a list"),
    (b'{"code": "1", "fetch_files": [1]}', 422, "field 'fetch_files' must be a list"),
    (b'{"code": "1", "run_timeout": "fast"}', 422, "field 'run_timeout' must be a positive number"),
    (b'{"code": "1", "run_timeout": -1}', 422, "field 'run_timeout' must be a positive number"),
    (b'{"code": "1", "run_timeout": NaN}', 422, "field 'run_timeout' must be a positive number"),
    (b'{"code": "1", "run_timeout": 1e999}', 422, "field 'run_timeout' must be a positive number"),
    (b'{"code": "1", "memory_limit_MB": true}', 422, "field 'memory_limit_MB' must be a positive number"),
    (b'{"code": "1", "compile_timeout": {}}', 422, "field 'compile_timeout' must be a positive number"),
]


@pytest.mark.parametrize(("body", "status", "words"), BAD_BODIES, ids=[str(i) for i in range(len(BAD_BODIES))])
def test_bad_body_gets_a_json_4xx_naming_it(port, body, status, words):
    code, answer, _ = exchange(port, post(body))
    assert code == status and words in answer["detail"], answer


BAD_FRAMING = [  # (raw request, status, words, half_close)
    (b"POST /run_code HTTP/1.1\r\nHost: x\r\n\r\n{}", 411, "Content-Length is required", False),
    (b"POST /run_code HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n", 411, "chunked", False),
    (post(b"{}", length=-5), 400, "non-negative integer", False),
    (b"POST /run_code HTTP/1.1\r\nContent-Length: abc\r\n\r\n{}", 400, "non-negative integer", False),
    (b"POST /run_code HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}", 400, "one non-negative", False),
    (post(b'{"code": "print(1)"}', length=10), 400, "not valid JSON", False),  # lying low: truncated
    (post(b'{"code": "print(1)"}', length=500), 400, "ended after 20 of 500 bytes", True),  # lying high, then EOF
    (post(b'{"code": "print(1)"}', length=500), 408, "stopped after 20 of 500 bytes", False),  # lying high, silent
    (post(b"", length=MAX_BODY_BYTES + 1), 413, "the limit is", False),
    (b"HELLO\r\n\r\n", 400, "Bad request", False),
    (b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\n\r\n", 414, "URI Too Long", False),
    (b"GET /v1/ping HTTP/1.1\r\nX: " + b"a" * 70_000 + b"\r\n\r\n", 431, "Line too long", False),
    (b"GET /v1/ping HTTP/1.1\r\n" + b"X: 1\r\n" * 150 + b"\r\n", 431, "Too many headers", False),
    (b"PUT /run_code HTTP/1.1\r\nContent-Length: 0\r\n\r\n", 501, "Unsupported method", False),
    (b"GET /nothing HTTP/1.1\r\n\r\n", 404, "not found: GET /nothing", False),
    (b"POST /nothing HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}", 404, "not found: POST /nothing", False),
]


@pytest.mark.parametrize(("raw", "status", "words", "half_close"), BAD_FRAMING,
                         ids=[str(i) for i in range(len(BAD_FRAMING))])
def test_bad_framing_gets_a_json_4xx_naming_it(port, raw, status, words, half_close):
    code, answer, headers = exchange(port, raw, half_close)
    assert code == status and words in answer["detail"], answer
    if raw.startswith(b"POST"):  # what is left of its body is not read as another request
        assert headers.get("connection") == "close"


def test_good_requests_still_work_after_the_hostile_ones(port):
    code, answer, _ = exchange(port, post(b'{"code": "print(6 * 7)", "run_timeout": 0, "memory_limit_MB": null}'))
    assert code == 200 and answer["status"] == "Success" and answer["run_result"]["stdout"] == "42\n"
    code, answer, _ = exchange(port, post(b'\xef\xbb\xbf{"code": "print(1)"}', extra="Expect: 100-continue\r\n"))
    assert code == 200 and answer["run_result"]["stdout"] == "1\n"  # after the 100 Continue it asked for
