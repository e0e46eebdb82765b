"""Who may read what: keys guard /v1/status, /metrics and /openapi.json; /health and the
dashboard page stay open and give nothing away; metrics can be switched off."""

from __future__ import annotations

import re

import httpx
import pytest
from support.daemon import daemon_in_thread, write_registry

import mlxd

KEY = "sk-monitoring-test-0123456789"


@pytest.fixture(scope="module")
def keyed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("keyed")
    registry = write_registry(tmp, [{"name": "secret-project-model", "model": "qwen"}])
    with daemon_in_thread(registry, tmp, api_keys=KEY) as d:
        yield d


@pytest.mark.parametrize("path", ["/v1/status", "/metrics"])
def test_status_and_metrics_need_the_key_when_keys_are_set(keyed, path):
    assert httpx.get(keyed.url + path).status_code == 401
    assert httpx.get(keyed.url + path, headers={"Authorization": "Bearer wrong"}).status_code == 401
    answer = httpx.get(keyed.url + path, headers={"Authorization": f"Bearer {KEY}"})
    assert answer.status_code == 200
    assert "secret-project-model" in answer.text
    assert KEY not in answer.text


def test_the_api_schema_needs_the_key_and_no_docs_page_is_served(keyed):
    # It lists every route and field: a map for whoever probes the daemon.
    assert httpx.get(keyed.url + "/openapi.json").status_code == 401  # on the old code: 200
    answer = httpx.get(keyed.url + "/openapi.json", headers={"Authorization": f"Bearer {KEY}"})
    assert answer.status_code == 200 and "/v1/chat/completions" in answer.json()["paths"]
    for page in ("/docs", "/redoc"):
        assert httpx.get(keyed.url + page).status_code == 404


def test_status_says_auth_is_required_without_showing_a_key(keyed):
    doc = httpx.get(keyed.url + "/v1/status", headers={"Authorization": f"Bearer {KEY}"}).json()
    assert doc["daemon"]["auth_required"] is True
    assert KEY not in str(doc)


def test_health_is_open_and_gives_nothing_away(keyed):
    answer = httpx.get(keyed.url + "/health")
    assert answer.status_code == 200
    assert answer.json()["status"] == "ok" and answer.json()["reasons"] == []
    assert answer.headers["cache-control"] == "no-store"
    for secret in (KEY, "secret-project-model", "models.yaml", "/tmp"):
        assert secret not in answer.text


@pytest.mark.parametrize("path", ["/", "/dashboard"])
def test_the_dashboard_page_is_open_self_contained_and_holds_no_data(keyed, path):
    answer = httpx.get(keyed.url + path, headers={"Accept": "text/html,application/xhtml+xml"})
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/html")
    page = answer.text
    assert "<title>mlxd</title>" in page
    assert "secret-project-model" not in page and KEY not in page
    # No external assets: no src/href attributes, CSS imports or url() fetches.
    assert not re.search(r"\b(src|href)\s*=", page)
    assert "@import" not in page and "url(" not in page
    assert "sessionStorage" in page and 'new URL("v1/status"' in page


def test_root_without_a_browser_gets_a_pointer_in_json(keyed):
    answer = httpx.get(keyed.url + "/")
    assert answer.json() == {"name": "mlxd", "version": mlxd.__version__, "status": "/v1/status",
                             "dashboard": "/dashboard"}


def test_metrics_can_be_switched_off(tmp_path):
    registry = write_registry(tmp_path, [{"name": "a", "model": "qwen"}])
    with daemon_in_thread(registry, tmp_path, metrics=False) as d:
        answer = httpx.get(d.url + "/metrics")
        assert answer.status_code == 404
        assert answer.json()["error"]["code"] == "metrics_disabled"
        assert d.status()["daemon"]["metrics_enabled"] is False
