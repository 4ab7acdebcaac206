"""The docs cannot rot: the site builds strictly, every config key is documented, and the code
blocks of README.md and docs/*.md run.

Each fenced block in bash, python or yaml carries a marker on the line before it:

    <!-- docs-test: run -->            bash: each command runs (in a scratch directory); python: the block runs
    <!-- docs-test: recipe FILE -->    yaml: the block is FILE's text, word for word, and `postrl plan FILE` accepts it
    <!-- docs-test: snippet -->        yaml: a part of a recipe; laid over the built-in defaults, the config loads
    <!-- docs-test: skip REASON -->    not run (long: `make demo`, servers, benchmarks; or needs RUN_DIR)

A block without a marker fails `test_every_block_is_marked`, so nothing slips through unmarked.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted([ROOT / "README.md", ROOT / "CHANGELOG.md", *(ROOT / "docs").glob("*.md")])
CHECKED = ("bash", "sh", "python", "yaml", "yml")
FENCE = re.compile(r"^(\s*)```(\w*)\s*$")
MARKER = re.compile(r"<!--\s*docs-test:\s*(\w+)\s*(.*?)\s*-->")
BIN = Path(sys.executable).parent


def blocks(page: Path):
    """(page, line, language, marker, argument, code) for every fenced block of a page."""
    lines = page.read_text().splitlines()
    out, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, lang, start = m.group(1), m.group(2), i
        j = i + 1
        while j < len(lines) and lines[j].strip() != "```":
            j += 1
        code = "\n".join(line[len(indent):] for line in lines[i + 1:j]) + "\n"
        prev = next((lines[k] for k in range(start - 1, -1, -1) if lines[k].strip()), "")
        mark = MARKER.search(prev)
        out.append((page, start + 1, lang, mark.group(1) if mark else None, mark.group(2) if mark else "", code))
        i = j + 1
    return out


ALL = [b for page in PAGES for b in blocks(page)]


def case_id(b) -> str:
    return f"{b[0].relative_to(ROOT)}:{b[1]}"


def test_every_block_is_marked():
    unmarked = [case_id(b) for b in ALL if b[2] in CHECKED and b[3] not in ("run", "recipe", "snippet", "skip")]
    assert not unmarked, f"code blocks with no docs-test marker: {unmarked}"
    assert all(b[4] for b in ALL if b[3] == "skip"), "a skip marker says why"


def test_the_docs_hold_runnable_blocks():
    kinds = {b[3] for b in ALL}
    assert {"run", "recipe", "snippet", "skip"} <= kinds  # the parser finds what the pages mark


def scratch_env() -> dict[str, str]:
    return dict(os.environ, PATH=f"{BIN}:{os.environ['PATH']}")


def in_scratch(tmp_path: Path) -> Path:
    """A scratch working directory that sees the checkout's recipes, examples and data."""
    for name in ("recipes", "examples", "postrl"):
        (tmp_path / name).symlink_to(ROOT / name)
    return tmp_path


@pytest.mark.parametrize("block", [b for b in ALL if b[3] == "run"], ids=case_id)
def test_runnable_block(block, tmp_path, builtin_models_cached):
    page, line, lang, _, _, code = block
    cwd = in_scratch(tmp_path)
    if lang == "python":
        script = tmp_path / "block.py"
        script.write_text(code)
        cmd = [sys.executable, str(script)]
    else:
        cmd = ["bash", "-euo", "pipefail", "-c", code]
    proc = subprocess.run(cmd, cwd=cwd, env=scratch_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{case_id(block)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"


@pytest.mark.parametrize("block", [b for b in ALL if b[3] == "recipe"], ids=case_id)
def test_recipe_block(block, tmp_path):
    _, _, _, _, file, code = block
    assert (ROOT / file).read_text() == code, f"{case_id(block)} differs from {file}: copy the file into the page"
    proc = subprocess.run([str(BIN / "postrl"), "plan", str(ROOT / file)], capture_output=True, text=True,
                          env=scratch_env(), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("block", [b for b in ALL if b[3] == "snippet"], ids=case_id)
def test_snippet_block(block, tmp_path):
    from postrl.config.loading import load_config

    recipe = tmp_path / "snippet.yaml"
    recipe.write_text(yaml.safe_dump(yaml.safe_load(block[5])))
    load_config(recipe)  # unknown keys, wrong types and out-of-range values raise


def load_hooks():
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_config_key_is_documented():
    hooks = load_hooks()
    assert not hooks.undocumented(), f"config fields with no docstring: {hooks.undocumented()}"
    reference = hooks.reference()
    assert "`rl.kl_coef`" in reference and "`domains.NAME.max_new_tokens`" in reference
    assert "`params.verifier`" in reference  # the dataset domain's params
    # what a key allows beyond its type, from the field's declaration: a range, a Literal's choices
    assert "| `train.top_p` | `float` | in (0, 1] | `1.0` |" in reference
    assert "| `rl.kl_in` | `str` | loss or reward | `'loss'` |" in reference
    assert "| `domains.NAME.stop` | `list[str]` | each not empty | `[]` |" in reference


def test_site_builds_strictly(tmp_path):
    """`mkdocs build --strict`: a broken link, a page missing from the nav or a docstring that
    mkdocstrings cannot render fails the build."""
    proc = subprocess.run([str(BIN / "mkdocs"), "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    config_page = (tmp_path / "site" / "config" / "index.html").read_text()
    assert "rl.kl_coef" in config_page and "generated: config reference" not in config_page


# ---- coming from TRL or verl: the tables name real config keys --------------------------------------

COMING = ROOT / "docs" / "coming-from-trl-verl.md"


def config_key_exists(key: str) -> bool:
    """Whether dotted `key` is a leaf field of the Config dataclasses: NAME stands for a dict's key
    (`domains.NAME.reward`), and a domain's `params` are the dataset domain's (`DatasetParams`)."""
    import dataclasses
    import typing

    from postrl.config.schema import Config
    from postrl.tasks.dataset import DatasetParams

    tp, parts, i = Config, key.split("."), 0
    while i < len(parts):
        if not dataclasses.is_dataclass(tp) or parts[i] not in (hints := typing.get_type_hints(tp)):
            return False
        tp, i = hints[parts[i]], i + 1
        if typing.get_origin(tp) is dict and i < len(parts):
            if parts[i - 1] == "params":
                tp = DatasetParams
            elif parts[i] == "NAME":
                tp, i = typing.get_args(tp)[1], i + 1
            else:
                return False
    return not dataclasses.is_dataclass(tp)  # a value one sets, not a section


def coming_keys() -> list[str]:
    """The postrl column (the second) of every table row of the page, one key each."""
    rows = [line.split("|")[1:-1] for line in COMING.read_text().splitlines() if line.startswith("| `")]
    keys = [re.findall(r"`([^`]+)`", cells[1]) for cells in rows]
    assert all(len(k) == 1 for k in keys), [cells for cells, k in zip(rows, keys) if len(k) != 1]
    return [k[0] for k in keys]


def test_coming_from_trl_verl_names_only_real_config_keys():
    keys = coming_keys()
    assert len(keys) >= 60 and "train.samples_per_prompt" in keys and "domains.NAME.params.split_by" in keys
    assert [k for k in keys if not config_key_exists(k)] == []
    for bogus in ("train.learning_rate", "domains.NAME.params.data_source", "rl", "domains.gsm.weight",
                  "monitor.wandb.team"):  # the walk can say no
        assert not config_key_exists(bogus), bogus
    assert "coming-from-trl-verl.md" in (ROOT / "mkdocs.yml").read_text()
