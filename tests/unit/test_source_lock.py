"""The run lock's pure parts: the holder's name and the one-line error (the lock itself: tests/integration)."""
from __future__ import annotations

import os
import socket
from datetime import UTC, datetime

import pytest

from slotlake.config import parse_config
from slotlake.source.lock import LockHolder, busy_message, holder_name

pytestmark = pytest.mark.unit

SHOP = parse_config({"lake": "/tmp/lake", "sources": {"shop": {"dsn": "postgresql://u@h/db"}}}).source("shop")


def test_holder_name_says_what_runs_where_within_postgres_limit():
    name = holder_name("sync", "shop")
    assert name.startswith(f"slotlake sync shop pid {os.getpid()} on ")
    assert socket.gethostname()[:10] in name and len(name) <= 63
    assert len(holder_name("sync", "s" * 41)) == 63


def test_busy_message_is_one_line_naming_holder_and_fix():
    holder = LockHolder(what="slotlake sync shop pid 1234 on host-a",
                        since=datetime(2026, 11, 23, 11, 50, 2, tzinfo=UTC), backend_pid=777)
    msg = busy_message(SHOP, holder, 12.4)
    assert msg == ("source shop is being synced by another run: slotlake sync shop pid 1234 on host-a (backend pid "
                   "777, since 2026-11-23T11:50:02+00:00); waited 12 s; wait for it to finish and run again, or "
                   "raise sources.shop.lock_timeout_s to wait longer")
    assert "waited" not in busy_message(SHOP, holder, 0.0)  # lock_timeout_s: 0 fails at once
    assert "\n" not in busy_message(SHOP, None, 0.0)
