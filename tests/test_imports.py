"""The architecture stays visible: importing the loop pulls in neither Ray nor the runtime
(the runtime composes the loop, never the other way), and no module of the package imports
one that imports it back (function-level imports included; `if TYPE_CHECKING:` blocks,
which never run, excluded)."""

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "reroll"


def test_importing_the_loop_pulls_in_neither_ray_nor_the_runtime():
    code = ("import sys, reroll.loop; bad = [m for m in sys.modules if m == 'ray' or "
            "m.startswith(('ray.', 'reroll.runtime'))]; print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def module_name(p: Path) -> str:
    parts = p.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, known: set[str]) -> set[str]:
    """reroll modules a file imports anywhere (module level or inside functions)."""
    tree = ast.parse(path.read_text())
    skip = set()
    for node in ast.walk(tree):  # `if TYPE_CHECKING:` bodies never run
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip |= {id(n) for b in node.body for n in ast.walk(b)}
    out = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        out |= {n for n in names if n in known}
    return out


def test_no_module_imports_one_that_imports_it_back():
    files = {module_name(p): p for p in ROOT.rglob("*.py")}
    graph = {m: imports(p, set(files)) - {m} for m, p in files.items()}
    cycles = []

    def visit(start, node, path):
        for nxt in sorted(graph[node]):
            if nxt == start:
                cycles.append(" -> ".join(path + [start]))
            elif nxt not in path and len(path) < 8:
                visit(start, nxt, path + [nxt])

    for m in sorted(graph):
        visit(m, m, [m])
    assert not cycles, "import cycles:\n" + "\n".join(sorted(set(cycles))[:20])
