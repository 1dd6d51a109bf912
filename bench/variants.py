"""Benchmarks that run the same changes through two sources of one database, one with the in-process path (the
default) and one with the Spark apps only (`spark.in_process_bytes: 0`): each source's config."""
from __future__ import annotations

import json
from pathlib import Path

VARIANTS = {"here": None, "spark": 0}  # source -> spark.in_process_bytes (None: the default)


def write_config(tmp: Path, dsn: str, source: str, tables: list[str], in_process_bytes: int | None,
                 lake: str | None = None, storage: dict | None = None, server: str | None = None) -> Path:
    """`tmp/<source>.yaml`: the source with its own slot, publication and lake (`lake`, default `tmp/<source>/lake`;
    `storage`: the config's `storage:` of an s3a lake), Spark local (`server`: its `spark.server`)."""
    spark: dict = {"master": "local[2]"}
    if in_process_bytes is not None:
        spark["in_process_bytes"] = in_process_bytes
    if server is not None:
        spark["server"] = server
    doc: dict = {"lake": lake or str(tmp / source / "lake"), "spark": spark,
                 "sources": {source: {"dsn": dsn, "tables": tables, "slot": f"slotlake_{source}",
                                      "publication": f"slotlake_{source}"}}}
    if storage is not None:
        doc["storage"] = storage
    cfg = tmp / f"{source}.yaml"
    cfg.write_text(json.dumps(doc))
    return cfg
