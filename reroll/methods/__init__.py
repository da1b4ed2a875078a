"""Methods: one paper, one module. A method module holds its paper's math and registers its
components into the stages' registries (allocators, selectors, workflows' tree branches,
tree credits); it imports the stages, and no stage imports it. The registries import this
package on their first lookup (`reroll.registry.PLUGINS`), so `reroll list`, `reroll
config` and config validation see every entry.
"""

from reroll.methods import latr, treerl  # noqa: F401  (registers them)
