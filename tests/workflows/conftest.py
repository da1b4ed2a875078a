import pytest


@pytest.fixture()
def tiny(tiny_dir, device):
    """The tiny model (as tests/conftest.py's ``tiny``) on ``--device``: the workflows here
    drive a `TorchEngine` over it."""
    from reroll.models import load

    model, tok = load(tiny_dir)
    return model.to(device), tok
