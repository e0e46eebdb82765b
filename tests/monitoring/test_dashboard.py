"""The dashboard in a real headless Chromium (Debian's chromium and
chromium-driver, driven by selenium): it asks for the key once, renders the
models of a running daemon and follows a load as it happens. A screenshot is
saved under test-artifacts/ for a human to look at."""

from __future__ import annotations

import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from monitoring.monitoring_support import chat, corrupt_model
from support.daemon import daemon_in_thread, write_registry

pytestmark = pytest.mark.mlx

KEY = "sk-dashboard-test"
AUTH = {"Authorization": f"Bearer {KEY}"}
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1280,1000",
)


def _require(program: str) -> str:
    path = shutil.which(program)
    if path is None:
        pytest.fail(
            f"`{program}` is not installed: the dashboard test needs a real Chromium. "
            "Run scripts/setup.sh, or: sudo apt-get install -y chromium chromium-driver",
            pytrace=False,
        )
    return path


@pytest.fixture
def browser() -> Iterator[object]:
    chromium, driver_path = _require("chromium"), _require("chromedriver")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.fail("selenium is not installed: pip install -e '.[test]' (or run scripts/setup.sh)", pytrace=False)

    profile = tempfile.mkdtemp(prefix="mlxd-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    # An explicit driver path keeps Selenium Manager from going online.
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture
def daemon(tmp_path):
    registry = write_registry(
        tmp_path,
        [
            {"name": "qwen", "model": "qwen", "aliases": ["default"], "idle_unload_seconds": 600},
            # Prompt lookup needs no weights of its own: the page says whether it speculates.
            {"name": "llama", "model": "llama", "speculative": {"method": "prompt_lookup"}},
            {"name": "<b>broken</b>", "path": str(corrupt_model(tmp_path))},
        ],
    )
    with daemon_in_thread(registry, tmp_path, api_keys=KEY) as d:
        yield d


# The page re-renders every second, so elements go stale between a find and
# a read: each helper reads what it needs in one script run instead.
ROWS_JS = """
return Array.from(document.querySelectorAll('#models tr[data-model]')).map(row => ({
  name: row.dataset.model,
  state: row.querySelector('.badge.state').textContent,
  leases: row.querySelector('td.leases').textContent,
  idle: row.querySelector('td.idle').textContent,
  memory: row.querySelector('td.memory').textContent,
  markup: row.querySelectorAll('b').length,
  speculation: row.querySelector('.badge.spec') && [row.querySelector('.badge.spec').textContent,
                                                    row.querySelector('.badge.spec').title],
}));
"""


def _rows(driver) -> dict[str, dict[str, str]]:
    return {row["name"]: row for row in driver.execute_script(ROWS_JS)}


def _segments(driver) -> list[str]:
    return driver.execute_script(
        "return Array.from(document.querySelectorAll('#memory-bar .segment')).map(s => s.dataset.model);"
    )


def _events(driver) -> list[str]:
    return driver.execute_script("return Array.from(document.querySelectorAll('#events li')).map(e => e.textContent);")


def _wait(driver, condition, timeout: float = 20.0):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.1).until(lambda d: condition(d))


def test_dashboard_asks_for_the_key_once_renders_models_and_follows_a_load(daemon, browser):
    from selenium.webdriver.common.by import By

    assert chat(daemon, "qwen", headers=AUTH).status_code == 200
    assert chat(daemon, "<b>broken</b>", headers=AUTH).status_code == 503
    browser.get(f"{daemon.url}/?interval=300")

    # No key yet: the page asks for one, and shows no model.
    _wait(browser, lambda d: d.find_element(By.ID, "key-form").is_displayed())
    assert _rows(browser) == {}
    browser.find_element(By.ID, "key-input").send_keys(KEY)
    browser.find_element(By.ID, "key-submit").click()

    rows = _wait(browser, lambda d: _rows(d) if len(_rows(d)) == 3 else None)
    assert not browser.find_element(By.ID, "key-form").is_displayed()
    assert rows["qwen"]["state"] == "loaded" and rows["qwen"]["idle"].startswith(("in 10 min", "in 9 min"))
    assert rows["llama"]["state"] == "unloaded" and re.fullmatch(r"[\d.]+ MB estimated", rows["llama"]["memory"])
    assert re.fullmatch(r"[\d.]+ MB reserved[\d.]+ MB measured", rows["qwen"]["memory"]), rows["qwen"]["memory"]
    # A name is data, never markup.
    assert rows["<b>broken</b>"]["state"] == "failed" and rows["<b>broken</b>"]["markup"] == 0
    problems = browser.find_element(By.ID, "problems")
    assert problems.is_displayed() and "failed to load" in problems.text
    assert _segments(browser) == ["qwen"]

    # A load made elsewhere shows up without touching the page.
    assert httpx.post(f"{daemon.url}/v1/models/llama/load", json={}, headers=AUTH, timeout=60).status_code == 200
    _wait(browser, lambda d: _rows(d)["llama"]["state"] == "loaded")
    # Its speculation, which status has (on hover: method and K), and none on a model without it.
    speculation = _wait(browser, lambda d: _rows(d)["llama"]["speculation"])
    status = httpx.get(f"{daemon.url}/v1/status", headers=AUTH, timeout=30).json()
    active = next(m for m in status["models"] if m["name"] == "llama")["speculative"]["active"]
    assert speculation[0] == ("speculating" if active else "speculation off"), speculation
    assert speculation[1].startswith("prompt_lookup K=4"), speculation
    assert _rows(browser)["qwen"]["speculation"] is None
    _wait(browser, lambda d: _segments(d) == ["qwen", "llama"])
    events = _events(browser)
    assert "loaded llama in" in events[0], "newest event first"
    assert any("load of <b>broken</b> failed" in e for e in events)

    # The countdown ticks between polls (the page re-renders every second).
    first = _rows(browser)["qwen"]["idle"]
    _wait(browser, lambda d: _rows(d)["qwen"]["idle"] != first, timeout=5)

    ARTIFACTS.mkdir(exist_ok=True)
    browser.save_screenshot(str(ARTIFACTS / "dashboard.png"))

    # The key lives in the tab's session storage: a reload does not ask again.
    assert browser.execute_script("return sessionStorage.getItem('mlxd.apiKey')") == KEY
    browser.refresh()
    _wait(browser, lambda d: len(_rows(d)) == 3)
    assert not browser.find_element(By.ID, "key-form").is_displayed()


def test_a_rejected_key_is_forgotten_and_asked_again(daemon, browser):
    from selenium.webdriver.common.by import By

    browser.get(f"{daemon.url}/dashboard?interval=300")
    _wait(browser, lambda d: d.find_element(By.ID, "key-form").is_displayed())
    browser.find_element(By.ID, "key-input").send_keys("not-the-key")
    browser.find_element(By.ID, "key-submit").click()
    _wait(browser, lambda d: "rejected" in d.find_element(By.ID, "key-message").text)
    assert browser.execute_script("return sessionStorage.getItem('mlxd.apiKey')") is None
    assert _rows(browser) == {}
