"""Methods: one paper, one module. A method module holds its paper's math and registers its
components into the stages' registries (allocators, selectors, length schedules, group
shapers, drafters, tree branches, tree credits, pruners); it imports the stages, and no
stage imports it. The registries they plug into import this package on their first lookup
(``Registry(..., plugins=reroll.registry.METHODS)``), so
`reroll list`, `reroll config` and config validation see every entry.

ar3po, dars, xrpo, gdro, duet: allocators (gdro also a selector; duet also the marker gate);
vade, dots: selectors; siri: a length schedule; dot: a group shaper; specrl, das:
drafters (speculative rollouts); latr: the tree workflow's branching; treerl: segment credit;
vcpo: the advantage estimator ``opob`` and the optimiser step hook ``ess_lr``; arrol: the
pruner ``arrol`` (its quality head's training in `arrol_head`).
"""

from reroll.methods import (  # noqa: F401  (registers them)
    ar3po,
    arrol,
    dars,
    das,
    dot,
    dots,
    duet,
    gdro,
    latr,
    siri,
    specrl,
    treerl,
    vade,
    vcpo,
    xrpo,
)
