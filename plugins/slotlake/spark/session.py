"""The SparkSession with Delta, built the same way for spark-submit apps, tests and the demo.

Delta's jars come from `$SLOTLAKE_JARS_DIR`, else from `.jars/` of the checkout this package runs from (resolved
from Maven Central by scripts/setup.sh); nothing is downloaded when Spark starts.
"""
from __future__ import annotations

import glob
import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path

from slotlake.spark.cds import java_options
from slotlake.spark.code import PACKAGE_DIR, code_zip, jars_dir
from slotlake.storage import StorageSettings, spark_s3a_conf

# Settings every slotlake Spark session gets (config `spark.conf` may override all but the Delta wiring).
BASE_CONF: dict[str, str] = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    "spark.sql.session.timeZone": "UTC",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    # Plain Python UDFs (the array-literal parser) through the pickled runner: Spark 4.2's Arrow-batched UDF
    # runner can leave a worker waiting forever for its UDF list when fed by a columnar scan (SPARK-58241).
    "spark.sql.execution.pythonUDF.arrow.enabled": "false",
    "spark.databricks.delta.schema.autoMerge.enabled": "false",
    "spark.driver.memory": "2g",
    # Spark keeps 100 compiled query classes by default; one sync's decode and merge use ~400 (4 tables), so in a
    # long-lived driver (`spark.server`) every sync compiled and JIT-warmed them all again. Room for many syncs'
    # worth: a warm 310k-change sync's decode 5.5 -> 4.5 s, merge 15.5 -> 13.0 s (bench/README.md,
    # "bench/bursts.py"). Bounded: at most this many classes stay loaded (~20 KB of metaspace each).
    "spark.sql.codegen.cache.maxEntries": "10000",
}

# A query over a few thousand rows spends more CPU generating its Java, compiling it (Janino) and JIT-compiling the
# classes than running them. A table's merge of a small batch (`codegen_for_batch`) runs its queries interpreted:
# a warm small merge used ~15-25% less CPU (bench/README.md, "Small merges run interpreted"); a large batch runs
# Spark's generated code (its defaults), which is faster per row.
INTERPRETED_CONF: dict[str, str] = {
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.codegen.factoryMode": "NO_CODEGEN",
}
GENERATED_CONF: dict[str, str] = {
    "spark.sql.codegen.wholeStage": "true",
    "spark.sql.codegen.factoryMode": "FALLBACK",
}
# A small batch's queries are also planned once, without adaptive execution (which re-plans a query at each shuffle
# from its runtime statistics: with a batch this small and gold under SMALL_GOLD_BYTES there is nothing to coalesce,
# skew or broadcast differently, and re-planning is driver time, cold in a spark-submit app): a 1,000-change sync
# over the 4 pgbench tables 18.3 -> 16.6 s (bench/README.md, "Small batches are planned once"). A larger batch, or a
# small one into a big gold table, keeps it: there the runtime statistics can pick a broadcast join or coalesce.
SMALL_PLAN_CONF: dict[str, str] = {"spark.sql.adaptive.enabled": "false"}
SMALL_BATCH_ROWS = 20_000
# A small batch's MERGE still reads (and copy-on-write rewrites) the gold files holding its keys, which for random
# keys is all of gold: interpreted, a 1,000-change MERGE into 10 M rows took 133 s instead of 26 s (bench/README.md,
# "Small batches into big gold tables run generated code"). Gold of this size or more gets the generated code.
SMALL_GOLD_BYTES = 1 << 20


def codegen_for_batch(session, rows: int, user_conf: Mapping[str, str], gold_bytes: int = 0) -> str | None:
    """Sets `INTERPRETED_CONF` and `SMALL_PLAN_CONF` on `session` (one table's own session) when its batch of `rows`
    changes is small and so is the gold table its queries may read (`gold_bytes`: its Delta snapshot's size), else
    `GENERATED_CONF` and Spark's default plan settings, and says which ("interpreted" / "generated code"); None, and
    no code setting made, when the config's `spark.conf` sets either code key (a user's setting wins, as it does for
    each key of `SMALL_PLAN_CONF`)."""
    small = rows < SMALL_BATCH_ROWS and gold_bytes < SMALL_GOLD_BYTES
    for k, v in SMALL_PLAN_CONF.items():
        if k not in user_conf:
            if small:
                session.conf.set(k, v)
            else:
                session.conf.unset(k)  # Spark's default (adaptive execution on)
    if any(k in user_conf for k in INTERPRETED_CONF):
        return None
    for k, v in (INTERPRETED_CONF if small else GENERATED_CONF).items():
        session.conf.set(k, v)
    return "interpreted" if small else "generated code"


def delta_jars() -> list[str]:
    jars = sorted(glob.glob(str(jars_dir() / "*.jar")))
    if not any("delta-spark" in Path(j).name for j in jars):
        raise RuntimeError(f"Delta jars not found in {jars_dir()}; set SLOTLAKE_JARS_DIR to a folder holding them "
                           "(scripts/setup.sh resolves them from Maven Central into .jars/)")
    return jars


def s3_jars() -> list[str]:
    """hadoop-aws and what it needs (`.jars/s3/`, jars/s3/pom.xml), for an s3a lake only."""
    jars = sorted(glob.glob(str(jars_dir() / "s3" / "*.jar")))
    if not any("hadoop-aws" in Path(j).name for j in jars):
        raise RuntimeError(f"S3 jars not found in {jars_dir() / 's3'}; run scripts/setup.sh (it resolves them from "
                           "Maven Central) or put hadoop-aws and the AWS SDK bundle there")
    return jars


DIST_CLASSPATH_ENV = "SPARK_DIST_CLASSPATH"


def driver_env(master: str, storage: StorageSettings | None) -> dict[str, str]:
    """The environment a driver JVM on a local `master` needs for an s3a lake (`storage`): the S3 jars in
    `SPARK_DIST_CLASSPATH` (this process's value first, if any), which Spark's launcher puts after its own jars.
    Not `spark.driver.extraClassPath`, which goes before them: the driver's class path would then no longer start
    with the one the class-data-sharing archive was dumped with (slotlake.spark.cds), and the JVM would load every
    Spark class from the jars again ("Unable to use shared archive"). Where spark.jars would copy the 700 MB SDK
    bundle into every run's work folder, the class path is enough. Empty for a local lake or a cluster master."""
    if storage is None or local_cores(master) is None:
        return {}
    have = [p for p in os.environ.get(DIST_CLASSPATH_ENV, "").split(":") if p]
    return {DIST_CLASSPATH_ENV: ":".join(have + [j for j in s3_jars() if j not in have])}


def local_cores(master: str) -> int | None:
    """The cores of a local master (`local` 1, `local[N]` N, `local[*]` this machine's, `local[N,F]` N); None for a
    cluster master."""
    m = re.fullmatch(r"local(?:\[(\*|\d+)(?:,\s*\d+)?\])?", master.strip())
    if not m:
        return None
    if m.group(1) in (None, ""):
        return 1
    if m.group(1) == "*":
        return os.cpu_count() or 1
    return max(1, int(m.group(1)))


def spark_conf(master: str = "local[*]", extra: Mapping[str, str] | None = None, *,
               storage: StorageSettings | None = None) -> dict[str, str]:
    """The full Spark configuration: base settings, Delta jars, the S3 settings and jars when the lake is s3a
    (`storage`, the config's), then the user's `spark.conf`.

    On a local master, shuffles and Delta's log replay use one partition per core instead of Spark's 200 and
    Delta's 50: a batch of changes is small next to those, and every extra task is pure scheduling overhead
    (measured on the e2e workload, 2 cores: 90 s -> 53 s per sync). Cluster masters keep Spark's and Delta's
    defaults (with adaptive query execution coalescing small shuffles). `spark.conf` overrides both.
    """
    conf = dict(BASE_CONF)
    local = local_cores(master)
    cores = local if local is not None else cluster_cores(extra)
    if cores is not None:
        conf["spark.sql.shuffle.partitions"] = str(cores)
        conf["spark.databricks.delta.snapshotPartitions"] = str(cores)
    conf["spark.jars"] = ",".join(delta_jars())
    if storage is not None:
        conf.update(spark_s3a_conf(storage))
        if local is not None:
            pass  # driver and executors are one JVM: the jars go after Spark's on its class path (`driver_env`)
        elif "spark.executor.extraClassPath" in (extra or {}):
            # A cluster whose nodes hold the jars says so with spark.executor.extraClassPath; the driver (here)
            # takes them from .jars/s3. Only for an s3a lake: a local lake's start loads none of it.
            conf["spark.driver.extraClassPath"] = ":".join(s3_jars())
        else:
            conf["spark.jars"] += "," + ",".join(s3_jars())
    conf["spark.master"] = master
    conf.update(extra or {})
    if "spark.driver.extraJavaOptions" not in conf:
        cds = java_options()  # the class-data-sharing archive, when built (slotlake.spark.cds)
        if cds:
            conf["spark.driver.extraJavaOptions"] = cds
    if local is not None:
        # Executors import slotlake (the decoder runs there). On a local master they are this machine's: put the
        # folder holding the package on their PYTHONPATH (plugins/ in a checkout; site-packages when installed).
        # A cluster's executors get the package shipped instead (--py-files, or `ship_code` for an in-process
        # session), never a path that exists only on the submitting machine.
        conf.setdefault("spark.executorEnv.PYTHONPATH", str(PACKAGE_DIR.parent))
    return conf


def cluster_cores(extra: Mapping[str, str] | None) -> int | None:
    """The cores a cluster app may use, when `spark.cores.max` bounds them (standalone, Mesos); None otherwise."""
    text = (extra or {}).get("spark.cores.max", "").strip()
    return max(1, int(text)) if text.isdigit() else None


def ship_code(spark) -> None:
    """Give a running session's executors the slotlake package (the same zip `--py-files` ships): for an
    in-process session on a cluster master, whose executors cannot import it from this machine's paths."""
    spark.sparkContext.addPyFile(code_zip())


def get_spark(app_name: str = "slotlake", master: str | None = None, extra: Mapping[str, str] | None = None, *,
              storage: StorageSettings | None = None):
    """Get or create the SparkSession. Under spark-submit the master and jars already come from the command line.
    `storage`: the config's, for an s3a lake (see `spark_conf`)."""
    from pyspark.sql import SparkSession

    # Python workers must run this interpreter (it has pyarrow and slotlake), not whatever `python3` is on PATH.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name)
    under_spark_submit = "SPARK_ENV_LOADED" in os.environ or bool(os.environ.get("SLOTLAKE_UNDER_SPARK_SUBMIT"))
    if not under_spark_submit:
        os.environ.update(driver_env(master or "local[*]", storage))  # read by the JVM pyspark starts next
        for k, v in spark_conf(master or "local[*]", extra, storage=storage).items():
            builder = builder.config(k, v)
    elif extra:
        for k, v in extra.items():
            builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    if not under_spark_submit and local_cores(spark.sparkContext.master or "local") is None:
        ship_code(spark)  # spark-submit ships the zip itself (--py-files)
    return spark


def error_summary(e: BaseException) -> str:
    """One line naming what failed: a Py4JJavaError's first line is only "An error occurred while calling oN.x",
    so the Java exception's own class and message are taken instead."""
    java = getattr(e, "java_exception", None)
    text = ""
    if java is not None:
        try:
            text = str(java.toString())
        except Exception:  # the gateway may be gone already
            text = ""
    if not text:
        text = str(e)
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return f"{type(e).__name__}: {first}"[:1000]
