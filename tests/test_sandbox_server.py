"""The SandboxFusion-compatible server over real HTTP, driven by the real `sandbox-fusion`
client, postrl's own client, and the CLI."""

from __future__ import annotations

import base64
import json
import threading
import urllib.error
import urllib.request

import pytest
from sandbox_fusion import RunCodeRequest, RunStatus, run_code
from sandbox_fusion.models import CommandRunStatus

from postrl.cli import main as cli_main
from postrl.sandbox.client import RemoteSandbox
from postrl.sandbox.judge import CodeJudge, CodeProblem
from postrl.sandbox.pool import SandboxPool
from postrl.sandbox.runs import RunRequest, SandboxConfig, SandboxUnavailable
from postrl.sandbox.server import SandboxServer


@pytest.fixture(scope="module")
def server():
    try:
        pool = SandboxPool(SandboxConfig(workers=2))
    except SandboxUnavailable as e:
        pytest.skip(str(e))
    srv = SandboxServer(("127.0.0.1", 0), pool, max_queue=0)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield srv, f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()
    pool.close()


def test_ping(server):
    _, url = server
    with urllib.request.urlopen(f"{url}/v1/ping") as r:
        assert r.status == 200 and json.loads(r.read()) == "pong"


def test_sandbox_fusion_client(server):
    _, url = server
    files = {"data.txt": base64.b64encode(b"41").decode()}
    code = "import sys\nn = int(open('data.txt').read()) + int(input())\nprint(n)\nopen('out.txt', 'w').write(str(n))"
    resp = run_code(RunCodeRequest(code=code, language="python", stdin="1\n", files=files,
                                   fetch_files=["out.txt"]), endpoint=url, max_attempts=1)
    assert resp.status == RunStatus.Success
    assert resp.run_result.status == CommandRunStatus.Finished and resp.run_result.return_code == 0
    assert resp.run_result.stdout == "42\n"
    assert base64.b64decode(resp.files["out.txt"]) == b"42"

    failed = run_code(RunCodeRequest(code="raise ValueError('no')", language="python"), endpoint=url, max_attempts=1)
    assert failed.status == RunStatus.Failed and failed.run_result.return_code == 1
    assert "ValueError: no" in failed.run_result.stderr

    slow = run_code(RunCodeRequest(code="while True: pass", language="python", run_timeout=0.5),
                    endpoint=url, max_attempts=1)
    assert slow.status == RunStatus.Failed and slow.run_result.status == CommandRunStatus.TimeLimitExceeded

    sh = run_code(RunCodeRequest(code="echo $((6*7)); exit 3", language="bash"), endpoint=url, max_attempts=1)
    assert sh.run_result.stdout == "42\n" and sh.run_result.return_code == 3 and sh.status == RunStatus.Failed


def _post(url: str, body: dict) -> tuple[int, dict]:
    rq = urllib.request.Request(f"{url}/run_code", data=json.dumps(body).encode(),
                                headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(rq) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_fields_and_errors(server):
    _, url = server
    code, resp = _post(url, {"code": "print(1)", "language": "python", "memory_limit_MB": 128, "run_timeout": 5,
                             "compile_timeout": 5})
    assert code == 200 and resp["status"] == "Success" and resp["compile_result"] is None
    assert set(resp["run_result"]) >= {"status", "execution_time", "return_code", "stdout", "stderr"}
    assert resp["isolation"].startswith("bwrap")
    assert _post(url, {"code": "1", "language": "cobol"})[0] == 422
    assert _post(url, {"language": "python"})[0] == 422


def test_overload_answers_503_without_queueing(server):
    srv, url = server
    n = srv.pool.n_workers  # max_queue=0: exactly n requests may be in flight
    results: list[int] = []
    threads = [threading.Thread(target=lambda: results.append(_post(url, {"code": "import time; time.sleep(1.5)",
                                                                          "language": "python"})[0]))
               for _ in range(n + 3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results).count(200) == n and results.count(503) == 3


def test_judge_over_http_matches_local(server):
    _, url = server
    p = CodeProblem("sq", "def sq(x):\n", "def check(candidate):\n    assert candidate(3) == 9\n    assert candidate(-2) == 4\n",
                    "sq")
    remote = CodeJudge(RemoteSandbox(url, concurrency=2))
    good, bad = remote.judge([p, p], ["    return x * x\n", "    return abs(x) * 2\n"])
    assert good.passed and good.tests == [True, True]
    assert not bad.passed and bad.tests == [False, True]
    assert RemoteSandbox(url).run(RunRequest(code="print(2)")).stdout == "2\n"


def test_cli_score(tmp_path, capsys):
    probs = tmp_path / "p.jsonl"
    sols = tmp_path / "s.jsonl"
    probs.write_text(json.dumps({"task_id": "t/0", "prompt": "def inc(x):\n", "entry_point": "inc",
                                 "test": "def check(candidate):\n    assert candidate(1) == 2\n"}) + "\n")
    sols.write_text(json.dumps({"task_id": "t/0", "completion": "    return x + 1\n"}) + "\n"
                    + json.dumps({"task_id": "t/0", "completion": "    while True: pass\n"}) + "\n")
    assert cli_main(["sandbox", "score", str(probs), str(sols), "--workers", "1", "--timeout-s", "1"]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [x["passed"] for x in lines] == [True, False]
    assert lines[0]["reward"] == 1.0 and lines[0]["isolation"].startswith("bwrap")
    assert lines[1]["penalties"]["timeout"] == 0.1 and lines[1]["reward"] == pytest.approx(0.1)
    sols.write_text(sols.read_text() + "{broken\n")
    assert cli_main(["sandbox", "score", str(probs), str(sols)]) == 2
    assert f"{sols}:3:" in capsys.readouterr().err
