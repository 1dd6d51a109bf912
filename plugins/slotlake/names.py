"""Table names: `TableName`, parsed and printed with PostgreSQL's identifier rules.

Config entries, `--table` arguments and messages write a table as PostgreSQL does:

    public.orders                 -> ("public", "orders")
    Public.Orders                 -> ("public", "orders")        unquoted: folded to lower case
    "Sales Dept"."Order Items"    -> ("Sales Dept", "Order Items")  quoted: kept as written
    "a.b"."say ""hi"" now"        -> ("a.b", 'say "hi" now')     "" is a quote inside a quoted name

`str(TableName)` is the canonical form: a part is written bare when it reads back the same (lower-case letters,
digits, `_`, `$`, not starting with a digit or `$`), else in double quotes. So `parse(str(t)) == t`, and plain
names print as they always did (`public.orders`). SQL never uses that text: it quotes every part
(`source.connection.table_ident` for psycopg, `spark_ident` for Spark SQL).

A TableName is a NamedTuple: it unpacks and compares like the `(schema, table)` pairs read from silver, `_runs`
and the lake layout.
"""
from __future__ import annotations

import re
from typing import NamedTuple

from slotlake.errors import ConfigError

MAX_IDENTIFIER_BYTES = 63  # NAMEDATALEN - 1: PostgreSQL truncates longer names
_BARE = re.compile(r"[a-z_][a-z0-9_$]*")
# PostgreSQL's unquoted identifier: a letter (any non-ASCII character counts as one) or _, then also digits and $.
_UNQUOTED = re.compile(r"[A-Za-z_\x80-\U0010FFFF][A-Za-z0-9_$\x80-\U0010FFFF]*")


class TableName(NamedTuple):
    """A table's schema and name exactly as pg_namespace.nspname and pg_class.relname hold them."""

    schema: str
    name: str

    @classmethod
    def parse(cls, text: str) -> TableName:
        """`schema.table` with PostgreSQL's rules (see the module). Raises ConfigError saying how to write it."""
        if not isinstance(text, str):
            raise ConfigError(f"{text!r} must be written schema.table, e.g. public.orders")
        parts = _identifiers(text)
        if len(parts) != 2:
            raise ConfigError(f"{text!r} must be written schema.table, e.g. public.orders or "
                              '"Sales Dept"."Order Items" (double quotes keep case, spaces and dots)')
        return cls(parts[0], parts[1])

    @classmethod
    def parse_list(cls, text: str) -> tuple[TableName, ...]:
        """Comma-separated names (`public.a, "x,y".b`); commas inside double quotes belong to the name."""
        items, start, quoted = [], 0, False
        for i, ch in enumerate(text):
            if ch == '"':
                quoted = not quoted  # "" inside a quoted name toggles twice: no net change
            elif ch == "," and not quoted:
                items.append(text[start:i])
                start = i + 1
        items.append(text[start:])
        return tuple(cls.parse(item) for item in items if item.strip())

    def __str__(self) -> str:
        return f"{quote(self.schema)}.{quote(self.name)}"


def quote(identifier: str) -> str:
    """One identifier in canonical form: bare when it reads back unchanged, else double-quoted."""
    if _BARE.fullmatch(identifier):
        return identifier
    return '"' + identifier.replace('"', '""') + '"'


def spark_ident(name: str) -> str:
    """A column (or table) name quoted for Spark SQL and Spark column expressions: backticks, ` doubled."""
    return "`" + name.replace("`", "``") + "`"


def _identifiers(text: str) -> list[str]:
    """The dot-separated identifiers of `text` (whitespace around them allowed, as in SQL)."""
    out: list[str] = []
    i, n = 0, len(text)
    while True:
        while i < n and text[i].isspace():
            i += 1
        if i < n and text[i] == '"':
            j, chars = i + 1, []
            while True:
                k = text.find('"', j)
                if k < 0:
                    raise ConfigError(f"{text!r}: a double quote is not closed; write a quote inside a quoted name "
                                      'as two ("say ""hi"" now")')
                chars.append(text[j:k])
                if text[k + 1:k + 2] == '"':
                    chars.append('"')
                    j = k + 2
                    continue
                break
            ident = "".join(chars)
            if not ident:
                raise ConfigError(f'{text!r}: "" is an empty name; PostgreSQL names have at least one character')
            i = k + 1
        else:
            m = _UNQUOTED.match(text, i)
            if m is None:
                bad = text[i] if i < n else "the end"
                raise ConfigError(f"{text!r} must be written schema.table (found {bad!r} where a name should start); "
                                  'write names with spaces, dots or other characters in double quotes: '
                                  '"Sales Dept"."Order Items"')
            ident = _fold(m.group())
            i = m.end()
        if len(ident.encode("utf-8")) > MAX_IDENTIFIER_BYTES:
            raise ConfigError(f"{text!r}: name {ident[:20]!r}... is longer than {MAX_IDENTIFIER_BYTES} bytes, and "
                              "PostgreSQL truncates longer names; write it as the catalog holds it")
        out.append(ident)
        while i < n and text[i].isspace():
            i += 1
        if i == n:
            return out
        if text[i] != ".":
            raise ConfigError(f"{text!r}: unexpected {text[i]!r} after {quote(ident)}; write names with spaces or "
                              'other characters in double quotes: "Sales Dept"."Order Items"')
        i += 1


def _fold(identifier: str) -> str:
    """PostgreSQL's downcase_identifier for UTF-8 databases: ASCII letters only."""
    return identifier.translate(_ASCII_LOWER)


_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
