"""The dashboard's operator views in a real headless Chromium: the activity
table, the history charts, and the actions an admin key may take (a
read-only key may not)."""

from __future__ import annotations

import hashlib
import time

import httpx
import pytest
from monitoring.monitoring_support import chat
from monitoring.test_dashboard import ARTIFACTS as ARTIFACTS_DIR
from monitoring.test_dashboard import _wait, browser  # noqa: F401  (the fixture)
from support.daemon import daemon_in_thread, write_registry

pytestmark = pytest.mark.mlx

ADMIN = "sk-dashboard-admin"
READER = "sk-dashboard-reader"
AS_ADMIN = {"Authorization": f"Bearer {ADMIN}"}


@pytest.fixture
def daemon(tmp_path):
    registry = write_registry(
        tmp_path,
        [{"name": "qwen", "model": "qwen", "idle_unload_seconds": 600}, {"name": "llama", "model": "llama"}],
        server={"read_only_keys": [READER]},
    )
    # Samples twice a second, so the charts fill within the test.
    with daemon_in_thread(registry, tmp_path, api_keys=ADMIN, history_step_seconds=0.5) as d:
        yield d


def _open(browser, daemon, key: str, interval: int = 1000) -> None:
    browser.get(f"{daemon.url}/?interval={interval}")
    browser.execute_script("sessionStorage.setItem('mlxd.apiKey', arguments[0])", key)
    browser.refresh()


ACTIVITY_JS = """
return Array.from(document.querySelectorAll('#activity tr[data-request-id]')).map(row => ({
  id: row.dataset.requestId,
  model: row.querySelector('td.model').textContent,
  status: row.querySelector('td.status').textContent,
  out: row.querySelector('td.tokens-out').textContent,
  finish: row.querySelector('td.finish').textContent,
}));
"""


def test_the_activity_table_shows_a_request_within_two_seconds_of_its_end(daemon, browser):
    _open(browser, daemon, ADMIN)
    _wait(browser, lambda d: d.execute_script("return document.querySelectorAll('#models tr[data-model]').length") == 2)
    answer = chat(daemon, "qwen", max_tokens=5, headers={**AS_ADMIN, "X-Request-Id": "seen-in-page"})
    ended = time.monotonic()
    assert answer.status_code == 200
    rows = _wait(browser, lambda d: [r for r in d.execute_script(ACTIVITY_JS) if r["id"] == "seen-in-page"], timeout=10)
    assert time.monotonic() - ended < 2.0
    assert rows[0]["model"] == "qwen" and rows[0]["status"] == "200"
    assert rows[0]["out"] == str(answer.json()["usage"]["completion_tokens"])

    # Filters: errors only hides it; a failed request shows there.
    from selenium.webdriver.support.ui import Select

    too_long = httpx.post(f"{daemon.url}/v1/completions", headers={**AS_ADMIN, "X-Request-Id": "too-long"},
                          json={"model": "qwen", "prompt": "alpha beta gamma delta " * 3000, "max_tokens": 2})
    assert too_long.status_code == 400
    Select(browser.find_element("id", "activity-status")).select_by_value("errors")
    failed = _wait(browser, lambda d: [r for r in d.execute_script(ACTIVITY_JS) if r["id"] == "too-long"] and
                   d.execute_script(ACTIVITY_JS))
    assert [r["id"] for r in failed] == ["too-long"] and "4096" in failed[0]["finish"]
    Select(browser.find_element("id", "activity-status")).select_by_value("")
    Select(browser.find_element("id", "activity-model")).select_by_visible_text("llama")
    _wait(browser, lambda d: d.execute_script(ACTIVITY_JS) == [])


CHART_JS = """
const out = {};
for (const path of document.querySelectorAll('.chart path[data-series]')) {
  out[path.closest('.chart').id + '/' + path.dataset.series] = Number(path.dataset.points);
}
return out;
"""


def test_the_history_charts_draw_the_traffic(daemon, browser):
    _open(browser, daemon, ADMIN, interval=500)
    for _ in range(3):  # the same prompt again: the prefix cache serves its start
        assert chat(daemon, "qwen", max_tokens=24, headers=AS_ADMIN, temperature=0).status_code == 200
    points = _wait(browser, lambda d: (p := d.execute_script(CHART_JS)).get("chart-rate/qwen", 0) >= 1
                   and p.get("chart-ttft/qwen", 0) >= 1 and p.get("chart-cache/qwen", 0) >= 2
                   and p.get("chart-memory/committed", 0) >= 2 and p)
    assert points.get("chart-queue/qwen", 0) >= 2 and points.get("chart-memory/budget", 0) >= 2
    assert "chart-rate/llama" in points, "every model has its line, drawn or not"
    # The scale follows the data: the rate chart's top label is a real rate.
    top = browser.execute_script("return document.querySelector('#chart-rate svg text').textContent")
    assert top.endswith("tok/s") and float(top.split()[0]) > 0
    browser.find_element("css selector", "#ranges button[data-range='300']").click()
    _wait(browser, lambda d: d.execute_script(CHART_JS).get("chart-rate/qwen", 0) >= 1)
    ARTIFACTS_DIR.mkdir(exist_ok=True)
    browser.save_screenshot(str(ARTIFACTS_DIR / "dashboard-history.png"))


def _status_of(daemon, model: str) -> dict:
    models = httpx.get(f"{daemon.url}/v1/status", headers=AS_ADMIN).json()["models"]
    return next(m for m in models if m["name"] == model)


def _click(browser, selector: str, accept: bool = True) -> None:
    """Click an action button and answer its confirmation. (The page
    re-renders every second: a button found may be gone when clicked.)"""
    from selenium.common.exceptions import StaleElementReferenceException

    for _ in range(10):
        try:
            browser.find_element("css selector", selector).click()
            break
        except StaleElementReferenceException:
            continue
    alert = _wait(browser, lambda d: d.switch_to.alert, timeout=5)
    alert.accept() if accept else alert.dismiss()


def _result(browser) -> str:
    return browser.execute_script("return document.getElementById('action-result').textContent")


def _state(browser, model: str) -> str:
    return browser.execute_script(
        "const r = document.querySelector(`#models tr[data-model='${arguments[0]}'] .badge.state`);"
        "return r ? r.textContent : null;", model)


def test_an_admin_key_acts_from_the_dashboard_with_a_confirmation_and_sees_the_result(daemon, browser):
    assert chat(daemon, "qwen", headers=AS_ADMIN).status_code == 200
    _open(browser, daemon, ADMIN, interval=500)
    _wait(browser, lambda d: _state(d, "qwen") == "loaded")
    qwen = "#models tr[data-model='qwen'] button"

    # Dismissed: nothing happens.
    _click(browser, qwen + "[data-action='unload']", accept=False)
    time.sleep(1)
    assert _state(browser, "qwen") == "loaded" and _status_of(daemon, "qwen")["state"] == "loaded"

    _click(browser, qwen + "[data-action='pin']")
    _wait(browser, lambda d: "Done" in _result(d) and '"pinned":true' in _result(d))
    assert _status_of(daemon, "qwen")["pinned"] is True
    _wait(browser, lambda d: d.find_elements("css selector", qwen + "[data-action='unpin']"))
    _click(browser, qwen + "[data-action='unpin']")
    _wait(browser, lambda d: '"pinned":false' in _result(d))

    _click(browser, qwen + "[data-action='clear-cache']")
    _wait(browser, lambda d: '"status":"cleared"' in _result(d))

    _click(browser, qwen + "[data-action='unload']")
    _wait(browser, lambda d: _state(d, "qwen") == "unloaded")
    assert "Done" in _result(browser)
    _wait(browser, lambda d: d.find_elements("css selector", qwen + "[data-action='load']"))
    _click(browser, qwen + "[data-action='load']")
    _wait(browser, lambda d: _state(d, "qwen") == "loaded")


def test_an_admin_cancels_a_running_request_from_the_dashboard(daemon, browser):
    import threading

    outcome: dict = {}

    def stream() -> None:
        body = {"model": "llama", "messages": [{"role": "user", "content": "Count"}], "max_tokens": 4000,
                "stream": True, "ignore_eos": True}
        with httpx.stream("POST", f"{daemon.url}/v1/chat/completions", json=body,
                          headers={**AS_ADMIN, "X-Request-Id": "long-one"}, timeout=120) as r:
            outcome["lines"] = [line for line in r.iter_lines() if line]

    reader = threading.Thread(target=stream)
    reader.start()
    _open(browser, daemon, ADMIN, interval=500)
    _wait(browser, lambda d: d.find_elements("css selector", "#requests tr[data-request-id='long-one'] button"), timeout=30)
    _click(browser, "#requests tr[data-request-id='long-one'] button[data-action='cancel']")
    reader.join(timeout=20)
    assert not reader.is_alive() and outcome["lines"][-1] == "data: [DONE]"
    _wait(browser, lambda d: '"cancelled":true' in _result(d))
    _wait(browser, lambda d: not d.find_elements("css selector", "#requests tr[data-request-id='long-one']"))


def test_a_read_only_key_gets_no_actions_and_the_daemon_refuses_them(daemon, browser):
    assert chat(daemon, "qwen", headers=AS_ADMIN).status_code == 200
    _open(browser, daemon, READER, interval=500)
    _wait(browser, lambda d: _state(d, "qwen") == "loaded")
    time.sleep(1)  # a few refreshes: still no buttons
    assert browser.find_elements("css selector", "#models button") == []
    assert not browser.find_element("css selector", "th.admin-only").is_displayed()
    # The page's own request, sent anyway, is refused: the daemon decides, not the page.
    status = browser.execute_async_script("""
        const done = arguments[arguments.length - 1];
        fetch('/v1/models/qwen/unload', {method: 'POST', body: '{}', headers: {
          'Content-Type': 'application/json', 'Authorization': 'Bearer ' + sessionStorage.getItem('mlxd.apiKey')}})
          .then(r => done(r.status));
    """)
    assert status == 403
    assert _status_of(daemon, "qwen")["state"] == "loaded"


def test_capture_shows_why_a_diverged_prompt_missed_the_cache(daemon, browser):
    _open(browser, daemon, ADMIN, interval=500)
    _wait(browser, lambda d: d.find_element("id", "capture-section").is_displayed())
    browser.find_element("id", "capture-all").click()
    _wait(browser, lambda d: d.switch_to.alert, timeout=5).accept()
    _wait(browser, lambda d: '"all_models":true' in _result(d))

    def ask(day: str, request_id: str) -> None:
        messages = [{"role": "system", "content": f"You are a careful assistant. Today is {day}. Answer briefly."},
                    {"role": "user", "content": "Read the configuration file and report the errors"}]
        answer = httpx.post(f"{daemon.url}/v1/chat/completions", headers={**AS_ADMIN, "X-Request-Id": request_id},
                            json={"model": "qwen", "messages": messages, "max_tokens": 6, "temperature": 0}, timeout=60)
        assert answer.status_code == 200

    ask("Monday", "monday-turn")
    ask("Tuesday", "tuesday-turn")
    row = "#captures tr[data-request-id='tuesday-turn']"
    _wait(browser, lambda d: d.find_elements("css selector", row))
    for _ in range(10):  # the table re-renders under the click now and then
        try:
            browser.find_element("css selector", row).click()
            break
        except Exception:
            continue
    _wait(browser, lambda d: d.find_element("id", "capture-detail").is_displayed())
    assert browser.find_element("id", "capture-reason").text == "diverged:"
    assert "parts from entry" in browser.find_element("id", "capture-explanation").text
    assert "Tuesday" in browser.find_element("id", "capture-prompt-text").text
    assert "Monday" in browser.find_element("id", "capture-entry-text").text
    ARTIFACTS_DIR.mkdir(exist_ok=True)
    browser.save_screenshot(str(ARTIFACTS_DIR / "dashboard-capture.png"))


OPS, BATCH = "sk-dashboard-ops", "sk-dashboard-batch"


@pytest.fixture
def apps_daemon(tmp_path):
    registry = write_registry(tmp_path, [{"name": "qwen", "model": "qwen", "idle_unload_seconds": 600}])
    registry.write_text(registry.read_text() + (
        "apps:\n"
        f"  - {{name: ops, key_sha256: {hashlib.sha256(OPS.encode()).hexdigest()}, admin: true}}\n"
        f"  - {{name: batch, key_sha256: {hashlib.sha256(BATCH.encode()).hexdigest()}, priority: bulk, rpm: 2}}\n"
    ))
    with daemon_in_thread(registry, tmp_path) as d:
        yield d


APPS_JS = """
return Array.from(document.querySelectorAll('#apps tr[data-app]')).map(row => ({
  app: row.dataset.app,
  running: row.querySelector('td.running').textContent,
  limits: row.querySelector('td.limits').textContent,
  requests: row.querySelector('td.requests').textContent,
  tokens_out: row.querySelector('td.tokens-out').textContent,
}));
"""


def test_the_page_shows_each_apps_use_and_limits_and_why_a_model_left_memory(apps_daemon, browser):
    """"Which app is using what?" and "why is this model not loaded?" on the page itself."""
    as_batch = {"Authorization": f"Bearer {BATCH}"}
    for _ in range(2):
        assert chat(apps_daemon, "qwen", max_tokens=3, headers=as_batch).status_code == 200
    assert chat(apps_daemon, "qwen", max_tokens=3, headers=as_batch).status_code == 429
    unload = httpx.post(f"{apps_daemon.url}/v1/models/qwen/unload", json={}, headers={"Authorization": f"Bearer {OPS}"})
    assert unload.status_code == 200
    _open(browser, apps_daemon, OPS)
    rows = _wait(browser, lambda d: {r["app"]: r for r in d.execute_script(APPS_JS)} or None, timeout=10)
    assert rows["batch"]["running"] == "0" and rows["batch"]["requests"] == "3" and rows["batch"]["tokens_out"] == "6"
    assert rows["batch"]["limits"].startswith("rpm 0 / 2 (room in"), rows["batch"]["limits"]
    assert rows["ops"]["limits"] == "none"
    idle = _wait(browser, lambda d: d.execute_script(
        "const c = document.querySelector('#models tr[data-model=\"qwen\"] td.idle'); return c && [c.textContent, c.title];"))
    assert idle[0] == "operator" and "unloaded by operator" in idle[1]
