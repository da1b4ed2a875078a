"""Methods are plug-ins: no stage imports `reroll.methods` at module level (a lookup in any
registry that methods plug into imports them, `reroll.registry.METHODS`), and every method's entry is then found; a registry without plug-ins (verifiers) imports none."""

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "reroll"


def test_no_stage_imports_the_methods_at_module_level():
    bad = []
    for path in ROOT.rglob("*.py"):
        if path.parent.name == "methods":
            continue
        for node in ast.parse(path.read_text()).body:  # module level only
            names = ([node.module or ""] if isinstance(node, ast.ImportFrom) else
                     [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            bad += [f"{path.relative_to(ROOT)}: {n}" for n in names
                    if n == "reroll.methods" or n.startswith("reroll.methods.")]
    assert bad == []


def test_a_lookup_registers_every_method():
    code = ("import sys\n"
            "from reroll.control.allocators import ALLOCATORS\n"
            "from reroll.control.selectors import SELECTORS\n"
            "from reroll.algo.tree_credit import TREE_CREDITS\n"
            "from reroll.workflows.tree import TREE_BRANCHES\n"
            "from reroll.control.lengths import LENGTHS\n"
            "from reroll.control.shapers import SHAPERS\n"
            "from reroll.replay.drafts import DRAFTERS\n"
            "assert 'reroll.methods' not in sys.modules\n"
            "print(ALLOCATORS.names(), SELECTORS.names(), TREE_CREDITS.names(), "
            "TREE_BRANCHES.names())\n"
            "print(LENGTHS.names(), SHAPERS.names(), DRAFTERS.names())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.split("\n")[0] == (
        "['ar3po_stages', 'dars', 'duet', 'fixed', 'gdro', 'xrpo'] ['dots', 'gdro', 'vade'] "
        "['leaves', 'segments', 'segments_once'] ['entropy', 'positions']")
    assert out.stdout.split("\n")[1] == "['fixed', 'siri'] ['dot'] ['das', 'spec_rl']"


def test_a_registry_without_plug_ins_imports_no_method():
    """A scoring worker looks up verifiers only: that must not import the methods (some of
    which import torch, which the workers never load)."""
    code = ("import sys\n"
            "from reroll.verifiers.base import VERIFIERS\n"
            "VERIFIERS.get('exact'); VERIFIERS.names()\n"
            "print('reroll.methods' in sys.modules, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False False"
