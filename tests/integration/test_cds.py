"""The class-data-sharing archive scripts/setup.sh builds (slotlake.spark.cds) is mapped by a real Spark driver JVM
started the way slotlake starts one (`spark_conf` adds the option; the suite's SPARK_SUBMIT_OPTS on its command
line), and that JVM runs a Delta query with it."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from slotlake.spark import cds

pytestmark = [pytest.mark.integration, pytest.mark.spark]

ROOT = Path(__file__).resolve().parents[2]

_APP = """
import sys
sys.path.insert(0, {plugins!r})
from slotlake.spark.session import get_spark, spark_conf
print("option:", spark_conf("local[1]").get("spark.driver.extraJavaOptions"))
spark = get_spark("slotlake-cds-check", "local[1]")
spark.range(5).write.format("delta").save({table!r})
print("rows:", spark.read.format("delta").load({table!r}).count())
"""


def test_a_driver_jvm_maps_the_archive_and_runs_delta(tmp_path):
    path = cds.archive_path()
    assert path is not None and path.is_file(), \
        f"no class-data-sharing archive at {path}; scripts/setup.sh builds it (python -m slotlake.spark.cds)"
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable,
           # -Xlog:cds: the JVM says which archives it mapped (stdout)
           "SPARK_SUBMIT_OPTS": f"{os.environ.get('SPARK_SUBMIT_OPTS', '')} -Xlog:cds=info"}
    code = _APP.format(plugins=str(ROOT / "plugins"), table=str(tmp_path / "t"))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-3000:]
    assert f"option: -XX:SharedArchiveFile={path}" in out.stdout
    assert f"Opened archive {path}." in text and "Mapped dynamic region #0" in text, text[-3000:]
    assert "Unable to use shared archive" not in text
    assert "rows: 5" in out.stdout
