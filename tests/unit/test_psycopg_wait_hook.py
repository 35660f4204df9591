"""The two psycopg internals that queen_trio/db/bridge.py builds its trio bridge on.

``TrioWaitConnection`` overrides ``psycopg.Connection.wait(gen, interval, timeout)`` (the hook
every wait of a sync connection goes through) and raises ``psycopg.errors._WaitTimeout`` when
``timeout`` expires, as psycopg's own waits do (``Connection.notifies`` catches it). Both
appeared in psycopg 3.3.6 and are not public API, hence the pin ``psycopg[binary]>=3.3.6,<3.4``
in pyproject.toml. These tests fail, naming bridge.py, as soon as an installed psycopg differs;
no database is needed.
"""

from __future__ import annotations

import inspect

import psycopg
from psycopg import errors

from queen_trio.db.bridge import TrioWaitConnection

_FIX = (
    f"psycopg {psycopg.__version__}'s wait hook is not the one queen_trio/db/bridge.py "
    "(TrioWaitConnection.wait, _wait_on_trio) is written for (psycopg 3.3.6 to 3.3.x); adapt "
    "bridge.py and the psycopg pin in pyproject.toml together"
)


def test_connection_wait_has_the_signature_bridge_py_overrides() -> None:
    theirs = inspect.signature(psycopg.Connection.wait)
    P = inspect.Parameter
    shape = [(p.name, p.kind, p.default is P.empty) for p in theirs.parameters.values()]
    assert shape == [
        ("self", P.POSITIONAL_OR_KEYWORD, True),
        ("gen", P.POSITIONAL_OR_KEYWORD, True),
        ("interval", P.POSITIONAL_OR_KEYWORD, False),
        ("timeout", P.POSITIONAL_OR_KEYWORD, False),
    ], f"{_FIX}: Connection.wait{theirs}"
    assert theirs.parameters["timeout"].default is None, f"{_FIX}: Connection.wait{theirs}"

    ours = inspect.signature(TrioWaitConnection.wait)
    assert [(n, p.default) for n, p in ours.parameters.items()] == [
        (n, p.default) for n, p in theirs.parameters.items()
    ], f"queen_trio/db/bridge.py: TrioWaitConnection.wait{ours} no longer matches psycopg's{theirs}"


def test_wait_timeout_is_the_error_bridge_py_raises() -> None:
    wait_timeout = getattr(errors, "_WaitTimeout", None)
    assert isinstance(wait_timeout, type), f"{_FIX}: psycopg.errors._WaitTimeout is gone"
    assert issubclass(wait_timeout, psycopg.OperationalError), (
        f"{_FIX}: psycopg.errors._WaitTimeout is no longer an OperationalError"
    )
