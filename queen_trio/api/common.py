"""What every blueprint needs: the broker it serves and a JSON answer."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any

import msgspec
from flask.json.provider import DefaultJSONProvider
from quart import Response, current_app, jsonify

from ..context import BrokerContext
from ..models import codec

#: A request's bookkeeping to be done once its answer is written (api/fast.py answers on the
#: connection's task and runs it then).
Chores = list[Callable[[], None]]
#: Where a route function puts its counting: Chores, or None to count at once (Quart's routes).
Later = Chores | None


def count_later(later: Later, count: Callable[..., None], *args: Any) -> None:
    """``count(*args)`` now, or once the answer is written when ``later`` collects it."""
    if later is None:
        count(*args)
    else:
        later.append(functools.partial(count, *args))


def broker() -> BrokerContext:
    """The broker this app serves (set by :func:`queen_trio.api.create_app`)."""
    return current_app.config["BROKER"]


# What jsonify() writes with the provider create_app sets up (Flask's DefaultJSONProvider,
# sort_keys off, compact unless in debug mode), from one encoder made once: json.dumps with
# any non-default argument builds a new JSONEncoder for every answer.
_COMPACT = json.JSONEncoder(
    default=DefaultJSONProvider.default, ensure_ascii=DefaultJSONProvider.ensure_ascii,
    sort_keys=False, separators=(",", ":"),
)


def json_response(body: Any, status: int = 200) -> Response:
    app = current_app._get_current_object()  # type: ignore[attr-defined]
    if app.debug:  # jsonify indents its answers then
        response = jsonify(body)
        response.status_code = status
        return response
    return app.response_class(_COMPACT.encode(body) + "\n", status=status,
                              mimetype=app.json.mimetype)


def model_response(model: Any, status: int = 200) -> Response:
    """An answer declared by a wire model (:mod:`queen_trio.models`), encoded by msgspec."""
    app = current_app._get_current_object()  # type: ignore[attr-defined]
    body = codec.encode(model)
    if app.debug:  # indented, as jsonify does then
        body = msgspec.json.format(body, indent=2)
    return app.response_class(body + b"\n", status=status, mimetype=app.json.mimetype)
