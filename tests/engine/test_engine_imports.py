"""The engine stands below the methods that use it: no module under reroll/engine/ imports
reroll.control or reroll.replay, anywhere (module level, inside functions, under
`if TYPE_CHECKING:`, relative imports, or by name through importlib / __import__); and its
plug-ins use the engine through the plug-in surface, never its private attributes."""

import ast
from pathlib import Path

ENGINE = Path(__file__).resolve().parents[2] / "reroll" / "engine"
BANNED = ("reroll.control", "reroll.replay")


def package_of(path: Path) -> list[str]:
    return ["reroll", *path.relative_to(ENGINE.parent).with_suffix("").parts[:-1]]


def imported(source: str, pkg: list[str]) -> set[str]:
    """Every module name ``source`` (a module of package ``pkg``) imports or asks importlib /
    __import__ for by a constant."""
    out = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(pkg[:len(pkg) - node.level + 1]) if node.level else ""
            mod = ".".join(x for x in (base, node.module or "") if x)
            out |= {mod} | {f"{mod}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            name = ast.unparse(node.func)
            if name in ("importlib.import_module", "import_module", "__import__"):
                out.add(str(node.args[0].value))
    return out


def test_no_engine_module_imports_control_or_replay():
    files = sorted(ENGINE.rglob("*.py"))
    assert len(files) > 20  # the whole package, plug-ins included
    bad = {str(f.relative_to(ENGINE.parent)): sorted(
        m for m in imported(f.read_text(), package_of(f)) if m.startswith(BANNED))
        for f in files}
    assert {f: m for f, m in bad.items() if m} == {}


def test_the_scan_sees_every_kind_of_import():
    probe = ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
             "    from reroll.control import arrol\n"
             "def f():\n    import reroll.replay.store\n"
             "    from ...replay import drafts\n"
             "    importlib.import_module('reroll.control.rules')\n")
    got = imported(probe, ["reroll", "engine", "plugins"])
    assert {"reroll.control.arrol", "reroll.replay.store", "reroll.replay.drafts",
            "reroll.control.rules"} <= got


def test_plugins_use_no_private_attribute_of_the_engine_nor_of_another_plugin():
    for f in sorted((ENGINE / "plugins").glob("*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not (
                    node.attr.startswith("__")):
                owner = ast.unparse(node.value)
                assert owner == "self", f"{f.name}: {ast.unparse(node)}"
            if isinstance(node, ast.Attribute) and ast.unparse(node.value) == "self.core":
                assert node.attr not in ("forks", "branches", "drafts", "redrafts", "prune",
                                         "plugins"), f"{f.name}: {ast.unparse(node)}"
