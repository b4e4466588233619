"""`async with` for the objects that own a resource and close it in `aclose` (the client, the
store sink): entering gives the object itself, leaving awaits its `aclose`."""

from __future__ import annotations

from types import TracebackType
from typing import Self

__all__ = ["AsyncClosing"]


class AsyncClosing:
    """A base for classes with an `async def aclose()`: `async with obj:` closes it on exit."""

    __slots__ = ()

    async def aclose(self) -> None:
        """Release what the object holds (each subclass says what)."""
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
