"""What `reroll config` prints: every config key with its type, default, value and
docstring, and under each key that chooses a registered component, that component's
hyperparameters (with the configured values).

Field docstrings are the string literals written under each dataclass field (read from
the source, since Python keeps no attribute docstrings). Knows the config dataclasses and
the catalogue of registries; knows nothing of what any setting does.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import textwrap
from dataclasses import dataclass
from typing import Any

from reroll.catalog import (
    BY_KEY,
    Catalogued,
    format_hyperparameter,
    hyperparameters,
    summary,
    wrapped,
)
from reroll.config import RunConfig


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """Field name -> the docstring written under it in ``cls``'s body."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body  # the class's statements
    out = {}
    for node, nxt in zip(body, body[1:]):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)):
            out[node.target.id] = inspect.cleandoc(nxt.value.value)
    return out


@dataclass(frozen=True)
class KeyDoc:
    key: str
    """Dotted, as on the command line (``train.lr``)."""
    type: str
    default: Any
    value: Any
    doc: str


def config_keys(cfg: RunConfig) -> list[KeyDoc]:
    """Every leaf key of ``cfg`` (nested tables walked), in declaration order."""
    out: list[KeyDoc] = []

    def walk(node: Any, default: Any, prefix: str) -> None:
        docs = field_docs(type(node))
        for f in dataclasses.fields(node):
            v, d = getattr(node, f.name), getattr(default, f.name)
            if dataclasses.is_dataclass(v):
                walk(v, d, prefix + f.name + ".")
            else:
                tp = f.type if isinstance(f.type, str) else inspect.formatannotation(f.type)
                out.append(KeyDoc(prefix + f.name, tp, d, v, docs.get(f.name, "")))

    walk(cfg, RunConfig(), "")
    return out


def _lookup(cfg: RunConfig, key: str) -> Any:
    node: Any = cfg
    for part in key.split("."):
        node = getattr(node, part)
    return node


def component_lines(cfg: RunConfig, entry: Catalogued) -> dict[str, list[str]]:
    """What to print under the keys of a registry-backed choice: the chosen component's
    summary under the choosing key, its hyperparameters (configured values beside the
    defaults) under the key that holds them. A list-valued key (``many``) gets both."""
    reg = entry.registry()
    chosen = _lookup(cfg, entry.key)
    specs = ([(s.get("name", ""), s.get("args", {})) for s in chosen] if entry.many
             else [(chosen, _lookup(cfg, entry.args_key) if entry.args_key else {})])
    out: dict[str, list[str]] = {entry.key: []}
    params = out.setdefault(entry.args_key or entry.key, [])
    if entry.many and not specs:
        out[entry.key].append("(empty: the task's default verifier, weight 1)")
    for name, args in specs:
        if not name:
            continue
        if name not in reg:
            out[entry.key].append(f"{name!r}: not a registered {reg.kind}, built into the "
                                  f"wiring (registered: {', '.join(reg.names())})")
            continue
        out[entry.key].append(f"{name}: {summary(reg.get(name))}".rstrip(": "))
        if not (entry.args_key or entry.many):
            continue
        hps = hyperparameters(reg, name)
        params.append(f"hyperparameters of {name}:" if hps else f"{name} has no hyperparameters")
        for h in hps:
            value = args.get(h.name, inspect.Parameter.empty)
            params.append("  " + format_hyperparameter(h, value))
    return out


def describe(cfg: RunConfig, *, only: str = "", width: int = 92) -> str:
    """The text `reroll config` prints for ``cfg`` (values beside defaults where they
    differ). ``only``: one key or a table prefix (``train``, ``algo.surrogate``)."""
    every = config_keys(cfg)
    keys = [k for k in every if not only or k.key == only or k.key.startswith(only + ".")]
    if not keys:
        from reroll.errors import ConfigError
        from reroll.registry import closest

        names = sorted({k.key for k in every} | {k.key.rsplit(".", 1)[0] for k in every})
        raise ConfigError(f"no config key or table {only!r}{closest(only, names)}")
    shown = {k.key for k in keys}
    extra: dict[str, list[str]] = {}
    for entry in BY_KEY.values():
        if entry.key in shown or entry.args_key in shown:
            for key, lines in component_lines(cfg, entry).items():
                extra.setdefault(key, []).extend(lines)
    blocks = []
    for k in keys:
        head = f"{k.key}: {k.type} = {k.value!r}"
        if k.value != k.default:
            head += f"  (default {k.default!r})"
        lines = [head]
        if k.doc:
            lines.append(textwrap.fill(k.doc, width, initial_indent="    ",
                                       subsequent_indent="    "))
        lines += [wrapped(x.strip(), 4 + len(x) - len(x.lstrip()), width)
                  for x in extra.get(k.key, [])]
        blocks.append("\n".join(lines))
    return "\n".join(blocks)
