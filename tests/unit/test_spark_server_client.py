"""The Spark server client's decisions that need no Spark: the address format, and that an app goes to
spark-submit (False) when nothing listens or when the server does not serve its stage."""
from __future__ import annotations

import logging
import socket

import pytest

from slotlake.errors import SlotlakeError
from slotlake.spark.server_client import SERVED_STAGES, parse_address, run_on_server
from slotlake.spark.submit import SparkApp

pytestmark = pytest.mark.unit


def _app(stage: str, server: str) -> SparkApp:
    return SparkApp(name=f"slotlake-{stage}-shop", application=f"spark_apps/{stage}.py",
                    args=("--config", "c.yaml", "--source", "shop"), master="local[1]", conf={}, ship_code=False,
                    stage=stage, server=server)


def test_parse_address():
    assert parse_address("127.0.0.1:7079") == ("127.0.0.1", 7079)
    assert parse_address(" spark-driver.internal:15000 ") == ("spark-driver.internal", 15000)
    for bad in ("7079", "host:", "host:0", "host:70000", ":7079"):
        with pytest.raises(SlotlakeError, match="is not host:port"):
            parse_address(bad)


def test_nothing_listening_means_spark_submit_with_a_warning(caplog):
    with socket.socket() as s:  # a port that was free a moment ago and has no listener
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with caplog.at_level(logging.WARNING):
        assert run_on_server(_app("sync", f"127.0.0.1:{port}")) is False
    assert f"no slotlake Spark server at 127.0.0.1:{port}" in caplog.text and "spark-submit" in caplog.text


def test_recover_is_never_sent_to_the_server():
    assert "recover" not in SERVED_STAGES  # its destination password lives in the caller's environment
    with socket.socket() as listener:  # even with a server listening, recover is not sent there
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        listener.settimeout(0.5)
        assert run_on_server(_app("recover", f"127.0.0.1:{listener.getsockname()[1]}")) is False
        with pytest.raises(socket.timeout):
            listener.accept()
