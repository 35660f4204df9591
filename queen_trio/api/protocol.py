"""Requests hypercorn refuses before the app sees them still get the broker's JSON error.

h11 refuses a request line with a byte outside printable ASCII (a query string pasted with a
'…' or a raw non-UTF-8 byte in the path) and hypercorn then answers an empty 400. The answer
keeps its status and ``Connection: close`` and gains the usual
error body (:func:`queen_trio.api.errors.error_json`, the one writer of error JSON).
"""

from __future__ import annotations

from itertools import chain
from typing import Any

import h11
from hypercorn.protocol.h11 import H11Protocol

from .errors import error_json

MESSAGES = {
    400: ("bad_request", "the request is not valid HTTP/1.1: the request line must be printable "
          "ASCII (percent-encode any other byte, e.g. in the query string)"),
    431: ("headers_too_large", "the request headers are too large"),
}


def protocol_error_body(status: int) -> bytes:
    code, message = MESSAGES.get(status, ("http_error", "the request is not valid HTTP/1.1"))
    return error_json(code, message)


async def _send_json_error_response(self: Any, status_code: int) -> None:
    body = protocol_error_body(status_code)
    await self._send_h11_event(h11.Response(
        status_code=status_code,
        headers=list(chain(
            [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body)),
             (b"connection", b"close")],
            self.config.response_headers("h11"),
        )),
    ))
    await self._send_h11_event(h11.Data(data=body))
    await self._send_h11_event(h11.EndOfMessage())


def install() -> None:
    """Replace hypercorn's empty protocol-error answer (idempotent)."""
    H11Protocol._send_error_response = _send_json_error_response  # type: ignore[method-assign]
