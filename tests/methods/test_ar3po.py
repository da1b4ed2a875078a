"""AR3PO (`reroll.methods.ar3po`): the method's name turns on both of its parts, the staged
allocator and the response reuse; the allocator alone has its own name."""

import pytest

from reroll.config_checks import load_checked
from reroll.control.allocators import ALLOCATORS
from reroll.errors import ConfigError


def test_the_ar3po_preset_turns_on_staged_sampling_and_response_reuse():
    """Paper's rule: k responses per stage, another stage only while none is correct, and a
    prompt with no correct response after its last stage reuses a past correct response.
    The stages alone are `ar3po_stages`; the name ``ar3po`` is the whole method."""
    cfg = load_checked(None, ["preset=ar3po"])
    assert cfg.control.allocator == "ar3po_stages"
    assert cfg.control.allocator_args == {"k": 2, "max_stages": 4}
    assert cfg.replay.reuse and cfg.replay.reuse_per_prompt == 1
    a = ALLOCATORS.get("ar3po_stages")(8, **cfg.control.allocator_args)
    assert (a.initial(None), a.max_size()) == (2, 8)
    assert "ar3po" not in ALLOCATORS.names()  # not the allocator alone under the method's name
    with pytest.raises(ConfigError):
        load_checked(None, ["control.allocator=ar3po"])
