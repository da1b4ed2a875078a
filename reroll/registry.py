"""A small generic registry with signature-checked keyword arguments.

Components (advantage estimators, surrogates, aggregations, KL estimators, corrections,
tasks, verifiers, filters) register under a name. Their hyperparameters are keyword-only
parameters (after ``*``); ``Registry.check_kwargs`` checks a config's kwargs against that
signature and the declared ranges when the config is checked (before any work starts), so an
unknown, missing or out-of-range hyperparameter is an error that names the component and
the key; ``Registry.bind`` checks them again. The trainer only looks things up: no
branching on names.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


class RegistryError(KeyError):
    def __str__(self) -> str:  # KeyError quotes its message; we want it plain
        return str(self.args[0])


def closest(name: str, options: list[str]) -> str:
    match = difflib.get_close_matches(name, options, n=1, cutoff=0.0)
    return f" (did you mean {match[0]!r}?)" if match else ""


@dataclass(frozen=True)
class Range:
    """A numeric interval in the usual notation: ``Range.parse("(0, 1]")``; ``inf`` for an
    open end. ``None`` is accepted where the parameter's default is None."""

    low: float
    high: float
    low_open: bool
    high_open: bool
    text: str

    @classmethod
    def parse(cls, text: str) -> Range:
        m = re.fullmatch(r"\s*([\[(])\s*(-?[\w.]+)\s*,\s*(-?[\w.]+)\s*([\])])\s*", text)
        if not m:
            raise ValueError(f"bad range {text!r}; write it like '(0, 1]' or '[0, inf)'")
        return cls(float(m[2]), float(m[3]), m[1] == "(", m[4] == ")", text.strip())

    def __contains__(self, v: float) -> bool:
        if not math.isfinite(v) and not (math.isinf(v) and v == self.high and not self.high_open):
            return False
        above = v > self.low if self.low_open else v >= self.low
        below = v < self.high if self.high_open else v <= self.high
        return above and below


@dataclass(frozen=True)
class Choice:
    """A set of allowed strings: ``Choice.parse("{rate, attention}")``."""

    options: tuple[str, ...]
    text: str

    @classmethod
    def parse(cls, text: str) -> Choice:
        m = re.fullmatch(r"\s*\{(.*)\}\s*", text)
        opts = tuple(o.strip() for o in m[1].split(",")) if m else ()
        if not opts or not all(opts):
            raise ValueError(f"bad choice {text!r}; write it like '{{rate, attention}}'")
        return cls(opts, "{" + ", ".join(opts) + "}")

    def __contains__(self, v: object) -> bool:
        return v in self.options


def parse_range(text: str) -> Range | Choice:
    return Choice.parse(text) if text.strip().startswith("{") else Range.parse(text)


def check_range(key: str, value: Any, rng: Range | Choice | str, where: str = "") -> str | None:
    """An error message when ``value`` is not a number in ``rng`` (or not one of a
    `Choice`'s strings), else None."""
    rng = parse_range(rng) if isinstance(rng, str) else rng
    at = f" (in {where})" if where else ""
    if isinstance(rng, Choice):
        if value not in rng:
            return f"{key}{at} must be one of {rng.text}, got {value!r}"
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"{key}{at} must be a number in {rng.text}, got {value!r}"
    if value not in rng:
        return f"{key}{at} must be in {rng.text}, got {value!r}"
    return None


METHODS = ("reroll.methods",)
"""The plug-in modules of the registries that methods register into (``plugins=METHODS``):
the method modules register their components into the stages' registries, and no stage
imports them itself."""
_loaded: set[str] = set()


def load_plugins(modules: tuple[str, ...] = METHODS) -> None:
    """Import ``modules`` once each (a lookup made while they import finds what is there so
    far)."""
    import importlib

    for name in modules:
        if name not in _loaded:
            _loaded.add(name)  # first: a lookup made while it imports must not recurse
            try:
                importlib.import_module(name)
            except BaseException:
                _loaded.discard(name)  # the next lookup raises the import's error again
                raise


class Registry:
    def __init__(self, kind: str, plugins: tuple[str, ...] = ()):
        """``plugins``: modules imported on the first lookup, which register into this
        registry (`METHODS` for the registries a method can plug into); a registry without
        them (verifiers, tasks, ...) imports nothing on lookup."""
        self.kind = kind
        self.plugins = plugins
        self._items: dict[str, Callable] = {}
        self._ranges: dict[str, dict[str, Range | Choice]] = {}
        self._traits: dict[str, dict[str, Any]] = {}

    def register(self, name: str, ranges: dict[str, str] | None = None, **traits: Any
                 ) -> Callable[[Callable], Callable]:
        """Register a component; ``ranges`` gives the valid interval of each numeric
        hyperparameter (checked with the config); ``traits`` are facts about the
        component that wiring may ask for (e.g. a verifier's ``cheap=True``)."""

        def deco(fn: Callable) -> Callable:
            if name in self._items:
                raise RegistryError(f"{self.kind} {name!r} registered twice")
            self._items[name] = fn
            self._ranges[name] = {k: parse_range(v) for k, v in (ranges or {}).items()}
            self._traits[name] = dict(traits)
            return fn

        return deco

    def ranges(self, name: str) -> dict[str, Range | Choice]:
        self.get(name)
        return dict(self._ranges.get(name, {}))

    def trait(self, name: str, key: str, default: Any = None) -> Any:
        self.get(name)
        return self._traits.get(name, {}).get(key, default)

    def names(self) -> list[str]:
        load_plugins(self.plugins)
        return sorted(self._items)

    def __contains__(self, name: str) -> bool:
        load_plugins(self.plugins)
        return name in self._items

    def get(self, name: str) -> Callable:
        load_plugins(self.plugins)
        if name not in self._items:  # in a run's child process: the run's plug-in modules
            from reroll.plugins import import_inherited

            import_inherited()
        if name not in self._items:
            raise RegistryError(
                f"unknown {self.kind} {name!r}{closest(name, self.names())}; "
                f"registered: {', '.join(self.names())}"
            )
        return self._items[name]

    def hyperparameters(self, name: str) -> dict[str, inspect.Parameter]:
        """The keyword-only parameters of a component: its configurable hyperparameters."""
        sig = inspect.signature(self.get(name))
        return {p.name: p for p in sig.parameters.values() if p.kind is p.KEYWORD_ONLY}

    def check_kwargs(self, name: str, kwargs: dict[str, Any], where: str = "") -> None:
        params = self.hyperparameters(name)
        at = f" (in {where})" if where else ""
        for key in kwargs:
            if key not in params:
                raise RegistryError(
                    f"{self.kind} {name!r} has no hyperparameter {key!r}{at}"
                    f"{closest(key, list(params))}; valid: {', '.join(params) or 'none'}"
                )
        missing = [k for k, p in params.items() if p.default is p.empty and k not in kwargs]
        if missing:
            raise RegistryError(
                f"{self.kind} {name!r} needs hyperparameter(s) {', '.join(missing)}{at}"
            )
        for key, rng in self._ranges.get(name, {}).items():
            if key in kwargs and not (kwargs[key] is None and params[key].default is None):
                err = check_range(f"{self.kind} {name!r} hyperparameter {key!r}", kwargs[key],
                                  rng, where)
                if err:
                    raise RegistryError(err)

    def check_choice(self, key: str, name: str, kwargs: dict[str, Any], off: str) -> bool:
        """The config key ``key`` chooses ``name`` from this registry, or ``off`` (nothing,
        a value not registered): the chosen component's hyperparameters ``kwargs`` (the key
        ``{key}_args``) are checked, and ``off`` takes none. Whether a component is chosen."""
        if name == off:
            if kwargs:
                raise RegistryError(f"{key} = \"{off}\" takes no {key.rsplit('.', 1)[-1]}_args, "
                                    f"got {sorted(kwargs)}")
            return False
        self.check_kwargs(name, kwargs, f"{key}_args")
        return True

    def bind(self, name: str, kwargs: dict[str, Any] | None = None, where: str = "") -> Callable:
        """The component with its hyperparameters fixed, after checking them."""
        kwargs = dict(kwargs or {})
        self.check_kwargs(name, kwargs, where)
        fn = functools.partial(self.get(name), **kwargs)
        fn.__name__ = name  # type: ignore[attr-defined]
        return fn
