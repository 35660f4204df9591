"""What every blueprint needs: the broker it serves and a JSON answer."""

from __future__ import annotations

from typing import Any

from quart import Response, current_app, jsonify

from ..context import BrokerContext


def broker() -> BrokerContext:
    """The broker this app serves (set by :func:`queen_trio.api.create_app`)."""
    return current_app.config["BROKER"]


def json_response(body: Any, status: int = 200) -> Response:
    response = jsonify(body)
    response.status_code = status
    return response
