"""The joint-vs-single benchmark's report (benchmarks/joint_vs_single.py runs the arms): its
readings of the arms' records (gains and their paired standard errors, the seesaw, forgetting
along a sequential arm, joint against single at equal completions, when each joint arm reached
its targets, where the time went), the tables it prints and the plots it draws. Pure functions of
the records, so the tests check them on hand-worked ones."""

from __future__ import annotations

import math
import os
import statistics
from pathlib import Path

from _gain import paired_se, scores  # benchmarks/, on the path when a benchmark runs
from _harness import write_plot

from postrl.monitor.alerts import Alert
from postrl.monitor.report import alert_lines

TARGET_GAIN_SE = 2.0
TARGET_DROP_SE = 2.0
TARGET_HOURS = 4.0
"""Issue 46: every arm, summed over sittings (issue 31's was 3 h for the six arms it had)."""
REACH = {"word_problems": 0.28, "letter_counting": 0.20, "code": 0.28}
"""Held-out pass@1 each trained domain is to reach, stated on 2026-12-07 before the joint arms were
first measured along their runs: the base plus three quarters of the smaller of the two joint arms'
gains at 14 steps (word problems 0.140 + 0.75 x 0.185, letter counting 0.115 + 0.75 x 0.115, code
0.155 + 0.75 x 0.160), rounded to 0.01; both joint arms reach them by step 14, the question is how
soon."""


def change(base: dict, after: dict) -> tuple[float, float]:
    """(pass@1 after - before, its paired standard error): one sample a problem."""
    return scores(after, 1)["pass@1"] - scores(base, 1)["pass@1"], paired_se(base, after, 1)


def in_se(delta: float, se: float) -> float:
    """A change in standard errors; a change on identical answers (SE 0) is 0 or +/-inf."""
    return delta / se if se > 0 else (0.0 if delta == 0 else math.copysign(math.inf, delta))


def table(results: dict[str, dict], domains: list[str], trained: list[str]) -> None:
    base = results["base"]["results"]
    names = list(results)
    print("\nheld-out pass@1 at T=0.7, one sample a problem (change vs base +/- 2 paired SE); greedy in brackets")
    print("| domain | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for d in domains:
        cells = []
        for arm in names:
            r = results[arm]["results"][d]
            s = scores(r, 1)
            cell = f"{s['pass@1']:.3f}" + ("" if math.isnan(s["greedy"]) else f" ({s['greedy']:.3f})")  # nan: not measured
            if arm != "base":
                delta, se = change(base[d], r)
                cell += f" {delta:+.3f}+/-{2 * se:.3f}"
            cells.append(cell)
        role = "" if d in trained else " (control)"
        print(f"| {d}{role} | " + " | ".join(cells) + " |")


def gains_in_se(results: dict[str, dict], domains: list[str]) -> dict[str, float]:
    """Each domain's pass@1 change in the joint curriculum arm against the base model, in paired SE."""
    base, joint = results["base"]["results"], results["joint_curriculum"]["results"]
    return {d: in_se(*change(base[d], joint[d])) for d in domains}


def headline(gains: dict[str, float], trained: list[str]) -> tuple[float, float]:
    """(the smallest trained domain's gain, the largest drop below base of any domain, 0 if none), in SE."""
    return min(gains[d] for d in trained), max(0.0, *(-g for g in gains.values()))


def seesaws(results: dict[str, dict], domains: list[str], trained: list[str]) -> list[str]:
    """Where a single-domain arm pushed another domain below its base by more than 2 SE (the
    single arms that ran)."""
    base, found = results["base"]["results"], []
    for name in trained:
        if f"single_{name}" not in results:
            continue
        arm = results[f"single_{name}"]["results"]
        for d in domains:
            delta, se = change(base[d], arm[d])
            if d != name and in_se(delta, se) < -2:
                found.append(f"single_{name} squeezed {d}: {delta:+.3f} ({in_se(delta, se):+.1f} SE)")
    return found


def joint_against_single(results: dict[str, dict], trained: list[str]) -> list[tuple[str, float, float]]:
    """Per trained domain whose single arm ran: (domain, joint curriculum - single arm, paired SE
    between the two arms)."""
    joint = results["joint_curriculum"]["results"]
    return [(d, *change(results[f"single_{d}"]["results"][d], joint[d])) for d in trained if f"single_{d}" in results]


def over_seeds(results: dict[str, dict], domains: list[str]) -> dict[str, dict]:
    """The joint curriculum arm and its reseeded runs (`joint_curriculum_seed<N>`), per domain:
    {"gains": each run's pass@1 change against base, "mean": their mean, "pooled_se": the paired SE
    of the mean over runs (per problem: the runs' mean minus the base's; the problems' spread
    only), "seed_se": the runs' own spread, stdev(gains) / sqrt(runs)}."""
    runs = [r["results"] for arm, r in results.items() if arm == "joint_curriculum" or arm.startswith("joint_curriculum_seed")]
    base, out = results["base"]["results"], {}
    for d in domains:
        gains = [change(base[d], r[d])[0] for r in runs]
        pooled = {"correct": [statistics.mean(c) for c in zip(*(r[d]["correct"] for r in runs))]}
        out[d] = {"gains": gains, "mean": statistics.mean(gains), "pooled_se": paired_se(base[d], pooled, 1),
                  "seed_se": statistics.stdev(gains) / math.sqrt(len(gains)) if len(gains) > 1 else math.nan}
    return out


def curriculum_story(metrics: dict[int, dict], trained: list[str]) -> list[str]:
    """What a joint run spent its samples on, step by step, and its domain weights (its metrics)."""
    lines = ["| step | " + " | ".join(f"{d} weight / batch share / pass rate" for d in trained) + " |",
             "|---|" + "---|" * len(trained)]
    for step, m in metrics.items():
        cells = [f"{m.get(f'curriculum/weight/{d}', math.nan):.2f} / {m.get(f'batch/{d}', 0):.2f} / "
                 f"{m.get(f'pass_rate/{d}', math.nan):.2f}" for d in trained]
        lines.append(f"| {step} | " + " | ".join(cells) + " |")
    return lines


def plot(run: dict, path: Path) -> None:
    """Held-out pass@1 per domain at each in-run eval, and the curriculum's domain weights (a run record)."""
    alerts = [Alert(a["step"], "seesaw", a["message"]) for a in run["seesaw_alerts"]]
    for series, title, ylabel, suffix in [(run["evals"], "Joint curriculum run: held-out pass@1 (in-run eval)", "pass@1", "eval"),
                                          (run["weights"], "Joint curriculum run: domain weights", "sampling weight", "weights")]:
        write_plot(path.with_name(f"{path.stem}-{suffix}.svg"), title, ylabel,
                   {k: [tuple(p) for p in v] for k, v in series.items() if v}, alert_lines(alerts))




def stage_results(record: dict) -> list[tuple[str, list[int], dict]]:
    """A sequential arm's (domain, [first step, step after its last], held-out results after the
    stage) for each stage; the last stage's results are the arm's own."""
    return [(s["domain"], s["steps"], s.get("results", record["results"])) for s in record.get("stages", [])]


def forgetting(record: dict) -> list[tuple[str, float, float, float, float]]:
    """Each earlier stage's domain of a sequential arm: (domain, its pass@1 after its own stage, at
    the end, the change, its paired SE): what the later stages took from it, measured."""
    final, out = record["results"], []
    for d, _, after in stage_results(record)[:-1]:
        delta, se = change(after[d], final[d])
        out.append((d, scores(after[d], 1)["pass@1"], scores(final[d], 1)["pass@1"], delta, se))
    return out


def stage_table(record: dict, base: dict, domains: list[str], trained: list[str]) -> list[str]:
    """A sequential arm's held-out pass@1 on every domain after each stage, and its change against
    the base model in paired SE."""
    lines = ["| after stage | " + " | ".join(d + ("" if d in trained else " (control)") for d in domains) + " |",
             "|---|" + "---|" * len(domains)]
    for d, (start, end), r in stage_results(record):
        cells = [f"{scores(r[e], 1)['pass@1']:.3f} ({in_se(*change(base[e], r[e])):+.1f} SE)" for e in domains]
        lines.append(f"| {d} (steps {start}-{end - 1}) | " + " | ".join(cells) + " |")
    return lines


def worst_margin(results: dict[str, dict], joint: str, other: str, trained: list[str]) -> tuple[str, str, float, float]:
    """(`joint`'s trained domain of smallest gain against base, `other`'s, the first gain minus the
    second, its SE). One domain: the paired SE of the two arms on it; two: the two gains' paired SEs
    in quadrature (different problems)."""
    base = results["base"]["results"]
    gain = {arm: {d: change(base[d], results[arm]["results"][d]) for d in trained} for arm in (joint, other)}
    worst = {arm: min(trained, key=lambda d, arm=arm: gain[arm][d][0]) for arm in (joint, other)}
    if worst[joint] == worst[other]:
        d = worst[joint]
        return d, d, *change(results[other]["results"][d], results[joint]["results"][d])
    (gj, sj), (go, so) = gain[joint][worst[joint]], gain[other][worst[other]]
    return worst[joint], worst[other], gj - go, math.hypot(sj, so)


def equal_completions(results: dict[str, dict], trained: list[str], joint: str) -> list[tuple]:
    """Per trained domain whose single arm was measured along its run: (domain, the single arm's
    completions at its first point, the joint arm's completions of the domain, joint - single on
    it, paired SE)."""
    out = []
    for d in trained:
        along = results.get(f"single_{d}", {}).get("along")
        if along and joint in results:
            first = along[0]
            out.append((d, sum(first["completions"].values()), results[joint]["completions"].get(d, 0),
                        *change(first["results"][d], results[joint]["results"][d])))
    return out


def time_split(record: dict) -> str:
    """Where an arm's time went: its run's `time/*` metrics summed (scoring: what it added after
    generation ended; the in-run eval where the run timed it, `time/eval_s`, all but the last),
    the rest of its training (checkpoints, loading and saving the model, and the in-run eval where
    it was not timed), and the script's measurements."""
    t = record.get("times")
    if not t:
        return "not recorded (a record from before issue 46)"
    scoring = t.get("time/reward_tail_s", t.get("time/reward_s", 0.0))
    parts = {"sampling": t.get("time/sample_s", 0.0), "scoring": scoring, "update": t.get("time/update_s", 0.0),
             "refill": t.get("time/refill_s", 0.0)}
    if "time/eval_s" in t:
        parts["in-run eval"] = t["time/eval_s"]
        parts["checkpoints, loading, last eval"] = t["train_s"] - sum(parts.values())
    else:
        parts["in-run eval, checkpoints, loading"] = t["train_s"] - sum(parts.values())
    parts["measurement"] = t["measure_s"]
    return ", ".join(f"{k} {v / 60:.1f}" for k, v in parts.items() if k != "refill" or v) + \
        f" min (scoring {t.get('time/reward_s', 0.0) / 60:.1f} min in all)"


def plot_stages(record: dict, base: dict, path: Path) -> None:
    """A sequential arm's held-out pass@1 per domain at the start and after each stage."""
    series = {d: [(0, scores(r, 1)["pass@1"]) for r in [base[d]]] for d in base}
    for _, (_, end), r in stage_results(record):
        for d in series:
            series[d].append((end, scores(r[d], 1)["pass@1"]))
    write_plot(path, f"{record['arm']}: held-out pass@1 after each stage", "pass@1", series)


def report_sequential(results: dict[str, dict], domains: list[str], trained: list[str], plot_to: str) -> dict[str, float]:
    """Print each sequential arm's stages and what it forgot, and the joint curriculum against it;
    returns {sequential arm: the joint curriculum's worst-domain margin over it, in SE}."""
    margins, base = {}, results["base"]["results"]
    for arm in ("sequential", "sequential_rev"):
        if arm not in results:
            continue
        record = results[arm]
        order = " then ".join(d for d, _, _ in stage_results(record))
        print(f"\n{arm} ({order}): held-out pass@1 after each stage (change against base in paired SE)")
        print("\n".join(stage_table(record, base, domains, trained)))
        for d, after, end, delta, se in forgetting(record):
            print(f"  {d}: {after:.3f} after its stage -> {end:.3f} at the end: {delta:+.3f} +/- {2 * se:.3f} "
                  f"({in_se(delta, se):+.1f} SE)")
        if plot_to:
            plot_stages(record, base, Path(f"{plot_to}-{arm}.svg"))
        if "joint_curriculum" in results:
            dj, do, delta, se = worst_margin(results, "joint_curriculum", arm, trained)
            margins[arm] = in_se(delta, se)
            print(f"joint curriculum's worst trained domain ({dj}) against {arm}'s ({do}), gains against base: "
                  f"{delta:+.3f} +/- {2 * se:.3f} ({margins[arm]:+.1f} SE; target >= +2)")
    return margins


def reach_points(results: dict[str, dict], joint: str, size: dict) -> list[tuple[int, dict]]:
    """(completions, held-out results) along `joint`'s run, in order: its checkpoints measured along
    the run (`along`), then its final weights; [] unless the arm ran and was measured along it."""
    along, per_step = results.get(joint, {}).get("along"), size["prompts"] * size["samples"]
    if not along:
        return []
    return ([(p["step"] * per_step, p["results"]) for p in sorted(along, key=lambda p: p["step"])]
            + [(size["steps"] * per_step, results[joint]["results"])])


def first_reach(points: list[tuple[int, dict]], domain: str, target: float) -> int | None:
    """The completions at the first point where `domain`'s pass@1 is at least `target` (None: never)."""
    return next((n for n, r in points if scores(r[domain], 1)["pass@1"] >= target), None)


def report_reach(results: dict[str, dict], trained: list[str], size: dict) -> tuple[int, int] | None:
    """Print each joint arm's pass@1 along its run and the completions it took to reach each
    domain's `REACH` target; returns (domains where the curriculum got there in no more
    completions than the uniform mixture, domains with a target), None unless both were read along
    their runs."""
    points = {j: reach_points(results, j, size) for j in ("joint_curriculum", "joint_uniform")}
    if not all(points.values()):
        return None
    targets = {d: REACH[d] for d in trained if d in REACH}
    print("\nheld-out pass@1 along the joint runs (completions: pass@1 per domain), and the completions each took "
          "to reach the targets stated first (" + ", ".join(f"{d} {t:.2f}" for d, t in targets.items()) + "):")
    not_later = 0
    for d, target in targets.items():
        at = {j: first_reach(p, d, target) for j, p in points.items()}
        curve = "; ".join(f"{j} " + " ".join(f"{n}:{scores(r[d], 1)['pass@1']:.3f}" for n, r in p)
                          for j, p in points.items())
        ok = at["joint_curriculum"] is not None and (at["joint_uniform"] is None
                                                     or at["joint_curriculum"] <= at["joint_uniform"])
        not_later += ok
        print(f"  {d}: {curve}; reached at " + ", ".join(f"{j} {n if n is not None else 'never'}"
                                                        for j, n in at.items()) + ("" if ok else " (curriculum later)"))
    return not_later, len(targets)


def report_equal(results: dict[str, dict], trained: list[str]) -> list[float]:
    """Print each joint arm against each single arm at (about) equal completions of the domain;
    returns the joint curriculum's differences in SE."""
    found = []
    for joint in ("joint_curriculum", "joint_uniform"):
        rows = equal_completions(results, trained, joint)
        if rows:
            print(f"\n{joint} vs single arms at equal domain completions (each single arm after a third of its "
                  "steps; difference +/- 2 paired SE):")
        for d, n_single, n_joint, delta, se in rows:
            verdict = "within 2 SE or above" if in_se(delta, se) >= -2 else "BELOW by more than 2 SE"
            print(f"  {d}: {delta:+.3f} +/- {2 * se:.3f} ({in_se(delta, se):+.1f} SE, {verdict}); "
                  f"{n_joint} completions of it in {joint}, {n_single} in single_{d} by then")
            if joint == "joint_curriculum":
                found.append(in_se(delta, se))
    return found


def report_joint(results: dict[str, dict], domains: list[str], trained: list[str], plot_to: str) -> dict[str, float]:
    """Print the joint arms' seesaw alerts, the joint curriculum against base and each single arm, and
    its run step by step; returns its gains in SE ({} when it did not run)."""
    for arm in ("joint_uniform", "joint_curriculum"):
        if arm in results:
            alerts = results[arm]["run"]["seesaw_alerts"]
            print(f"{arm}: {len(alerts)} seesaw alert(s)" + "".join(f"\n  step {a['step']}: {a['message']}" for a in alerts))
    if "joint_curriculum" not in results:
        return {}
    gains = gains_in_se(results, domains)
    print("\njoint curriculum vs base, in SE: " + ", ".join(f"{d} {g:+.1f}" for d, g in gains.items()))
    print("joint curriculum vs each single arm on its own domain, at the same total completions (difference +/- 2 "
          "paired SE):")
    for d, delta, se in joint_against_single(results, trained):
        verdict = "within 2 SE or above" if in_se(delta, se) >= -2 else "BELOW by more than 2 SE"
        print(f"  {d}: {delta:+.3f} +/- {2 * se:.3f} ({verdict})")
    joint = results["joint_curriculum"]
    print(f"\nthe joint curriculum run, step by step (postrl report {joint['run_dir']} draws it, where it is kept):")
    print("\n".join(joint["run"]["story"]))
    if plot_to:
        plot(joint["run"], Path(plot_to))
    return gains


def report_seeds(seeded: dict[str, dict]) -> None:
    print(f"\nthe joint curriculum over {len(next(iter(seeded.values()))['gains'])} seeds, pass@1 change against base: "
          "each run; their mean, in pooled paired SE (the problems' spread) and in the runs' own SE")
    for d, s in seeded.items():
        print(f"  {d}: {' '.join(f'{g:+.3f}' for g in s['gains'])}; mean {s['mean']:+.3f} "
              f"({in_se(s['mean'], s['pooled_se']):+.1f} pooled SE, {in_se(s['mean'], s['seed_se']):+.1f} seed SE)")


def report_costs(ran: dict[str, dict]) -> None:
    print("\n" + "\n".join(f"{arm}: {r['seconds'] / 60:.1f} min, {r.get('date', '?')}, at {r.get('commit') or '?'}"
                            + (f"; {time_split(r)}" if arm != "base" else "") for arm, r in ran.items()))
    seconds = sum(r["seconds"] for r in ran.values())
    loads = [x for r in ran.values() for x in r["load"]]
    print(f"\ntotal {seconds / 3600:.2f} h over the arms (target {TARGET_HOURS:.0f} h; --quick: 20 min); "
          f"load average {min(loads):.2f}-{max(loads):.2f} (median {statistics.median(loads):.2f}) on "
          f"{os.cpu_count()} CPUs")
