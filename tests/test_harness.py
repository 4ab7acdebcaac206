"""The benchmarks' shared harness (benchmarks/_harness.py): the RESULT line's format, records written
whole with their commit and date, the shared flags, timing and SVG plots."""

import json
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import _harness as harness  # noqa: E402


def test_a_result_line_is_metric_value_then_the_fields_in_order_a_bound_written_as_one():
    assert harness.result_line("speedup", "1.52", target=1.5) == "RESULT speedup=1.52 target=1.5"
    assert (harness.result_line("fire_minus_peak_max", 2, seeds=5, target="<=3")
            == "RESULT fire_minus_peak_max=2 seeds=5 target<=3")
    assert (harness.result_line("steps_ratio", "0.700", "(per seed: 0:0.25)", target=0.7, below_base="none")
            == "RESULT steps_ratio=0.700 target=0.7 below_base=none (per seed: 0:0.25)")


def git(cwd: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    return subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True, check=True).stdout.strip()


def test_commit_is_the_short_head_with_a_plus_when_tracked_files_differ_and_empty_outside_git(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "a.py").write_text("x = 1\n")
    git(repo, "add", "a.py")
    git(repo, "commit", "-qm", "one")
    head = git(repo, "rev-parse", "--short", "HEAD")
    assert harness.commit(repo) == head
    (repo / "untracked.txt").write_text("not the code")
    assert harness.commit(repo) == head
    (repo / "a.py").write_text("x = 2\n")
    assert harness.commit(repo) == head + "+"
    outside = tmp_path / "plain"
    outside.mkdir()
    assert harness.commit(outside) == ""


def test_a_record_is_written_whole_with_its_date_and_commit_and_a_failed_write_keeps_the_old_one(tmp_path, monkeypatch):
    path = tmp_path / "deep" / "arm.json"
    before = time.strftime(harness.DATE_FORMAT, time.gmtime())
    written = harness.write_record(path, {"arm": "base", "pass@1": 0.25}, "abc1234+")
    after = time.strftime(harness.DATE_FORMAT, time.gmtime())
    assert json.loads(path.read_text()) == written
    assert written["arm"] == "base" and written["pass@1"] == 0.25 and written["commit"] == "abc1234+"
    assert written["date"] in (before, after) and written["date"].endswith(" UTC")

    def power_cut(src, dst):
        raise OSError("disk gone")

    monkeypatch.setattr(os, "replace", power_cut)
    with pytest.raises(OSError, match="disk gone"):
        harness.write_record(path, {"arm": "other"}, "def5678")
    assert json.loads(path.read_text())["arm"] == "base"
    assert sorted(p.name for p in path.parent.iterdir()) == ["arm.json"]  # no temporary sibling left


def test_bench_prints_each_result_and_keeps_all_of_them_in_the_record_file(tmp_path, capsys):
    script = ROOT / "benchmarks" / "eval_batching.py"
    record = tmp_path / "out" / "record.json"
    args = harness.parser("doc").parse_args(["--record", str(record)])
    bench = harness.Bench(str(script), args)
    assert bench.result("pathological_hangs", 0, target=0) == "RESULT pathological_hangs=0 target=0"
    bench.result("verify_speedup", "1.92", target=1.5)
    assert capsys.readouterr().out.splitlines() == ["RESULT pathological_hangs=0 target=0",
                                                    "RESULT verify_speedup=1.92 target=1.5"]
    kept = json.loads(record.read_text())
    assert kept["benchmark"] == "eval_batching" and kept["args"]["record"] == str(record)
    assert kept["results"] == [{"metric": "pathological_hangs", "value": "0", "target": "0"},
                               {"metric": "verify_speedup", "value": "1.92", "target": "1.5"}]
    assert kept["commit"] == harness.commit(ROOT) and kept["date"].endswith(" UTC") and kept["seconds"] >= 0


def test_bench_without_record_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    bench = harness.Bench(str(ROOT / "benchmarks" / "eval_batching.py"), harness.parser("doc").parse_args([]))
    bench.result("eval_speedup", "2.30", target=1.5)
    assert capsys.readouterr().out == "RESULT eval_speedup=2.30 target=1.5\n"
    assert list(tmp_path.iterdir()) == []


def test_the_shared_flags_come_only_when_asked_for_and_help_prints_the_docstring(capsys):
    plain = harness.parser("First line.\n\n    usage block\n")
    assert vars(plain.parse_args([])) == {"record": ""}
    with pytest.raises(SystemExit):
        plain.parse_args(["--quick"])
    capsys.readouterr()
    full = harness.parser("doc", out="runs/bench-x", quick="one step an arm", seed=3)
    assert vars(full.parse_args([])) == {"record": "", "out": "runs/bench-x", "quick": False, "seed": 3}
    assert vars(full.parse_args(["--quick", "--seed", "7", "--out", "d"])) == {
        "record": "", "out": "d", "quick": True, "seed": 7}
    assert vars(harness.parser("doc", record=False).parse_args([])) == {}  # a benchmark without RESULT lines
    with pytest.raises(SystemExit):
        plain.parse_args(["--help"])
    assert "First line.\n\n    usage block" in capsys.readouterr().out  # as written, not reflowed


def test_a_recipe_then_overrides_on_the_command_line_and_a_stray_word_is_an_error(capsys):
    args, recipe, overrides = harness.parse_recipe_args(harness.parser("doc"), ["r.yaml", "a.b=1", "--record", "f"],
                                                        "default.yaml")
    assert (recipe, overrides, args.record) == ("r.yaml", ["a.b=1"], "f")
    assert harness.parse_recipe_args(harness.parser("doc"), ["seed=3"], "default.yaml")[1:] == ("default.yaml", ["seed=3"])
    with pytest.raises(SystemExit):
        harness.parse_recipe_args(harness.parser("doc"), ["a.b=1", "typo"], "default.yaml")
    assert "nor a dotted.key=value override: typo" in capsys.readouterr().err


def test_timed_runs_on_inside_the_block_and_is_fixed_at_its_end():
    with harness.timed() as t:
        time.sleep(0.02)
        inside = t.seconds
    assert inside >= 0.02
    done = t.seconds
    time.sleep(0.01)
    assert t.seconds == done >= inside


def test_write_plot_writes_an_svg_with_its_title_and_one_curve_per_series(tmp_path):
    path = tmp_path / "plots" / "curves.svg"
    harness.write_plot(path, "held-out pass@1", "pass@1", {"arith": [(0, 0.1), (4, 0.3)], "code": [(0, 0.2), (4, 0.5)]})
    root = ET.fromstring(path.read_text())
    texts = [e.text for e in root.iter() if e.text]
    assert root.tag.endswith("svg") and "held-out pass@1" in texts and {"arith", "code"} <= set(texts)
    assert len([e for e in root.iter() if e.get("class") == "series"]) == 2


def test_the_benchmarks_contract_names_every_benchmark_and_only_the_shared_modules_start_with_an_underscore():
    """pyproject.toml's import-linter contract forbids each benchmark by its name: a benchmark added
    without its name there could be imported by another unseen."""
    import tomllib

    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (contract,) = [c for c in contracts if c.get("source_modules") == ["benchmarks"]]
    files = {p.stem for p in (ROOT / "benchmarks").glob("*.py")} - {"__init__"}
    shared = {name for name in files if name.startswith("_")}
    assert shared == {"_harness", "_gain", "_joint_report"}  # the last: joint_vs_single's report, split off
    assert sorted(contract["forbidden_modules"]) == sorted(files - shared)
