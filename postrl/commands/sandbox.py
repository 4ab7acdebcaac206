"""postrl sandbox serve|score: the isolated code sandbox from the command line.

  postrl sandbox serve --host 127.0.0.1 --port 8080 --workers N
      SandboxFusion-compatible server (POST /run_code, GET /v1/ping).
  postrl sandbox score PROBLEMS.jsonl SOLUTIONS.jsonl
      Score solutions (lines of task_id, completion) against HumanEval-format problems
      (task_id, prompt, test, entry_point); prints one JSON line per solution.
"""

from __future__ import annotations

import json
import sys

from postrl.errors import UserError
from postrl.rewards.jsonl import read_jsonl


def add_parser(sub) -> None:
    p = sub.add_parser("sandbox", help="run the code sandbox: serve over HTTP or score solutions",
                       description=__doc__)
    cmds = p.add_subparsers(dest="sandbox_command", required=True)
    s = cmds.add_parser("serve", help="SandboxFusion-compatible HTTP server")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8080)
    s.add_argument("--max-queue", type=int, default=0, help="requests waiting for a worker before 503 (0: 4/worker)")
    _common(s)
    s.set_defaults(func=serve)
    c = cmds.add_parser("score", help="score solutions against HumanEval-format problems")
    c.add_argument("problems", help="JSONL: task_id, prompt, test, entry_point")
    c.add_argument("solutions", help="JSONL: task_id, completion")
    c.add_argument("--url", default="", help="use a SandboxFusion-compatible server instead of a local pool")
    c.add_argument("--w-compiles", type=float, default=0.2)
    c.add_argument("--w-tests", type=float, default=0.8)
    c.add_argument("--penalty-timeout", type=float, default=0.1)
    c.add_argument("--penalty-memory", type=float, default=0.1)
    c.add_argument("--penalty-output", type=float, default=0.1)
    _common(c)
    c.set_defaults(func=score)


def _common(p) -> None:
    p.add_argument("--workers", type=int, default=0, help="concurrent workers (0: one per core)")
    p.add_argument("--timeout-s", type=float, default=None, help="wall-clock limit per run")
    p.add_argument("--memory-mb", type=int, default=512)
    p.add_argument("--allow-unisolated", action="store_true",
                   help="run even without namespace isolation (rlimits/seccomp/uid only)")


def _pool(args, **extra):
    from postrl.sandbox.pool import SandboxPool
    from postrl.sandbox.runs import SandboxConfig, SandboxUnavailable

    cfg = SandboxConfig(workers=args.workers, memory_mb=args.memory_mb, allow_unisolated=args.allow_unisolated,
                        allow_unisolated_key="--allow-unisolated", **extra)
    if args.timeout_s is not None:
        cfg.timeout_s = args.timeout_s
    try:
        return SandboxPool(cfg)
    except SandboxUnavailable as e:
        raise UserError(str(e)) from None


def serve(args) -> int:
    from postrl.sandbox.server import SandboxServer

    pool = _pool(args, max_queue=args.max_queue)
    try:
        try:
            server = SandboxServer((args.host, args.port), pool)
        except OSError as e:
            raise UserError(f"cannot listen on {args.host}:{args.port}: {e.strerror or e}") from None
        host, port = server.server_address[:2]
        print(f"postrl sandbox serving on http://{host}:{port} ({pool.n_workers} workers, isolation "
              f"{pool.isolation}; {server.limits()}; metrics at /metrics)", file=sys.stderr, flush=True)
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            server.server_close()
    finally:
        pool.close()
    return 0


def score(args) -> int:
    from postrl.sandbox.client import RemoteSandbox
    from postrl.sandbox.judge import (
        CodeJudge,
        CodeProblem,
        JudgeLimits,
        RewardWeights,
        code_reward,
        split_test,
    )

    def usable_test(row: dict) -> str | None:
        try:
            split_test(row["test"], row["entry_point"])
        except (SyntaxError, ValueError) as e:
            return f"unusable test ({e})"
        return None

    rows = read_jsonl(args.problems, dict.fromkeys(("task_id", "prompt", "test", "entry_point"), str), usable_test)
    problems = {r["task_id"]: CodeProblem(r["task_id"], r["prompt"], r["test"], r["entry_point"]) for r in rows}
    sols = read_jsonl(args.solutions, dict.fromkeys(("task_id", "completion"), str),
                      lambda s: None if s["task_id"] in problems else f"unknown task_id {s['task_id']!r}")
    weights = RewardWeights(args.w_compiles, args.w_tests, args.penalty_timeout, args.penalty_memory,
                            args.penalty_output)
    backend = RemoteSandbox(args.url, concurrency=max(1, args.workers or 4)) if args.url else _pool(args)
    try:
        limits = JudgeLimits(timeout_s=args.timeout_s or 3.0, memory_mb=args.memory_mb)
        verdicts = CodeJudge(backend, limits).judge([problems[s["task_id"]] for s in sols],
                                                    [s["completion"] for s in sols])
    finally:
        if not args.url:
            backend.close()
    for v in verdicts:
        reward, c = code_reward(v, weights)
        print(json.dumps({
            "task_id": v.task_id, "reward": reward, "compiles": v.compiles, "passed": v.passed,
            "penalties": {"timeout": weights.timeout * c["penalty_timeout"],
                          "memory": weights.memory * c["penalty_memory"],
                          "output": weights.output * c["penalty_output"]},
            "tests": v.tests, "status": v.status, "isolation": v.isolation, "detail": v.detail,
        }))
    return 0
