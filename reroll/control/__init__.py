"""Rollout control: decisions about which groups to keep and how to spend the budget.

Pure decision functions (filters, allocation rules, the staleness formula) live here;
importing this package registers the group filters.
"""

from reroll.control.filters import FILTERS

__all__ = ["FILTERS"]
