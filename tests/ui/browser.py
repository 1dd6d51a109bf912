"""A real browser for the UI tests: Debian's headless Chromium driven by its chromedriver through Selenium (no
browser or driver is downloaded: both come from the `chromium` and `chromium-driver` packages scripts/setup.sh
installs), and the screenshots each test saves as artifacts.

Screenshots go to $SLOTLAKE_UI_ARTIFACTS, default `test-artifacts/ui/` at the repo root (README "Tests"), one PNG
per page a test looked at, named `<test>-<nn>-<page>.png` in the order taken.
"""
from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = Path(os.environ.get("SLOTLAKE_UI_ARTIFACTS") or ROOT / "test-artifacts" / "ui")
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"

T = TypeVar("T")


def chromium() -> Any:
    """A headless Chromium session (1400x1000) without background network traffic, extensions or first-run UI."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
        raise RuntimeError("chromium / chromedriver not found: run scripts/setup.sh (installs Debian's chromium and "
                           "chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1400,1000", "--disable-background-networking", "--disable-extensions",
                "--no-first-run", "--disable-sync", "--metrics-recording-only", "--mute-audio"):
        options.add_argument(arg)
    return webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))


def wait_for(what: str, probe: Callable[[], T | None], seconds: float = 60, every: float = 0.5) -> T:
    """Poll `probe` until it returns something truthy (its exceptions count as not yet); fail saying `what`."""
    deadline = time.monotonic() + seconds
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            got = probe()
            if got:
                return got
        except Exception as e:  # noqa: BLE001  (an element not there yet, stale, not clickable: try again)
            last = e
        time.sleep(every)
    raise AssertionError(f"timed out after {seconds:.0f} s waiting for {what}" + (f" (last error: {last!r})"
                                                                                   if last else ""))


class Screenshots:
    """Saves numbered screenshots of one test's pages under ARTIFACTS."""

    def __init__(self, driver: Any, test_name: str) -> None:
        self.driver, self.prefix, self.n = driver, test_name, 0
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        for old in ARTIFACTS.glob(f"{test_name}-*.png"):
            old.unlink()

    def __call__(self, page: str) -> Path:
        self.n += 1
        path = ARTIFACTS / f"{self.prefix}-{self.n:02d}-{page}.png"
        self.driver.save_screenshot(str(path))
        return path
