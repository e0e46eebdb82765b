"""A small client for the CLI's commands that talk to a running daemon."""

from __future__ import annotations

import os
from typing import Any

import httpx

from mlxd.errors import MlxdError, ServiceUnavailable


class DaemonClient:
    def __init__(self, base_url: str, api_key: str | None = None, timeout: float = 600.0) -> None:
        # `--url localhost:8080` (how the daemon prints its address without
        # the scheme) was refused as "an unsupported protocol 'localhost://'".
        if "://" not in base_url:
            base_url = f"http://{base_url}"
        self.base_url = base_url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._timeout = timeout
        # Made at the first request, where a URL httpx cannot take is one line like any failure to reach.
        self._http: httpx.Client | None = None

    @classmethod
    def discover(
        cls,
        url: str | None = None,
        api_key: str | None = None,
        *,
        config: str | os.PathLike[str] | None = None,
        timeout: float = 600.0,
    ) -> DaemonClient:
        """The daemon the same settings as ``mlxd serve`` would start
        (``config`` is what ``serve --config`` was given, if anything)."""
        if url is None:
            host = os.environ.get("MLXD_HOST")
            port = os.environ.get("MLXD_PORT")
            config = config or os.environ.get("MLXD_CONFIG")
            if (host is None or port is None) and config:
                server = _server_section(str(config))
                host = host or server.get("host")
                port = port or server.get("port")
            host = str(host or "127.0.0.1")
            if host in ("0.0.0.0", "::"):
                host = "127.0.0.1"
            if ":" in host and not host.startswith("["):
                host = f"[{host}]"  # an IPv6 address, as a URL writes it
            url = f"http://{host}:{port or 8080}"
        if api_key is None:
            keys = os.environ.get("MLXD_API_KEYS", "")
            api_key = keys.split(",")[0].strip() or None
        return cls(url, api_key, timeout=timeout)

    def request(self, method: str, path: str, **kw: Any) -> Any:
        try:
            if self._http is None:
                self._http = httpx.Client(base_url=self.base_url, headers=self._headers, timeout=self._timeout)
            response = self._http.request(method, path, **kw)
        except (httpx.InvalidURL, httpx.UnsupportedProtocol) as exc:
            raise _bad_url(self.base_url, exc) from None
        except httpx.ConnectError:
            raise ServiceUnavailable(f"no mlxd is running at {self.base_url}") from None
        except httpx.HTTPError as exc:
            raise ServiceUnavailable(f"could not reach mlxd at {self.base_url}: {exc}") from None
        if response.status_code >= 400:
            try:
                message = response.json()["error"]["message"]
            except (ValueError, KeyError, TypeError):
                # Not mlxd's error body (another server on that port): one line, not its HTML page.
                kind = response.headers.get("content-type", "no content type").split(";")[0]
                message = f"{self.base_url} answered, but not as mlxd does ({kind})"
            # Every command reaches the daemon through here: each says how to give a key.
            hint = " (pass --api-key or set MLXD_API_KEY)" if response.status_code == 401 else ""
            error = MlxdError(f"{response.status_code}: {message}{hint}")
            error.status_code = response.status_code
            raise error
        return response.json()

    def get(self, path: str) -> Any:
        return self.request("GET", path)

    def post(self, path: str, **kw: Any) -> Any:
        # The daemon's admin routes take JSON only (mlxd.api.routes.admin).
        kw.setdefault("json", {})
        return self.request("POST", path, **kw)


def _server_section(config: str) -> dict[str, Any]:
    try:
        import yaml

        with open(config, encoding="utf-8") as handle:
            data = yaml.safe_load(handle) or {}
        server = data.get("server") or {} if isinstance(data, dict) else {}
        return server if isinstance(server, dict) else {}
    except (OSError, ValueError, yaml.YAMLError):
        # Its address is then the default; `mlxd check` says what is wrong with the file.
        return {}


def _bad_url(url: str, exc: Exception) -> MlxdError:
    return MlxdError(f"{url} is not a URL mlxd can be reached at ({exc}); give one like http://127.0.0.1:8080")
