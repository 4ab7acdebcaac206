"""A backend that runs programs on any SandboxFusion-compatible server over HTTP.

    backend = RemoteSandbox("http://127.0.0.1:8080", concurrency=8)
    CodeJudge(backend).judge(problems, completions)      # same as with a local SandboxPool

Uses only the standard library and the public SandboxFusion API (`POST /run_code`), so it
works against `postrl sandbox serve` or a SandboxFusion deployment. Overload answers (HTTP 503
or status SandboxError) are retried with backoff a few times before they count as errors.
"""

from __future__ import annotations

import json
import random
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from postrl.sandbox.runs import RunRequest, RunResult

_RUN_STATUS = {"Finished": "finished", "TimeLimitExceeded": "timeout", "Error": "error"}


class RemoteSandbox:
    def __init__(self, url: str, concurrency: int = 8, retries: int = 5, client_timeout_s: float = 120.0):
        self.url = url.rstrip("/")
        self.concurrency = concurrency
        self.retries = retries
        self.client_timeout_s = client_timeout_s

    @property
    def n_workers(self) -> int:
        return self.concurrency

    def ping(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/v1/ping", timeout=5) as r:
                return r.status == 200
        except OSError:
            return False

    def run(self, req: RunRequest) -> RunResult:
        body = {
            "code": req.code, "language": req.language, "stdin": req.stdin, "files": req.files,
            "fetch_files": req.fetch_files, "run_timeout": req.timeout_s or 10.0, "compile_timeout": 10.0,
        }
        if req.memory_mb:
            body["memory_limit_MB"] = req.memory_mb
        last = ""
        for attempt in range(self.retries):
            try:
                resp = self._post(body)
            except urllib.error.HTTPError as e:
                last = f"HTTP {e.code}: {e.read()[:200].decode(errors='replace')}"
                if e.code not in (429, 502, 503, 504):
                    break
            except OSError as e:
                last = str(e)
            else:
                if resp.get("status") != "SandboxError":
                    return to_result(resp)
                last = str(resp.get("message", "SandboxError"))
            time.sleep(min(2.0, 0.05 * 2**attempt) * (0.5 + random.random()))
        return RunResult("error", None, "", "", 0.0, 0.0, "remote", message=last)

    def _post(self, body: dict) -> dict:
        data = json.dumps(body).encode()
        rq = urllib.request.Request(f"{self.url}/run_code", data=data, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(rq, timeout=self.client_timeout_s) as r:
            return json.loads(r.read())

    def run_many(self, reqs: list[RunRequest]) -> list[RunResult]:
        if not reqs:
            return []
        with ThreadPoolExecutor(max_workers=min(self.concurrency, len(reqs))) as ex:
            return list(ex.map(self.run, reqs))


def to_result(resp: dict) -> RunResult:
    """A SandboxFusion `RunCodeResponse` as a `RunResult`."""
    run = resp.get("run_result") or resp.get("compile_result") or {}
    status = _RUN_STATUS.get(run.get("status"), "error")
    message = str(resp.get("message", ""))
    if "output limit" in message:
        status = "output_limit"
    return RunResult(
        status=status, exit_code=run.get("return_code"), stdout=run.get("stdout") or "",
        stderr=run.get("stderr") or "", wall_s=float(run.get("execution_time") or 0.0),
        cpu_s=float(run.get("cpu_time") or 0.0), isolation=str(resp.get("isolation", "remote")),
        files=dict(resp.get("files") or {}), message=message,
    )
