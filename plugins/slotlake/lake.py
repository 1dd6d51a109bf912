"""Where things live under `<lake>/<source>/` (DESIGN.md "Lake layout").

A table's folder is `gold/<schema>/<table>`, each name one path segment. Names may hold any character
(PostgreSQL allows `/`, `%`, spaces, quotes, non-ASCII in quoted names), so each segment is encoded reversibly:
ASCII letters, digits, `_`, `$` and `-` stay as they are, every other character becomes `!XX` per UTF-8 byte
(upper-case hex), and a name that is exactly `_delta_log` gets its `_` encoded (a folder of that name would make
its parent look like a Delta table). Plain names keep the path they always had (`gold/public/orders`);
`"Sales Dept"."Order Items"` lives in `gold/Sales!20Dept/Order!20Items`. Not `%XX`: delta-rs (deltalake 1.6,
behind Polars and DuckDB) percent-decodes table paths once too often and cannot open a table under `a%20b`; `!` means
nothing to Hadoop paths and globs, URIs, S3 keys or delta-rs.
Dots are encoded too, so `<schema>.<table>` (the initial copies' folders) is unambiguous, and no segment is
hidden (`.x`) or climbs (`..`). The encoding never touches case: on a case-insensitive file system (macOS,
Windows) two tables whose names differ only in case would share a folder.

A gold table's name outside the lake (its Airflow Asset, `slotlake.airflow.assets`) is `gold_asset_uri`:
`slotlake://<source>/<schema>/<table>`, the names percent-encoded as URI path segments.
"""
from __future__ import annotations

import re
import time
import urllib.parse
import uuid
from dataclasses import dataclass

_SAFE = re.compile(r"[A-Za-z0-9_$-]")
_SEGMENT = re.compile(r"(?:[A-Za-z0-9_$-]|![0-9A-F]{2})+")
ESCAPE = "!"
_DELTA_LOG = "_delta_log"


def path_segment(name: str) -> str:
    """The folder name of one schema or table name (see the module). Reversed by `name_of_segment`."""
    if not name:
        raise ValueError("an empty name has no folder")
    out = "".join(ch if _SAFE.fullmatch(ch) else "".join(f"{ESCAPE}{b:02X}" for b in ch.encode("utf-8")) for ch in name)
    return f"{ESCAPE}5F" + out[1:] if name == _DELTA_LOG else out


def name_of_segment(segment: str) -> str | None:
    """The name whose folder is `segment`, or None when slotlake would not have written that folder."""
    if not _SEGMENT.fullmatch(segment):
        return None
    data = bytearray()
    i = 0
    while i < len(segment):
        if segment[i] == ESCAPE:
            data.append(int(segment[i + 1:i + 3], 16))
            i += 3
        else:
            data += segment[i].encode("ascii")
            i += 1
    try:
        name = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return name if path_segment(name) == segment else None


def table_dir(base: str, schema: str, table: str) -> str:
    """`<base>/<schema>/<table>` with both names encoded: gold tables, replay `--dest` and scratch tables."""
    return f"{base.rstrip('/')}/{path_segment(schema)}/{path_segment(table)}"


def gold_asset_uri(source: str, schema: str, table: str) -> str:
    """`slotlake://<source>/<schema>/<table>`: the URI of a gold table as an Airflow Asset (and anywhere a gold table
    is named by URI). Schema and table are the names as PostgreSQL holds them, case kept, each percent-encoded as one
    path segment (UTF-8; everything but ASCII letters, digits and `_.-~`, and a name of only dots), so
    `public.orders` is `slotlake://shop/public/orders` and `"Sales Dept"."Order/Items"` is
    `slotlake://shop/Sales%20Dept/Order%2FItems`. The result is already in the form Airflow stores (lower-case
    scheme, no trailing slash, query or fragment), so `Asset(uri).uri == uri` and an Asset's name and URI agree."""
    def segment(name: str) -> str:
        if not name:
            raise ValueError("an empty name has no URI segment")
        quoted = urllib.parse.quote(name, safe="")
        return quoted.replace(".", "%2E") if not name.strip(".") else quoted  # "." and ".." are not path steps
    return f"slotlake://{source}/{segment(schema)}/{segment(table)}"


@dataclass(frozen=True)
class LakePaths:
    """Paths of one source's lake. `root` is `<lake>/<source>` (a local path or a URI)."""

    root: str

    @classmethod
    def of(cls, lake: str, source: str) -> LakePaths:
        return cls(f"{lake.rstrip('/')}/{source}")

    @property
    def bronze(self) -> str:
        return f"{self.root}/bronze"

    @property
    def snapshots(self) -> str:
        """`bronze/snapshot`: the initial copies (source/snapshot.py)."""
        return f"{self.bronze}/snapshot"

    @property
    def catalog(self) -> str:
        return f"{self.root}/_catalog"

    @property
    def changes(self) -> str:
        return f"{self.root}/silver/changes"

    @property
    def ddl_log(self) -> str:
        return f"{self.root}/_ddl_log"

    @property
    def quarantine(self) -> str:
        return f"{self.root}/_quarantine"

    @property
    def runs(self) -> str:
        """Delta table: one row per (run, gold table) with the end LSN and the table's Delta version."""
        return f"{self.root}/_runs"

    @property
    def gold_root(self) -> str:
        return f"{self.root}/gold"

    def gold(self, schema: str, table: str) -> str:
        """`gold/<schema>/<table>`, the names encoded by `path_segment` (plain names as they are)."""
        return table_dir(self.gold_root, schema, table)

    def gold_history(self, schema: str, table: str) -> str:
        """`gold_history/<schema>/<table>`: the SCD2 history of a gold table (source setting `history`)."""
        return table_dir(f"{self.root}/gold_history", schema, table)

    def scratch(self, kind: str) -> str:
        """A new folder `_<kind>/<local time>-<random>` for one run's scratch tables (`replay`, `recover`, `undo`)."""
        return f"{self.root}/_{kind}/{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}"
