"""``mlxd status``: the /v1/status document as a terminal table, as JSON for
scripts, or refreshed in place with ``--watch``.

Failures are one line on stderr and exit status 1: no daemon, a rejected key,
an unexpected answer. Never a traceback."""

from __future__ import annotations

import json
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from mlxd.cli.client import DaemonClient
from mlxd.errors import MlxdError

STATE_STYLES = {
    "loaded": "bold green",
    "loading": "bold cyan",
    "draining": "bold yellow",
    "unloading": "yellow",
    "unloaded": "dim",
    "failed": "bold red",
}
MODEL_COLORS = ("blue", "green", "magenta", "dark_orange", "cyan", "red", "purple", "yellow")
BAR_WIDTH = 50
EVENTS_SHOWN = 6


class StatusUnavailable(Exception):
    """The status could not be fetched; the message is the one line to print."""


def human_bytes(n: int | None) -> str:
    if n is None:
        return "—"
    if n < 1024:
        return f"{n} B"
    value = float(n)
    for unit in ("KB", "MB", "GB", "TB"):
        value /= 1024
        if value < 1024 or unit == "TB":
            break
    return f"{value:.2f} {unit}" if value < 10 else f"{value:.1f} {unit}"


def human_seconds(seconds: float) -> str:
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    minutes, rest = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {rest} s"
    return f"{minutes // 60} h {minutes % 60} min"


def idle_countdown(model: dict[str, Any]) -> str:
    if model["pinned"]:
        return "pinned"
    if not model["idle_unload_seconds"]:
        return "never"
    remaining = model["idle_unload_in_seconds"]
    if remaining is not None:
        return f"in {human_seconds(remaining)}"
    if model["state"] == "loaded" and model["active_leases"]:
        return f"{human_seconds(model['idle_unload_seconds'])} after use"
    return "—"


def fetch_status(client: DaemonClient) -> dict[str, Any]:
    try:
        doc = client.get("/v1/status")
    except MlxdError as exc:
        hint = " (pass --api-key or set MLXD_API_KEY)" if exc.status_code == 401 else ""
        raise StatusUnavailable(f"{exc.message}{hint}") from None
    except ValueError:
        raise StatusUnavailable(f"{client.base_url} answered, but not with mlxd's status") from None
    if not isinstance(doc, dict) or "schema_version" not in doc:
        raise StatusUnavailable(f"{client.base_url} answered, but not with mlxd's status")
    return doc


def _header(doc: dict[str, Any]) -> Text:
    d, config = doc["daemon"], doc["config"]
    text = Text()
    text.append(f"mlxd {d['version']}", style="bold")
    text.append(
        f"  pid {d['pid']} · up {human_seconds(d['uptime_seconds'])} · "
        f"http://{d['bind']['host']}:{d['bind']['port']} · {d['mlx']['device'] or 'MLX unavailable'}"
    )
    text.append(f"\nconfig: {config['path'] or '—'} (generation {config['generation']})", style="dim")
    health = doc["health"]
    if health["status"] == "ok":
        text.append("\nhealth: ok", style="green")
    else:
        text.append("\nhealth: degraded", style="bold red")
        for problem in health["problems"]:
            text.append(f"\n  • {problem}", style="red")
    if d["draining"]:
        text.append("\ndraining: new requests are refused while in-flight ones finish", style="yellow")
    return text


def _memory(doc: dict[str, Any]) -> Text:
    m = doc["memory"]
    budget = max(1, m["budget_bytes"])
    bar = Text("[")
    used = 0
    legend = Text()
    for index, model in enumerate(doc["models"]):
        reserved = model["memory"]["reserved_bytes"]
        if reserved <= 0:
            continue
        color = MODEL_COLORS[index % len(MODEL_COLORS)]
        cells = max(1, round(BAR_WIDTH * reserved / budget))
        cells = min(cells, BAR_WIDTH - used)
        bar.append("█" * cells, style=color)
        used += cells
        legend.append("  ■ ", style=color)
        legend.append(f"{model['name']} {human_bytes(reserved)}")
    bar.append("·" * (BAR_WIDTH - used), style="dim")
    bar.append("]")
    percent = 100 * m["committed_bytes"] / budget
    text = Text("memory ")
    text.append_text(bar)
    text.append(f" {human_bytes(m['committed_bytes'])} of {human_bytes(m['budget_bytes'])} ({percent:.0f}%)")
    text.append_text(legend)
    text.append(
        f"\nfree in budget {human_bytes(m['free_bytes'])} · process RSS {human_bytes(m['process_rss_bytes'])} · "
        f"MLX active {human_bytes(m['mlx']['active_bytes'])} · system available "
        f"{human_bytes(m['system_available_bytes'])} of {human_bytes(m['system_total_bytes'])}",
        style="dim",
    )
    return text


def _models(doc: dict[str, Any]) -> Table:
    table = Table(header_style="bold")
    for column, justify in (
        ("Model", "left"), ("State", "left"), ("Memory", "right"), ("Leases", "right"), ("Queued", "right"),
        ("Idle unload", "right"), ("Tok/s", "right"), ("Loads", "right"), ("Last error", "left"),
    ):
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    for model in doc["models"]:
        name = Text(model["name"], style="bold")
        if model["aliases"]:
            name.append(f" ({', '.join(model['aliases'])})", style="dim")
        mem = model["memory"]
        if model.get("backend"):
            memory = f"on {model['backend']}"
        elif mem["reserved_bytes"]:
            memory = human_bytes(mem["reserved_bytes"])
        elif mem["measured_bytes"] is not None:
            memory = f"{human_bytes(mem['measured_bytes'])} measured"
        else:
            memory = f"{human_bytes(mem['estimated_bytes'])} est."
        loads = str(model["load_count"]) + (f" ({model['failures']} failed)" if model["failures"] else "")
        table.add_row(
            name,
            Text(model["state"] + (" · pinned" if model["pinned"] else ""), style=STATE_STYLES.get(model["state"], "")),
            memory,
            f"{model['active_leases']}/{model['max_concurrency']}",
            str(model["queued"]),
            idle_countdown(model),
            f"{model['recent_tokens_per_second']:.1f}",
            loads,
            Text(model["last_error"] or "", style="red"),
        )
    return table


def _backends(doc: dict[str, Any]) -> Text:
    """One line per backend: where, whether it answers, what it is doing."""
    text = Text("backends", style="bold")
    for b in doc["backends"]:
        text.append(f"\n  {b['name']:<10} ", style="bold")
        if b["reachable"] is None:
            text.append("not polled yet", style="dim")
        elif b["reachable"]:
            text.append(f"up {b['latency_ms']:.0f} ms", style="green")
        else:
            text.append("unreachable", style="red")
        text.append(f"  {b['in_flight']}/{b['max_concurrency']} in flight  {b['errors']} errors  {b['url']}", style="dim")
        if b["models"]:
            text.append("\n             " + ", ".join(f"{n} {s}" for n, s in b["models"].items()), style="dim")
    return text


def _events(doc: dict[str, Any]) -> Text:
    events = doc["events"][-EVENTS_SHOWN:]
    text = Text("recent events", style="bold")
    if not events:
        text.append("\n  none yet", style="dim")
    for event in reversed(events):
        at = datetime.fromtimestamp(event["at"]).strftime("%H:%M:%S")
        text.append(f"\n  {at} ", style="dim")
        text.append(f"{event['kind']:<8}", style="bold")
        text.append(f" {event['message']}")
    return text


def render(doc: dict[str, Any]) -> RenderableType:
    try:
        parts = [_header(doc), Text(""), _memory(doc), _models(doc)]
        if doc.get("backends"):
            parts.append(_backends(doc))
        return Group(*parts, _events(doc))
    except (KeyError, TypeError, AttributeError):
        # A daemon from another release: its schema is not the one drawn here.
        return Text(
            f"This daemon's status (schema {doc.get('schema_version')}) cannot be drawn by this mlxd "
            "release; `mlxd status --json` shows it as it is.",
            style="yellow",
        )


def run_status(
    *,
    url: str | None = None,
    api_key: str | None = None,
    config: Path | None = None,
    as_json: bool = False,
    watch: bool = False,
    interval: float = 2.0,
    console: Console | None = None,
    errors: Console | None = None,
) -> int:
    """Show the daemon's status; returns the exit status."""
    console = console or Console()
    errors = errors or Console(stderr=True)
    client = DaemonClient.discover(url=url, api_key=api_key, config=config, timeout=10.0)
    try:
        doc = fetch_status(client)
    except StatusUnavailable as exc:
        errors.print(f"mlxd: error: {exc}", markup=False, highlight=False, soft_wrap=True)
        return 1
    if not watch:
        _show(console, doc, as_json)
        return 0
    try:
        _watch(client, doc, console, errors, as_json, max(0.2, interval))
    except KeyboardInterrupt:
        pass
    return 0


def _show(console: Console, doc: dict[str, Any], as_json: bool) -> None:
    if as_json:
        console.out(json.dumps(doc, indent=2), highlight=False)
    else:
        console.print(render(doc))


def _watch(
    client: DaemonClient, doc: dict[str, Any], console: Console, errors: Console, as_json: bool, interval: float
) -> None:
    """Refresh until interrupted. A daemon that goes away is reported and
    waited for; the watch does not end because of it."""
    if as_json or not console.is_terminal:
        # Piped or scripted: one compact document (or one table) per refresh.
        while True:
            if as_json:
                console.out(json.dumps(doc, separators=(",", ":")), highlight=False)
            else:
                console.print(render(doc))
                console.rule(style="dim")
            doc = _next_document(client, errors, interval)
    with Live(render(doc), console=console, auto_refresh=False) as live:
        while True:
            time.sleep(interval)
            try:
                live.update(render(fetch_status(client)), refresh=True)
            except StatusUnavailable as exc:
                live.update(Text(f"mlxd: {exc}; retrying every {interval:g} s", style="red"), refresh=True)


def _next_document(client: DaemonClient, errors: Console, interval: float) -> dict[str, Any]:
    while True:
        time.sleep(interval)
        try:
            return fetch_status(client)
        except StatusUnavailable as exc:
            errors.print(f"mlxd: {exc}; retrying", markup=False, highlight=False, soft_wrap=True)
