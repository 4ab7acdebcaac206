"""Recipes and overrides into the typed tree, and the tree back to YAML.

    cfg = load_config("recipes/default.yaml", ["rl.kl_coef=0.02", "train.total_steps=10"])

A recipe is a YAML file or a built-in recipe's name; `key=value` overrides are laid over it by
dotted key; `from_dict` builds the tree, coercing each value to its field's type and checking what
the field allows (`postrl.config.fields`); `postrl.config.checks.validate` then runs the checks
that span fields. The resolved config is what a run saves as `config.yaml` (`save_config`).
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from pathlib import Path
from typing import Any, Literal

import yaml

from postrl.config.checks import validate
from postrl.config.fields import ALLOWED, Choice
from postrl.config.schema import Config
from postrl.errors import ConfigError
from postrl.files import write_atomic


def load_config(path: str | Path | None = None, overrides: list[str] = (), imports: list[str] = ()) -> Config:
    """Recipe YAML (optional) + dotted `key=value` overrides -> validated `Config`. `imports` (the
    command line's `--import`) join the recipe's own; their modules must be loaded before this
    call when they register what the recipe names (`postrl.extensions.load_recipe` does both)."""
    raw = raw_recipe(path, overrides)
    raw["imports"] = recipe_imports(raw, imports)
    cfg = from_dict(Config, raw)
    validate(cfg)
    return cfg


def raw_recipe(path: str | Path | None, overrides: list[str] = ()) -> dict[str, Any]:
    """The recipe's mapping with the overrides applied, before any check."""
    raw: dict[str, Any] = {}
    if path is not None:
        path = recipe_path(path)
        raw = read_yaml(path)
        raw.setdefault("base_dir", str(Path(path).resolve().parent))
    for item in overrides:
        key, value = parse_override(item)
        set_dotted(raw, key, value)
    return raw


def recipe_imports(raw: dict[str, Any], extra: list[str] = ()) -> list[str]:
    """The recipe's `imports` (relative to its `base_dir`), then `extra` (relative to the working
    directory), resolved: a .py file, or a module name with a .py file beside the recipe, becomes
    an absolute path; any other entry stays a module name."""
    listed = raw.get("imports") or []
    if not isinstance(listed, list) or not all(isinstance(x, str) and x for x in listed):
        raise ConfigError(f"config key 'imports' = {listed!r}: expected a list of module names or .py files")
    base = Path(raw.get("base_dir") or Path.cwd())
    resolved = [resolve_import(x, base) for x in listed] + [resolve_import(x, Path.cwd()) for x in extra]
    return list(dict.fromkeys(resolved))


def resolve_import(entry: str, base: Path) -> str:
    if entry.endswith(".py") or "/" in entry:
        return str((base / entry).resolve())
    beside = base / (entry.replace(".", "/") + ".py")
    return str(beside.resolve()) if beside.is_file() else entry


RECIPES = Path(__file__).parent.parent / "recipes"  # shipped in the wheel; `recipes/` in a checkout links here


def builtin_recipes() -> list[str]:
    """The names `postrl train NAME` accepts: the recipes shipped inside the package."""
    return sorted(p.stem for p in RECIPES.glob("*.yaml"))


def recipe_path(path: str | Path) -> Path:
    """A recipe file, or a built-in recipe's name (`default` -> the package's recipes/default.yaml).
    A file of that name in the working directory wins over the built-in one."""
    p = Path(path)
    if p.is_file() or p.suffix or len(p.parts) > 1:
        return p
    if (RECIPES / f"{p}.yaml").is_file():
        return RECIPES / f"{p}.yaml"
    raise ConfigError(f"recipe not found: {p} (not a file; built-in recipes: {', '.join(builtin_recipes())})")


def read_yaml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"recipe not found: {p}")
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise ConfigError(f"{p}:{where} invalid YAML: {getattr(e, 'problem', e)}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: a recipe must be a mapping of keys, got {type(data).__name__}")
    return data


def parse_override(item: str) -> tuple[str, Any]:
    if "=" not in item:
        raise ConfigError(f"override {item!r} is not of the form key=value")
    key, text = item.split("=", 1)
    try:
        value = yaml.safe_load(text) if text != "" else ""
    except yaml.YAMLError:
        value = text
    return key.strip(), value


def set_dotted(raw: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    node = raw
    for part in parts[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = {}
            node[part] = child
        node = child
    node[parts[-1]] = value


def from_dict(cls: type, raw: Any, prefix: str = "") -> Any:
    """Build dataclass `cls` from a nested dict, checking every key, type, choice and range."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{prefix or 'config'}: expected a mapping, got {raw!r}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    extensions = getattr(cls, "EXTENSIONS", {})  # monitor settings that extensions register
    kwargs: dict[str, Any] = {}
    for key, value in raw.items():
        dotted = f"{prefix}{key}"
        if key not in fields and key in extensions:  # checked here, kept plain: see monitor.settings
            kwargs.setdefault("plugins", {})[key] = dataclasses.asdict(coerce(extensions[key], value, dotted))
            continue
        if key not in fields:
            raise ConfigError(unknown_key_message(dotted, key, [*fields, *extensions], prefix))
        kwargs[key] = coerce(hints[key], value, dotted)
        check_allowed(fields[key], kwargs[key], dotted)
    obj = cls(**kwargs)
    return obj


def check_allowed(f: dataclasses.Field, value: Any, key: str) -> None:
    """A value outside its field's `ALLOWED` metadata (any item, for a list) is a one-line error."""
    allowed = f.metadata.get(ALLOWED)
    if allowed is None:
        return
    for item_key, item in ([(f"{key}[{i}]", v) for i, v in enumerate(value)] if isinstance(value, list)
                           else [(key, value)]):
        if item not in allowed:
            raise ConfigError(f"config key '{item_key}' = {item!r}: {allowed.error()}")


def unknown_key_message(dotted: str, key: str, valid: list[str], prefix: str) -> str:
    close = difflib.get_close_matches(key, valid, n=1, cutoff=0.5)
    hint = f"; did you mean '{prefix}{close[0]}'?" if close else f"; valid keys: {', '.join(valid)}"
    return f"unknown config key '{dotted}'{hint}"


def coerce(tp: Any, value: Any, key: str) -> Any:
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value, key + ".")
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return coerce(inner[0], value, key)
    if origin is list:
        (item_tp,) = typing.get_args(tp)
        if not isinstance(value, list):
            raise type_error(key, value, tp)
        return [coerce(item_tp, v, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        _, val_tp = typing.get_args(tp)
        if not isinstance(value, dict):
            raise type_error(key, value, tp)
        return {str(k): coerce(val_tp, v, f"{key}.{k}") for k, v in value.items()}
    if tp is Any:
        return value
    if origin is Literal:
        choice = Choice(typing.get_args(tp))
        if isinstance(value, bool) and {"on", "off"} <= set(choice.names):
            value = "on" if value else "off"  # YAML 1.1 reads on and off (yes, no) unquoted as booleans
        if value in choice:
            return value
        raise ConfigError(f"config key '{key}' = {value!r}: {choice.error()}")
    return coerce_scalar(tp, value, key)


def coerce_scalar(tp: Any, value: Any, key: str) -> Any:
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp is float and isinstance(value, str):
        try:  # YAML 1.1 reads 5e-5 (no dot) as a string; a float field takes it as the number it is
            return float(value)
        except ValueError:
            pass
    if tp in (int, float, str, bool):
        if isinstance(value, tp) and not (tp is int and isinstance(value, bool)):
            return value
        raise type_error(key, value, tp)
    raise ConfigError(f"config key '{key}' has an unsupported type {tp}")


def type_error(key: str, value: Any, tp: Any) -> ConfigError:
    name = getattr(tp, "__name__", str(tp)).replace("typing.", "")
    if typing.get_origin(tp) is not None:
        name = str(tp).replace("typing.", "")
    return ConfigError(f"config key '{key}' = {value!r}: expected {name}, got {type(value).__name__}")


def to_dict(cfg: Any) -> dict[str, Any]:
    out = dataclasses.asdict(cfg)
    if isinstance(cfg, Config):  # extension monitors' settings are written where the recipe had them
        out["monitor"].update(out["monitor"].pop("plugins"))
    return out


def save_config(cfg: Config, path: str | Path) -> None:
    """Written whole or not at all: `--resume` reads it back, and a half-written one would be neither
    a run to resume nor an empty directory to start in."""
    write_atomic(path, yaml.safe_dump(to_dict(cfg), sort_keys=False))
