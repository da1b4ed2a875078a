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


def test_a_choice_with_an_off_value_checks_the_chosen_and_refuses_args_for_off():
    reg = Registry("thing")

    @reg.register("cut", ranges={"at": "[1, inf)"})
    def cut(*, at: int = 1):
        return at

    assert reg.check_choice("control.thing", "none", {}, off="none") is False
    assert reg.check_choice("control.thing", "cut", {"at": 3}, off="none") is True
    with pytest.raises(RegistryError, match='control.thing = "none" takes no thing_args, '
                                            r"got \['at'\]"):
        reg.check_choice("control.thing", "none", {"at": 3}, off="none")
    with pytest.raises(RegistryError, match=r"'at' \(in control.thing_args\) must be in"):
        reg.check_choice("control.thing", "cut", {"at": 0}, off="none")


def test_a_string_hyperparameter_can_declare_its_choices():
    reg = Registry("thing")

    @reg.register("pick", ranges={"how": "{rate, attention}"})
    def pick(*, how: str = "rate"):
        return how

    assert reg.bind("pick", {"how": "attention"})() == "attention"
    with pytest.raises(RegistryError, match=r"'how' \(in x\) must be one of \{rate, "
                                            r"attention\}, got 'embedding'"):
        reg.bind("pick", {"how": "embedding"}, "x")
    assert reg.ranges("pick")["how"].text == "{rate, attention}"
    with pytest.raises(ValueError, match="bad choice"):
        reg.register("bad", ranges={"how": "{}"})(pick)


def _package_registries() -> dict[str, Registry]:
    """Every ``Registry`` defined in the reroll package, after importing all of its modules
    (so that every component is registered); keyed by ``module.NAME``."""
    import importlib
    import pkgutil
    import sys

    import reroll

    for m in pkgutil.walk_packages(reroll.__path__, "reroll."):
        try:
            importlib.import_module(m.name)
        except ImportError:  # an optional dependency (ray) that this install lacks
            pass
    return {f"{mod.__name__}.{k}": v for mod in list(sys.modules.values())
            if getattr(mod, "__name__", "").startswith("reroll")
            for k, v in vars(mod).items() if isinstance(v, Registry)}


def _is_numeric(param, hint) -> bool:
    """An int/float hyperparameter (``float | None`` included; bool and lists are not)."""
    import types
    import typing

    args = typing.get_args(hint) if isinstance(hint, types.UnionType) or \
        typing.get_origin(hint) is typing.Union else (hint,)
    if any(a in (int, float) for a in args):
        return True
    d = param.default
    return d is not param.empty and not isinstance(d, bool) and isinstance(d, int | float)


def test_every_registered_numeric_hyperparameter_declares_its_range():
    import typing

    regs = _package_registries()
    kinds = {r.kind for r in regs.values()}
    assert {"advantage", "surrogate", "aggregation", "KL estimator", "correction", "filter",
            "verifier", "task", "environment", "workflow", "engine", "allocator", "selector",
            "length schedule"} <= kinds, kinds
    missing, checked = set(), 0
    for reg in regs.values():
        for name in reg.names():
            params = reg.hyperparameters(name)
            ranges = reg.ranges(name)
            # a declared range names a real hyperparameter, and its default lies inside it
            assert set(ranges) <= set(params), (reg.kind, name, set(ranges) - set(params))
            for key, rng in ranges.items():
                d = params[key].default
                if d is not params[key].empty and d is not None:
                    assert d in rng, f"{reg.kind} {name!r}: default {key}={d} not in {rng.text}"
            hints = typing.get_type_hints(reg.get(name))
            for key, p in params.items():
                if _is_numeric(p, hints.get(key, p.annotation)):
                    checked += 1
                    if key not in ranges:
                        missing.add((reg.kind, name, key))
    assert checked >= 40  # the walk found the components (not an empty registry)
    assert missing == set(), f"declare ranges for: {sorted(missing)}"


@pytest.mark.parametrize("kind,name,kwargs,message", [
    ("task", "longtail", {"alpha": 0.0}, r"'alpha' must be in \(0, inf\), got 0.0"),
    ("task", "longtail", {"test_letters": 52}, r"'test_letters' must be in \[1, 51\], got 52"),
    ("task", "longtail", {"n_train": 0}, r"'n_train' must be in \[1, inf\), got 0"),
    ("task", "jsonl", {"path": "x.jsonl", "test_fraction": 1.0},
     r"'test_fraction' must be in \[0, 1\), got 1.0"),
    ("task", "parquet", {"path": "x.parquet", "test_fraction": -0.1},
     r"'test_fraction' must be in \[0, 1\), got -0.1"),
])
def test_the_newly_declared_ranges_refuse_out_of_range_values(kind, name, kwargs, message):
    reg = next(r for r in _package_registries().values() if r.kind == kind)
    with pytest.raises(RegistryError, match=message):
        reg.bind(name, kwargs)
    ok = {k: (0.5 if k == "alpha" else 0.2 if k == "test_fraction" else 10 if k == "test_letters"
              else 5) if not isinstance(v, str) else v for k, v in kwargs.items()}
    reg.bind(name, ok)  # in range: accepted
