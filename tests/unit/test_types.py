"""mypy over queen_trio/, with the [tool.mypy] configuration of pyproject.toml.

CI runs only ``pip install -e '.[dev]' && pytest``, so this test is where type checking runs.
mypy's cache (.mypy_cache/ at the top of the repository) makes a repeated run quick; a fresh
clone pays for a cold run once.
"""

from __future__ import annotations

import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# TEMPORARY (issue 19): files being rewritten while mypy was introduced. mypy's errors in these
# files are reported as a warning instead of failing the test. Empty this set as each rewrite
# lands, then delete it and its handling below.
PENDING_FILES: set[str] = {
    "queen_trio/api/log.py",
    "queen_trio/client/async_client.py",
    "queen_trio/client/consumer.py",
    "queen_trio/client/sync_client.py",
    "queen_trio/client/wire.py",
    "queen_trio/log/rules.py",
    "queen_trio/log/store.py",
    "queen_trio/sweeper.py",
}

_MESSAGE = re.compile(r"^(?P<path>[^:\s]+\.pyi?):\d+(?::\d+)?: (?P<kind>error|note): ")


@pytest.mark.slow
def test_mypy_is_clean() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
         "--no-color-output", "--no-error-summary"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    output = done.stdout + done.stderr
    if done.returncode == 0:
        return
    assert done.returncode == 1, f"mypy did not run (exit {done.returncode}):\n{output}"

    blocking: list[str] = []
    pending: dict[str, list[str]] = {}
    for line in done.stdout.splitlines():
        match = _MESSAGE.match(line)
        if match is None:
            if line.strip():
                blocking.append(line)  # not a message we understand: never let it pass silently
        elif match["path"] in PENDING_FILES:
            pending.setdefault(match["path"], []).append(line)
        elif match["kind"] == "error":
            blocking.append(line)
    assert not blocking, f"mypy reports errors (exit {done.returncode}):\n{output}"
    warnings.warn(
        f"mypy errors tolerated for now in PENDING_FILES of tests/unit/test_types.py "
        f"({', '.join(sorted(pending))}):\n" + "\n".join(sum(pending.values(), [])),
        stacklevel=1,
    )
