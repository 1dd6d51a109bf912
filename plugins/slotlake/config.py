"""The YAML config (see DESIGN.md "Config"), validated before anything touches a database.

    lake: ./lake
    spark: {master: "local[*]", conf: {}}
    sources:
      shop:
        dsn: postgresql://user@127.0.0.1:5432/shop    # or conn_id: <Airflow connection id>; ${ENV} expands
        slot: slotlake_shop
        publication: slotlake_shop
        tables: [public.orders]
        schedule: "0 * * * *"
        delete_mode: hard
        history: false
"""
from __future__ import annotations

import difflib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import yaml

from slotlake.errors import ConfigError

ENV_VAR = "SLOTLAKE_CONFIG"
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,40}$")
_IDENT = re.compile(r'^[A-Za-z_][A-Za-z0-9_$]*$')
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


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
    tables: tuple[str, ...] | None  # None: every table in the publication
    schedule: str
    delete_mode: str  # hard | soft
    history: bool
    start_date: str
    on_bad_value: str  # quarantine | fail
    on_drop_column: str = "keep"  # keep | drop: what gold does with a column dropped in the source
    schema_changes: SchemaChanges = SchemaChanges()

    def lake_path(self, lake: str) -> str:
        return f"{lake.rstrip('/')}/{self.name}"


@dataclass(frozen=True)
class Config:
    lake: str
    spark: SparkSettings
    extract: ExtractSettings
    sources: Mapping[str, SourceConfig]
    path: str | None = None
    snapshot: SnapshotSettings = SnapshotSettings()

    def source(self, name: str) -> SourceConfig:
        try:
            return self.sources[name]
        except KeyError:
            known = ", ".join(sorted(self.sources)) or "(none)"
            raise ConfigError(f"unknown source {name!r}: the config defines {known}") from None


_TOP_KEYS = {"lake", "spark", "sources", "extract", "snapshot"}
_SPARK_KEYS = {"master", "conf", "conn_id", "spark_submit"}
_EXTRACT_KEYS = {"upto_nchanges", "batch_rows", "max_calls", "warn_retained_wal_mb"}
_SNAPSHOT_KEYS = {"workers", "part_pages"}
_SOURCE_KEYS = {"dsn", "conn_id", "slot", "publication", "tables", "schedule", "delete_mode", "history",
                "start_date", "on_bad_value", "on_drop_column", "schema_changes"}
_SCHEMA_CHANGES_MODES = {"widen": ("rewrite", "type_widening"), "rename": ("rewrite", "column_mapping")}


def _unknown(keys: set[str], allowed: set[str], where: str) -> None:
    for k in sorted(keys - allowed):
        close = difflib.get_close_matches(k, allowed, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else f"; allowed keys: {', '.join(sorted(allowed))}"
        raise ConfigError(f"{where}.{k}: unknown key{hint}")


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
    if not isinstance(name, str) or "." not in name:
        raise ConfigError(f"{where}: {name!r} must be written schema.table, e.g. public.orders")
    schema, _, table = name.partition(".")
    for part in (schema, table):
        if not _IDENT.match(part):
            raise ConfigError(f"{where}: {name!r}: {part!r} is not a plain identifier (quoted names are not supported)")
    return name


def _parse_source(name: str, raw: Any) -> SourceConfig:
    where = f"sources.{name}"
    if not _NAME.match(name):
        raise ConfigError(f"{where}: source names are letters, digits and _ (at most 41), starting with a letter")
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: must be a mapping with at least dsn or conn_id")
    _unknown(set(raw), _SOURCE_KEYS, where)
    dsn, conn_id = raw.get("dsn"), raw.get("conn_id")
    if bool(dsn) == bool(conn_id):
        raise ConfigError(f"{where}: set exactly one of dsn (postgresql://user@host:port/db) or conn_id (Airflow connection)")
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
            raise ConfigError(f"{where}.tables: must be a non-empty list like [public.orders], or left out for every table in the publication")
        tables = tuple(_parse_table(t, f"{where}.tables") for t in tables)
        if len(set(tables)) != len(tables):
            raise ConfigError(f"{where}.tables: lists a table twice")
    schedule = raw.get("schedule", "0 * * * *")
    if not isinstance(schedule, str) or len(schedule.split()) != 5:
        raise ConfigError(f"{where}.schedule: {schedule!r} must be a 5-field cron expression, e.g. \"0 * * * *\"")
    delete_mode = raw.get("delete_mode", "hard")
    if delete_mode not in ("hard", "soft"):
        raise ConfigError(f"{where}.delete_mode: {delete_mode!r} must be hard or soft")
    history = raw.get("history", False)
    if not isinstance(history, bool):
        raise ConfigError(f"{where}.history: must be true or false")
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
    schema_changes = _parse_schema_changes(raw.get("schema_changes"), f"{where}.schema_changes")
    return SourceConfig(name=name, dsn=dsn, conn_id=conn_id, slot=slot, publication=publication, tables=tables,
                        schedule=schedule, delete_mode=delete_mode, history=history, start_date=start_date,
                        on_bad_value=on_bad_value, on_drop_column=on_drop_column, schema_changes=schema_changes)


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
    spark = SparkSettings(master=master, conf={str(k): str(v) for k, v in conf.items()},
                          conn_id=spark_raw.get("conn_id"), spark_submit=spark_raw.get("spark_submit"))
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
    return Config(lake=lake, spark=spark, extract=extract, sources=sources, path=path, snapshot=snapshot)


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
