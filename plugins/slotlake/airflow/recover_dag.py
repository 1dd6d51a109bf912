"""`slotlake_recover__<source>`: point-in-time recovery from the Airflow UI (see slotlake.recover.point).

A manual DAG (no schedule): trigger it with the typed form (Params) and one task runs `slotlake recover` with them:

- tables: schema.table names, one per line (checked against the configured tables when the source lists them);
- as_of: an LSN (`16/B374D848`) or an ISO time (UTC unless it carries a zone): the last commit at or before it;
- target: `delta` (destination: a folder/URI; one Delta table per table at `<destination>/<schema>/<table>`) or
  `postgres` (destination: a postgresql:// URL; tables `<into_schema>.<table>`), `replace` to overwrite;
- mode: `restore` (the above) or `undo_sql` with `xid`: `slotlake undo --xid N --out <destination>` (the SQL that
  undoes one transaction, written to the file `destination`).

The result (resolved commit LSN and time, rows per table, where each was written; for undo_sql the transaction
and the script's path) is in the task log and is the
task's XCom (`return_value`). The task runs the recovery exactly as the CLI does (`recover_run.recover`: in the
task's own process where that is exact, else the recover Spark app).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow.sdk import DAG, Param, task

from slotlake.airflow.tasks import source_dag_kwargs, table_items
from slotlake.config import Config
from slotlake.errors import ConfigError
from slotlake.recover.point import AS_OF_PATTERN, DEFAULT_INTO_SCHEMA, is_postgres_url
from slotlake.recover.recover_run import recover


def recover_from_params(cfg: Config, source_name: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """Run the recovery the form asks for; returns the result as a JSON-able dict (the task's XCom).

    Raises ConfigError with the fix when the Params do not fit together."""
    mode = params.get("mode") or "restore"
    if mode == "undo_sql":
        return undo_from_params(cfg, source_name, params)
    if mode != "restore":
        raise ConfigError(f"mode {mode!r} must be restore or undo_sql")
    target = params.get("target") or "delta"
    destination = (params.get("destination") or "").strip()
    if target not in ("delta", "postgres"):
        raise ConfigError(f"target {target!r} must be delta or postgres")
    if (target == "postgres") != is_postgres_url(destination):
        raise ConfigError(f"target {target} needs a {'postgresql:// URL' if target == 'postgres' else 'folder or URI'}"
                          f" as destination; change target or destination")
    result = recover(cfg, source_name, str(params.get("as_of") or ""), list(params.get("tables") or []),
                     destination, (params.get("into_schema") or DEFAULT_INTO_SCHEMA) if target == "postgres" else None,
                     bool(params.get("replace")))  # logs the result's lines
    return result.as_dict()


def undo_from_params(cfg: Config, source_name: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """mode undo_sql: `slotlake undo SOURCE --xid N --out <destination>`; returns where the script is and what it
    undoes."""
    xid = params.get("xid")
    destination = (params.get("destination") or "").strip()
    if not xid:
        raise ConfigError("mode undo_sql needs xid: the transaction to undo (see `slotlake transactions`)")
    if not destination or is_postgres_url(destination):
        raise ConfigError("mode undo_sql writes the SQL to a file: give its path as destination")
    try:
        from slotlake.recover.undo import undo
    except ImportError:
        raise ConfigError("mode undo_sql is not available yet in this version (no `slotlake undo`); use mode "
                          "restore") from None
    result = undo(cfg, source_name, xid=int(xid), out=destination)
    ref = result.transaction
    return {"source": source_name, "mode": "undo_sql", "xid": ref.xid, "commit_lsn": str(ref.commit_lsn),
            "commit_ts": ref.commit_ts.isoformat(), "script": destination, "summary": result.summary(),
            "tables": [str(t.table) for t in result.tables]}


def build_recover_dag(cfg: Config, source_name: str) -> DAG:
    with DAG(**source_dag_kwargs(
        cfg, source_name, dag_id=f"slotlake_recover__{source_name}",
        description=f"Recover tables of source {source_name} as of an LSN or time, into Delta or PostgreSQL",
        extra_tags=["recover"],
        schedule=None,
        params={
            "tables": Param(type="array", items=table_items(cfg.source(source_name)), minItems=1, uniqueItems=True,
                            description="the tables to recover (schema.table), all at the same commit LSN"),
            "as_of": Param(type="string", pattern=AS_OF_PATTERN,
                           description="an LSN (16/B374D848) or ISO time (UTC unless zoned): the last commit at "
                                       "or before it"),
            "target": Param("delta", type="string", enum=["delta", "postgres"]),
            "destination": Param(type="string", minLength=1,
                                 description="delta: a folder/URI (<destination>/<schema>/<table>); postgres: a "
                                             "postgresql:// URL"),
            "into_schema": Param(DEFAULT_INTO_SCHEMA, type="string", minLength=1,
                                 description="postgres: the schema the tables are created in"),
            "replace": Param(False, type="boolean", description="overwrite target tables that exist"),
            "mode": Param("restore", type="string", enum=["restore", "undo_sql"]),
            "xid": Param(None, type=["null", "integer"], minimum=1,
                         description="undo_sql: the transaction id to undo"),
        },
        doc_md=__doc__,
    )) as dag:
        @task(task_id="recover")
        def run(params: dict[str, Any] | None = None) -> dict[str, Any]:
            return recover_from_params(cfg, source_name, params or {})

        run()
    return dag
