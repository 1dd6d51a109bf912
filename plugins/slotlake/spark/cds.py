"""A class-data-sharing archive for the Spark driver JVM: the classes of Spark, Delta and their libraries, parsed and
verified once, mapped into every later JVM instead of loaded from the jars again.

A driver JVM loads ~20,000 classes before a sync's first Delta commit. With the archive a small Delta app's
spark-submit took 11.5 s instead of 16.0 s on 2 cores (16.2 instead of 21.4 CPU-s; bench/README.md, "Class data
sharing"). The archive is built once per Java, pyspark and jar set (`python -m slotlake.spark.cds`, which
scripts/setup.sh runs) by a JVM that runs a small Delta workload and writes the classes it loaded at exit
(`-XX:ArchiveClassesAtExit`, Java 13+). `java_options()` then gives every driver `-XX:SharedArchiveFile=`; with no
archive (not built, or another Java or pyspark: the name carries them) it gives nothing and the JVM loads its
classes as before. A JVM that still cannot map it (another JVM build under the same path) says so in one warning
line and runs without it.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from slotlake.spark.code import jars_dir

ENV = "SLOTLAKE_CDS"  # "off": no archive for the drivers (the JVM loads its classes from the jars)


def _java() -> Path | None:
    """The java binary spark-submit starts: `$JAVA_HOME/bin/java`, else `java` on PATH."""
    home = os.environ.get("JAVA_HOME")
    found = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    return Path(found).resolve() if found and Path(found).exists() else None


def _key() -> str | None:
    """What the archive depends on: the java binary, the driver's class path (`$SPARK_CONF_DIR`, which
    spark-submit puts first on it, and pyspark's jars) and the Delta jars (names and sizes)."""
    java = _java()
    if java is None:
        return None
    import pyspark

    parts = [str(java), str(java.stat().st_size), str(int(java.stat().st_mtime)),
             os.path.abspath(os.environ["SPARK_CONF_DIR"]) if os.environ.get("SPARK_CONF_DIR") else ""]
    for folder in (Path(pyspark.__file__).parent / "jars", jars_dir()):
        parts += sorted(f"{p.name}:{p.stat().st_size}" for p in folder.glob("*.jar"))
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def archive_path() -> Path | None:
    key = _key()
    return jars_dir() / "cds" / f"spark-{key}.jsa" if key else None


def java_options() -> str:
    """`-XX:SharedArchiveFile=<archive>` when this Java's archive exists (and `$SLOTLAKE_CDS` is not off), else ""."""
    if os.environ.get(ENV, "").lower() == "off":
        return ""
    path = archive_path()
    return f"-XX:SharedArchiveFile={path}" if path is not None and path.is_file() else ""


_WORKLOAD = """
import sys
sys.path.insert(0, {plugins!r})
from pyspark.sql import functions as F, Window
from delta.tables import DeltaTable
from slotlake.spark.session import get_spark
spark = get_spark("slotlake-cds", "local[2]", {{"spark.driver.extraJavaOptions": {opts!r}}})
d = {work!r}
df = spark.range(5000).select("id", (F.col("id") % 7).alias("k"), F.concat(F.lit("v"), F.col("id")).alias("s"),
                              F.current_timestamp().alias("ts"), (F.col("id") / 3).cast("decimal(20,4)").alias("n"))
df.write.format("delta").save(d + "/t")
df.write.parquet(d + "/p")
src = spark.read.parquet(d + "/p").where("k < 3")
w = Window.partitionBy("k").orderBy(F.col("id").desc())
src = src.withColumn("r", F.row_number().over(w)).where("r <= 100").drop("r")
agg = src.groupBy("k").agg(F.max("id").alias("m"), F.count("*").alias("c"))
src = src.join(agg, "k", "left_semi")
t = DeltaTable.forPath(spark, d + "/t")
t.alias("t").merge(src.alias("s"), "t.id <=> s.id").whenMatchedDelete("s.k = 0") \\
    .whenMatchedUpdate(set={{"s": "s.s", "n": "s.n"}}).whenNotMatchedInsertAll().execute()
spark.read.format("delta").load(d + "/t").groupBy("k").count().collect()
t.history(1).collect()
t.detail().collect()
spark.stop()
"""


def build(force: bool = False) -> Path | None:
    """Build this Java's archive unless it exists (`force`: again). Returns its path, None when there is no java."""
    path = archive_path()
    if path is None:
        return None
    if path.is_file() and not force:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="slotlake-cds-") as work:
        tmp = path.with_name(f".{path.name}.tmp")
        code = _WORKLOAD.format(plugins=str(Path(__file__).resolve().parents[2]), work=work,
                                opts=f"-XX:ArchiveClassesAtExit={tmp}")
        env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SLOTLAKE_CDS": "off"}
        proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=900)
        if proc.returncode != 0 or not tmp.is_file():
            tmp.unlink(missing_ok=True)
            last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            raise RuntimeError(f"building the class-data-sharing archive failed ({last}); Spark runs without it")
        os.replace(tmp, path)
    return path


def main() -> int:
    started = time.monotonic()
    force = "--force" in sys.argv[1:]
    existed = not force and (path := archive_path()) is not None and path.is_file()
    try:
        path = build(force=force)
    except RuntimeError as e:
        print(f"slotlake cds: {e}", file=sys.stderr)
        return 1
    if path is None:
        print("slotlake cds: no java found (JAVA_HOME or PATH); nothing built", file=sys.stderr)
        return 1
    how = "already built" if existed else f"built in {time.monotonic() - started:.0f} s"
    print(f"slotlake cds: {path} ({path.stat().st_size / 1e6:.0f} MB, {how})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
