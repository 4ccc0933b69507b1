"""A named registry of implementations (trainer backends, weight transports, ...): one name each,
and an error naming the registered ones when a config asks for another."""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, what: str) -> None:
        self.what = what
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator: register the decorated factory (or class) under ``name``."""
        def deco(item: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.what} {name!r} registered twice")
            self._items[name] = item
            return item

        return deco

    def __getitem__(self, name: str) -> T:
        if name not in self._items:
            raise ValueError(f"unknown {self.what} {name!r}; registered: {sorted(self._items)}")
        return self._items[name]

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def names(self) -> list[str]:
        return sorted(self._items)
