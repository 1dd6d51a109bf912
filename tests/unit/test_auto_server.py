"""`spark.server: auto` without Spark: which apps share a server, the server's state file, and what a client does
with the file it finds (a live server of the same code is reused; one of other code is stopped; a server that
cannot start means spark-submit). Real processes stand in for the server where only its pid matters."""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time

import pytest

from slotlake.config import parse_config
from slotlake.spark.auto_server import (
    ensure_server,
    remove_ready_file,
    server_key,
    state_dir,
    write_ready_file,
)
from slotlake.spark.code import code_digest
from slotlake.spark.submit import spark_app

pytestmark = pytest.mark.unit


def _app(tmp_path, stage="sync", source="shop", conf=None, master="local[2]"):
    raw = {"lake": str(tmp_path / "lake"), "spark": {"master": master, "conf": conf or {}, "server": "auto",
                                                     "server_idle_minutes": 1},
           "sources": {"shop": {"dsn": "postgresql://u@127.0.0.1/shop"},
                       "crm": {"dsn": "postgresql://u@127.0.0.1/crm"}}}
    return spark_app(parse_config(raw, path=str(tmp_path / "missing.yaml")), source, stage)


def test_apps_with_the_same_spark_settings_share_a_server(tmp_path):
    key = server_key(_app(tmp_path))
    assert server_key(_app(tmp_path, "merge", "crm")) == key
    assert server_key(_app(tmp_path, conf={"spark.driver.memory": "4g"})) != key
    assert server_key(_app(tmp_path, master="local[1]")) != key


def test_state_dir_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("SLOTLAKE_STATE_DIR", str(tmp_path))
    assert state_dir() == tmp_path / "spark-servers"
    monkeypatch.delenv("SLOTLAKE_STATE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert state_dir() == tmp_path / "cache" / "slotlake" / "spark-servers"


def test_ready_file_is_removed_only_by_the_server_that_wrote_it(tmp_path):
    path = tmp_path / "k.json"
    write_ready_file(path, ("127.0.0.1", 4321), "abc")
    assert json.loads(path.read_text()) == {"pid": os.getpid(), "address": "127.0.0.1:4321", "code": "abc"}
    path.write_text(json.dumps({"pid": os.getpid() + 1, "address": "127.0.0.1:1", "code": "abc"}))
    remove_ready_file(path)  # another server's file: kept
    assert path.exists()
    write_ready_file(path, ("127.0.0.1", 4321), "abc")
    remove_ready_file(path)
    assert not path.exists()
    remove_ready_file(path)  # nothing to remove: no error


@pytest.fixture
def state(monkeypatch, tmp_path):
    monkeypatch.setenv("SLOTLAKE_STATE_DIR", str(tmp_path / "state"))
    folder = state_dir()
    folder.mkdir(parents=True)
    return folder


def _standin() -> subprocess.Popen:
    """A live process whose pid a state file can name (no server listens: only the pid is looked at here)."""
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])


def test_a_live_server_of_this_code_is_reused(state, tmp_path):
    app = _app(tmp_path)
    proc = _standin()
    try:
        (state / f"{server_key(app)}.json").write_text(
            json.dumps({"pid": proc.pid, "address": "127.0.0.1:4321", "code": code_digest()}))
        assert ensure_server(app) == "127.0.0.1:4321"
        assert proc.poll() is None  # left running
    finally:
        proc.kill()
        proc.wait()


def test_a_server_of_other_code_is_stopped_and_a_failed_start_means_spark_submit(state, tmp_path, caplog):
    app = _app(tmp_path)  # its config file does not exist: the server it starts exits at once
    info = state / f"{server_key(app)}.json"
    proc = _standin()
    try:
        info.write_text(json.dumps({"pid": proc.pid, "address": "127.0.0.1:4321", "code": "other"}))
        with caplog.at_level(logging.INFO):
            started = time.monotonic()
            assert ensure_server(app) is None
        assert proc.wait(timeout=5) is not None  # stopped (SIGTERM)
        assert time.monotonic() - started < 60
    finally:
        proc.kill()
        proc.wait()
    assert "runs other slotlake code (other): stopping it" in caplog.text
    assert "exited with code 1 while starting" in caplog.text and "spark-submit" in caplog.text
    assert not info.exists()
    assert "missing.yaml" in (state / f"{server_key(app)}.log").read_text()  # the server's own error, in its log


def test_a_dead_server_in_the_state_file_is_not_used(state, tmp_path):
    app = _app(tmp_path)
    proc = _standin()
    proc.kill()
    proc.wait()
    info = state / f"{server_key(app)}.json"
    info.write_text(json.dumps({"pid": proc.pid, "address": "127.0.0.1:4321", "code": code_digest()}))
    assert ensure_server(app) is None  # tried to start a new one (it fails: no config file)
    assert not info.exists()


def test_spark_server_stop_stops_the_auto_server_of_the_config(state, tmp_path, capsys):
    from slotlake.cli import main

    cfg = tmp_path / "slotlake.yaml"
    cfg.write_text(json.dumps({"lake": str(tmp_path / "lake"),
                               "spark": {"master": "local[2]", "server": "auto"},
                               "sources": {"shop": {"dsn": "postgresql://u@127.0.0.1/shop"}}}))
    from slotlake.config import load_config

    info = state / f"{server_key(spark_app(load_config(str(cfg)), 'shop', 'sync'))}.json"
    proc = _standin()
    try:
        info.write_text(json.dumps({"pid": proc.pid, "address": "127.0.0.1:4321", "code": code_digest()}))
        assert main(["--config", str(cfg), "spark-server", "--stop"]) == 0
        assert proc.wait(timeout=5) is not None and not info.exists()
        assert f"stopped the slotlake Spark server (pid {proc.pid})" in capsys.readouterr().out
    finally:
        proc.kill()
        proc.wait()
    assert main(["--config", str(cfg), "spark-server", "--stop"]) == 0
    assert "no slotlake Spark server started by spark.server: auto runs" in capsys.readouterr().out
