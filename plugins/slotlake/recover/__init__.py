"""Point-in-time recovery: tables as they were at one commit LSN, into Delta or back into PostgreSQL.

    slotlake recover SOURCE --as-of POINT --table T [--table T ...] --to DEST [--into-schema S] [--replace]

`point` parses and checks the request (no I/O) and submits the Spark app `spark_apps/recover.py`
(`slotlake.recover.point_job.run_recover`); `to_postgres` creates the historical table in PostgreSQL and fills it.
"""
