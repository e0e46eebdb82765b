"""API keys for every /v1 route, as a bearer token or in `x-api-key`
(Anthropic clients send that); /health stays open. Who is asking is read
here, once per request, as a ``Caller``."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass

from fastapi import Request

from mlxd.errors import AuthenticationFailed, PermissionDenied
from mlxd.registry.model import ServerSpec


@dataclass(frozen=True)
class Caller:
    """Who sent a request. ``name`` is what logs and the activity log show:
    never the key itself, a short hash of it ("local" without keys)."""

    name: str
    admin: bool


# No key configured: whoever reaches the daemon (loopback, by default) owns it.
LOCAL = Caller("local", admin=True)
# Routes the gatekeeper does not check (the page, /health) have no caller.
NOBODY = Caller("anonymous", admin=False)


def key_name(key: str) -> str:
    return "key:" + hashlib.sha256(key.encode()).hexdigest()[:8]


def check_api_key(request: Request, server: ServerSpec) -> Caller:
    keys, read_only = server.api_keys, server.read_only_keys
    if not keys and not read_only:
        return LOCAL
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
    return Caller(key_name(token), admin=admin)


def caller_of(request: Request) -> Caller:
    """The caller the gatekeeper found for this request."""
    return getattr(request.state, "caller", NOBODY)


def require_admin(request: Request) -> Caller:
    caller = caller_of(request)
    if not caller.admin:
        raise PermissionDenied("This action needs an admin key; this key may generate and read status only")
    return caller
