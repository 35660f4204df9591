"""The ``queen-trio`` command line.

Exit codes: 0 success, 1 runtime failure (database unreachable, embedded server failed),
2 usage or configuration error.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from collections.abc import Sequence

from . import __version__
from .config import Settings, load_settings
from .errors import ConfigError, QueenError

log = logging.getLogger("queen_trio")

EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)

_EPILOG = """\
configuration comes from QUEEN_* environment variables (see README.md). The most used:
  QUEEN_DATABASE_URL  libpq URL of an existing PostgreSQL; unset = embedded server
  QUEEN_DATA_DIR      where the embedded server keeps its data (default ./.queen)
  QUEEN_HOST/PORT     HTTP bind address (default 127.0.0.1:6632)

examples:
  queen-trio serve                      start on an embedded PostgreSQL
  QUEEN_DATABASE_URL=postgresql://app@db/queen queen-trio migrate
"""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="queen-trio",
        description="A message broker with durable, cancellable timers, on PostgreSQL.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.add_parser(
        "serve",
        help="run the broker (HTTP API and background services) until SIGINT/SIGTERM",
        description="Run the broker. Applies pending migrations first. Without "
        "QUEEN_DATABASE_URL it starts an embedded PostgreSQL under QUEEN_DATA_DIR and stops "
        "it on exit.",
    )
    commands.add_parser(
        "migrate",
        help="apply pending schema migrations and exit",
        description="Apply schema/ migrations that the database has not seen yet. Safe to run "
        "while brokers are starting: an advisory lock serialises migrators.",
    )
    commands.add_parser("version", help="print the version and exit")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    if args.command == "version":
        print(f"queen-trio {__version__}")
        return EXIT_OK

    try:
        settings = load_settings(os.environ)
    except ConfigError as exc:
        print(f"queen-trio: {exc}", file=sys.stderr)
        return EXIT_USAGE
    logging.basicConfig(
        level=settings.log_level,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        if args.command == "migrate":
            return _with_database(settings, _migrate)
        return _with_database(settings, _serve)
    except QueenError as exc:
        print(f"queen-trio: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        return EXIT_OK


def _with_database(settings: Settings, command) -> int:  # type: ignore[no-untyped-def]
    """Run ``command(settings)`` against the configured or the embedded database."""
    if settings.database_url is not None:
        return command(settings)
    from .embedded import EmbeddedPostgres

    server = EmbeddedPostgres(settings.data_dir)
    url = server.start()
    try:
        log.info("using embedded PostgreSQL at %s (data in %s)", url, server.pgdata)
        return command(settings.with_database_url(url))
    finally:
        # A second SIGTERM/SIGINT (a supervisor repeating itself, an impatient Ctrl-C) must not
        # kill us between the broker's exit and PostgreSQL's: that would orphan the server.
        previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in _STOP_SIGNALS}
        try:
            server.stop()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def _migrate(settings: Settings) -> int:
    import psycopg

    from .db.migrations import apply_migrations

    assert settings.database_url is not None
    try:
        applied = apply_migrations(settings.database_url)
    except psycopg.OperationalError as exc:
        print(f"queen-trio: cannot reach the database: {str(exc).strip()}", file=sys.stderr)
        return EXIT_FAILURE
    print(f"applied {len(applied)} migration(s)" + (f": {applied}" if applied else ""))
    return EXIT_OK


def _serve(settings: Settings) -> int:
    import psycopg
    import trio

    from .server import serve_until_signalled

    try:
        trio.run(serve_until_signalled, settings)
    except psycopg.OperationalError as exc:
        print(f"queen-trio: cannot reach the database: {str(exc).strip()}", file=sys.stderr)
        return EXIT_FAILURE
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
