"""Test, demo and benchmark support that does not ship with the slotlake package: a throw-away PostgreSQL
(`localpg`) and a local Airflow (`airflow_local`). Importable from a checkout with the repository root on sys.path
(tests/conftest.py, bench/, scripts/demo.py do that)."""
