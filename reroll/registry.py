"""A small generic registry with signature-checked keyword arguments.

Components (advantage estimators, surrogates, aggregations, KL estimators, corrections,
tasks, verifiers, filters) register under a name. Their hyperparameters are keyword-only
parameters (after ``*``); ``Registry.bind`` checks a config's kwargs against that signature
when the config loads, so an unknown or missing hyperparameter is a load-time error that
names the component and the key. The trainer only looks things up: no branching on names.
"""

from __future__ import annotations

import difflib
import functools
import inspect
from collections.abc import Callable
from typing import Any


class RegistryError(KeyError):
    def __str__(self) -> str:  # KeyError quotes its message; we want it plain
        return str(self.args[0])


def closest(name: str, options: list[str]) -> str:
    match = difflib.get_close_matches(name, options, n=1, cutoff=0.0)
    return f" (did you mean {match[0]!r}?)" if match else ""


class Registry:
    def __init__(self, kind: str):
        self.kind = kind
        self._items: dict[str, Callable] = {}

    def register(self, name: str) -> Callable[[Callable], Callable]:
        def deco(fn: Callable) -> Callable:
            if name in self._items:
                raise RegistryError(f"{self.kind} {name!r} registered twice")
            self._items[name] = fn
            return fn

        return deco

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: str) -> bool:
        return name in self._items

    def get(self, name: str) -> Callable:
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

    def bind(self, name: str, kwargs: dict[str, Any] | None = None, where: str = "") -> Callable:
        """The component with its hyperparameters fixed, after checking them."""
        kwargs = dict(kwargs or {})
        self.check_kwargs(name, kwargs, where)
        fn = functools.partial(self.get(name), **kwargs)
        fn.__name__ = name  # type: ignore[attr-defined]
        return fn
