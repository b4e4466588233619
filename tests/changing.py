"""Collections that give other items on a later pass: for tests that what a check passed is
what is kept (a lazy or mutating input read twice would let unchecked items through)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence, Set
from typing import Any


class Changing:
    """Gives `first` for the first `good` passes over it, and `later` after (its length and
    membership follow)."""

    def __init__(self, first: Any, later: Any, good: int = 1) -> None:
        self._first, self._later, self._passes, self._good = first, later, 0, good

    def _now(self) -> Any:
        return self._first if self._passes < self._good else self._later

    def __len__(self) -> int:
        return len(self._now())

    def __contains__(self, item: object) -> bool:
        return item in self._now()

    def __iter__(self) -> Iterator[Any]:
        items = self._now()
        self._passes += 1
        yield from items


class ChangingSequence(Changing, Sequence[Any]):
    def __getitem__(self, index: Any) -> Any:
        return self._now()[index]


class ChangingSet(Changing, Set[Any]):
    pass
