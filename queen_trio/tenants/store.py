"""Tenants, tokens, plans and storage usage in the database.

Plain functions over a psycopg connection, shared by the CLI (``queen-trio tenants …``, which
works whether or not a broker is running) and the broker (through ``Database.run_transaction``).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from ..db import queries
from ..db.rows import DictConnection
from ..errors import Conflict, NotFound, ValidationError
from . import tokens

Q = queries.load("tenants")
PLANS_CHANNEL = "queen_tenants"

_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}$")


@dataclasses.dataclass(frozen=True, slots=True)
class Plan:
    tenant_id: int
    name: str
    max_message_bytes: int | None  # None: the broker's QUEEN_MAX_MESSAGE_BYTES, not lowered
    max_stored_bytes: int | None
    requests_per_second: int | None
    stored_bytes: int


def check_name(name: str) -> str:
    if not _NAME_RE.fullmatch(name):
        raise ValidationError(
            "invalid_tenant", "tenant names are 1-63 characters of a-z, 0-9, '_', '.', '-', "
            "starting with a letter or digit"
        )
    return name


def create_tenant(raw: DictConnection, name: str) -> int:
    row = raw.execute(Q.create_tenant, {"name": check_name(name)}).fetchone()
    if row is None:
        raise Conflict("tenant_exists", f"tenant {name!r} already exists")
    return row["tenant_id"]


def list_tenants(raw: DictConnection) -> list[dict[str, Any]]:
    return raw.execute(Q.list_tenants).fetchall()


def tenant_id(raw: DictConnection, name: str) -> int:
    row = raw.execute(Q.tenant_id_by_name, {"name": name}).fetchone()
    if row is None:
        raise NotFound("tenant_not_found", f"no tenant {name!r}")
    return row["tenant_id"]


def create_token(raw: DictConnection, name: str) -> str:
    new = tokens.generate()
    raw.execute(
        Q.insert_token,
        {"tenant_id": tenant_id(raw, name), "prefix": new.prefix, "salt": new.salt,
         "hash": new.hash},
    )
    return new.token


def revoke_token(raw: DictConnection, prefix: str) -> None:
    # Accept the whole token or its "qt_<prefix>" head as well as the bare prefix.
    parsed = tokens.parse(prefix)
    if parsed is not None:
        prefix = parsed[0]
    prefix = prefix.removeprefix("qt_").split("_", 1)[0]
    if raw.execute(Q.revoke_token, {"prefix": prefix}).fetchone() is None:
        raise NotFound("token_not_found", f"no active token with prefix {prefix!r}")


def set_plan(
    raw: DictConnection, name: str, *, max_message_bytes: int | None = None,
    max_stored_bytes: int | None = None, requests_per_second: int | None = None,
    set_stored: bool = False, set_rate: bool = False, set_message: bool | None = None,
) -> dict[str, Any]:
    """Change a tenant's plan; each ``set_*`` says whether its value (None: no limit) is set.
    ``set_message`` defaults to "max_message_bytes was given"."""
    if set_message is None:
        set_message = max_message_bytes is not None
    row = raw.execute(
        Q.set_plan,
        {"name": name, "max_message_bytes": max_message_bytes, "set_message": set_message,
         "max_stored_bytes": max_stored_bytes, "requests_per_second": requests_per_second,
         "set_stored": set_stored, "set_rate": set_rate},
    ).fetchone()
    if row is None:
        raise NotFound("tenant_not_found", f"no tenant {name!r}")
    raw.execute(Q.notify_plans, {"name": name})
    return row


def tenant_for_token(raw: DictConnection, token: str) -> int | None:
    """The tenant a bearer token belongs to, or None (malformed, unknown or revoked)."""
    parsed = tokens.parse(token)
    if parsed is None:
        tokens.verify("x", None, None)
        return None
    prefix, secret = parsed
    row = raw.execute(Q.token_by_prefix, {"prefix": prefix}).fetchone()
    if row is None:
        tokens.verify(secret, None, None)
        return None
    ok = tokens.verify(secret, bytes(row["salt"]), bytes(row["hash"]))
    return row["tenant_id"] if ok else None


def fold_usage_and_load_plans(raw: DictConnection) -> list[Plan]:
    raw.execute(Q.fold_usage)
    return [Plan(**row) for row in raw.execute(Q.plans).fetchall()]
