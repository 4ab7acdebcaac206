"""Extensions: user modules that register domains, verifiers, reward terms or monitors.

    imports: [my_rewards, ./plugins/checks.py]      # in a recipe (paths: the recipe's directory)
    postrl train recipe.yaml --import ./checks.py   # on the command line (paths: the working directory)

    cfg = load_recipe("recipe.yaml", overrides, imports=["./checks.py"])   # loaded, then checked

The modules are loaded before the recipe is parsed and its names are checked, so what they
register (a domain type, a reward term, a monitor and its settings dataclass) is checked like a
built-in. A `.py` file is loaded as the module named after its stem (`checks`), and its directory
joins `sys.path`, so it can import its neighbours and its functions pickle by reference; a module
name is imported from `sys.path` plus the working directory. Each entry loads once per process.

Every process of a run loads the same list (absolute paths, as `postrl.config` resolves them):
the trainer (`load_recipe`, and `postrl.run.open_run` for a `Config` built in Python), the
verifier pools' workers (this process's list is in the environment they inherit, `POSTRL_IMPORTS`,
read by `postrl.rewards.workers.worker`), and the Ray actors (`load(cfg.imports)` when they start).
This module knows nothing of what the modules register.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import sys
import traceback
from pathlib import Path
from types import ModuleType

from postrl.config.loading import load_config, raw_recipe, recipe_imports
from postrl.config.schema import Config
from postrl.errors import UserError

ENV = "POSTRL_IMPORTS"
"""Environment variable holding the JSON list of extensions loaded in this process."""

_loaded: dict[str, ModuleType] = {}
"""entry -> module: what this process has loaded (a cache like `sys.modules`, not settings)."""


def load_recipe(path: str | Path | None = None, overrides: list[str] = (), imports: list[str] = ()) -> Config:
    """`postrl.config.loading.load_config`, with the recipe's `imports` and `imports` loaded first."""
    load(recipe_imports(raw_recipe(path, overrides), imports))
    return load_config(path, overrides, imports)


def load(entries: list[str]) -> list[ModuleType]:
    """Load each entry (a .py file or a module name) once; child processes inherit the list."""
    modules = [_loaded.get(entry) or _load_one(entry) for entry in entries]
    os.environ[ENV] = json.dumps(list(_loaded))
    return modules


def load_from_env() -> list[ModuleType]:
    """In a child process (a verifier worker): the extensions its parent had loaded."""
    return load(json.loads(os.environ.get(ENV) or "[]"))


def _load_one(entry: str) -> ModuleType:
    try:
        module = _load_file(Path(entry)) if entry.endswith(".py") else _load_module(entry)
    except UserError:
        raise
    except Exception as e:  # the user's module failed while loading: one line, where it failed
        frames = [f for f in traceback.extract_tb(e.__traceback__) if "importlib" not in f.filename]
        where = f" ({Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else ""
        raise UserError(f"imports: {entry}: {type(e).__name__}: {e}{where}") from e
    _loaded[entry] = module
    return module


def _load_module(name: str) -> ModuleType:
    if os.getcwd() not in sys.path:  # the `postrl` script's sys.path lacks the working directory
        sys.path.append(os.getcwd())
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name != name.split(".")[0] and e.name != name:
            raise
        raise UserError(f"imports: no module named {name!r} (not a .py file beside the recipe, "
                        f"nor importable from {os.getcwd()})") from None


def _load_file(path: Path) -> ModuleType:
    if not path.is_file():
        raise UserError(f"imports: {path}: no such file")
    name = path.stem
    existing = sys.modules.get(name)
    if existing is not None:
        if Path(getattr(existing, "__file__", "") or "").resolve() == path.resolve():
            return existing
        raise UserError(f"imports: {path}: its module name {name!r} is taken by {existing!r}; rename the file")
    if str(path.parent) not in sys.path:
        sys.path.append(str(path.parent))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module
