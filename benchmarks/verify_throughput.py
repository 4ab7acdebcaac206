"""Math verification throughput, side by side in one run: postrl's `MathVerifier` (worker pool,
hard deadline, within-batch dedupe and cache) against plain serial math-verify in the main thread
(its own SIGALRM timeouts), on 1,000 realistic (gold, completion) pairs; then a pathological set.

    .venv/bin/python benchmarks/verify_throughput.py [--groups 125] [--group-size 8] [--workers 0]

"Realistic" means what an RL step produces: 125 problems x 8 sampled completions, each a few
sentences of reasoning ending in `\\boxed{}` (right in some equivalent form, or wrong), in plain
text, or with no answer; completions within a group often repeat an answer, as real samples do.
Gold answers mix integers, fractions, decimals, percents, sets, intervals and expressions.

Reported: verifications/s of each, the sides alternating in chunks of 100 pairs so that load from
other jobs on a shared machine falls on all alike, with identical verdicts required. The
completions' reasoning differs, so nearly all pairs are distinct and postrl's (gold, completion)
verdict cache gives it no help here (cache off). What does help is each worker remembering the
parses of many extracted answers (math-verify keeps 20): a group's completions end in a few
answers. A third side, the pool with math-verify's own 20, shows how much of the ratio that is.
Worker start-up is reported apart (the pool lives as long as the trainer).
Then a pathological set (towers of powers, huge factorials): postrl must return `timeout` for each
within its deadline (a "hang" is a call not back by deadline + 5 s); plain math-verify's verdict on
the same inputs is shown (it turns its own timeouts into a silent False).

Target on 2 cores: ratio >= 1.5 with timeouts enforced; 0 hangs. The ratio cannot exceed the
parallelism the machine actually gives, so that is measured first (a CPU-bound loop run alone,
then in as many copies as there are workers) and printed next to it: on a machine whose cores are
busy with other jobs, the ratio says more about the neighbours than about the verifier.
"""

from __future__ import annotations

import logging
import os
import random
import subprocess
import sys
import time

from _harness import Bench, load_avg, parser  # benchmarks/, on the path when this script runs

from postrl.rewards.math import MathVerifier, _parse_gold

# (gold, equivalent forms a model might write, plausible wrong answers)
GOLDS = [
    ("\\frac{3}{4}", ["\\frac{3}{4}", "0.75", "\\frac{6}{8}", "3/4"], ["\\frac{4}{3}", "0.7", "\\frac{1}{4}"]),
    ("12", ["12", "12.0", "\\frac{24}{2}"], ["120", "1.2", "13"]),
    ("-7", ["-7", "-7.0"], ["7", "-6"]),
    ("50\\%", ["50\\%", "0.5", "\\frac{1}{2}"], ["5\\%", "0.05"]),
    ("\\{-2, 2\\}", ["\\{-2, 2\\}", "\\{2, -2\\}"], ["\\{2\\}", "\\{-2, 3\\}"]),
    ("[1, 3)", ["[1,3)", "[1, 3)"], ["(1, 3)", "[1, 3]"]),
    ("(-\\infty, 0]", ["(-\\infty, 0]"], ["(-\\infty, 0)", "[0, \\infty)"]),
    ("x^2+2x+1", ["(x+1)^2", "x^2 + 2x + 1", "1 + 2x + x^2"], ["x^2+1", "(x-1)^2"]),
    ("2\\sqrt{2}", ["2\\sqrt{2}", "\\sqrt{8}"], ["2\\sqrt{3}", "4"]),
    ("\\frac{\\pi}{4}", ["\\frac{\\pi}{4}", "\\pi/4", "0.25\\pi"], ["\\frac{\\pi}{2}", "\\pi"]),
    ("1024", ["1024", "2^{10}"], ["1000", "2^{11}"]),
    ("(1, 2)", ["(1,2)", "(1, 2)"], ["(2, 1)", "(1, 3)"]),
    ("3.14", ["3.14"], ["3.15", "3.1"]),
    ("\\frac{5}{2}", ["2.5", "\\frac{5}{2}", "2\\frac{1}{2}"], ["2", "\\frac{2}{5}"]),
]
REASONING = [
    "Let us set up the problem. We have $a = {a}$ and $b = {b}$, so $a + b = {s}$.",
    "First, note that the product is ${a} \\cdot {b} = {p}$. Dividing both sides by ${a}$ gives the value.",
    "We expand and collect terms; the quadratic $x^2 - {s}x + {p} = 0$ has roots that we check below.",
    "By symmetry the two cases contribute equally, and there are ${a}$ of them in total.",
]
PATHOLOGICAL = [
    "\\boxed{9^{9^{9^9}}}", "\\boxed{10^{10^{10^{10}}}}", "\\boxed{(10^{100})!}", "\\boxed{1000000!}",
    "\\boxed{2^{2^{2^{2^{2^{2}}}}}}", "\\boxed{7^{7^{7^{7}}}}", "9**9**9**9", "\\boxed{3^{10^{8}}}",
]


def completion(rng: random.Random, answer: str | None, boxed: bool) -> str:
    a, b = rng.randint(2, 40), rng.randint(2, 40)
    steps = [rng.choice(REASONING).format(a=a, b=b, s=a + b, p=a * b) for _ in range(rng.randint(2, 5))]
    text = " ".join(steps)
    if answer is None:
        return text + " Hence the value follows from the previous step."
    return text + (f" Therefore the answer is $\\boxed{{{answer}}}$." if boxed else f" The answer is ${answer}$.")


def make_pairs(groups: int, group_size: int, seed: int = 0) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    pairs = []
    for _ in range(groups):
        gold, right, wrong = rng.choice(GOLDS)
        # a group's samples share a few candidate answers, as samples from one policy do
        candidates = [rng.choice(right), rng.choice(wrong), rng.choice(right + wrong)]
        for _ in range(group_size):
            kind = rng.random()
            answer = None if kind < 0.1 else rng.choice(candidates)
            pairs.append((gold, completion(rng, answer, boxed=kind >= 0.2)))
    return pairs


def plain_serial(pairs: list[tuple[str, str]]) -> list[bool]:
    from math_verify import parse, verify

    return [bool(verify(_parse_gold_plain(g), parse(a))) for g, a in pairs]


def _parse_gold_plain(gold: str):
    from math_verify import parse

    text = gold if ("$" in gold or "\\boxed" in gold) else f"${gold}$"
    return parse(text) or parse(gold)


def timed(fn, *args):
    t0 = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - t0


def effective_cores(n: int) -> float:
    """How much parallelism this machine gives right now: a fixed pure-Python loop run once
    alone, then n copies at once (n * t_alone / t_together; n on idle cores, ~1 when saturated)."""
    spin = [sys.executable, "-c", "s = 0\nfor i in range(5_000_000): s += i"]

    def run(k: int) -> float:
        t0 = time.perf_counter()
        procs = [subprocess.Popen(spin) for _ in range(k)]
        for p in procs:
            p.wait()
        return time.perf_counter() - t0

    return n * run(1) / run(n)


def interleaved(sides: dict, pairs, chunk: int) -> dict[str, tuple[list, float]]:
    """Run every side on each chunk in turn, so that a machine shared with other jobs loads all
    alike; each side sees every pair once. Returns {name: (verdicts, seconds)}."""
    out = {name: ([], 0.0) for name in sides}
    for i in range(0, len(pairs), chunk):
        part = pairs[i : i + chunk]
        for name, fn in sides.items():
            got, t = timed(fn, part)
            out[name] = (out[name][0] + got, out[name][1] + t)
    return out


def pathological(verifier: MathVerifier, deadline_s: float) -> int:
    hangs = 0
    for answer in PATHOLOGICAL:
        (score,), seconds = timed(verifier.verify, [("5", answer)])
        hung = seconds > deadline_s + 5.0 or score.status != "timeout"
        hangs += hung
        print(f"  postrl   {answer[:32]:34s} {score.status:8s} {seconds:5.2f}s{'  HANG' if hung else ''}")
    for answer in PATHOLOGICAL[:3]:
        verdict, seconds = timed(plain_serial, [("5", answer)])
        print(f"  plain    {answer[:32]:34s} {str(verdict[0]):8s} {seconds:5.2f}s  (a timeout reported as a verdict)")
    return hangs


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--groups", type=int, default=125)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--workers", type=int, default=0, help="0 = CPU count")
    ap.add_argument("--timeout-s", type=float, default=5.0)
    ap.add_argument("--chunk", type=int, default=100, help="pairs per alternation between the two sides")
    args = ap.parse_args()
    bench = Bench(__file__, args)
    logging.disable(logging.WARNING)  # math-verify logs every timeout
    pairs = make_pairs(args.groups, args.group_size)
    assert all(_parse_gold(g) for g, _, _ in GOLDS)
    workers = args.workers or os.cpu_count() or 1
    cores = effective_cores(workers)
    print(f"{len(pairs)} pairs ({len(set(pairs))} distinct), {os.cpu_count()} CPUs, load average "
          f"{load_avg():.1f}; {workers} processes get {cores:.2f}x one process's CPU right now")

    with MathVerifier(workers=workers, timeout_s=args.timeout_s, cache_size=0) as v, \
            MathVerifier(workers=workers, timeout_s=args.timeout_s, cache_size=0, parse_cache=0) as v20:
        _, t_start = timed(v.verify, [("1", "\\boxed{1}")])
        v20.verify([("1", "\\boxed{1}")])
        print(f"worker start-up {t_start:.2f}s ({v.stats['isolation']}), {v._pool.workers} workers")
        runs = interleaved({"plain": plain_serial, "postrl": v.verify, "postrl20": v20.verify}, pairs, args.chunk)
        print("pathological set:")
        hangs = pathological(v, args.timeout_s)
    (plain, t_plain), (ours, t_ours), (ours20, t_ours20) = runs["plain"], runs["postrl"], runs["postrl20"]
    verdicts = [s.correct for s in ours]
    assert verdicts == plain == [s.correct for s in ours20], "verdicts differ from plain math-verify"
    ratio = t_plain / t_ours
    print(f"plain serial math-verify  {len(pairs) / t_plain:8.1f} verifications/s ({t_plain:.2f}s)")
    print(f"postrl MathVerifier       {len(pairs) / t_ours:8.1f} verifications/s ({t_ours:.2f}s), ratio {ratio:.2f}x")
    print(f"  with math-verify's own 20-entry parse cache per worker: {len(pairs) / t_ours20:8.1f} "
          f"verifications/s, ratio {t_plain / t_ours20:.2f}x")
    print(f"parallel efficiency {ratio / cores:.2f} (ratio / the {cores:.2f}x the machine gave {workers} processes)")
    print(f"correct {sum(x is True for x in verdicts)}/{len(pairs)}, unverified "
          f"{sum(s.status != 'ok' for s in ours)}, verdicts identical to plain math-verify")
    bench.result("pathological_hangs", hangs, target=0)
    bench.result("verify_speedup", f"{ratio:.2f}", target=1.5)


if __name__ == "__main__":
    main()
