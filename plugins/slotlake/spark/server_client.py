"""The client of the Spark server (`slotlake.spark_apps.server`): `run_on_server` sends one app and streams its log.

Protocol (TCP, one request per connection, JSON lines): the client sends `{"stage": ..., "argv": [...], "code":
<code_digest>}`; the server answers `{"log": line}` lines while the app runs, then `{"exit": 0, "lines": [...]}` or
`{"exit": 1, "error": line}` (`exit` 2: the server cannot take it; the caller falls back to spark-submit).
"""
from __future__ import annotations

import json
import logging
import socket
from typing import Any

from slotlake.config import host_port
from slotlake.errors import SlotlakeError
from slotlake.spark.code import code_digest

log = logging.getLogger(__name__)

SERVED_STAGES = frozenset({"decode", "merge", "sync", "snapshot", "replay"})
CONNECT_TIMEOUT_S = 5.0


def parse_address(text: str) -> tuple[str, int]:
    address = host_port(text)
    if address is None:
        raise SlotlakeError(f"{text!r} is not host:port (e.g. 127.0.0.1:7079)")
    return address


def send_message(sock: socket.socket, message: dict[str, Any]) -> None:
    sock.sendall((json.dumps(message) + "\n").encode())


def run_on_server(app) -> bool:
    """Run `app` (a `slotlake.spark.submit.SparkApp`) on the Spark server at `app.server`, streaming its output to
    the log. True: it ran (raises SlotlakeError if it failed); False: the server could not take it (not
    reachable, other code, a stage it does not serve): the caller runs it with spark-submit."""
    if app.stage not in SERVED_STAGES:
        return False
    host, port = parse_address(app.server)
    try:
        sock = socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S)
    except OSError as e:
        log.warning("no slotlake Spark server at %s (%s): running %s with spark-submit; start `slotlake "
                    "spark-server` or remove spark.server", app.server, e.strerror or e, app.name)
        return False
    with sock:
        sock.settimeout(None)  # an app runs as long as it needs
        send_message(sock, {"stage": app.stage, "argv": list(app.args), "code": code_digest()})
        log.info("running %s on the Spark server at %s", app.name, app.server)
        final: dict[str, Any] = {}
        for raw in sock.makefile("r", encoding="utf-8", errors="replace"):
            message = json.loads(raw)
            if "log" in message:
                log.info("[%s] %s", app.name, message["log"])
            else:
                final = message
                break
    code = final.get("exit")
    if code == 0:
        for line in final.get("lines", []):
            log.info("[%s] %s", app.name, line)
        log.info("%s finished on the Spark server", app.name)
        return True
    if code == 2:
        log.warning("%s: %s; running it with spark-submit", app.name, final.get("error"))
        return False
    if code is None:
        raise SlotlakeError(f"the Spark server at {app.server} closed the connection while running {app.name} "
                            "(did it stop?); run the sync again: every stage is idempotent")
    raise SlotlakeError(f"Spark app {app.name} failed on the Spark server at {app.server}: {final.get('error')}")
