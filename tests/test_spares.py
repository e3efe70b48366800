"""Freed device storage kept for reuse (``_cuda/device/_spares.py``): bounded by size and in all."""

from __future__ import annotations

from typing import Any

from asyncgraph._cuda.device._spares import PER_SIZE, Spares


def _spares(limit: int) -> tuple[Spares, list[tuple[Any, Any]]]:
    released: list[tuple[Any, Any]] = []
    return Spares(lambda storage, stream: released.append((storage, stream)), limit), released


def test_a_kept_storage_serves_the_next_allocation_of_its_size_only() -> None:
    spares, released = _spares(1 << 20)
    assert spares.keep("a", 4096)
    assert spares.take(8192) is None
    assert spares.take(4096) == "a"
    assert spares.take(4096) is None
    assert spares.bytes == 0
    assert released == []


def test_spares_are_bounded_per_size_and_in_all() -> None:
    spares, _ = _spares(3 * 4096)
    kept = [spares.keep(f"s{i}", 4096) for i in range(PER_SIZE + 1)]
    assert kept == [True] * PER_SIZE + [False]
    assert spares.keep("big", 2 * 4096) is False  # over the limit in all
    assert spares.keep("empty", 0) is False
    assert spares.bytes == PER_SIZE * 4096
    assert repr(spares) == f"<Spares {PER_SIZE} kept, {PER_SIZE * 4096} B of {3 * 4096} B>"


def test_release_gives_every_storage_back_on_the_stream() -> None:
    spares, released = _spares(1 << 20)
    spares.keep("a", 4096)
    spares.keep("b", 256)
    assert spares.release("stream") == 2
    assert sorted(released) == [("a", "stream"), ("b", "stream")]
    assert spares.bytes == 0
    assert spares.take(4096) is None
