"""The ``queen-trio`` command line.

Exit codes: 0 success, 1 runtime failure of ``serve``/``migrate`` (database unreachable,
embedded server failed), 2 usage or configuration error (a bad setting, a busy or forbidden HTTP
address). The client commands (timers, push, pop, dlq, kv; see :mod:`queen_trio.cli_client`) add
3 (absent/too_late/nothing), 4 (broker error) and 5 (broker unreachable).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable, Sequence
from typing import Any

from . import __version__, cli_client
from .config import Settings, help_text, load_settings
from .errors import ConfigError, ListenError, QueenError

log = logging.getLogger("queen_trio")

EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2
EXIT_REFUSED, EXIT_UNREACHABLE = cli_client.EXIT_REFUSED, cli_client.EXIT_UNREACHABLE

TENANTS_EXIT_CODES = """\
Prints the database it works on as one line on stderr. exit codes:
  0  done
  2  usage error (a plan value out of range; no database here and no --init)
  4  refused (no such tenant, name taken or invalid, unknown token); its error code is printed
  5  the database cannot be reached (or the embedded one cannot start)
"""
# SIGHUP is the terminal closing: a stop like any other, never an orphaned PostgreSQL.
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

_EPILOG = """\
configuration comes from QUEEN_* environment variables; a bad value is refused at start-up
in one line naming it (all of them: `queen-trio serve --help`). The most used:
  QUEEN_DATABASE_URL  libpq URL of an existing PostgreSQL; unset = embedded server
  QUEEN_DATA_DIR      where the embedded server keeps its data (default ./.queen)
  QUEEN_HOST/PORT     HTTP bind address (default 127.0.0.1:6632)
  QUEEN_WORKERS       broker processes sharing that address (default 1)
  QUEEN_AUTH          on: every request needs a tenant's bearer token (queen-trio tenants)
  QUEEN_ALLOW_OPEN    1: allow a non-loopback QUEEN_HOST with QUEEN_AUTH off

each command has its own help: queen-trio COMMAND --help (queen-trio pop --help…); a running
broker describes its HTTP API at /openapi.json and shows a dashboard at /ui.

examples:
  queen-trio serve                      start on an embedded PostgreSQL
  QUEEN_DATABASE_URL=postgresql://app@db/queen queen-trio migrate
  queen-trio timers schedule reminders trial-ending:42 --delay 72h --payload '{"id": 42}'
  queen-trio timers cancel reminders trial-ending:42
  queen-trio switches pause timers-fire     pause firing timers on every broker (resume: same)
  queen-trio pop orders --batch 2           then: queen-trio ack TXN PARTITION_ID LEASE_ID

client commands print tables or `field  value` lines (none shown as -); --json prints one
JSON document instead.
"""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="queen-trio",
        description="A message broker with durable, cancellable timers, on PostgreSQL.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"queen-trio {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.add_parser(
        "serve",
        help="run the broker (HTTP API and background services) until SIGINT/SIGTERM/SIGHUP",
        description="Run the broker. Applies pending migrations first. Without "
        "QUEEN_DATABASE_URL it starts an embedded PostgreSQL under QUEEN_DATA_DIR and stops "
        "it on exit.",
        epilog=help_text(),  # every setting, from its declaration (queen_trio/config.py)
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands.add_parser(
        "migrate",
        help="apply pending schema migrations and exit",
        description="Apply schema/ migrations that the database has not seen yet. Safe to run "
        "while brokers are starting: an advisory lock serialises migrators.",
    )
    commands.add_parser("version", help="print the version and exit")

    tenants = commands.add_parser(
        "tenants",
        help="manage tenants, their tokens and plans (works with or without a running broker)",
        description="Tenants own every queue, message, timer and KV key. With QUEEN_AUTH=on a "
        "request's bearer token selects its tenant.",
    )
    sub = tenants.add_subparsers(dest="tenants_command", metavar="ACTION", required=True)
    database = argparse.ArgumentParser(add_help=False)
    database.add_argument(
        "--init", action="store_true",
        help="without QUEEN_DATABASE_URL: create the embedded database under QUEEN_DATA_DIR if "
             "there is none yet (otherwise refused: it would not be your broker's)")

    def action(group: Any, name: str, help: str) -> argparse.ArgumentParser:
        return group.add_parser(name, help=help, parents=[database], epilog=TENANTS_EXIT_CODES,
                                formatter_class=argparse.RawDescriptionHelpFormatter)

    create = action(sub, "create", "create a tenant")
    create.add_argument("name")
    action(sub, "list", "list tenants with their plans and usage").add_argument(
        "--json", action="store_true", help="machine-readable output"
    )
    token = sub.add_parser("token", help="create or revoke bearer tokens")
    token_sub = token.add_subparsers(dest="token_command", metavar="ACTION", required=True)
    token_create = action(token_sub, "create", "create a token (printed once, never stored)")
    token_create.add_argument("name", help="tenant name")
    token_create.add_argument("--json", action="store_true", help='print {"tenant", "token"}')
    token_revoke = action(token_sub, "revoke", "revoke a token by its prefix")
    token_revoke.add_argument("prefix", help="the token's prefix (qt_<prefix>_…) or the token")
    plan = action(sub, "plan", "change a tenant's plan (running brokers apply it within a second)")
    plan.add_argument("name")
    plan.add_argument("--max-message-bytes", type=int, metavar="N",
                      help="lowers the message ceiling (QUEEN_MAX_MESSAGE_BYTES) for this "
                           "tenant; -1 removes the lowering")
    plan.add_argument("--max-stored-bytes", type=int, metavar="N",
                      help="storage gate in bytes; 0 refuses all writes; -1 removes the gate")
    plan.add_argument("--requests-per-second", type=int, metavar="N",
                      help="request-rate quota per broker; -1 removes the quota")
    plan.add_argument("--json", action="store_true", help="print the plan as JSON")
    _add_switches(commands)
    cli_client.add_commands(commands)  # timers, push, pop, dlq, kv: talk to a running broker
    return parser


SWITCHES_HELP = """\
switches (NAME): kv, timers-schedule, timers-fire (or kv_enabled, timers_schedule_enabled,
timers_fire_enabled, as stored in queen.runtime_switches). Every broker on the database applies a
change within a second. While one is paused:
  kv               KV and locks routes answer 503 kv_disabled (Retry-After: 1); a transaction
                   with a kv rider 403
  timers-schedule  schedules answer 503 timers_disabled (a transaction scheduling one 403);
                   cancels and timer reads are never paused
  timers-fire      no timer fires; due ones stay pending, nothing is lost, and they fire (each
                   once) at the resume

Prints the database it works on as one line on stderr. exit codes:
  0  done
  2  usage error (an unknown switch; no database here)
  5  the database cannot be reached (or the embedded one cannot start)
"""


def _add_switches(commands: Any) -> None:
    switches = commands.add_parser(
        "switches", help="show, pause or resume the runtime switches (kv, timers-schedule, "
                         "timers-fire)",
        description="Pause a surface of every broker on the database while they keep running, "
                    "and resume it. Works on the database, with or without a running broker.",
        epilog=SWITCHES_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    switches.add_argument("--json", action="store_true", help="print the switches as JSON")
    sub = switches.add_subparsers(dest="switches_command", metavar="ACTION")
    for action, help in (("pause", "turn switches off"), ("resume", "turn switches back on")):
        p = sub.add_parser(action, help=help, epilog=SWITCHES_HELP,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        p.add_argument("names", nargs="+", type=_switch_name, metavar="NAME")
        p.add_argument("--json", action="store_true", help="print the switches as JSON")
    sub.add_parser("show", help="print the switches (the default)").add_argument(
        "--json", action="store_true", help="print the switches as JSON")


def _switch_name(text: str) -> str:
    from .switches import NAMES

    name = text.strip().lower().replace("-", "_")
    name = name if name.endswith("_enabled") else f"{name}_enabled"
    if name not in NAMES:
        raise argparse.ArgumentTypeError(
            f"no switch {text!r}: kv, timers-schedule or timers-fire")
    return name


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    if args.command == "version":
        print(f"queen-trio {__version__}")
        return EXIT_OK
    if args.command in cli_client.COMMANDS:
        return cli_client.run(args)

    try:
        settings = load_settings(os.environ)
    except ConfigError as exc:
        print(f"queen-trio: {exc}", file=sys.stderr)
        return EXIT_USAGE
    quiet = args.command in ("tenants", "switches") and "QUEEN_LOG_LEVEL" not in os.environ
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(OneLineFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.WARNING if quiet else settings.log_level,
                        handlers=[handler])
    try:
        if args.command == "migrate":
            return _with_database(settings, _migrate)
        if args.command == "tenants":
            return _database_command(settings, args, _tenants)
        if args.command == "switches":
            return _database_command(settings, args, _switches)
        # From here on SIGINT/SIGTERM are noted, never fatal: trio turns them into a graceful
        # shutdown while the broker runs, and before or after that (embedded PostgreSQL starting
        # or stopping) a repeated signal must not kill us and orphan the server.
        stop = _StopRequests()
        for sig in _STOP_SIGNALS:
            signal.signal(sig, stop)
        try:
            # The address first: a busy port or a bad QUEEN_HOST is one line before any
            # database is started (an embedded one would be initialised for nothing).
            listening = _bind_first(settings)
        except ListenError as exc:
            print(f"queen-trio: {exc}", file=sys.stderr)
            return EXIT_USAGE
        try:
            return _with_database(settings, lambda s: _serve(s, stop, listening))
        finally:
            if listening is not None:
                listening.close()
            # We are exiting anyway; Python restores default handlers while it finalizes, and a
            # late repeated signal would otherwise turn a clean exit 0 into death by SIGTERM.
            for sig in _STOP_SIGNALS:
                signal.signal(sig, signal.SIG_IGN)
    except QueenError as exc:
        print(f"queen-trio: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        return EXIT_OK


def _with_database(settings: Settings, command: Callable[[Settings], int]) -> int:
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


def _database_command(settings: Settings, args: argparse.Namespace,
                      command: Callable[[Settings, argparse.Namespace], int]) -> int:
    """``tenants …``, ``switches …``: say which database, refuse to invent an embedded one,
    exit 0/2/4/5."""
    if settings.database_url is not None:
        from .db.conninfo import redacted

        print(f"queen-trio: database: {redacted(settings.database_url)}", file=sys.stderr)
        return command(settings, args)
    data_dir = settings.data_dir.resolve()
    if not (data_dir / "pg" / "PG_VERSION").exists() and not getattr(args, "init", False):
        print(f"queen-trio: no embedded database in {data_dir}: set QUEEN_DATA_DIR to your "
              "broker's data directory or QUEEN_DATABASE_URL to its database "
              "(or pass --init to create one here)", file=sys.stderr)
        return EXIT_USAGE
    print(f"queen-trio: database: embedded PostgreSQL in {data_dir}", file=sys.stderr)
    try:
        return _with_database(settings, lambda s: command(s, args))
    except QueenError as exc:  # the embedded server would not start, a migration failed
        print(f"queen-trio: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE


def _migrate(settings: Settings) -> int:
    import psycopg

    from .db.migrations import apply_migrations

    assert settings.database_url is not None
    try:
        applied = apply_migrations(settings.database_conninfo())
    except psycopg.errors.InsufficientPrivilege as exc:
        print(_not_allowed(exc, settings), file=sys.stderr)
        return EXIT_FAILURE
    except psycopg.OperationalError as exc:
        print(_unreachable(exc), file=sys.stderr)
        return EXIT_FAILURE
    print(f"applied {len(applied)} migration(s)" + (f": {applied}" if applied else ""))
    return EXIT_OK


def _tenants(settings: Settings, args: argparse.Namespace) -> int:
    import json

    import psycopg
    from psycopg.rows import dict_row

    from .db.migrations import apply_migrations
    from .errors import ClientError
    from .tenants import store

    assert settings.database_url is not None
    try:
        url = settings.database_conninfo()
        apply_migrations(url)
        with psycopg.connect(url, row_factory=dict_row) as raw:
            action = args.tenants_command
            if action == "create":
                store.create_tenant(raw, args.name)
                print(f"created tenant {args.name}")
            elif action == "list":
                rows = store.list_tenants(raw)
                if args.json:
                    print(json.dumps([{k: v for k, v in r.items() if k != "created_at"}
                                      for r in rows]))
                else:
                    _print_tenants(rows)
            elif action == "token" and args.token_command == "create":
                token = store.create_token(raw, args.name)
                print(json.dumps({"tenant": args.name, "token": token}) if args.json else token)
            elif action == "token":
                store.revoke_token(raw, args.prefix)
                print("revoked")
            elif action == "plan":
                changed = store.set_plan(
                    raw, args.name,
                    max_message_bytes=_unset(args.max_message_bytes),
                    set_message=args.max_message_bytes is not None,
                    max_stored_bytes=_unset(args.max_stored_bytes),
                    requests_per_second=_unset(args.requests_per_second),
                    set_stored=args.max_stored_bytes is not None,
                    set_rate=args.requests_per_second is not None,
                )
                cli_client.Output(args.json).record(
                    {k: v for k, v in changed.items() if k != "tenant_id"})
    except ClientError as exc:
        print(f"queen-trio: {exc.code}: {exc.message}", file=sys.stderr)
        return EXIT_REFUSED
    except psycopg.errors.CheckViolation:
        print("queen-trio: a plan value is out of range (see --help)", file=sys.stderr)
        return EXIT_USAGE
    except psycopg.errors.InsufficientPrivilege as exc:
        print(_not_allowed(exc, settings), file=sys.stderr)
        return EXIT_UNREACHABLE
    except psycopg.OperationalError as exc:
        print(_unreachable(exc), file=sys.stderr)
        return EXIT_UNREACHABLE
    except QueenError as exc:  # a failed migration
        print(f"queen-trio: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE
    return EXIT_OK


def _switches(settings: Settings, args: argparse.Namespace) -> int:
    import json

    import psycopg
    from psycopg.rows import dict_row

    from . import switches
    from .db.migrations import apply_migrations

    assert settings.database_url is not None
    action = args.switches_command or "show"
    try:
        url = settings.database_conninfo()
        apply_migrations(url)
        with psycopg.connect(url, row_factory=dict_row) as raw:
            if action == "show":
                state = switches.read(raw)
            else:
                state = switches.set_switches(
                    raw, dict.fromkeys(args.names, action == "resume"))
    except psycopg.errors.InsufficientPrivilege as exc:
        print(_not_allowed(exc, settings), file=sys.stderr)
        return EXIT_UNREACHABLE
    except psycopg.OperationalError as exc:
        print(_unreachable(exc), file=sys.stderr)
        return EXIT_UNREACHABLE
    except QueenError as exc:  # a failed migration
        print(f"queen-trio: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE
    if args.json:
        print(json.dumps(state))
    else:
        for name, enabled in state.items():
            effect = "" if enabled else f"  {switches.EFFECTS[name]}"
            print(f"{name:<24} {'on' if enabled else 'PAUSED'}{effect}")
    if action != "show":
        print("queen-trio: every broker on this database applies it within a second",
              file=sys.stderr)
    return EXIT_OK


def _unset(value: int | None) -> int | None:
    """-1 on the command line means "no limit" (stored as NULL)."""
    return None if value is None or value == -1 else value


def _print_tenants(rows: list[dict[str, Any]]) -> None:
    def limit(v: object) -> str:
        return "unlimited" if v is None else str(v)

    header = f"{'TENANT':<24} {'TOKENS':>6} {'MAX MSG':>9} {'STORED':>12} {'GATE':>12} {'RPS':>9}"
    print(header)
    for r in rows:
        print(f"{r['name']:<24} {r['active_tokens']:>6} {limit(r['max_message_bytes']):>9} "
              f"{r['stored_bytes']:>12} {limit(r['max_stored_bytes']):>12} "
              f"{limit(r['requests_per_second']):>9}")


class _StopRequests:
    """A signal handler that only remembers that a stop was asked for."""

    def __init__(self) -> None:
        self.requested = False

    def __call__(self, signum: int, frame: object) -> None:
        self.requested = True
        log.info("received %s", signal.Signals(signum).name)

    def asked(self) -> bool:
        # A bound method, not ``lambda: stop.requested``: after ``if stop.requested: return``
        # mypy types such a lambda as always returning False.
        return self.requested


def _bind_first(settings: Settings) -> socket.socket | None:
    """The listening socket, bound before anything else starts (None: a socket was passed in,
    QUEEN_LISTEN_FD). Refused when it is reachable from other machines with auth off, unless
    QUEEN_ALLOW_OPEN=1 says that is meant."""
    if settings.listen_fd is not None:
        return None
    import ipaddress

    from .workers import bind

    sock = bind(settings)
    address = sock.getsockname()[0]
    if not (settings.auth or settings.allow_open
            or ipaddress.ip_address(address.split("%")[0]).is_loopback):
        sock.close()
        raise ListenError(
            f"refusing to serve {settings.host}:{settings.port} with QUEEN_AUTH off: anyone "
            "who reaches it could read and write every queue; set QUEEN_AUTH=on (tokens: "
            "queen-trio tenants), bind QUEEN_HOST=127.0.0.1, or set QUEEN_ALLOW_OPEN=1 if an "
            "open broker is meant (a private network, a proxy that authenticates)")
    return sock


def _serve(settings: Settings, stop: _StopRequests, listening: socket.socket | None) -> int:
    import psycopg
    import trio

    from .server import serve_until_signalled

    if stop.requested:  # asked to stop while the embedded server was starting
        return EXIT_OK
    if settings.workers > 1 and listening is not None:
        from .workers import Supervisor

        return Supervisor(settings, stop.asked, listening).run()
    if listening is not None:  # hypercorn takes the descriptor over and closes it
        settings = dataclasses.replace(settings, listen_fd=listening.detach())
    try:
        trio.run(serve_until_signalled, settings, stop.asked)
    except psycopg.errors.InsufficientPrivilege as exc:
        print(_not_allowed(exc, settings), file=sys.stderr)
        return EXIT_FAILURE
    except psycopg.OperationalError as exc:
        print(_unreachable(exc), file=sys.stderr)
        return EXIT_FAILURE
    except BaseExceptionGroup as group:
        # A bind failure, or a database that cannot be reached at start-up, surfaces from the
        # broker's nurseries wrapped in exception groups.
        listen, rest = group.split(ListenError)
        if listen is not None and rest is None:
            print(f"queen-trio: {_first_leaf(listen)}", file=sys.stderr)
            return EXIT_USAGE
        unreachable, rest = group.split(psycopg.OperationalError)
        if unreachable is not None and rest is None:
            print(_unreachable(_first_leaf(unreachable)), file=sys.stderr)
            return EXIT_FAILURE
        # A role that may not create the schema (the migrations run first thing).
        refused, rest = group.split(psycopg.errors.InsufficientPrivilege)
        if refused is not None and rest is None:
            print(_not_allowed(_first_leaf(refused), settings), file=sys.stderr)
            return EXIT_FAILURE
        raise
    except ListenError as exc:
        print(f"queen-trio: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return EXIT_OK


def _unreachable(exc: BaseException) -> str:
    """One line for a database that cannot be reached (libpq lists each host it tried on
    lines of their own)."""
    import psycopg

    text = one_line(str(exc))
    if isinstance(exc, psycopg.errors.ConnectionTimeout):
        text += " (a host took longer than QUEEN_DB_CONNECT_TIMEOUT_S to answer)"
    return f"queen-trio: cannot reach the database: {text}"


def _not_allowed(exc: BaseException, settings: Settings) -> str:
    """One line for a role that lacks a privilege the migrations need: the broker creates its
    ``queen`` schema itself, so its role needs CREATE on the database (once, at the first
    migration; owning the schema after that)."""
    from psycopg.conninfo import conninfo_to_dict

    info = conninfo_to_dict(settings.database_conninfo()) if settings.database_url else {}
    role, db = info.get("user") or "this role", info.get("dbname") or "the database"
    return (f"queen-trio: the database refused role {role}: {one_line(str(exc))}; it needs "
            f"CREATE on database {db} to make the queen schema and its tables (GRANT CREATE ON "
            f"DATABASE {db} TO {role}; or run `queen-trio migrate` once as the owner)")


def one_line(text: str) -> str:
    """libpq's multi-line messages (one line per host tried, DETAIL/HINT lines) as one."""
    return " ".join(line.strip() for line in text.strip().splitlines() if line.strip())


class OneLineFormatter(logging.Formatter):
    """Log records stay one line each (a libpq message inside one would spill over several);
    tracebacks, when logged, still follow on lines of their own."""

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 (logging's name)
        return one_line(super().formatMessage(record))


def _first_leaf(error: BaseException) -> BaseException:
    while isinstance(error, BaseExceptionGroup):
        error = error.exceptions[0]
    return error


if __name__ == "__main__":
    sys.exit(main())
