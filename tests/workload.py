"""A workload that touches every type and every merge case of the sync path, in phases.

Each phase is SQL run in its own transactions; tests sync between phases and compare gold with PostgreSQL.
Tables (all in schema public):
  customers     PK (DEFAULT identity), plain columns; key changes; delete + re-insert in one batch
  orders        PK, big TOASTed `note` updated around (unchanged TOAST), enum status, numeric(12,2)
  all_types     PK, one column of every mapped type, incl. NaN/Infinity floats, arrays, json, inet...
  events_full   no key, REPLICA IDENTITY FULL, identical duplicate rows, NULLs in the row
  by_index      REPLICA IDENTITY USING INDEX on a unique (a, b) index, no PK
  audit_log     REPLICA IDENTITY NOTHING: insert-only
  scratch       PK, truncated mid-stream, then written again
"""
from __future__ import annotations

TABLES = ["public.customers", "public.orders", "public.all_types", "public.events_full", "public.by_index",
          "public.audit_log", "public.scratch"]

SCHEMA = """
CREATE TYPE order_status AS ENUM ('new', 'paid', 'shipped', 'cancelled');
CREATE TABLE customers (id int PRIMARY KEY, name text NOT NULL, email varchar(100), vip boolean DEFAULT false);
CREATE TABLE orders (id bigint PRIMARY KEY, customer_id int, amount numeric(12,2), status order_status,
                     note text, created timestamptz);
ALTER TABLE orders ALTER COLUMN note SET STORAGE EXTERNAL;  -- force out-of-line TOAST, uncompressed
CREATE TABLE all_types (
  id int PRIMARY KEY,
  c_bool boolean, c_int2 smallint, c_int4 integer, c_int8 bigint,
  c_float4 real, c_float8 double precision,
  c_num numeric, c_num_ps numeric(10,3), c_text text, c_varchar varchar(20), c_char char(5),
  c_bytea bytea, c_date date, c_time time, c_timetz timetz, c_ts timestamp, c_tstz timestamptz,
  c_interval interval, c_uuid uuid, c_json json, c_jsonb jsonb,
  c_int_arr integer[], c_text_arr text[], c_enum order_status, c_inet inet, c_cidr cidr, c_macaddr macaddr
);
CREATE TABLE events_full (kind text, qty int, at date);
ALTER TABLE events_full REPLICA IDENTITY FULL;
CREATE TABLE by_index (a int NOT NULL, b text NOT NULL, v text);
CREATE UNIQUE INDEX by_index_ab ON by_index (a, b);
ALTER TABLE by_index REPLICA IDENTITY USING INDEX by_index_ab;
CREATE TABLE audit_log (at timestamptz DEFAULT now(), msg text);
ALTER TABLE audit_log REPLICA IDENTITY NOTHING;
CREATE TABLE scratch (id int PRIMARY KEY, v text);
"""

BIG = "repeat(md5(random()::text), 400)"  # ~12.8 KB: stored out of line (TOAST)

PHASES: list[list[str]] = [
    # phase 0: initial inserts
    [
        "INSERT INTO customers SELECT g, 'customer ' || g, 'c' || g || '@example.com', g % 3 = 0 "
        "FROM generate_series(1, 40) g",
        f"INSERT INTO orders SELECT g, 1 + g % 40, (g * 12.34)::numeric(12,2), 'new', {BIG}, "
        "'2024-03-01 09:14:00+00'::timestamptz + g * interval '1 minute' FROM generate_series(1, 30) g",
        """INSERT INTO all_types VALUES
          (1, true, 32767, 2147483647, 9223372036854775807, 1.5, 2.25,
           123456789012345.123456789012345678, 1234567.891, 'hello ''world''', 'varchar', 'ab',
           '\\x00ff10', '2024-02-29', '23:59:59.999999', '10:00:00+05:30', '2024-01-01 00:00:00.000001',
           '2024-06-30 12:34:56.789+02', '1 year 2 mons 3 days 04:05:06.7', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11',
           '{"a": [1, 2, {"b": null}]}', '{"z": 1, "a": "x"}', '{1,NULL,3}', '{"a b","c,d","e\\"f",NULL}',
           'paid', '192.168.1.10/24', '10.0.0.0/8', '08:00:2b:01:02:03'),
          (2, false, -32768, -2147483648, -9223372036854775808, 'NaN', 'Infinity',
           -0.000000000000000001, -9999999.999, '', '', '', '\\x', '0001-01-01', '00:00:00', '00:00:00+00',
           '1970-01-01 00:00:00', '1999-12-31 23:59:59.5+00', '-1 days -00:00:01',
           '00000000-0000-0000-0000-000000000000',
           '[]', '{}', '{}', '{}', 'new', '::1', '::/0', 'ff:ff:ff:ff:ff:ff'),
          (3, NULL, NULL, NULL, NULL, '-Infinity', 'NaN', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
           NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)""",
        "INSERT INTO events_full VALUES ('click', 1, '2024-01-01'), ('click', 1, '2024-01-01'), "
        "('click', 1, '2024-01-01'), ('view', NULL, NULL), ('view', NULL, NULL), ('buy', 5, '2024-01-02')",
        "INSERT INTO by_index SELECT g % 5, 'k' || g, 'v' || g FROM generate_series(1, 20) g",
        "INSERT INTO audit_log (msg) SELECT 'event ' || g FROM generate_series(1, 10) g",
        "INSERT INTO scratch SELECT g, 'before truncate ' || g FROM generate_series(1, 10) g",
    ],
    # phase 1: updates, deletes, key changes, toast, duplicates, truncate
    [
        # unchanged TOAST: note is not touched (=> 'u' in pgoutput), several times in one batch
        "UPDATE orders SET status = 'paid' WHERE id <= 10",
        "UPDATE orders SET amount = amount + 1 WHERE id <= 5",
        "UPDATE orders SET status = 'shipped' WHERE id <= 3",
        # key change carrying an unchanged TOAST value to the new key
        "UPDATE orders SET id = id + 1000 WHERE id IN (4, 5)",
        "UPDATE orders SET status = 'cancelled' WHERE id = 1004",
        # a TOAST value that does change
        f"UPDATE orders SET note = {BIG} WHERE id = 6",
        "DELETE FROM orders WHERE id IN (7, 8)",
        # customers: key change, many updates of one row, delete + re-insert in one batch, NULLs
        "UPDATE customers SET id = 100 WHERE id = 1",
        "UPDATE customers SET name = 'renamed once' WHERE id = 2",
        "UPDATE customers SET name = 'renamed twice' WHERE id = 2",
        "UPDATE customers SET email = NULL WHERE id = 2",
        "UPDATE customers SET vip = NOT vip WHERE id = 2",
        "UPDATE customers SET name = 'renamed five times' WHERE id = 2",
        "DELETE FROM customers WHERE id = 3",
        "INSERT INTO customers VALUES (3, 'reinserted', 'again@example.com', true)",
        "DELETE FROM customers WHERE id BETWEEN 30 AND 35",
        # swap two keys through a temporary key
        "UPDATE customers SET id = -10 WHERE id = 10",
        "UPDATE customers SET id = 10 WHERE id = 11",
        "UPDATE customers SET id = 11 WHERE id = -10",
        # all_types: change values, NaN stays
        "UPDATE all_types SET c_float8 = '-Infinity', c_text = 'changed', c_int_arr = '{4,5}' WHERE id = 1",
        "UPDATE all_types SET c_num = 1e-18, c_jsonb = '{\"k\": [true, false]}' WHERE id = 2",
        # FULL identity: delete ONE of three identical rows, update one of two identical NULL rows
        "DELETE FROM events_full WHERE ctid = (SELECT min(ctid) FROM events_full WHERE kind = 'click')",
        "UPDATE events_full SET qty = 7 WHERE ctid = (SELECT min(ctid) FROM events_full WHERE kind = 'view')",
        "INSERT INTO events_full VALUES ('buy', 5, '2024-01-02')",
        # USING INDEX: update values, change the key
        "UPDATE by_index SET v = 'updated' WHERE a = 1",
        "UPDATE by_index SET b = b || '-moved' WHERE a = 2",
        "DELETE FROM by_index WHERE a = 3",
        "INSERT INTO audit_log (msg) VALUES ('after updates')",
        # truncate in the middle of the batch: rows written before are gone, after stay
        "INSERT INTO scratch VALUES (11, 'also before truncate')",
        "TRUNCATE scratch",
        "INSERT INTO scratch VALUES (1, 'after truncate'), (2, 'after truncate')",
        "UPDATE scratch SET v = 'after truncate, updated' WHERE id = 2",
    ],
    # phase 2: more of the same across a batch boundary (TOAST from the gold table, not the batch)
    [
        "UPDATE orders SET customer_id = 99 WHERE id IN (1, 2, 1004, 1005)",
        "UPDATE customers SET id = 200 WHERE id = 100",
        "DELETE FROM events_full WHERE kind = 'click'",
        "INSERT INTO events_full VALUES ('view', NULL, NULL)",
        "UPDATE by_index SET v = NULL WHERE a = 4",
        "INSERT INTO all_types (id, c_text) VALUES (4, 'late row')",
        "DELETE FROM all_types WHERE id = 3",
        "INSERT INTO scratch VALUES (3, 'phase two')",
    ],
]


def create_schema(conn) -> None:
    with conn.cursor() as cur:
        cur.execute(SCHEMA)
    conn.commit()


def run_phase(conn, phase: int) -> None:
    """Each statement in its own transaction, so batches hold many transactions in commit order."""
    for stmt in PHASES[phase]:
        with conn.cursor() as cur:
            cur.execute(stmt)
        conn.commit()
