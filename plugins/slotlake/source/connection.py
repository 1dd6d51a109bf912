"""Connections to the source PostgreSQL: DSN resolution, password redaction, pinned session settings.

With the SQL decoding functions, pgoutput runs inside our backend and renders values as text with the settings
of *our* session. Pinning them gives every value one format (ISO dates in UTC, ISO 8601 intervals, round-trip
floats, hex bytea), whatever the server or role defaults are. They go into libpq's `options`, so the psycopg
control connection and the ADBC bulk connection (which does the peeking) get the same ones.
"""
from __future__ import annotations

import logging
import re
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg import conninfo, sql

from slotlake.config import SourceConfig, expand_env
from slotlake.errors import PreflightError
from slotlake.names import TableName

log = logging.getLogger(__name__)

SESSION_SETTINGS: dict[str, str] = {
    "DateStyle": "ISO",
    "TimeZone": "UTC",
    "IntervalStyle": "iso_8601",
    "extra_float_digits": "3",
    "bytea_output": "hex",
    "client_encoding": "UTF8",
}
_OPTIONS = " ".join(f"-c {k}={v}" for k, v in SESSION_SETTINGS.items())
_URI = re.compile(r"^postgres(ql)?://", re.IGNORECASE)


def resolve_dsn(source: SourceConfig) -> str:
    """The source's connection string: `dsn` with ${ENV} expanded, or the Airflow connection's URI."""
    if source.conn_id:
        # Airflow is imported only here, so the CLI and Spark apps work without it.
        from airflow.sdk import BaseHook

        uri = BaseHook.get_connection(source.conn_id).get_uri()
        # Airflow names the scheme after the connection type ("postgres://"); libpq accepts both spellings.
        return uri
    if not source.dsn:
        raise PreflightError(f"source {source.name}: neither dsn nor conn_id is set")
    return expand_env(source.dsn, f"sources.{source.name}.dsn")


def redact(dsn: str) -> str:
    """`dsn` with any password replaced by `***`, for logs and error messages (URI or key=value form)."""
    if _URI.match(dsn):
        parts = urlsplit(dsn)
        netloc = parts.netloc
        if "@" in netloc:
            userinfo, _, hosts = netloc.rpartition("@")
            if ":" in userinfo:
                userinfo = userinfo.split(":", 1)[0] + ":***"
            netloc = f"{userinfo}@{hosts}"
        query = "&".join(
            f"{k}=***" if k.lower() == "password" else f"{k}={quote(v, safe='')}"
            for k, v in parse_qsl(parts.query, keep_blank_values=True)
        )
        return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
    return re.sub(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", r"\1***", dsn, flags=re.IGNORECASE)


def scrub(text: str, dsn: str) -> str:
    """Free text on one line without the DSN's password (a driver's error message may echo the connection string)."""
    try:
        password = conninfo.conninfo_to_dict(dsn).get("password")
    except psycopg.ProgrammingError:
        password = None
    text = " ".join(text.replace(dsn, redact(dsn)).split())  # one line: the CLI prints errors as one line
    return text.replace(str(password), "***") if password else text


def session_dsn(dsn: str) -> str:
    """`dsn` with the pinned session settings added to libpq `options` (kept in the DSN's own form)."""
    if _URI.match(dsn):
        parts = urlsplit(dsn)
        query = parse_qsl(parts.query, keep_blank_values=True)
        existing = " ".join(v for k, v in query if k == "options")
        query = [(k, v) for k, v in query if k != "options"]
        query.append(("options", f"{existing} {_OPTIONS}".strip()))
        return urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(query, quote_via=quote),
                           parts.fragment))
    options = str(conninfo.conninfo_to_dict(dsn).get("options") or "")
    return conninfo.make_conninfo(dsn, options=f"{options} {_OPTIONS}".strip())


def connect(source: SourceConfig, *, autocommit: bool = True) -> psycopg.Connection:
    """A psycopg connection to the source with the pinned session settings. Errors carry the redacted DSN."""
    dsn = resolve_dsn(source)
    try:
        return psycopg.connect(session_dsn(dsn), autocommit=autocommit, application_name="slotlake")
    except psycopg.Error as e:
        raise PreflightError(
            f"source {source.name}: cannot connect to {redact(dsn)}: {scrub(str(e), dsn)}; "
            "check host, port, database, user and password (or the Airflow connection)"
        ) from None


def connect_bulk(source: SourceConfig):  # -> adbc_driver_postgresql.dbapi.Connection
    """An ADBC connection (COPY binary straight into Arrow batches) with the same pinned session settings."""
    import adbc_driver_postgresql.dbapi as adbc

    dsn = resolve_dsn(source)
    uri = session_dsn(dsn)
    try:
        return adbc.connect(uri, autocommit=True)
    except Exception as e:  # ADBC raises its own DB-API error classes
        raise PreflightError(
            f"source {source.name}: cannot open the bulk (ADBC) connection to {redact(dsn)}: "
            f"{scrub(str(e), dsn)}"
        ) from None


def one_row(conn: psycopg.Connection, query, params=None) -> tuple:
    """The first row of a query that always returns one (SHOW, SELECT f()); a clear error if it returned none."""
    row = conn.execute(query, params).fetchone()
    if row is None:
        raise RuntimeError(f"PostgreSQL returned no row for {query!r}; check the server and the role's privileges")
    return row


def scalar(conn: psycopg.Connection, query, params=None):
    """The first column of `one_row`."""
    return one_row(conn, query, params)[0]


def table_ident(name: TableName) -> sql.Identifier:
    """A table's qualified name for psycopg's `sql.SQL(...).format(...)`: both parts always quoted."""
    return sql.Identifier(name.schema, name.name)
