"""slotlake.storage's pure parts: path mapping, the delta-rs and Spark settings, local put_new semantics."""
from __future__ import annotations

import pytest

from slotlake import storage
from slotlake.errors import ConfigError
from slotlake.storage import StorageSettings

pytestmark = pytest.mark.unit

MINIO = StorageSettings(endpoint="http://127.0.0.1:9000", region="us-east-1", path_style=True)


def test_paths():
    assert storage.split_s3("s3a://bucket/a/b/") == ("bucket", "a/b")
    assert storage.split_s3("s3a://bucket") == ("bucket", "")
    assert storage.delta_rs_uri("s3a://bucket/x/gold/public/t") == "s3://bucket/x/gold/public/t"
    assert storage.delta_rs_uri("/lake/x") == "/lake/x"
    assert storage.join("s3a://b/p/", "bronze", "x.parquet") == "s3a://b/p/bronze/x.parquet"
    assert storage.supported("s3a://b/p") and storage.supported("/x") and storage.supported("file:///x")
    assert not storage.supported("abfss://c@a.dfs.core.windows.net/x")
    assert isinstance(storage.files_for("/x"), storage.LocalFiles)
    assert isinstance(storage.files_for("s3a://b/x"), storage.S3Files)


def test_delta_rs_options():
    assert storage.delta_rs_options(None) == {}
    assert storage.delta_rs_options(MINIO) == {
        "aws_conditional_put": "etag", "AWS_REGION": "us-east-1", "AWS_ENDPOINT_URL": "http://127.0.0.1:9000",
        "AWS_ALLOW_HTTP": "true", "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": "false"}
    aws = storage.delta_rs_options(StorageSettings(region="eu-west-1"))
    assert aws == {"aws_conditional_put": "etag", "AWS_REGION": "eu-west-1"}


def test_spark_conf_has_no_secrets(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDTEST")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s3cr3t-value")
    conf = storage.spark_s3a_conf(MINIO)
    assert conf["spark.hadoop.fs.s3a.endpoint"] == "http://127.0.0.1:9000"
    assert conf["spark.hadoop.fs.s3a.path.style.access"] == "true"
    assert conf["spark.hadoop.fs.s3a.endpoint.region"] == "us-east-1"
    assert conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] == "false"
    assert conf["spark.hadoop.fs.s3a.aws.credentials.provider"] == storage.ENV_CREDENTIALS_PROVIDER
    assert not any("AKIDTEST" in v or "s3cr3t" in v for v in conf.values())
    assert not any("secret" in k.lower() or "access.key" in k.lower() for k in conf)
    aws = storage.spark_s3a_conf(StorageSettings())
    assert "spark.hadoop.fs.s3a.endpoint" not in aws and aws["spark.hadoop.fs.s3a.path.style.access"] == "false"


def test_spark_conf_adds_s3_jars_only_for_an_s3a_lake(monkeypatch):
    from slotlake.spark.session import DIST_CLASSPATH_ENV, driver_env, s3_jars, spark_conf

    monkeypatch.delenv(DIST_CLASSPATH_ENV, raising=False)
    local = spark_conf("local[2]")
    assert "hadoop-aws" not in local["spark.jars"] and "spark.driver.extraClassPath" not in local
    assert driver_env("local[2]", None) == {}
    s3 = spark_conf("local[2]", storage=MINIO)
    # A local master: the driver's class path (spark.jars would copy the SDK bundle into each run's work dir),
    # after Spark's own jars (SPARK_DIST_CLASSPATH), so the class-data-sharing archive still maps.
    assert "hadoop-aws" not in s3["spark.jars"] and "spark.driver.extraClassPath" not in s3
    assert driver_env("local[2]", MINIO) == {DIST_CLASSPATH_ENV: ":".join(s3_jars())}
    monkeypatch.setenv(DIST_CLASSPATH_ENV, "/opt/mine.jar")
    assert driver_env("local[2]", MINIO) == {DIST_CLASSPATH_ENV: ":".join(["/opt/mine.jar", *s3_jars()])}
    monkeypatch.setenv(DIST_CLASSPATH_ENV, driver_env("local[2]", MINIO)[DIST_CLASSPATH_ENV])  # a second session
    assert driver_env("local[2]", MINIO) == {DIST_CLASSPATH_ENV: ":".join(["/opt/mine.jar", *s3_jars()])}
    assert driver_env("spark://m:7077", MINIO) == {}
    assert s3["spark.hadoop.fs.s3a.endpoint"] == "http://127.0.0.1:9000"
    cluster = spark_conf("spark://m:7077", storage=MINIO)
    assert all(j in cluster["spark.jars"].split(",") for j in s3_jars())
    assert "spark.driver.extraClassPath" not in cluster
    # A cluster whose nodes have the jars (docker/slotlake.yaml): no copy through spark.jars.
    nodes = spark_conf("spark://m:7077", {"spark.executor.extraClassPath": "/opt/s3/*"}, storage=MINIO)
    assert "hadoop-aws" not in nodes["spark.jars"] and nodes["spark.driver.extraClassPath"] == ":".join(s3_jars())


def test_credentials_only_from_the_environment(monkeypatch):
    monkeypatch.delenv("AWS_ACCESS_KEY_ID", raising=False)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "x")
    with pytest.raises(ConfigError, match=r"^an s3a lake needs credentials: set AWS_ACCESS_KEY_ID and "
                                          r"AWS_SECRET_ACCESS_KEY in the environment"):
        storage.credentials()


def test_local_put_new_never_replaces(tmp_path):
    files = storage.LocalFiles()
    target = str(tmp_path / "bronze" / "a.json")
    files.put_new(target, b"first")
    with pytest.raises(FileExistsError):
        files.put_new(target, b"second")
    assert files.read_bytes(target) == b"first" and files.size(target) == len(b"first")
    with pytest.raises(FileNotFoundError):
        files.size(str(tmp_path / "bronze" / "nope.json"))
    assert files.list_names(str(tmp_path / "bronze")) == ["a.json"]  # the refused write left no temporary file
    files.write_replace(target, b"third")
    assert files.read_bytes(target) == b"third"
    files.remove(target)
    assert not files.exists(target) and files.list_names(str(tmp_path / "nope")) == []


def test_local_get_file_remove_tree_and_arrow_files(tmp_path):
    files = storage.LocalFiles()
    files.put_new(str(tmp_path / "t" / "a" / "x.parquet"), b"x")
    files.get_file(str(tmp_path / "t" / "a" / "x.parquet"), str(tmp_path / "copy"))
    assert (tmp_path / "copy").read_bytes() == b"x"
    with pytest.raises(FileNotFoundError):
        files.get_file(str(tmp_path / "nope"), str(tmp_path / "copy2"))
    assert storage.arrow_files(str(tmp_path / "t")) == (None, str(tmp_path / "t"))
    files.remove_tree(str(tmp_path / "t"))
    assert not (tmp_path / "t").exists()
    files.remove_tree(str(tmp_path / "t"))  # nothing there: nothing to do
