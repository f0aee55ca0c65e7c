"""A real headless Chromium for the page tests (Debian's ``chromium`` + ``chromium-driver``,
driven by Selenium), started by the tests themselves.

Without a browser the tests skip with the reason, unless ``MIA_REQUIRE_BROWSER=1`` (set by
``.ci/run``, which installs the browser): then a missing browser fails the run loudly.
``MIA_CHROMIUM`` / ``MIA_CHROMEDRIVER`` point at other binaries.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1400,1000",
)


def _missing(reason: str) -> None:
    if os.environ.get("MIA_REQUIRE_BROWSER") == "1":
        pytest.fail(f"MIA_REQUIRE_BROWSER=1 but {reason}")
    pytest.skip(reason)


def browser_paths() -> tuple[str, str]:
    """``(chromium, chromedriver)``, or skip (fail under MIA_REQUIRE_BROWSER=1)."""
    browser = (
        os.environ.get("MIA_CHROMIUM")
        or shutil.which("chromium")
        or shutil.which("chromium-browser")
    )
    driver = os.environ.get("MIA_CHROMEDRIVER") or shutil.which("chromedriver")
    if not browser:
        _missing("no chromium browser (apt-get install chromium chromium-driver)")
    if not driver:
        _missing("no chromedriver (apt-get install chromium-driver)")
    try:
        import selenium  # noqa: F401
    except ImportError:
        _missing("selenium is not installed (pip install -e '.[test]')")
    return str(browser), str(driver)


@contextlib.contextmanager
def chromium() -> Iterator[Any]:
    """A Selenium driver over a fresh headless Chromium profile; closed on exit."""
    browser, driver_path = browser_paths()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="mia-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(driver_path))
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def screenshot_dir(tmp_path: Path) -> Path:
    """Where the tests save their screenshots: ``MIA_SCREENSHOTS`` (e.g. docs/img, to refresh
    the docs' pictures), else the test's own folder."""
    out = Path(os.environ.get("MIA_SCREENSHOTS") or tmp_path / "screenshots")
    out.mkdir(parents=True, exist_ok=True)
    return out


def wait(driver: Any, condition: Any, timeout: float = 30.0) -> Any:
    """Poll ``condition`` until truthy. An element that goes stale mid-check (the page was
    replaced, e.g. by a form's answer) means "not yet", as a missing one does; Chrome reports
    some of those as a generic error, "Node with given id does not belong to the document"."""
    from selenium.common.exceptions import (
        NoSuchElementException,
        StaleElementReferenceException,
        WebDriverException,
    )
    from selenium.webdriver.support.ui import WebDriverWait

    def check(d: Any) -> Any:
        try:
            return condition(d)
        except WebDriverException as err:
            if "does not belong to the document" in str(err):
                return False
            raise

    return WebDriverWait(
        driver,
        timeout,
        poll_frequency=0.05,
        ignored_exceptions=(NoSuchElementException, StaleElementReferenceException),
    ).until(check)


def severe_logs(driver: Any) -> list[str]:
    """Console errors since the last call (each call drains the browser's log)."""
    return [e["message"] for e in driver.get_log("browser") if e.get("level") == "SEVERE"]
