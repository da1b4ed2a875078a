import pytest

from reroll.registry import Registry, RegistryError


def test_bind_checks_signature():
    reg = Registry("thing")

    @reg.register("scale")
    def scale(x, *, factor: float, offset: float = 0.0):
        return x * factor + offset

    assert reg.bind("scale", {"factor": 2.0})(3) == 6.0
    assert reg.bind("scale", {"factor": 2.0, "offset": 1.0})(3) == 7.0
    with pytest.raises(RegistryError, match="needs hyperparameter.*factor"):
        reg.bind("scale", {})
    with pytest.raises(RegistryError, match="no hyperparameter 'factr'.*did you mean 'factor'"):
        reg.bind("scale", {"factor": 1.0, "factr": 2})
    with pytest.raises(RegistryError, match="unknown thing 'scal'.*'scale'"):
        reg.get("scal")
    with pytest.raises(RegistryError, match="registered twice"):
        reg.register("scale")(scale)
