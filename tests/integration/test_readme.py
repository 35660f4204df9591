"""Every code block of README.md and of the docs/ pages runs as pasted, against a live broker.

```python blocks run in a fresh interpreter; ```sh blocks that call the broker with curl run in
bash. Both have the README's address (127.0.0.1:6632 / localhost:6632) replaced by the test
broker's, and QUEEN_URL set to it. Blocks that only illustrate are fenced ```text and skipped;
the other ```sh blocks (the queen-trio command line) are not curl calls and are skipped too.
Blocks run in the order a reader meets them: the README's, then each docs/ page's.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest
import trio

from queen_trio.config import Settings
from queen_trio.server import BrokerHandle


@pytest.fixture
def settings(database_url: str) -> Settings:
    """The default settings (the README's), with a quick sweeper: blocks wait for fires."""
    return Settings(database_url=database_url, port=0, graceful_timeout_ms=1000, db_pool_size=5,
                    sweeper_min_sleep_ms=5, sweeper_max_sleep_ms=200)

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
# The reference pages the README links to (docs/upstream/ holds notes for other projects).
PAGES = [README, *sorted((REPO / "docs").glob("*.md"))]

# The "Two commands" blocks install the package, start a broker or run this very suite.
TWO_COMMANDS = ("pip install -e . && queen-trio serve", "pip install -e '.[dev]' && pytest")

_FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.S | re.M)


def blocks(language: str, pages: list[Path] = PAGES) -> list[str]:
    return [body for page in pages for lang, body in _FENCE.findall(page.read_text())
            if lang == language]


def python_blocks() -> list[str]:
    return blocks("python")


def curl_blocks() -> list[str]:
    return [b for b in blocks("sh") if b.strip() not in TWO_COMMANDS
            and re.search(r"^\s*curl ", b, re.M)]


def test_the_readme_has_blocks_to_run() -> None:
    assert len(python_blocks()) >= 1
    assert len(curl_blocks()) >= 1
    # The two-command promise is there, word for word, and .ci/run runs the second one.
    sh = [b.strip() for b in blocks("sh")]
    assert all(command in sh for command in TWO_COMMANDS)
    assert (REPO / ".ci" / "run").read_text().splitlines()[-1] == TWO_COMMANDS[1]
    # Few blocks are only illustrations.
    assert len(blocks("text")) <= 3


_LINK = re.compile(r"\]\(([^)\s]+)\)")


def _anchors(page: Path) -> set[str]:
    """GitHub's ids for a page's headings: lower case, punctuation dropped, spaces to '-'."""
    text = _FENCE.sub("", page.read_text())
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
            for h in re.findall(r"^#+ (.*)$", text, re.M)}


def test_links_between_the_pages_resolve() -> None:
    """Every relative link of the README and the docs/ pages names a file that exists, and
    every #fragment a heading of that file: the reference moved, the links must follow."""
    broken = []
    for page in PAGES:
        for target in _LINK.findall(_FENCE.sub("", page.read_text())):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, fragment = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            if not file.exists() or (fragment and file.suffix == ".md"
                                     and fragment not in _anchors(file)):
                broken.append(f"{page.relative_to(REPO)}: {target}")
    assert not broken, broken


def test_the_quick_start_fires_a_timer_into_consume_on_its_first_screen() -> None:
    """A newcomer reading from the top meets, within a screenful of "## Quick start", a block
    that schedules a timer and receives it with consume(), after the command that starts the
    broker inside a virtual environment."""
    text = README.read_text()
    start = text.index("## Quick start")
    screen = "\n".join(text[start:].splitlines()[:60])
    assert "python3 -m venv" in screen and TWO_COMMANDS[0] in screen
    first = blocks("python", [README])[0]
    assert first in screen and ".schedule()" in first and ".consume(" in first
    assert screen.index(TWO_COMMANDS[0]) < screen.index(first)


def test_the_command_line_block_does_not_reuse_the_sdk_blocks_transaction_ids() -> None:
    """Pasted in order, a CLI push with a txn an SDK block already pushed is a duplicate, and
    the CLI pop after it waits for nothing."""
    sdk = {m for b in blocks("python", [README]) for m in re.findall(r'txn="([^"]+)"', b)}
    cli = {m for b in blocks("sh", [README]) for m in re.findall(r"--txn (\S+)", b)}
    assert cli and not sdk & cli, sdk & cli


def _localise(text: str, url: str) -> str:
    address = url.removeprefix("http://")
    return text.replace("127.0.0.1:6632", address).replace("localhost:6632", address)


def _env(url: str) -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "QUEEN_URL": url, "PYTHONPATH": path}


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(python_blocks())))
async def test_python_block_runs(broker: BrokerHandle, index: int, tmp_path: Path) -> None:
    script = tmp_path / "block.py"
    script.write_text(_localise(python_blocks()[index], broker.url))
    done = await trio.run_process([sys.executable, str(script)], env=_env(broker.url),
                                  capture_stdout=True, capture_stderr=True, check=False)
    assert done.returncode == 0, done.stderr.decode()


# Each curl of a block must get a 2xx answer (--fail-with-body) and every answer is printed.
_CURL = 'curl() { command curl -sS --fail-with-body "$@"; echo; }\n'


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(curl_blocks())))
async def test_curl_block_runs(broker: BrokerHandle, index: int) -> None:
    script = "set -euo pipefail\n" + _CURL + _localise(curl_blocks()[index], broker.url)
    done = await trio.run_process(["bash", "-c", script], env=_env(broker.url),
                                  capture_stdout=True, capture_stderr=True, check=False)
    out = done.stdout.decode()
    assert done.returncode == 0, out + done.stderr.decode()
    assert '"ok":false' not in out.replace(" ", ""), out
    if "booking-18" in curl_blocks()[index]:  # the timer fired, the pop received it, acked
        compact = out.replace(" ", "")
        assert '"bookingId":18' in compact, out
        assert '"status":"completed","success":true' in compact, out
    if "-X DELETE" in curl_blocks()[index]:  # the cancel found the timer pending
        assert '"status":"cancelled"' in out.replace(" ", ""), out
