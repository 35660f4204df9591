"""What importing the broker and the SDK pulls in: no test framework. trio.testing imports
pytest (about 30 ms of a broker's start-up and 5 MB of its memory, for nothing); the sweeper
only needs to recognise a test's MockClock when a test made one."""

from __future__ import annotations

import subprocess
import sys

import pytest

_TEST_ONLY = ("pytest", "_pytest", "trio.testing", "hypothesis")


@pytest.mark.parametrize("module", ["queen_trio.server", "queen_trio", "queen_trio.cli"])
def test_importing_loads_no_test_framework(module: str) -> None:
    probe = (f"import sys, {module}; "
             f"print(','.join(m for m in {_TEST_ONLY!r} if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                            check=True, timeout=60)
    assert result.stdout.strip() == "", f"{module} imports {result.stdout.strip()}"
