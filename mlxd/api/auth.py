"""API keys for every /v1 route, as a bearer token or in `x-api-key`
(Anthropic clients send that); /health stays open. Who is asking is read
here, once per request, as a ``Caller``.

With ``apps:`` in the registry a key is an app's: it is matched by its
sha256 against every app's (all compared, in constant time, so timing tells
neither the key nor which app it is), and the caller carries that app's
scope. ``server.api_keys`` stay admin keys and ``server.read_only_keys``
read-only ones beside the apps."""

from __future__ import annotations

import hashlib
import ipaddress
import secrets

from fastapi import Request

from mlxd.api.embeddings import paths as embedding_paths
from mlxd.caller import ANONYMOUS, NOBODY, Caller, key_name
from mlxd.errors import AuthenticationFailed, PermissionDenied
from mlxd.registry.model import AppSpec, ServerSpec

MISSING = "API key required: send 'Authorization: Bearer <key>' or 'x-api-key: <key>'"

# The route groups an app's ``routes:`` names, by path (docs/apps.md).
_GENERATION = ("/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/responses")
_EMBEDDINGS = embedding_paths.PATHS
_AUDIO = ("/v1/audio/",)


def route_group(path: str) -> str | None:
    """The group a path's route belongs to; None for the routes every key
    may read (status, the model list, its own requests) and the admin ones
    (which the admin flag guards)."""
    for group, prefixes in (("generation", _GENERATION), ("embeddings", _EMBEDDINGS), ("audio", _AUDIO)):
        if any(path == p or path.startswith(p.rstrip("/") + "/") for p in prefixes):
            return group
    return None


def check_api_key(request: Request, server: ServerSpec, apps: tuple[AppSpec, ...] | None = None) -> Caller:
    """The caller the request's key names; AuthenticationFailed without a
    valid one."""
    keys, read_only = server.api_keys, server.read_only_keys
    if not keys and not read_only and apps is None:
        return ANONYMOUS
    token = _token(request)
    if token is None:
        keyless = next((a for a in apps or () if a.key_sha256 is None), None)
        if keyless is not None and _from_loopback(request):
            return app_caller(keyless, key=None)
        raise AuthenticationFailed(MISSING)
    # Compare against every key so timing reveals neither the key nor which one matched.
    admin = read = False
    for key in keys:
        admin |= secrets.compare_digest(token.encode(), key.encode())
    for key in read_only:
        read |= secrets.compare_digest(token.encode(), key.encode())
    digest = hashlib.sha256(token.encode()).hexdigest().encode()
    found: AppSpec | None = None
    for app in apps or ():
        if secrets.compare_digest(digest, (app.key_sha256 or "-").encode()):
            found = app
    if found is not None:
        return app_caller(found, key=key_name(token))
    if not (admin or read):
        raise AuthenticationFailed("Invalid API key")
    return Caller(key=key_name(token), admin=admin)


def app_caller(app: AppSpec, key: str | None) -> Caller:
    return Caller(key=key, app=app.name, admin=app.admin, models=app.models, routes=app.routes, priority=app.priority)


def check_route(caller: Caller, path: str) -> None:
    """PermissionDenied for a route outside the caller's ``routes:``."""
    group = route_group(path)
    if not caller.may_call(group):
        allowed = ", ".join(caller.routes) or "none"
        raise PermissionDenied(f"App `{caller.app}` may not call {group} routes (its routes: {allowed})")


def _token(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        token = request.headers.get("x-api-key", "")
    return token.strip() or None


def _from_loopback(request: Request) -> bool:
    host = request.client.host if request.client else ""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def caller_of(request: Request) -> Caller:
    """The caller the gatekeeper found for this request."""
    return getattr(request.state, "caller", NOBODY)


def require_admin(request: Request) -> Caller:
    caller = caller_of(request)
    if not caller.admin:
        who = f"app `{caller.app}`" if caller.app else "this key"
        raise PermissionDenied(f"This action needs an admin key; {who} may generate and read status only")
    return caller
