"""One broker process per module for the hostile-input tests (they only read and write their
own keys, so they can share it), on a database of its own."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import httpx
import pytest

from ..brokers import BrokerProcess
from ..pgserver import Databases


def start_broker(databases: Databases, name: str, env: dict[str, str] | None = None,
                 prepare: Callable[[str], object] | None = None) -> Iterator[BrokerProcess]:
    """A healthy broker on a database of its own (``prepare(url)`` runs first)."""
    url = databases.create()
    if prepare is not None:
        prepare(url)
    broker = BrokerProcess(url, name=name, env=env).start()
    try:
        deadline = time.monotonic() + 30
        while True:
            assert broker.alive, f"{name} exited: {broker.stderr()}"
            try:
                if httpx.get(f"{broker.url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"{name} never became healthy: {broker.stderr()}"
            time.sleep(0.05)
        yield broker
        if not broker.alive:  # it died during the module's tests: say why
            print(f"{name} died:\n{broker.stderr()}")
    finally:
        broker.close()
        databases.drop(url)


@pytest.fixture(scope="module")
def live_broker(databases: Databases) -> Iterator[BrokerProcess]:
    yield from start_broker(databases, "hostile")
