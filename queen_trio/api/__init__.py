"""The HTTP API: a QuartTrio app with one blueprint per area."""

from __future__ import annotations

import time
from urllib.parse import unquote_to_bytes

from quart import Response, g, request
from quart.json.provider import DefaultJSONProvider
from quart_trio import QuartTrio
from werkzeug.routing import BaseConverter

from ..context import BrokerContext
from . import bodies
from .admin import admin_routes
from .errors import ApiError, install_error_handlers
from .kv import kv_routes
from .locks import lock_routes
from .log import log_routes
from .ops import ops
from .origin import HostPolicy, check_request
from .reads import read_routes
from .rules import SharedBuilderRule
from .stats import stats_routes
from .stream import stream_routes
from .switches import switch_routes
from .tenancy import admit_request
from .timers import timer_routes
from .transaction import transaction_routes
from .ui import ui_routes
from .unsupported import unsupported_routes


class NameConverter(BaseConverter):
    """The rest of the path as a name (a timer key, a KV key): any characters, '/' included.

    Werkzeug's ``path`` converter refuses a leading '/' and a line break, which turned
    ``/timers/q//abs`` and ``/timers/q/a%0Ab`` into a 404 "no route"; here they reach the
    handler, which accepts the first and answers the second 400 ``invalid_key``.
    """

    part_isolating = False
    regex = r"[\s\S]+"
    weight = 200


def create_app(broker: BrokerContext) -> QuartTrio:
    app = QuartTrio("queen_trio")
    app.url_rule_class = SharedBuilderRule  # each rule's URL builder compiled once per process
    app.config["BROKER"] = broker
    # Above the message ceiling (QUEEN_MAX_MESSAGE_BYTES), which no plan can raise.
    app.config["MAX_CONTENT_LENGTH"] = broker.settings.http_body_limit()
    app.config["BODY_TIMEOUT"] = broker.settings.http_body_timeout_s  # then 408
    bodies.install(app, broker.settings.http_body_budget())
    assert isinstance(app.json, DefaultJSONProvider)  # json_provider_class is left as it is
    app.json.sort_keys = False
    # Werkzeug would answer a path with "//" in it (a key starting with an unencoded '/') with
    # an HTML 308 redirect to the merged path; a client's mistake gets a JSON 404 instead.
    app.url_map.merge_slashes = False
    app.url_map.converters["name"] = NameConverter
    install_error_handlers(app)
    app.register_blueprint(ops)
    app.register_blueprint(log_routes)
    app.register_blueprint(stream_routes)
    app.register_blueprint(read_routes)
    app.register_blueprint(kv_routes)
    app.register_blueprint(lock_routes)
    app.register_blueprint(transaction_routes)
    app.register_blueprint(timer_routes)
    app.register_blueprint(admin_routes)
    app.register_blueprint(stats_routes)
    app.register_blueprint(switch_routes)
    app.register_blueprint(ui_routes)
    app.register_blueprint(unsupported_routes)

    # One hook each way: every hook costs Quart a dispatch (ensure_async, an await), and each
    # `request`/`g` access a context-variable lookup, on every request.
    metrics = broker.metrics
    hosts = HostPolicy.from_settings(broker.settings)

    @app.before_request
    async def _before() -> None:
        g.started = time.perf_counter()
        req = request._get_current_object()  # type: ignore[attr-defined]
        # Before the body is read (bodies.py: read only when a handler asks): a refused
        # client's upload is never buffered.
        check_request(req, hosts)  # another origin's page, or a rebound host name: 403
        await admit_request(req, broker)
        # A name in the path is text: percent-escapes that decode to bytes which are not
        # UTF-8 would become U+FFFD, and %FF, %FE and %EF%BF%BD would all name one timer.
        raw = req.scope.get("raw_path") or b""
        if b"%" in raw or not raw.isascii():  # (plain ASCII is UTF-8: the usual path)
            try:
                unquote_to_bytes(raw.split(b"?", 1)[0]).decode("utf-8")
            except UnicodeDecodeError:
                raise ApiError(400, "invalid_path",
                               "the path is not UTF-8 once percent-decoded") from None

    @app.after_request
    async def _after(response: Response) -> Response:
        req = request._get_current_object()  # type: ignore[attr-defined]
        rule = req.url_rule.rule if req.url_rule is not None else "unmatched"
        started = getattr(g, "started", None)
        metrics.count_http(rule, req.method, response.status_code,
                           None if started is None else time.perf_counter() - started)
        # An empty answer (a 204 long-poll) would otherwise say "content-type: text/html".
        if response.status_code in (204, 304) or response.content_length == 0:
            response.headers.pop("Content-Type", None)
        return response

    return app
