"""API keys for every /v1 route, as a bearer token or in `x-api-key`
(Anthropic clients send that); /health stays open."""

from __future__ import annotations

import secrets

from fastapi import Request

from mlxd.errors import AuthenticationFailed


def check_api_key(request: Request, keys: tuple[str, ...]) -> None:
    if not keys:
        return
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        token = request.headers.get("x-api-key", "")
        if not token:
            raise AuthenticationFailed("API key required: send 'Authorization: Bearer <key>' or 'x-api-key: <key>'")
    token = token.strip()
    # Compare against every key so timing reveals neither the key nor which one matched.
    matched = False
    for key in keys:
        matched |= secrets.compare_digest(token.encode(), key.encode())
    if not matched:
        raise AuthenticationFailed("Invalid API key")
