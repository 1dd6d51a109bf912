"""slotlake built as a wheel and installed into a fresh virtualenv works outside the checkout.

The wheel is built from this checkout and installed with pip into a new venv that sees the pinned dependencies of
`.venv` (a `.pth` line: the dependencies' folder only, so `.venv`'s editable slotlake is not importable there). Then,
from a working directory outside the checkout and without PYTHONPATH, the installed package reads its own package
data (the DDL capture SQL, installed into a real PostgreSQL) and the installed `slotlake` console script runs a sync
whose Spark app is the entry point inside the installed package. Gold must equal PostgreSQL row by row.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import psycopg
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

from oracle import assert_gold_equals_pg  # noqa: E402


def _run(cmd: list[str], *, cwd: Path, env: dict[str, str], timeout: int = 900) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"{cmd} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out


@pytest.mark.integration
@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.spark_submit  # the installed package's own entry point under spark-submit
def test_wheel_in_a_fresh_venv_installs_ddl_capture_and_syncs_outside_the_checkout(pg_db, tmp_path):
    work = tmp_path / "elsewhere"  # not inside the checkout
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["SLOTLAKE_JARS_DIR"] = str(ROOT / ".jars")  # outside a checkout the jars folder is configured

    # Built from a copy of the sources: setuptools leaves `plugins/slotlake.egg-info` and `build/` where it builds,
    # and an egg-info beside the editable install is a second `slotlake` distribution to importlib.metadata (its
    # airflow.plugins entry point twice: "Plugin 'slotlake' already registered" in every later Airflow process).
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy2(ROOT / "pyproject.toml", src / "pyproject.toml")
    shutil.copytree(ROOT / "plugins", src / "plugins", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    wheels = tmp_path / "wheels"
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels),
          str(src)], cwd=work, env=env)
    assert not list((ROOT / "plugins").glob("*.egg-info")), "the wheel build left an egg-info in the checkout"
    wheel = next(wheels.glob("slotlake-*.whl"))
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=work, env=env)
    py = venv / "bin" / "python"
    site = _run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                cwd=work, env=env).stdout.strip()
    Path(site, "slotlake_test_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    _run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "-q", str(wheel)],
         cwd=work, env=env)

    # The package is the installed one, and its data files came with it.
    where = _run([str(py), "-c", "import slotlake.spark.submit as s, slotlake.source.ddl as d; "
                  "print(s.APPS_DIR); print(d.INSTALL_SQL)"], cwd=work, env=env).stdout.split()
    assert all(p.startswith(site) for p in where), where
    assert Path(where[0], "sync.py").is_file() and Path(where[1]).is_file()

    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, name text, qty int)")
        conn.execute("CREATE TABLE log (at int, note text)")
        conn.execute("ALTER TABLE log REPLICA IDENTITY FULL")
    _run([str(py), "-c", "import sys, psycopg; from slotlake.source.ddl import install_ddl_capture, "
          "ddl_capture_installed\nwith psycopg.connect(sys.argv[1], autocommit=True) as c:\n"
          "    install_ddl_capture(c); assert ddl_capture_installed(c)", pg_db], cwd=work, env=env)

    cfg = work / "slotlake.yaml"
    spark_submit = ROOT / ".venv" / "bin" / "spark-submit"  # pyspark's script; the app runs on the new venv's Python
    cfg.write_text(f"lake: ./lake\nspark: {{master: \"local[2]\", spark_submit: {spark_submit}}}\n"
                   f"sources:\n  shop:\n    dsn: {pg_db}\n    tables: [public.items, public.log]\n")
    slotlake = str(venv / "bin" / "slotlake")
    _run([slotlake, "--config", str(cfg), "sync", "shop"], cwd=work, env=env)
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("INSERT INTO items SELECT g, 'item ' || g, g FROM generate_series(1, 50) g")
        conn.execute("INSERT INTO log VALUES (1, 'a'), (1, 'a'), (2, NULL)")
        conn.execute("UPDATE items SET qty = qty * 2 WHERE id % 3 = 0")
        conn.execute("DELETE FROM items WHERE id > 45")
        conn.execute("ALTER TABLE items ADD COLUMN tag text")  # captured by the installed DDL triggers
        conn.execute("UPDATE items SET tag = 'x' WHERE id < 5")
        conn.execute("DELETE FROM log WHERE at = 2")
    out = _run([slotlake, "--config", str(cfg), "sync", "shop"], cwd=work, env=env)
    assert "sync shop: archived" in out.stdout, out.stdout
    # The Spark app spark-submit ran is the entry point inside the installed package.
    assert f"submitting slotlake-sync-shop to local[2] ({where[0]}/sync.py)" in out.stderr, out.stderr[-3000:]
    for table in ("public.items", "public.log"):
        schema, name = table.split(".")
        for reader in ("spark", "delta-rs"):
            assert_gold_equals_pg(str(work / "lake" / "shop" / "gold" / schema / name), pg_db, table,
                                  reader=reader)
