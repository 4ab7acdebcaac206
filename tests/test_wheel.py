"""The wheel installs and works from outside the checkout.

The checkout's files (tracked, and new ones git does not ignore) are copied to a temporary
directory and built there with `python -m build --wheel`, so the build writes nothing into the
checkout. The wheel goes into a fresh virtual environment without its dependencies, which that
environment takes from the test's own (a `.pth` file names the test environment's site-packages,
after the new one's: the wheel's `postrl` comes first, the checkout's never). Installing them
again took 3 minutes of the suite, to prove only what `make setup` proved already from the same
index: that pip resolves them. What the test keeps proving about the wheel: every requirement it
declares is the project's and is met in that environment, and from another directory
`postrl --version`, `postrl --help`, `postrl plan default` (a recipe shipped in the package, by
name) and a 2-step `postrl train default` (its built-in model is the suite's small one:
`builtin_models_cached`) run from the installed package. About 40 s.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

from packaging.requirements import Requirement

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10, where pytest brings tomli
    import tomli as tomllib

import postrl

ROOT = Path(__file__).resolve().parents[1]
# run in the new environment: each requirement the installed wheel declares (extras' aside), with
# the version found there; importlib.metadata reads the new site-packages first, so the wheel's own
DECLARED = """
import json
from importlib import metadata
from packaging.requirements import Requirement
found = {}
for line in metadata.distribution("postrl").requires or []:
    req = Requirement(line)
    if req.marker is None or req.marker.evaluate({"extra": ""}):
        try:
            found[line] = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            found[line] = None
print(json.dumps(found))
"""


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


def venv_on_these_packages(env_dir: Path) -> Path:
    """A new virtual environment (no pip of its own: this one's installs into it) whose imports
    fall back on this environment's site-packages; returns its python."""
    run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], cwd=env_dir.parent)
    python = env_dir / "bin" / "python"
    new_site = run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], env_dir).strip()
    ours = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    (Path(new_site) / "postrl-test-deps.pth").write_text("".join(f"{p}\n" for p in ours))
    return python


def test_wheel_installs_and_runs_outside_the_checkout(tmp_path, builtin_models_cached):
    src = source_copy(tmp_path / "src")
    run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(tmp_path / "dist"), str(src)],
        cwd=tmp_path)
    (wheel,) = (tmp_path / "dist").glob("postrl-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "postrl/recipes/default.yaml" in names and "postrl/data/gsm_symbolic_train.jsonl" in names
    assert not any(n.startswith(("tests/", "benchmarks/")) for n in names)

    env_dir = tmp_path / "env"
    python = venv_on_these_packages(env_dir)
    run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", "--no-index", str(wheel)],
        cwd=tmp_path)

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    # the wheel declares the project's requirements, and each is met where it is installed
    found = json.loads(run([python, "-c", DECLARED], elsewhere, env))
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert sorted(map(str, map(Requirement, found))) == sorted(map(str, map(Requirement, project)))
    unmet = {req: v for req, v in found.items() if v is None or not Requirement(req).specifier.contains(v, True)}
    assert not unmet, unmet
    cli = env_dir / "bin" / "postrl"
    assert run([cli, "--version"], elsewhere, env).strip() == f"postrl {postrl.__version__}"
    assert "post-training" in run([cli, "--help"], elsewhere, env)
    assert "completions per step" in run([cli, "plan", "default"], elsewhere, env)
    # the installed package, not the checkout, is what runs
    where = run([python, "-c", "import postrl; print(postrl.__file__)"], elsewhere, env)
    assert str(env_dir) in where
    run([cli, "train", "default", "train.total_steps=2", "train.prompts_per_step=8", "eval.num_problems=8",
         f"run.dir={tmp_path / 'run'}", "run.progress=false"], elsewhere, env)
    assert (tmp_path / "run" / "final" / "config.json").is_file()
    assert len(list((tmp_path / "run" / "rollouts").glob("*.parquet"))) == 2
