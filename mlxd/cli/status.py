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
    "warming": "cyan",
    "draining": "bold yellow",
    "unloading": "yellow",
    "unloaded": "dim",
    "failed": "bold red",
}
MODEL_COLORS = ("blue", "green", "magenta", "dark_orange", "cyan", "red", "purple", "yellow")
BAR_WIDTH = 50
EVENTS_SHOWN = 6
# What a terminal is assumed to be when rich cannot tell (piped output).
DEFAULT_WIDTH = 80


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
    # Three significant digits at most: table cells stay short.
    if value < 10:
        return f"{value:.2f} {unit}"
    return f"{value:.1f} {unit}" if value < 100 else f"{value:.0f} {unit}"


def human_seconds(seconds: float) -> str:
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    minutes, rest = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {rest} s"
    return f"{minutes // 60} h {minutes % 60} min"


def short_seconds(seconds: float) -> str:
    """A table cell's duration, at most 6 characters: ``42s``, ``14m``, ``2h05m``."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{round(seconds / 60)}m" if seconds < 3570 else "1h"
    hours, rest = divmod(seconds, 3600)
    return f"{hours}h{rest // 60:02d}m" if hours < 100 else f"{hours}h"


def idle_countdown(model: dict[str, Any]) -> str:
    if model["pinned"]:
        return "pinned"
    if not model["idle_unload_seconds"]:
        return "never"
    remaining = model["idle_unload_in_seconds"]
    if remaining is not None:
        return f"in {short_seconds(remaining)}"
    if model["state"] == "loaded" and model["active_leases"]:
        return "busy"  # the countdown starts when the last request ends
    left = model.get("last_unload")  # (absent from an older daemon's status)
    if model["state"] == "unloaded" and left:
        return left["cause"]  # why it is not in memory: idle, evicted, operator...
    return "—"


def fetch_status(client: DaemonClient) -> dict[str, Any]:
    try:
        doc = client.get("/v1/status")
    except MlxdError as exc:
        raise StatusUnavailable(exc.message) from None
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
    device = d.get("device") or {}
    if device.get("kind"):
        source = (device.get("memory_source") or "").split(" (")[0]
        text.append(f"\ndevice: {device['kind']} {device['name']} · {human_bytes(device['memory_bytes'])} {source}"
                    f" · MLX active {human_bytes(doc['memory']['mlx']['active_bytes'])}")
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


def _memory(doc: dict[str, Any], width: int) -> Text:
    m = doc["memory"]
    budget = max(1, m["budget_bytes"])
    percent = 100 * m["committed_bytes"] / budget
    summary = f" {human_bytes(m['committed_bytes'])} of {human_bytes(m['budget_bytes'])} ({percent:.0f}%)"
    # The bar shrinks to keep "memory [bar] X of Y (Z%)" on one line.
    bar_width = max(10, min(BAR_WIDTH, width - len("memory []") - len(summary)))
    bar = Text("[")
    used = 0
    legend = Text()
    for index, model in enumerate(doc["models"]):
        reserved = model["memory"]["reserved_bytes"]
        if reserved <= 0:
            continue
        color = MODEL_COLORS[index % len(MODEL_COLORS)]
        cells = max(1, round(bar_width * reserved / budget))
        cells = min(cells, bar_width - used)
        bar.append("█" * cells, style=color)
        used += cells
        legend.append("  ■ " if legend else "■ ", style=color)
        legend.append(f"{model['name']} {human_bytes(reserved)}")
    bar.append("·" * (bar_width - used), style="dim")
    bar.append("]")
    text = Text("memory ")
    text.append_text(bar)
    text.append(summary)
    if legend:
        text.append("\n       ")
        text.append_text(legend)
    text.append(
        f"\nfree {human_bytes(m['free_bytes'])} in budget · RSS {human_bytes(m['process_rss_bytes'])} · "
        f"MLX active {human_bytes(m['mlx']['active_bytes'])}"
        f"\nsystem {human_bytes(m['system_available_bytes'])} available of {human_bytes(m['system_total_bytes'])}",
        style="dim",
    )
    return text


def _memory_cell(model: dict[str, Any]) -> str:
    mem = model["memory"]
    if model.get("backend"):
        return f"on {model['backend']}"  # holds nothing here
    if mem["reserved_bytes"]:
        return human_bytes(mem["reserved_bytes"])
    if mem["measured_bytes"] is not None:
        return human_bytes(mem["measured_bytes"])
    return f"~{human_bytes(mem['estimated_bytes'])}"  # not measured yet: the estimate


def _rate(tokens_per_second: float) -> str:
    return f"{tokens_per_second:.1f}" if tokens_per_second < 100 else f"{tokens_per_second:.0f}"


def _models(doc: dict[str, Any], width: int) -> Table:
    """One line per model, like ``ollama ps``: no borders, short cells that
    never wrap, so 80 columns hold a row. A failed model's error is in the
    health problems above, in full, not squeezed into a cell."""
    rows = []
    for model in doc["models"]:
        name = Text(model["name"], style="bold")
        if model["aliases"]:
            name.append(f" ({', '.join(model['aliases'])})", style="dim")
        leases = f"{model['active_leases']}/{model['max_concurrency']}"
        if model["queued"]:
            leases += f" +{model['queued']}"
        rows.append((
            name,
            Text(state := shown_state(model), style=STATE_STYLES.get(state, "")),
            _memory_cell(model),
            leases,
            idle_countdown(model),
            _rate(model["recent_tokens_per_second"]),
            str(model["load_count"]) + (f" ✗{model['failures']}" if model["failures"] else ""),
        ))
    return _fitted(Table(box=None, header_style="bold", pad_edge=False, padding=(0, 2, 0, 0)),
                   ("NAME",), ("STATE", "MEMORY", "LEASES", "UNLOADS", "TOK/S", "LOADS"), rows, width)


def shown_state(model: dict[str, Any]) -> str:
    """The model's state, but ``warming`` for a loaded model whose warm-up
    still runs in the background (``warmup_done: false``): it serves, and its
    first requests of a new shape compile kernels meanwhile (docs/performance.md)."""
    if model["state"] == "loaded" and model.get("warmup_done") is False:
        return "warming"
    return str(model["state"])


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


def _failover(doc: dict[str, Any]) -> Text:
    """One line per failover entry, then its targets in the order a request
    would try them now, each with what it served and how often it failed."""
    text = Text("failover", style="bold")
    for f in doc["failover"]:
        text.append(f"\n  {f['name']:<10} ", style="bold")
        text.append(f"{f['strategy']}", style="cyan")
        recent = f["recent"][-1]["target"] if f["recent"] else None
        if recent:
            text.append(f"  last served by {recent}", style="dim")
        targets = {t["name"]: t for t in f["targets"]}
        for name in f["order"]:
            t = targets[name]
            where = "here" if t["kind"] == "local" else f"on {t['backend']}"
            text.append(f"\n    {name} ({where}, {t['state'] or 'state unknown'})")
            text.append(f"  {t['in_flight']}/{t['capacity']} in flight  served {t['requests']}", style="dim")
            if t["fell_through"]:
                text.append(f"  fell through {t['fell_through']}", style="yellow")
    return text


def _gangs(doc: dict[str, Any]) -> Text:
    """One line per parallel model, then its ranks while its gang is up."""
    text = Text("parallel models", style="bold")
    for model in doc["models"]:
        parallel = model.get("parallel")
        if not parallel:
            continue
        text.append(f"\n  {model['name']:<10} ", style="bold")
        text.append(f"{parallel['mode']} over {len(parallel['ranks'])} ranks by {parallel['transport']}", style="cyan")
        if model["state"] == "failed" and model.get("last_error"):
            text.append(f"  {model['last_error']}", style="red")
        for r in model.get("ranks") or []:
            text.append(f"\n    rank {r['rank']} {r['host']:<8} pid {r['pid']}  {r['state']:<8} "
                        f"{human_bytes(r['memory_bytes'])}  {r['last_progress_s']:.1f} s since progress", style="dim")
    return text


def _speculation(doc: dict[str, Any]) -> Text:
    """One line per model with ``speculative:``: whether it speculates now,
    the speed-up the auto-off last measured, and the drafts kept of those
    verified in how many verify steps (status: ``speculative``)."""
    text = Text("speculation", style="bold")
    for model in doc["models"]:
        spec = model.get("speculative")
        if not spec:
            continue
        text.append(f"\n  {model['name']:<10} ", style="bold")
        text.append(f"{spec['method']} K={spec['tokens']}", style="cyan")
        if spec.get("unsupported"):
            text.append(f"  off: {spec['unsupported']}", style="yellow")
            continue
        if model["state"] != "loaded":
            text.append("  not loaded", style="dim")
            continue
        text.append("  on" if spec["active"] else "  off", style="green" if spec["active"] else "yellow")
        if spec.get("speedup") is not None:
            text.append(f"  {spec['speedup']:.2f}x")
        drafted = spec.get("drafted_tokens")
        if drafted:
            # Short enough for 80 columns with a 10-character name.
            text.append(f"  kept {spec['accepted_tokens']}/{drafted} drafts, {spec['verify_steps']} steps", style="dim")
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


def _usage(doc: dict[str, Any], width: int) -> Table:
    """Per app and model since the state directory began: requests, errors, tokens."""
    rows = [(u["app"], u["model"], *(str(u[k]) for k in ("requests", "errors", "tokens_in", "tokens_cached",
                                                          "tokens_out")))
            for u in doc["usage"]]
    table = Table(title="usage", title_justify="left", title_style="bold", box=None, header_style="bold",
                  pad_edge=False, padding=(0, 2, 0, 0))
    return _fitted(table, ("APP", "MODEL"), ("REQS", "ERRS", "IN", "CACHED", "OUT"), rows, width)


# An app's limits as the apps block shows them, by registry key.
_LIMIT_COLUMNS = (("rpm", "RPM LEFT"), ("tpm", "TPM LEFT"), ("tokens_per_day", "DAY LEFT"),
                  ("max_concurrency", "SLOTS LEFT"))


def _apps(doc: dict[str, Any], width: int) -> Table:
    """Each app now: its requests under way and what is left of each limit
    (`remaining/limit`; `—` where it has none), so a 429 is seen coming."""
    rows = []
    for a in doc["apps"]:
        limits = {room["name"]: room for room in a["limits"]}
        left = [f"{limits[key]['remaining']}/{limits[key]['limit']}" if key in limits else "—"
                for key, _ in _LIMIT_COLUMNS]
        rows.append((a["name"], a["priority"], str(a["in_flight"]), *left))
    table = Table(title="apps", title_justify="left", title_style="bold", box=None, header_style="bold",
                  pad_edge=False, padding=(0, 2, 0, 0))
    return _fitted(table, ("APP", "PRIORITY"), ("RUNNING", *(h for _, h in _LIMIT_COLUMNS)), rows, width)


def _fitted(table: Table, names: tuple[str, ...], figures: tuple[str, ...], rows: list[tuple[Any, ...]],
            width: int) -> Table:
    """``table`` with ``names`` columns first, then ``figures``, one line a
    row in ``width`` columns: the figures keep their width, and where the
    line is too narrow the names are what is cut, each to its share of
    what is left (a short one keeps all of it)."""
    MIN_NAME = 6
    fixed = [max([len(h), *(len(str(row[len(names) + i])) for row in rows)]) for i, h in enumerate(figures)]
    room = width - sum(fixed) - 2 * (len(names) + len(figures) - 1)
    natural = [max([len(h), *(len(str(row[i])) for row in rows)]) for i, h in enumerate(names)]
    shares = list(natural)
    while sum(shares) > room and max(shares) > MIN_NAME:
        widest = shares.index(max(shares))
        shares[widest] -= 1
    for header, share in zip(names, shares):
        table.add_column(header, no_wrap=True, overflow="ellipsis", min_width=min(share, MIN_NAME), max_width=share)
    for header, size in zip(figures, fixed):
        justify = "left" if header == "STATE" else "right"
        table.add_column(header, justify=justify, no_wrap=True, min_width=size)  # type: ignore[arg-type]
    for row in rows:
        table.add_row(*row)
    return table


def _app_header(doc: dict[str, Any]) -> Text:
    """What an app's own key reads: its scope, not the daemon's configuration."""
    app = doc["app"]
    text = Text(f"mlxd {doc['daemon']['version']}", style="bold")
    text.append(f"  app {app['name']} · {app['priority']} · models {', '.join(app['models'])}"
                f" · up {human_seconds(doc['daemon']['uptime_seconds'])}")
    return text


def render(doc: dict[str, Any], width: int = DEFAULT_WIDTH) -> RenderableType:
    """``width``: the terminal's, so the memory bar fits on its line."""
    try:
        if "app" in doc:
            own = [_apps(doc, width), Text("")] if doc.get("apps") else []
            return Group(_app_header(doc), Text(""), _models(doc, width), Text(""), *own, _usage(doc, width), Text(""),
                         _events(doc))
        parts = [_header(doc), Text(""), _memory(doc, width), Text(""), _models(doc, width), Text("")]
        if doc.get("apps"):
            parts += [_apps(doc, width), Text("")]
        if doc.get("usage"):
            parts += [_usage(doc, width), Text("")]
        if doc.get("backends"):
            parts += [_backends(doc), Text("")]
        if doc.get("failover"):
            parts += [_failover(doc), Text("")]
        if any(m.get("parallel") for m in doc["models"]):
            parts += [_gangs(doc), Text("")]
        if any(m.get("speculative") for m in doc["models"]):
            parts += [_speculation(doc), Text("")]
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
        console.print(render(doc, console.width))


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
                console.print(render(doc, console.width))
                console.rule(style="dim")
            doc = _next_document(client, errors, interval)
    with Live(render(doc, console.width), console=console, auto_refresh=False) as live:
        while True:
            time.sleep(interval)
            try:
                live.update(render(fetch_status(client), console.width), refresh=True)
            except StatusUnavailable as exc:
                live.update(Text(f"mlxd: {exc}; retrying every {interval:g} s", style="red"), refresh=True)


def _next_document(client: DaemonClient, errors: Console, interval: float) -> dict[str, Any]:
    while True:
        time.sleep(interval)
        try:
            return fetch_status(client)
        except StatusUnavailable as exc:
            errors.print(f"mlxd: {exc}; retrying", markup=False, highlight=False, soft_wrap=True)
