"""The docker/ stack: `docker compose config` (the real docker CLI with Docker Compose v2, built by
scripts/build-compose.sh; `config` needs no engine) accepts docker/compose.yaml, and what it resolves is the stack the
README describes: an S3-compatible store for the lake with a bucket job, the lake credentials from the environment
into every Airflow and Spark container, the slotlake config mounted, and that config a valid slotlake config whose
lake is on that store."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from slotlake.config import load_config
from slotlake.source.connection import resolve_dsn

pytestmark = [pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker" / "compose.yaml"


def compose_plugin() -> Path:
    """The docker compose binary; waits for the build scripts/test.sh started in the background (or builds it)."""
    out = subprocess.run([str(ROOT / "scripts" / "build-compose.sh")], capture_output=True, text=True, timeout=3600)
    assert out.returncode == 0, f"building docker compose failed:\n{out.stderr[-3000:]}"
    found = sorted(ROOT.glob(".tools/compose-*/docker-compose"))
    assert found, "scripts/build-compose.sh left no .tools/compose-*/docker-compose"
    return found[-1]


@pytest.fixture(scope="module")
def docker_env(tmp_path_factory) -> dict[str, str]:
    """An environment whose docker CLI finds the compose plugin (DOCKER_CONFIG/cli-plugins), with the stack's
    variables set to recognisable values."""
    docker = shutil.which("docker")
    assert docker, "the docker CLI is not on PATH (it is on this machine kind; `docker compose config` needs it)"
    config_dir = tmp_path_factory.mktemp("docker-config")
    (config_dir / "cli-plugins").mkdir()
    (config_dir / "cli-plugins" / "docker-compose").symlink_to(compose_plugin())
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LAKE_", "AIRFLOW_", "SHOP_", "COMPOSE_"))}
    env.update(DOCKER_CONFIG=str(config_dir), LAKE_ACCESS_KEY="test-access", LAKE_SECRET_KEY="test-secret",
               SHOP_DB_PASSWORD="test-shop-pw")
    return env


def compose(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", "compose", "-f", str(COMPOSE), *args], capture_output=True, text=True,
                          timeout=300, env=env)


@pytest.mark.timeout(3600)  # the first test may wait for the background build of docker compose
def test_docker_compose_config_accepts_the_stack(docker_env):
    version = compose(docker_env, "version")
    assert version.returncode == 0 and "v2." in version.stdout, version.stdout + version.stderr
    out = compose(docker_env, "config", "--format", "json")
    assert out.returncode == 0, f"docker compose config failed:\n{out.stderr[-3000:]}"
    stack = json.loads(out.stdout)
    assert stack["name"] == "slotlake"
    services = stack["services"]
    assert {"source-db", "airflow-db", "minio", "minio-init", "airflow-init", "airflow-apiserver",
            "airflow-scheduler", "airflow-dag-processor", "airflow-triggerer", "spark-master",
            "spark-worker"} <= set(services)

    # the S3-compatible store of the lake, and the job that creates the bucket before Airflow starts
    assert services["minio"]["environment"]["MINIO_ROOT_USER"] == "test-access"
    assert services["minio-init"]["depends_on"]["minio"]["condition"] == "service_healthy"
    assert "mc mb --ignore-existing lake/lake" in " ".join(services["minio-init"]["command"])
    for name in ("airflow-scheduler", "airflow-apiserver", "airflow-dag-processor", "airflow-triggerer"):
        svc = services[name]
        assert svc["depends_on"]["minio-init"]["condition"] == "service_completed_successfully", name
        assert svc["environment"]["AWS_ACCESS_KEY_ID"] == "test-access", name
        assert svc["environment"]["AWS_SECRET_ACCESS_KEY"] == "test-secret", name
        mounts = {(v["source"], v["target"]) for v in svc["volumes"]}
        assert (str(ROOT / "docker" / "slotlake.yaml"), "/opt/slotlake/config/slotlake.yaml") in mounts, name
    assert services["spark-worker"]["environment"]["AWS_ACCESS_KEY_ID"] == "test-access"  # the executors'
    assert services["source-db"]["environment"]["POSTGRES_PASSWORD"] == "test-shop-pw"


def test_the_stacks_slotlake_config_puts_the_lake_on_its_store(docker_env, monkeypatch):
    monkeypatch.setenv("SHOP_DB_PASSWORD", "test-shop-pw")
    cfg = load_config(str(ROOT / "docker" / "slotlake.yaml"))
    assert cfg.lake == "s3a://lake/slotlake"  # the bucket minio-init creates
    assert cfg.storage is not None and cfg.storage.endpoint == "http://minio:9000" and cfg.storage.path_style
    assert cfg.spark.master == "spark://spark-master:7077"
    stack = json.loads(compose(docker_env, "config", "--format", "json").stdout)
    assert "9000:9000" in {f"{p['published']}:{p['target']}" for p in stack["services"]["minio"]["ports"]}
    # the password stays a reference in the parsed config and is read from the environment when connecting
    assert cfg.source("shop").dsn == "postgresql://slotlake:${SHOP_DB_PASSWORD}@source-db:5432/shop"
    assert resolve_dsn(cfg.source("shop")) == "postgresql://slotlake:test-shop-pw@source-db:5432/shop"
