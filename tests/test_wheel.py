"""The wheel installs and works from outside the checkout.

The checkout's files (tracked, and new ones git does not ignore) are copied to a temporary
directory and built there with `python -m build --wheel`, so the build writes nothing into the
checkout. The wheel goes into a fresh virtual environment, with torch pinned as a constraint so
that pip takes the CPU build on this machine's disk rather than a CUDA one. Then, from another
directory: `postrl --version`, `postrl --help`, `postrl plan default` (a recipe shipped in the
package, by name) and a 2-step `postrl train default` (its built-in model is the suite's small one:
`builtin_models_cached`). About 1.5 minutes, most of it pip.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import postrl

ROOT = Path(__file__).resolve().parents[1]
TORCH_PIN = "torch==2.13.0"  # the Makefile's pin


def run(cmd, cwd, env=None, timeout=900) -> str:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def source_copy(dest: Path) -> Path:
    files = run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], ROOT).split("\0")
    for name in filter(None, files):
        src = ROOT / name
        if src.is_file() and not src.is_symlink():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    return dest


def test_wheel_installs_and_runs_outside_the_checkout(tmp_path, builtin_models_cached):
    src = source_copy(tmp_path / "src")
    run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(tmp_path / "dist"), str(src)],
        cwd=tmp_path)
    (wheel,) = (tmp_path / "dist").glob("postrl-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "postrl/recipes/default.yaml" in names and "postrl/data/gsm_symbolic_train.jsonl" in names
    assert not any(n.startswith(("tests/", "benchmarks/")) for n in names)

    env_dir = tmp_path / "env"
    run([sys.executable, "-m", "venv", str(env_dir)], cwd=tmp_path)
    (tmp_path / "constraints.txt").write_text(TORCH_PIN + "\n")
    run([env_dir / "bin" / "pip", "install", "-q", "-c", str(tmp_path / "constraints.txt"), str(wheel)], cwd=tmp_path)

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    cli = env_dir / "bin" / "postrl"
    assert run([cli, "--version"], elsewhere, env).strip() == f"postrl {postrl.__version__}"
    assert "post-training" in run([cli, "--help"], elsewhere, env)
    assert "completions per step" in run([cli, "plan", "default"], elsewhere, env)
    # the installed package, not the checkout, is what runs
    where = run([env_dir / "bin" / "python", "-c", "import postrl; print(postrl.__file__)"], elsewhere, env)
    assert str(env_dir) in where
    run([cli, "train", "default", "train.total_steps=2", "train.prompts_per_step=8", "eval.num_problems=8",
         f"run.dir={tmp_path / 'run'}", "run.progress=false"], elsewhere, env)
    assert (tmp_path / "run" / "final" / "config.json").is_file()
    assert len(list((tmp_path / "run" / "rollouts").glob("*.parquet"))) == 2
