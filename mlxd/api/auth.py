"""API keys for every /v1 route, as a bearer token or in `x-api-key`
(Anthropic clients send that); /health stays open. Who is asking is read
here, once per request, as a ``Caller``."""

from __future__ import annotations

import secrets

from fastapi import Request

from mlxd.caller import ANONYMOUS, NOBODY, Caller, key_name
from mlxd.errors import AuthenticationFailed, PermissionDenied
from mlxd.registry.model import ServerSpec


def check_api_key(request: Request, server: ServerSpec) -> Caller:
    """The caller the request's key names (``server.api_keys`` are admin
    keys, ``server.read_only_keys`` are not); AuthenticationFailed without a
    valid one."""
    keys, read_only = server.api_keys, server.read_only_keys
    if not keys and not read_only:
        return ANONYMOUS
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        token = request.headers.get("x-api-key", "")
        if not token:
            raise AuthenticationFailed("API key required: send 'Authorization: Bearer <key>' or 'x-api-key: <key>'")
    token = token.strip()
    # Compare against every key so timing reveals neither the key nor which one matched.
    admin = read = False
    for key in keys:
        admin |= secrets.compare_digest(token.encode(), key.encode())
    for key in read_only:
        read |= secrets.compare_digest(token.encode(), key.encode())
    if not (admin or read):
        raise AuthenticationFailed("Invalid API key")
    return Caller(key=key_name(token), admin=admin)


def caller_of(request: Request) -> Caller:
    """The caller the gatekeeper found for this request."""
    return getattr(request.state, "caller", NOBODY)


def require_admin(request: Request) -> Caller:
    caller = caller_of(request)
    if not caller.admin:
        raise PermissionDenied("This action needs an admin key; this key may generate and read status only")
    return caller
