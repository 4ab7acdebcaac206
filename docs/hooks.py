"""MkDocs hook: the config reference (docs/config.md) is generated from the config dataclasses.

Every key of `postrl.config.schema.Config` (monitors' settings included) and every domain's `params`
dataclass (`*Params` in `postrl.tasks`) gets a row: dotted key, type, the values it allows (a
`Literal`'s choices, a range: `postrl.config.fields.allowed_of`), default and the docstring written
under the field. Nothing is copied by hand, so a new key cannot go undocumented:
`tests/test_docs.py` fails when a field has no docstring, and `mkdocs build --strict` (run by
`make test`) builds this page from the code of the checkout.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import pkgutil
import textwrap
import typing

MARKER = "<!-- generated: config reference -->"


def field_docs(cls: type) -> dict[str, str]:
    """{field name: the string literal written right under it} from the sources of the class and
    of the dataclasses it extends (a domain's params extend `SandboxSettings`); the class's own win."""
    docs = {}
    for klass in reversed([k for k in cls.__mro__ if dataclasses.is_dataclass(k)]):
        tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        body = tree.body[0].body
        for node, nxt in zip(body, body[1:] + [None]):
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                if isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str):
                    docs[node.target.id] = " ".join(inspect.cleandoc(nxt.value.value).split())
    return docs


def type_name(tp) -> str:
    if typing.get_origin(tp) is typing.Literal:  # its choices go to the `allowed` column
        return type(typing.get_args(tp)[0]).__name__
    text = tp.__name__ if isinstance(tp, type) else str(tp)
    return text.replace("typing.", "")


def default_of(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        return repr(f.default)
    if f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
        return "" if dataclasses.is_dataclass(value) else repr(value)
    return "(required)"


def rows(cls: type, prefix: str = "") -> list[tuple[str, str, str, str, str]]:
    """(dotted key, type, default, doc, allowed) for every leaf field of a config dataclass, depth
    first; a nested dataclass is walked, its key the prefix of its fields."""
    from postrl.config.fields import allowed_of

    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    out = []
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        value_tp = typing.get_args(tp)[-1] if typing.get_origin(tp) is dict else None
        if dataclasses.is_dataclass(tp):
            out += rows(tp, f"{prefix}{f.name}.")
        elif dataclasses.is_dataclass(value_tp):  # a mapping of sections by name: `domains.NAME.*`
            out.append((prefix + f.name, f"dict[str, {value_tp.__name__}]", "", docs.get(f.name, ""), ""))
            out += rows(value_tp, f"{prefix}{f.name}.NAME.")
        else:
            allowed = allowed_of(tp, f)
            shown = "" if allowed is None else f"each {allowed}" if typing.get_origin(tp) is list else str(allowed)
            out.append((prefix + f.name, type_name(tp), default_of(f), docs.get(f.name, ""), shown))
    return out


def params_classes() -> dict[str, type]:
    """Every domain's params dataclass (`*Params` in a module of postrl.tasks), by module."""
    import postrl.tasks

    found = {}
    for info in pkgutil.iter_modules(postrl.tasks.__path__):
        module = importlib.import_module(f"postrl.tasks.{info.name}")
        for name, obj in vars(module).items():
            if name.endswith("Params") and dataclasses.is_dataclass(obj) and obj.__module__ == module.__name__:
                found[f"{info.name}.{name}"] = obj
    return dict(sorted(found.items()))


def table(entries) -> str:
    lines = ["| key | type | allowed | default | what it does |", "|---|---|---|---|---|"]
    for key, tp, default, doc, allowed in entries:
        cells = [f"`{key}`", f"`{tp}`", allowed, f"`{default}`" if default else "", doc]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines)


def reference() -> str:
    """The whole generated reference, as Markdown."""
    from postrl.config.schema import Config

    by_section: dict[str, list] = {}
    for row in rows(Config):
        section = row[0].split(".")[0] if "." in row[0] else "top level"
        by_section.setdefault(section, []).append(row)
    parts = []
    for section, entries in by_section.items():
        parts += [f"### `{section}`" if section != "top level" else "### Top level", "", table(entries), ""]
    parts += ["## Domain parameters", "",
              "A domain's `params:` mapping is checked against its own dataclass, with the same one-line "
              "errors as the config. The domain types and their parameter classes:", ""]
    for where, cls in params_classes().items():
        parts += [f"### `{where}`", "", table(rows(cls, "params.")), ""]
    return "\n".join(parts)


def undocumented() -> list[str]:
    """Keys whose field has no docstring (tests/test_docs.py requires none)."""
    from postrl.config.schema import Config

    keys = [r[0] for r in rows(Config) if not r[3]]
    for where, cls in params_classes().items():
        keys += [f"{where}: {r[0]}" for r in rows(cls, "params.") if not r[3]]
    return keys


def on_page_markdown(markdown: str, page, config, files):
    if MARKER in markdown:
        return markdown.replace(MARKER, reference())
    return markdown
