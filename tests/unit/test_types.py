"""mypy over queen_trio/, with the [tool.mypy] configuration of pyproject.toml.

CI runs only ``pip install -e '.[dev]' && pytest``, so this test is where type checking runs.
mypy's cache (.mypy_cache/ at the top of the repository) makes a repeated run quick; a fresh
clone pays for a cold run once.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_mypy_is_clean() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
         "--no-color-output", "--no-error-summary"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, (f"mypy reports errors (exit {done.returncode}):\n"
                                  f"{done.stdout}{done.stderr}")
