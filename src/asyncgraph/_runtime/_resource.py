"""AsyncResource: ``async with`` for the objects that close with ``await aclose()``."""

from __future__ import annotations

from types import TracebackType
from typing import TYPE_CHECKING, Self

__all__ = ("AsyncResource",)


class AsyncResource:
    """A base for objects closed by ``await aclose()`` (as anyio's ``AsyncResource``):
    ``async with`` gives the object and closes it on the way out, however the block ended.
    A subclass that must open first overrides ``__aenter__``."""

    __slots__ = ()

    if TYPE_CHECKING:

        async def aclose(self) -> None:
            """Close the object; safe to call again."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
