"""API keys for every /v1 route, as a bearer token or in `x-api-key`
(Anthropic clients send that); /health stays open."""

from __future__ import annotations

import secrets

from fastapi import Request

from mlxd.caller import ANONYMOUS, Caller, key_name
from mlxd.errors import AuthenticationFailed


def check_api_key(request: Request, keys: tuple[str, ...]) -> Caller:
    """The caller the request's key names; AuthenticationFailed without a valid one."""
    if not keys:
        return ANONYMOUS
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        token = request.headers.get("x-api-key", "")
        if not token:
            raise AuthenticationFailed("API key required: send 'Authorization: Bearer <key>' or 'x-api-key: <key>'")
    token = token.strip()
    # Compare against every key so timing reveals neither the key nor which one matched.
    matched: int | None = None
    for index, key in enumerate(keys):
        if secrets.compare_digest(token.encode(), key.encode()) and matched is None:
            matched = index
    if matched is None:
        raise AuthenticationFailed("Invalid API key")
    return Caller(key=key_name(matched))


def caller_of(request: Request) -> Caller:
    """The caller the gatekeeper found for ``request`` (anonymous on a path it does not check)."""
    return getattr(request.state, "caller", ANONYMOUS)
