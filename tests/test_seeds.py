"""The ``seed`` and ``rng`` fixtures (``tests/conftest.py``): a failing test's random inputs can
be made again."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
SEEDED = "tests/test_seeds.py::test_the_generator_comes_from_the_seed"


def test_the_generator_comes_from_the_seed(seed: int, rng: np.random.Generator) -> None:
    assert rng.integers(1 << 62) == np.random.default_rng(seed).integers(1 << 62)
    print(f"first draw {np.random.default_rng(seed).integers(1 << 62)}")


def _run(seed: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "ASYNCGRAPH_TEST_SEED"}
    if seed is not None:
        env["ASYNCGRAPH_TEST_SEED"] = seed
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", SEEDED],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:]
    return done.stdout


def test_the_seed_is_printed_and_replays_the_inputs() -> None:
    replayed = _run("1234567")
    assert "random inputs from seed 1234567: replay with ASYNCGRAPH_TEST_SEED=1234567" in replayed
    first = [line for line in replayed.splitlines() if "first draw" in line]
    assert first == [f"first draw {np.random.default_rng(1234567).integers(1 << 62)}"]
    fresh = _run(None)
    assert "random inputs from seed " in fresh
    assert "seed 1234567:" not in fresh
