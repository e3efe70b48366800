"""The JSON-logs configuration docs/observability.md gives, run as written in a child process."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

DOC = Path(__file__).resolve().parent.parent / "docs" / "observability.md"

USE = """
import asyncio
import numpy as np
import asyncgraph as ag

async def main():
    async with ag.open_backend("host") as backend:
        await backend.upload(np.zeros(4, np.float32))

asyncio.run(main())
"""


def _snippet() -> str:
    section = DOC.read_text().split("## JSON logs", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert match is not None, "docs/observability.md lost its JSON-logs configuration"
    return match.group(1)


def test_the_documented_configuration_writes_one_json_object_per_line() -> None:
    env = {**os.environ, "ASYNCGRAPH_DISABLE_CUDA": "1"}
    done = subprocess.run(
        [sys.executable, "-c", _snippet() + USE],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=True,
    )
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    events = {line["event"]: line for line in lines}
    # backend.opened is a debug event, below the documented INFO filter.
    assert set(events) == {"backend.closed"}
    closed = events["backend.closed"]
    assert closed["device"] == "host"
    assert closed["level"] == "info"
    assert re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+Z$", closed["timestamp"])
    assert closed["dispatches"] == 0
    print(done.stdout)
