"""The slotlake demo (run by scripts/demo.sh after setup): a throw-away PostgreSQL with a small shop, two runs of
the sync DAG through `airflow dags test`, and what landed in the lake next to PostgreSQL's own counts.

Everything lives under .demo/ (config, lake, Airflow home); the PostgreSQL server is stopped and removed at the end
(pass --keep to leave it running and print its DSN).
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "plugins"))
sys.path.append(str(ROOT))  # slotlake_dev: test and demo support

import psycopg  # noqa: E402

from slotlake.config import load_config  # noqa: E402
from slotlake.lake import LakePaths  # noqa: E402
from slotlake_dev.airflow_local import dags_test, local_airflow_env, migrate  # noqa: E402
from slotlake_dev.localpg import LocalPostgres  # noqa: E402

TABLES = ["public.customers", "public.orders", "public.order_items", "public.products"]

SCHEMA = """
CREATE TABLE customers (id int PRIMARY KEY, name text NOT NULL, email text, balance numeric(12,2),
                        created_at timestamptz DEFAULT now());
CREATE TABLE orders (id bigint PRIMARY KEY, customer_id int, status text, total numeric(12,2),
                     notes text, placed_at timestamptz);
-- Big notes go out of line (TOAST): updates that leave them alone send them as "unchanged".
ALTER TABLE orders ALTER COLUMN notes SET STORAGE EXTERNAL;
CREATE TABLE order_items (order_id bigint, sku text, qty int, price numeric(10,2));  -- no key at all
ALTER TABLE order_items REPLICA IDENTITY FULL;
CREATE TABLE products (sku text NOT NULL, name text, price numeric(10,2), in_stock boolean);
CREATE UNIQUE INDEX products_sku ON products (sku);
ALTER TABLE products REPLICA IDENTITY USING INDEX products_sku;
"""

BIG = "repeat(md5(random()::text), 300)"  # ~9.6 KB of notes per order

ROUND_1 = [
    "INSERT INTO customers (id, name, email, balance) SELECT g, 'customer ' || g, 'c' || g || '@example.com', "
    "g * 10.5 FROM generate_series(1, 8) g",
    "INSERT INTO products VALUES ('SKU-1', 'kettle', 24.90, true), ('SKU-2', 'teapot', 31.00, true), "
    "('SKU-3', 'mug', 7.50, false), ('SKU-4', 'tray', 12.00, true)",
    f"INSERT INTO orders SELECT g, 1 + g % 8, 'new', g * 12.34, {BIG}, "
    "'2024-03-01 09:00:00+00'::timestamptz + g * interval '7 minutes' FROM generate_series(1, 12) g",
    "INSERT INTO order_items SELECT 1 + g % 12, 'SKU-' || (1 + g % 4), 1 + g % 3, 7.50 FROM generate_series(1, 30) g",
    "INSERT INTO order_items VALUES (1, 'SKU-9', 2, 1.00), (1, 'SKU-9', 2, 1.00)",  # two identical rows
]

ROUND_2 = [
    "UPDATE orders SET status = 'paid' WHERE id % 3 = 0",  # notes untouched: unchanged TOAST in the stream
    "UPDATE orders SET notes = 'short now', status = 'shipped' WHERE id = 4",
    "DELETE FROM orders WHERE id = 11",
    "UPDATE customers SET id = 100, name = 'customer 2 (renumbered)' WHERE id = 2",  # primary key change
    "DELETE FROM customers WHERE id = 7",
    "UPDATE customers SET balance = balance + 0.01 WHERE id IN (1, 3)",
    "UPDATE products SET sku = 'SKU-2B', price = 29.00 WHERE sku = 'SKU-2'",  # key change on the identity index
    "DELETE FROM products WHERE sku = 'SKU-3'",
    "DELETE FROM order_items WHERE ctid = (SELECT ctid FROM order_items WHERE sku = 'SKU-9' LIMIT 1)",
    "UPDATE order_items SET qty = qty + 10 WHERE order_id = 2",
    "TRUNCATE order_items",
    "INSERT INTO order_items VALUES (3, 'SKU-1', 1, 24.90), (3, 'SKU-4', 2, 12.00), (3, 'SKU-4', 2, 12.00)",
]


def step(msg: str) -> None:
    print(f"\n== {msg}", flush=True)


def run_sql(dsn: str, statements: list[str]) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for s in statements:
            conn.execute(s)


def sync_dag_run(env: dict[str, str], dag_id: str) -> None:
    t = time.time()
    out = dags_test(env, dag_id)
    for line in out.splitlines():
        if "sync shop:" in line:  # the report task's summary line
            summary = line[line.find("sync shop:"):]
            print("   ", summary.split(" [slotlake.pipeline]")[0].strip())  # without Airflow's log decoration
    print(f"   {dag_id}: success in {time.time() - t:.0f}s")


def show(cfg_path: Path, dsn: str) -> None:
    from slotlake.spark.session import get_spark

    cfg = load_config(str(cfg_path))
    paths = LakePaths.of(cfg.lake, "shop")
    spark = get_spark("slotlake-demo", "local[2]")
    try:
        with psycopg.connect(dsn) as conn:
            for table in TABLES:
                schema, name = table.split(".")
                pg_count = conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
                df = spark.read.format("delta").load(paths.gold(schema, name))
                cols = [c for c in df.columns if c != "notes"]
                print(f"\n{table}: PostgreSQL {pg_count} rows, gold {df.count()} rows")
                df.selectExpr(*cols, *(["length(notes) AS notes_len"] if "notes" in df.columns else [])) \
                    .orderBy(cols[0]).show(5, truncate=40)
    finally:
        spark.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--keep", action="store_true", help="leave PostgreSQL running at the end")
    args = ap.parse_args()
    work = ROOT / ".demo"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    step("starting a throw-away PostgreSQL (wal_level=logical)")
    pg = LocalPostgres().start()
    try:
        pg.psql("CREATE DATABASE shop")
        dsn = pg.dsn("shop")
        print(f"   {dsn}")
        run_sql(dsn, [SCHEMA])
        cfg_path = work / "slotlake.yaml"
        cfg_path.write_text(
            "lake: ./lake\n"
            "spark: {master: \"local[2]\"}\n"
            "sources:\n"
            "  shop:\n"
            f"    dsn: {dsn}\n"
            f"    tables: [{', '.join(TABLES)}]\n"
            "    schedule: \"0 * * * *\"\n")
        print(f"   config: {cfg_path}\n" + "".join(f"     {line}\n" for line in cfg_path.read_text().splitlines()))

        step("round 1: inserts (customers, orders with ~10 KB TOASTed notes, items with duplicate rows, products)")
        run_sql(dsn, ROUND_1)
        env = local_airflow_env(work / "airflow", cfg_path)
        migrate(env)
        step("airflow dags test slotlake_sync__shop   (first run: creates the slot and copies the tables)")
        sync_dag_run(env, "slotlake_sync__shop")

        step("round 2: updates around TOAST, deletes, key changes, a delete of one of two identical rows, "
             "TRUNCATE order_items")
        run_sql(dsn, ROUND_2)
        step("airflow dags test slotlake_sync__shop (again)")
        sync_dag_run(env, "slotlake_sync__shop")

        step("what landed in the lake (gold) next to PostgreSQL")
        show(cfg_path, dsn)
        step("slotlake status shop")
        subprocess.run([str(ROOT / ".venv/bin/slotlake"), "--quiet", "--config", str(cfg_path), "status", "shop"],
                       check=True)
        print(f"\nlake: {work / 'lake' / 'shop'}   Airflow home: {work / 'airflow'}")
        if args.keep:
            print(f"PostgreSQL left running: {dsn} (data in {pg.dir})")
    finally:
        if not args.keep:
            pg.stop()
    return 0


if __name__ == "__main__":
    from slotlake.errors import SlotlakeError

    try:
        sys.exit(main())
    except SlotlakeError as e:
        print(f"demo: error: {e}", file=sys.stderr)
        sys.exit(1)
