"""The YAML config (see DESIGN.md "Config"), validated before anything touches a database.

    lake: ./lake
    spark: {master: "local[*]", conf: {}}
    sources:
      shop:
        dsn: postgresql://user@127.0.0.1:5432/shop    # or conn_id: <Airflow connection id>; ${ENV} expands
        slot: slotlake_shop
        publication: slotlake_shop
        tables: [public.orders]         # or schemas: [public]; neither: every table (FOR ALL TABLES)
        insert_only: [public.events]    # keyless append-only tables (publication <publication>_insert_only)
        schedule: "0 * * * *"
        optimize_schedule: "30 3 * * *"  # slotlake_optimize__<source>: compaction of gold; null: manual runs only
        delete_mode: hard
        history: false
        deletion_vectors: false         # true, or [tables]: gold MERGEs mark rows deleted instead of rewriting files
        numeric: {unconstrained: decimal}   # or string; per table/column: tables: {public.t: {columns: {c: string}}}
    storage:                            # only with lake: s3a://bucket/prefix (credentials: AWS_* environment)
      endpoint: http://127.0.0.1:9000   # an S3-compatible store; left out for AWS S3
      region: us-east-1
      path_style: true
"""
from __future__ import annotations

import difflib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from slotlake.errors import ConfigError
from slotlake.names import TableName
from slotlake.storage import ACCESS_KEY_ENV, SECRET_KEY_ENV, StorageSettings, configure, is_s3

ENV_VAR = "SLOTLAKE_CONFIG"
# The Spark server for every config that names none (`spark.server` wins): one setting in the environment of the
# Airflow workers or a shell points all of them at the deployment's `slotlake spark-server`.
SPARK_SERVER_ENV = "SLOTLAKE_SPARK_SERVER"
# `spark.server: auto`: the first run starts a `slotlake spark-server` of its own and later runs reuse it
# (slotlake.spark.auto_server).
AUTO_SERVER = "auto"
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,40}$")
_IDENT = re.compile(r'^[A-Za-z_][A-Za-z0-9_$]*$')
INSERT_ONLY_SUFFIX = "_insert_only"
_MAX_IDENT = 63  # PostgreSQL truncates longer names (NAMEDATALEN - 1)
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
DEFAULT_SCHEDULE = "0 * * * *"  # the sync DAG: hourly, UTC
# Gold's daily compaction (`slotlake_optimize__<source>`): at half past the hour, between hourly syncs.
DEFAULT_OPTIMIZE_SCHEDULE = "30 3 * * *"


@dataclass(frozen=True)
class ExtractSettings:
    """Bounds of one extract: rows per peek call (`upto_nchanges`) and rows per Parquet row group."""

    # Each peek call re-decodes the WAL between the slot's restart_lsn and its confirmed position before it
    # returns anything; restart_lsn only moves at a running-xacts record (about every 15 s of activity), so a
    # burst decoded in many small calls costs O(calls x burst). 1 M rows keeps calls few; the extract streams them,
    # so its memory does not grow with this number (the server spills a call's rows past work_mem to disk).
    upto_nchanges: int = 1_000_000
    batch_rows: int = 65_536
    max_calls: int = 1_000  # peek calls per run; a run stops (and the next continues) past this
    warn_retained_wal_mb: int = 1024


@dataclass(frozen=True)
class SnapshotSettings:
    """The initial copy: parallel connections, and the heap blocks per part (a ctid range copied as one file)."""

    workers: int = 2
    part_pages: int = 16_384  # 128 MB of heap at 8 kB blocks


@dataclass(frozen=True)
class SparkSettings:
    master: str = "local[*]"
    conf: Mapping[str, str] = field(default_factory=dict)
    conn_id: str | None = None  # Airflow Spark connection for SparkSubmitOperator; default: built from master
    spark_submit: str | None = None  # path to spark-submit; default: the one in this Python env
    server: str | None = None  # host:port of a running `slotlake spark-server`, or AUTO_SERVER: apps run there
    server_idle_minutes: float = 120.0  # `server: auto`: the server it starts stops after this long without an app
    # `slotlake sync` decodes and merges its backlog in its own process, without Spark, in slices of at most this
    # many bronze bytes, while delta-rs can write them exactly (slotlake.merge.in_process); 0: always Spark
    in_process_bytes: int = 32 << 20


NUMERIC_MODES = ("decimal", "string")


@dataclass(frozen=True)
class TableNumeric:
    """A table's override of `numeric.unconstrained` (None: the source's), and per-column ones."""

    unconstrained: str | None = None
    columns: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class NumericSettings:
    """How a `numeric` column without precision lands in gold: `decimal` (decimal(38,18); a value that does not
    fit is NULL in gold and quarantined) or `string` (PostgreSQL's text: every digit, NaN, Infinity)."""

    unconstrained: str = "decimal"
    tables: Mapping[str, TableNumeric] = field(default_factory=dict)

    def unconstrained_for(self, table: str, column: str) -> str:
        """The mode of `column` of `table` ("schema.table"): the column's entry, else the table's, else the source's."""
        t = self.tables.get(table)
        if t is None:
            return self.unconstrained
        return t.columns.get(column, t.unconstrained or self.unconstrained)


@dataclass(frozen=True)
class SchemaChanges:
    """How gold follows a source schema change that Delta can apply in place only with a table feature.

    `rewrite` (default) rewrites the gold table in a new Delta version, so every Delta reader (delta-rs too) can
    still read it; `type_widening` / `column_mapping` change it in place with Delta's table features, which
    delta-rs 1.6 cannot read (type widening) or reads wrongly (NULL in renamed and later-added columns).
    """

    widen: str = "rewrite"  # rewrite | type_widening
    rename: str = "rewrite"  # rewrite | column_mapping: renamed columns, and dropped ones with on_drop_column: drop


@dataclass(frozen=True)
class SourceConfig:
    name: str
    dsn: str | None
    conn_id: str | None
    slot: str
    publication: str
    tables: tuple[str, ...] | None  # canonical names (str(TableName)); None: every table in the publication
    schedule: str
    delete_mode: str  # hard | soft
    history: bool
    start_date: str
    on_bad_value: str  # quarantine | fail
    on_drop_column: str = "keep"  # keep | drop: what gold does with a column dropped in the source
    schemas: tuple[str, ...] | None = None  # instead of tables: the publication is FOR TABLES IN SCHEMA these
    insert_only: tuple[str, ...] = ()  # keyless append-only tables, published for insert and truncate only
    lock_timeout_s: int = 600  # how long a run waits for another run of the source to finish (0: not at all)
    numeric: NumericSettings = NumericSettings()
    origin: str = "any"  # any | none: `none` skips changes other logical replication applied (PostgreSQL 16+)
    schema_changes: SchemaChanges = SchemaChanges()
    history_tables: tuple[str, ...] | None = None  # `history: [tables]`: only these (None: all, when history)
    # `deletion_vectors: true | [tables]`: gold tables with Delta's deletion vectors (README "Big gold tables")
    deletion_vectors: bool = False
    deletion_vectors_tables: tuple[str, ...] | None = None  # None: every table, when deletion_vectors
    # `slotlake_optimize__<source>`'s cron schedule (compaction of gold's small files and vectors); None: no
    # scheduled runs (the DAG still runs when triggered)
    optimize_schedule: str | None = DEFAULT_OPTIMIZE_SCHEDULE

    def keeps_history(self, table: str) -> bool:
        """Whether the merge keeps `table`'s SCD2 history table (gold_history/<schema>/<table>)."""
        return self.history and (self.history_tables is None or table in self.history_tables)

    def uses_deletion_vectors(self, table: str) -> bool:
        """Whether `table`'s gold table has Delta's deletion vectors turned on (config `deletion_vectors`)."""
        return self.deletion_vectors and (self.deletion_vectors_tables is None
                                          or table in self.deletion_vectors_tables)

    @property
    def insert_only_publication(self) -> str:
        """The second publication, `WITH (publish = 'insert, truncate')`, that carries the `insert_only` tables."""
        return f"{self.publication}{INSERT_ONLY_SUFFIX}"

    @property
    def publications(self) -> tuple[str, ...]:
        """Every publication the slot is read with."""
        return (self.publication, self.insert_only_publication) if self.insert_only else (self.publication,)

    @property
    def listed_tables(self) -> tuple[str, ...] | None:
        """The tables named in the config (`tables` + `insert_only`), or None when the publication decides."""
        if self.tables is None:
            return None
        return self.tables + tuple(t for t in self.insert_only if t not in self.tables)

    def keyless_appends(self, table: str) -> bool:
        """Whether a keyless table (REPLICA IDENTITY DEFAULT without a primary key) is merged as appends rather
        than refused: listed in `insert_only` (published for inserts and truncates only), or in a source without a
        table list (its publication publishes updates, so PostgreSQL rejects UPDATE and DELETE on such a table).
        Either way its stream holds only inserts and truncates."""
        return table in self.insert_only or self.tables is None

    def syncs(self, table: str) -> bool:
        """Whether `table` (schema.table) belongs to this source: listed in `tables` or `insert_only`, in one of
        `schemas`, or (neither set) any table its publications carry."""
        if table in self.insert_only:
            return True
        if self.tables is not None:
            return table in self.tables
        if self.schemas is not None:
            return TableName.parse(table).schema in self.schemas
        return True


@dataclass(frozen=True)
class Config:
    lake: str
    spark: SparkSettings
    extract: ExtractSettings
    sources: Mapping[str, SourceConfig]
    path: str | None = None
    snapshot: SnapshotSettings = SnapshotSettings()
    storage: StorageSettings | None = None  # set exactly when the lake is s3a:// (defaults: AWS S3)

    def source(self, name: str) -> SourceConfig:
        try:
            return self.sources[name]
        except KeyError:
            known = ", ".join(sorted(self.sources)) or "(none)"
            raise ConfigError(f"unknown source {name!r}: the config defines {known}") from None


_TOP_KEYS = {"lake", "spark", "sources", "extract", "snapshot", "storage"}
_STORAGE_KEYS = {"endpoint", "region", "path_style"}
_SECRET_WORDS = ("key", "secret", "password", "token", "credential")
_SPARK_KEYS = {"master", "conf", "conn_id", "spark_submit", "server", "server_idle_minutes", "in_process_bytes"}
_EXTRACT_KEYS = {"upto_nchanges", "batch_rows", "max_calls", "warn_retained_wal_mb"}
_SNAPSHOT_KEYS = {"workers", "part_pages"}
_SOURCE_KEYS = {"dsn", "conn_id", "slot", "publication", "tables", "schedule", "optimize_schedule", "delete_mode",
                "history",
                "start_date", "on_bad_value", "on_drop_column", "schemas", "insert_only", "lock_timeout_s",
                "numeric", "deletion_vectors",
                "origin", "schema_changes"}
_NUMERIC_KEYS = {"unconstrained", "tables"}
_NUMERIC_TABLE_KEYS = {"unconstrained", "columns"}
_SCHEMA_CHANGES_MODES = {"widen": ("rewrite", "type_widening"), "rename": ("rewrite", "column_mapping")}


def _is_cron(value: Any) -> bool:
    """Whether `value` has the shape of a cron expression (5 fields); `check_schedules` checks each field."""
    return isinstance(value, str) and len(value.split()) == 5


_CRON_KEYS = {"schedule": (DEFAULT_SCHEDULE, ""),
              "optimize_schedule": (DEFAULT_OPTIMIZE_SCHEDULE, ", or null (no scheduled compaction)")}


def _bad_cron(where: str, key: str, value: Any) -> ConfigError:
    example, alternative = _CRON_KEYS[key]
    return ConfigError(f"{where}.{key}: {value!r} must be a 5-field cron expression, e.g. \"{example}\"{alternative}")


def check_schedules(source: SourceConfig) -> None:
    """Each field of the source's cron expressions checked with croniter, as Airflow's timetables read them: called
    where the DAGs are built (Airflow, which brings croniter, is loaded there already), so a bad field is a one-line
    DAG import error naming the key, not a failure at the scheduler's first run; not at every config load (the CLI
    schedules nothing, and croniter's import is ~40 ms of each run's start)."""
    from croniter import croniter  # type: ignore[import-untyped]

    for key in _CRON_KEYS:
        value = getattr(source, key)
        if value is not None and not croniter.is_valid(value):
            raise _bad_cron(f"sources.{source.name}", key, value)


def _unknown(keys: set[str], allowed: set[str], where: str) -> None:
    for k in sorted(keys - allowed):
        close = difflib.get_close_matches(k, allowed, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else f"; allowed keys: {', '.join(sorted(allowed))}"
        raise ConfigError(f"{where}.{k}: unknown key{hint}")


def host_port(text: str) -> tuple[str, int] | None:
    """`host:port` (no colon or space in host, port 1-65535) -> (host, port); None if `text` is not one."""
    host, _, port = text.strip().rpartition(":")
    if not host or re.search(r"[\s:]", host) or not re.fullmatch(r"\d{1,5}", port) or not 0 < int(port) < 65536:
        return None
    return host, int(port)


def expand_env(text: str, where: str) -> str:
    """Expand ${VAR} from the environment; a missing variable is an error, never an empty string."""

    def sub(m: re.Match[str]) -> str:
        name = m.group(1)
        if name not in os.environ:
            raise ConfigError(f"{where}: environment variable {name} is not set (referenced as ${{{name}}})")
        return os.environ[name]

    return _ENV_REF.sub(sub, text)


def _positive_int(value: Any, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ConfigError(f"{where}: must be a positive integer, got {value!r}")
    return value


def _parse_table(name: Any, where: str) -> str:
    """The canonical form of a `schema.table` entry (PostgreSQL's rules: unquoted folds to lower case)."""
    try:
        return str(TableName.parse(name))
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None


def _numeric_mode(value: Any, where: str) -> str:
    if value not in NUMERIC_MODES:
        raise ConfigError(f"{where}: {value!r} must be decimal (decimal(38,18), values that do not fit go to "
                          "_quarantine) or string (PostgreSQL's text: every digit, NaN, Infinity)")
    return value


def _parse_numeric(raw: Any, where: str, tables: tuple[str, ...] | None) -> NumericSettings:
    """`numeric: {unconstrained: M, tables: {schema.table: M | {unconstrained: M, columns: {col: M}}}}`."""
    if raw is None:
        return NumericSettings()
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: must be a mapping, e.g. {{unconstrained: string}}")
    _unknown(set(raw), _NUMERIC_KEYS, where)
    default = _numeric_mode(raw.get("unconstrained", "decimal"), f"{where}.unconstrained")
    tables_raw = raw.get("tables") or {}
    if not isinstance(tables_raw, Mapping):
        raise ConfigError(f"{where}.tables: must be a mapping of schema.table to decimal, string or "
                          "{unconstrained: ..., columns: {column: ...}}")
    out: dict[str, TableNumeric] = {}
    for tname, traw in tables_raw.items():
        twhere = f"{where}.tables.{tname}"
        tname = _parse_table(tname, f"{where}.tables")
        if tables is not None and tname not in tables:
            raise ConfigError(f"{twhere}: not one of the source's tables ({', '.join(tables)})")
        if isinstance(traw, str):  # shorthand: the whole table
            out[tname] = TableNumeric(_numeric_mode(traw, twhere))
            continue
        if not isinstance(traw, Mapping):
            raise ConfigError(f"{twhere}: must be decimal, string or a mapping {{unconstrained: ..., columns: ...}}")
        _unknown(set(traw), _NUMERIC_TABLE_KEYS, twhere)
        mode = traw.get("unconstrained")
        columns_raw = traw.get("columns") or {}
        if not isinstance(columns_raw, Mapping):
            raise ConfigError(f"{twhere}.columns: must be a mapping of column name to decimal or string")
        columns = {}
        for c, m in columns_raw.items():
            if not isinstance(c, str) or not c:
                raise ConfigError(f"{twhere}.columns: {c!r} is not a column name")
            columns[c] = _numeric_mode(m, f"{twhere}.columns.{c}")
        out[tname] = TableNumeric(None if mode is None else _numeric_mode(mode, f"{twhere}.unconstrained"), columns)
    return NumericSettings(default, out)


def _parse_source(name: str, raw: Any) -> SourceConfig:
    where = f"sources.{name}"
    if not _NAME.match(name):
        raise ConfigError(f"{where}: source names are letters, digits and _ (at most 41), starting with a letter")
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: must be a mapping with at least dsn or conn_id")
    _unknown(set(raw), _SOURCE_KEYS, where)
    dsn, conn_id = raw.get("dsn"), raw.get("conn_id")
    if bool(dsn) == bool(conn_id):
        raise ConfigError(f"{where}: set exactly one of dsn (postgresql://user@host:port/db) "
                          "or conn_id (Airflow connection)")
    if dsn is not None:
        if not isinstance(dsn, str) or not re.match(r"^(postgres|postgresql)://", dsn.strip()):
            raise ConfigError(f"{where}.dsn: must be a URI starting postgresql://, e.g. postgresql://user@127.0.0.1:5432/shop")
        dsn = dsn.strip()  # ${ENV} is expanded when connecting, so secrets never sit in the parsed config
    slot = raw.get("slot", f"slotlake_{name}".lower())
    if not isinstance(slot, str) or not re.fullmatch(r"[a-z0-9_]{1,63}", slot):
        raise ConfigError(f"{where}.slot: {slot!r}: slot names are lower-case letters, digits and _ (at most 63)")
    publication = raw.get("publication", f"slotlake_{name}".lower())
    if not isinstance(publication, str) or not _IDENT.match(publication):
        raise ConfigError(f"{where}.publication: {publication!r} is not a plain identifier")
    tables = raw.get("tables")
    if tables is not None:
        if not isinstance(tables, list) or not tables:
            raise ConfigError(f"{where}.tables: must be a non-empty list like [public.orders], "
                              "or left out for every table in the publication")
        tables = tuple(_parse_table(t, f"{where}.tables") for t in tables)
        if len(set(tables)) != len(tables):
            raise ConfigError(f"{where}.tables: lists a table twice")
    schemas = raw.get("schemas")
    if schemas is not None:
        if tables is not None:
            raise ConfigError(f"{where}: set tables or schemas, not both (schemas publishes every table of the "
                              "listed schemas; tables only the listed tables)")
        if not isinstance(schemas, list) or not schemas:
            raise ConfigError(f"{where}.schemas: must be a non-empty list like [public], or left out for every table")
        for s in schemas:
            if not isinstance(s, str) or not _IDENT.match(s):
                raise ConfigError(f"{where}.schemas: {s!r} is not a plain schema name")
        if len(set(schemas)) != len(schemas):
            raise ConfigError(f"{where}.schemas: lists a schema twice")
        schemas = tuple(schemas)
    insert_only = raw.get("insert_only") or ()
    if insert_only:
        if not isinstance(insert_only, list):
            raise ConfigError(f"{where}.insert_only: must be a list like [public.events]")
        insert_only = tuple(_parse_table(t, f"{where}.insert_only") for t in insert_only)
        if len(set(insert_only)) != len(insert_only):
            raise ConfigError(f"{where}.insert_only: lists a table twice")
        both = [t for t in insert_only if t in (tables or ())]
        if both:
            raise ConfigError(f"{where}: {', '.join(both)} is listed in both tables and insert_only; keep it in "
                              "insert_only (published for inserts and truncates only, merged as appends) or in "
                              "tables, not both")
        if len(publication) + len(INSERT_ONLY_SUFFIX) > _MAX_IDENT:
            raise ConfigError(f"{where}.publication: {publication!r} is too long to name the insert-only "
                              f"publication {publication}{INSERT_ONLY_SUFFIX} (at most {_MAX_IDENT} characters); "
                              "choose a shorter publication name")
    schedule = raw.get("schedule", DEFAULT_SCHEDULE)
    if not _is_cron(schedule):
        raise _bad_cron(where, "schedule", schedule)
    optimize_schedule = raw.get("optimize_schedule", DEFAULT_OPTIMIZE_SCHEDULE)
    if optimize_schedule is not None and not _is_cron(optimize_schedule):
        raise _bad_cron(where, "optimize_schedule", optimize_schedule)
    delete_mode = raw.get("delete_mode", "hard")
    if delete_mode not in ("hard", "soft"):
        raise ConfigError(f"{where}.delete_mode: {delete_mode!r} must be hard or soft")
    synced = None if tables is None else tables + tuple(insert_only)
    history, history_tables = _flag_or_tables(raw.get("history", False), f"{where}.history", synced)
    deletion_vectors, dv_tables = _flag_or_tables(raw.get("deletion_vectors", False), f"{where}.deletion_vectors",
                                                  synced)
    start_date = str(raw.get("start_date", "2024-01-01"))
    if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", start_date):
        raise ConfigError(f"{where}.start_date: {start_date!r} must be YYYY-MM-DD")
    on_bad_value = raw.get("on_bad_value", "quarantine")
    if on_bad_value not in ("quarantine", "fail"):
        raise ConfigError(f"{where}.on_bad_value: {on_bad_value!r} must be quarantine or fail")
    on_drop_column = raw.get("on_drop_column", "keep")
    if on_drop_column not in ("keep", "drop"):
        raise ConfigError(f"{where}.on_drop_column: {on_drop_column!r} must be keep (the gold column stays, NULL "
                          "from the drop on) or drop (the gold column is dropped with its data)")
    lock_timeout_s = raw.get("lock_timeout_s", 600)
    if not isinstance(lock_timeout_s, int) or isinstance(lock_timeout_s, bool) or lock_timeout_s < 0:
        raise ConfigError(f"{where}.lock_timeout_s: {lock_timeout_s!r} must be a whole number of seconds >= 0 (how "
                          "long a run waits for another run of the source; 0: fail at once)")
    numeric = _parse_numeric(raw.get("numeric"), f"{where}.numeric",
                             None if tables is None else tables + tuple(insert_only))
    origin = raw.get("origin", "any")
    if origin not in ("any", "none"):
        raise ConfigError(f"{where}.origin: {origin!r} must be any (every change) or none (skip changes applied by "
                          "other logical replication, PostgreSQL 16+)")
    schema_changes = _parse_schema_changes(raw.get("schema_changes"), f"{where}.schema_changes")
    return SourceConfig(name=name, dsn=dsn, conn_id=conn_id, slot=slot, publication=publication, tables=tables,
                        schedule=schedule, optimize_schedule=optimize_schedule, delete_mode=delete_mode,
                        history=history, history_tables=history_tables,
                        start_date=start_date,
                        on_bad_value=on_bad_value, on_drop_column=on_drop_column, schemas=schemas,
                        insert_only=tuple(insert_only), lock_timeout_s=lock_timeout_s, numeric=numeric,
                        origin=origin, schema_changes=schema_changes, deletion_vectors=deletion_vectors,
                        deletion_vectors_tables=dv_tables)


def _flag_or_tables(value: Any, where: str, synced: tuple[str, ...] | None) -> tuple[bool, tuple[str, ...] | None]:
    """A per-source switch that is true, false or a list of the source's tables: (on, tables or None for all)."""
    if isinstance(value, list):  # per table: only these
        listed = tuple(_parse_table(t, where) for t in value)
        unknown = [t for t in listed if synced is not None and t not in synced]
        if unknown:
            raise ConfigError(f"{where}: {', '.join(unknown)} is not one of the source's tables "
                              f"({', '.join(synced or ())})")
        return bool(listed), listed
    if not isinstance(value, bool):
        raise ConfigError(f"{where}: must be true or false, or a list of the source's tables like [public.orders]")
    return value, None


def _parse_schema_changes(raw: Any, where: str) -> SchemaChanges:
    """`schema_changes: {widen: rewrite | type_widening, rename: rewrite | column_mapping}` (defaults: rewrite)."""
    if raw is None:
        return SchemaChanges()
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: must be a mapping, e.g. {{widen: rewrite, rename: rewrite}}")
    _unknown(set(raw), set(_SCHEMA_CHANGES_MODES), where)
    for key, allowed in _SCHEMA_CHANGES_MODES.items():
        if raw.get(key, "rewrite") not in allowed:
            raise ConfigError(f"{where}.{key}: {raw[key]!r} must be rewrite (gold is rewritten in a new Delta version, "
                              f"readable by every Delta reader) or {allowed[1]} (in place with the Delta table "
                              "feature; delta-rs cannot read such tables correctly)")
    return SchemaChanges(**{k: raw[k] for k in _SCHEMA_CHANGES_MODES if k in raw})


def _parse_storage(raw: Any, lake: str) -> StorageSettings | None:
    """`storage: {endpoint, region, path_style}` for an s3a lake; refused for any other lake, and any key that
    would hold a credential is refused (credentials come from the environment only)."""
    if raw is None:
        return StorageSettings() if is_s3(lake) else None
    if not is_s3(lake):
        raise ConfigError(f"storage: only for a lake on S3 (lake: s3a://bucket/prefix), but lake is {lake}; "
                          "remove storage: or set lake to an s3a:// URI")
    if not isinstance(raw, Mapping):
        raise ConfigError("storage: must be a mapping, e.g. {endpoint: http://127.0.0.1:9000, region: us-east-1, "
                          "path_style: true}")
    for k in raw:
        if any(w in str(k).lower() for w in _SECRET_WORDS):
            raise ConfigError(f"storage.{k}: credentials are never read from the config; remove it and set "
                              f"{ACCESS_KEY_ENV} / {SECRET_KEY_ENV} in the environment")
    _unknown(set(map(str, raw)), _STORAGE_KEYS, "storage")
    endpoint = raw.get("endpoint")
    if endpoint is not None:
        endpoint = expand_env(str(endpoint).strip(), "storage.endpoint")
        if not re.fullmatch(r"https?://[^\s/]+(:\d+)?/?", endpoint):
            raise ConfigError(f"storage.endpoint: {endpoint!r} must be http(s)://host[:port] of an S3-compatible "
                              "store, or left out for AWS S3")
        endpoint = endpoint.rstrip("/")
    region = raw.get("region")
    if region is not None and (not isinstance(region, str) or not re.fullmatch(r"[a-z0-9-]{1,40}", region)):
        raise ConfigError(f"storage.region: {region!r} must be a region name such as us-east-1")
    path_style = raw.get("path_style", False)
    if not isinstance(path_style, bool):
        raise ConfigError(f"storage.path_style: {path_style!r} must be true (http://host/bucket/key, most "
                          "S3-compatible stores) or false (virtual-hosted buckets, AWS S3)")
    return StorageSettings(endpoint=endpoint or None, region=region, path_style=path_style)


def parse_config(raw: Any, *, base_dir: str | None = None, path: str | None = None) -> Config:
    """Validate a parsed YAML document. Relative lake paths are taken from `base_dir` (the config's folder)."""
    if not isinstance(raw, Mapping):
        raise ConfigError("config: the top level must be a mapping with keys lake, spark, sources")
    _unknown(set(raw), _TOP_KEYS, "config")
    lake = raw.get("lake")
    if not isinstance(lake, str) or not lake.strip():
        raise ConfigError("lake: required, a local path or s3a://bucket/prefix")
    lake = expand_env(lake.strip(), "lake")
    if "://" not in lake:
        base = Path(base_dir) if base_dir else Path.cwd()
        lake = str((base / lake).resolve())
    elif not (is_s3(lake) or lake.startswith("file://")):
        raise ConfigError(f"lake: {lake!r}: a local path or s3a://bucket/prefix (for S3 and S3-compatible stores "
                          "use the s3a:// scheme)")
    elif is_s3(lake) and not re.fullmatch(r"s3a://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/[^\s]*)?", lake):
        raise ConfigError(f"lake: {lake!r} is not s3a://bucket/prefix (a bucket name: lower-case letters, digits, "
                          "dots and hyphens, 3-63)")
    storage = _parse_storage(raw.get("storage"), lake)
    spark_raw = raw.get("spark") or {}
    if not isinstance(spark_raw, Mapping):
        raise ConfigError("spark: must be a mapping, e.g. {master: \"local[*]\", conf: {}}")
    _unknown(set(spark_raw), _SPARK_KEYS, "spark")
    conf = spark_raw.get("conf") or {}
    if not isinstance(conf, Mapping):
        raise ConfigError("spark.conf: must be a mapping of Spark settings")
    master = spark_raw.get("master", "local[*]")
    if not isinstance(master, str) or not master:
        raise ConfigError("spark.master: must be a Spark master URL such as local[*] or spark://host:7077")
    server = spark_raw.get("server")
    if server is not None:
        server, where, undo = expand_env(str(server).strip(), "spark.server"), "spark.server", "remove"
    else:  # the deployment-wide default, when the config names none
        server, where, undo = os.environ.get(SPARK_SERVER_ENV, "").strip() or None, SPARK_SERVER_ENV, "unset"
    if server is not None and server.lower() == AUTO_SERVER:
        server = AUTO_SERVER
    elif server is not None and host_port(server) is None:
        raise ConfigError(f"{where}: {server!r} is not host:port or auto; set it to the address `slotlake "
                          f"spark-server` listens on (e.g. 127.0.0.1:7079), to auto (slotlake starts one and "
                          f"reuses it), or {undo} it to use spark-submit")
    idle = spark_raw.get("server_idle_minutes", SparkSettings.server_idle_minutes)
    if isinstance(idle, bool) or not isinstance(idle, int | float) or not 0 < idle <= 7 * 24 * 60:
        raise ConfigError(f"spark.server_idle_minutes: {idle!r} is not a number of minutes in (0, 10080]; it is "
                          "how long a server started by `spark.server: auto` waits for the next app (default 120)")
    in_process = spark_raw.get("in_process_bytes", SparkSettings.in_process_bytes)
    if isinstance(in_process, bool) or not isinstance(in_process, int) or in_process < 0:
        raise ConfigError(f"spark.in_process_bytes: {in_process!r} is not a number of bytes >= 0; it is the largest "
                          "slice (bronze bytes) a sync decodes and merges without Spark (default 33554432, 0: never)")
    spark = SparkSettings(master=master, conf={str(k): str(v) for k, v in conf.items()},
                          conn_id=spark_raw.get("conn_id"), spark_submit=spark_raw.get("spark_submit"),
                          server=server or None, server_idle_minutes=float(idle), in_process_bytes=in_process)
    ex_raw = raw.get("extract") or {}
    if not isinstance(ex_raw, Mapping):
        raise ConfigError("extract: must be a mapping")
    _unknown(set(ex_raw), _EXTRACT_KEYS, "extract")
    extract = ExtractSettings(**{k: _positive_int(v, f"extract.{k}") for k, v in ex_raw.items()})
    snap_raw = raw.get("snapshot") or {}
    if not isinstance(snap_raw, Mapping):
        raise ConfigError("snapshot: must be a mapping (workers, part_pages)")
    _unknown(set(snap_raw), _SNAPSHOT_KEYS, "snapshot")
    snapshot = SnapshotSettings(**{k: _positive_int(v, f"snapshot.{k}") for k, v in snap_raw.items()})
    sources_raw = raw.get("sources")
    if not isinstance(sources_raw, Mapping) or not sources_raw:
        raise ConfigError("sources: required, a mapping of source name to its settings (dsn, tables, ...)")
    sources = {str(n): _parse_source(str(n), s) for n, s in sources_raw.items()}
    slots = [s.slot for s in sources.values()]
    if len(set(slots)) != len(slots):
        raise ConfigError("sources: two sources use the same slot; each source needs its own slot")
    if storage is not None:
        configure(storage)  # this process's s3a paths use these settings (slotlake.storage.configure says why)
    return Config(lake=lake, spark=spark, extract=extract, sources=sources, path=path, snapshot=snapshot,
                  storage=storage)


def load_config(path: str | None = None) -> Config:
    """Load from `path`, else $SLOTLAKE_CONFIG. Errors name the file and the key."""
    path = path or os.environ.get(ENV_VAR)
    if not path:
        raise ConfigError(f"no config: pass --config FILE or set {ENV_VAR}")
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file {path} does not exist")
    try:
        raw = yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    try:
        return parse_config(raw, base_dir=str(p.resolve().parent), path=str(p.resolve()))
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None
