"""Integration tests (real PostgreSQL, Spark, Delta, Airflow). A package, so test file names may repeat tests/unit/."""
