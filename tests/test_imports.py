"""The architecture stays visible: importing the loop pulls in neither Ray nor the runtime
(the runtime composes the loop, never the other way), and the package's modules import one
another without a cycle.

What the cycle test counts: every ``import reroll.x`` and ``from reroll.x import y`` in a
module, wherever it is written: at module level, inside functions (a lazy import still ties
the two modules together), and inside ``if TYPE_CHECKING:`` blocks (a type-hint import is a
dependency too, even if it never runs). An edge goes to the module named (and to
``reroll.x.y`` where ``y`` is a submodule), not to the parent packages Python initialises on
the way: a package's ``__init__`` importing its own submodules so that they register, while
those import the package's base module, is the registry pattern, not a cycle.
"""

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
    """reroll modules a file imports anywhere (module level, functions, TYPE_CHECKING)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        out |= {n for n in names if n in known}
    return out


def import_graph() -> dict[str, set[str]]:
    files = {module_name(p): p for p in ROOT.rglob("*.py")}
    return {m: imports(p, set(files)) - {m} for m, p in files.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One cycle of ``graph`` as [a, b, ..., a], or [] when it has none (depth-first search,
    iterative: the package is deeper than a recursion limit should have to care about)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: finished
    for root in sorted(graph):
        if root in state:
            continue
        path, stack = [root], [iter(sorted(graph[root]))]
        state[root] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            elif nxt not in state:
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(sorted(graph[nxt])))
    return []


def test_find_cycle_finds_one_and_only_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) == []
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_no_module_imports_one_that_imports_it_back():
    cycle = find_cycle(import_graph())
    assert not cycle, "import cycle: " + " -> ".join(cycle)


def test_the_config_package_imports_neither_torch_nor_a_registry():
    code = ("import sys, reroll.config; bad = [m for m in sys.modules if m == 'torch' or "
            "m.startswith(('reroll.algo', 'reroll.engine', 'reroll.config_checks'))]; "
            "print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
