"""The class-data-sharing archive's option (slotlake.spark.cds): given to a driver only when this Java's, pyspark's
and the jars' archive exists, and composed with the spark-submit driver's own options. That a real JVM maps the
archive setup built: tests/integration/test_cds.py."""
from __future__ import annotations

from pathlib import Path

import pytest

from slotlake.config import parse_config
from slotlake.spark import cds
from slotlake.spark.session import spark_conf
from slotlake.spark.submit import SUBMIT_DRIVER_JAVA_OPTIONS, spark_app

pytestmark = pytest.mark.unit


@pytest.fixture
def jars(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "jars"
    folder.mkdir()
    (folder / "delta-spark_2.13-4.4.0.jar").write_bytes(b"jar")
    monkeypatch.setenv("SLOTLAKE_JARS_DIR", str(folder))
    monkeypatch.delenv("SLOTLAKE_CDS", raising=False)
    monkeypatch.delenv("SPARK_CONF_DIR", raising=False)
    return folder


def _app_options(conf: dict | None = None) -> str:
    cfg = parse_config({"lake": "/lake", "spark": {"master": "local[2]", "conf": conf or {}},
                        "sources": {"shop": {"dsn": "postgresql://u@127.0.0.1/shop"}}}, path="/etc/slotlake.yaml")
    return spark_app(cfg, "shop", "merge").conf["spark.driver.extraJavaOptions"]


def test_no_archive_no_option(jars):
    path = cds.archive_path()
    assert path is not None and path.parent == jars / "cds" and not path.exists()
    assert cds.java_options() == ""
    assert "spark.driver.extraJavaOptions" not in spark_conf("local[2]")
    assert _app_options() == SUBMIT_DRIVER_JAVA_OPTIONS


def test_an_archive_is_given_to_every_driver_unless_the_config_sets_java_options(jars, monkeypatch):
    path = cds.archive_path()
    path.parent.mkdir()
    path.write_bytes(b"archive")
    option = f"-XX:SharedArchiveFile={path}"
    assert cds.java_options() == option
    assert spark_conf("local[2]")["spark.driver.extraJavaOptions"] == option  # server, in-process sessions
    assert spark_conf("spark://m:7077")["spark.driver.extraJavaOptions"] == option  # a client-mode driver
    assert _app_options() == f"{SUBMIT_DRIVER_JAVA_OPTIONS} {option}"  # spark-submit: C1 as well
    assert _app_options({"spark.driver.extraJavaOptions": "-Xss4m"}) == "-Xss4m"  # the config's own wins
    assert spark_conf("local[2]", {"spark.driver.extraJavaOptions": "-Xss4m"})[
        "spark.driver.extraJavaOptions"] == "-Xss4m"
    monkeypatch.setenv("SLOTLAKE_CDS", "off")
    assert cds.java_options() == "" and _app_options() == SUBMIT_DRIVER_JAVA_OPTIONS


def test_the_archive_name_follows_the_jars_and_the_class_path(jars, monkeypatch, tmp_path):
    first = cds.archive_path()
    (jars / "delta-storage-4.4.0.jar").write_bytes(b"jar")  # another jar set: the old archive does not fit it
    second = cds.archive_path()
    assert second != first
    conf_dir = tmp_path / "conf"
    conf_dir.mkdir()
    monkeypatch.setenv("SPARK_CONF_DIR", str(conf_dir))  # first on the driver's class path
    assert cds.archive_path() not in (first, second)


def test_no_java_no_archive(jars, monkeypatch, tmp_path):
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-such-java"))
    assert cds.archive_path() is None and cds.java_options() == ""
