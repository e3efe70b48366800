"""What the docs promise in words that a reader acts on, checked against the code's behaviour
where a test elsewhere shows it."""

from __future__ import annotations

from pathlib import Path

DOCS = Path(__file__).resolve().parent.parent / "docs"


def _section(page: str, heading: str) -> str:
    text = (DOCS / page).read_text(encoding="utf-8")
    return text.split(f"\n{heading}\n", 1)[1].split("\n## ", 1)[0]


def test_the_ray_serve_recipe_says_to_install_ray_serve() -> None:
    # The 'ray' extra installs Ray's core; `from ray import serve` needs Serve's own extra.
    assert "pip install 'ray[serve]'" in _section("scale-out.md", "## Ray Serve")


def test_the_copy_of_a_member_that_failed_is_described_as_it_behaves() -> None:
    # tests/test_group_failures.py: replicated.on(member) raises GroupError for a member that
    # was out, and its entry in replicated.buffers is None.
    words = " ".join(_section("scale-out.md", "## Failures, cancellation, closing").split())
    assert "`replicated.on(member)` raises `GroupError`" in words
    assert "its entry in `replicated.buffers` is `None`" in words
