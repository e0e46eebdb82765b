"""A human summary of a registry, for ``mlxd check FILE``."""

from __future__ import annotations

from mlxd.registry.model import ContentionSpec, ModelSpec, Registry
from mlxd.registry.sizing import format_bytes


def _contention(c: ContentionSpec) -> str:
    wait = "without limit" if c.wait_timeout_s == float("inf") else f"up to {c.wait_timeout_s:g} s"
    plans = {
        "fail": "fail at once",
        "wait": f"wait {wait}",
        "wait_then_fail": f"wait {wait}, then fail",
        "preempt": "preempt other models at once",
        "wait_then_preempt": (
            f"wait {c.preempt_after_s:g} s, then preempt; give up after waiting {wait}"
        ),
    }
    return f"{c.strategy} ({plans.get(c.strategy, '?')})"


def _resident(registry: Registry) -> list[ModelSpec]:
    """Models meant to be in memory from startup: pinned or preloaded."""
    return [s for s in registry.models if s.pinned or s.preload]


def pinned_and_preloaded_fit(registry: Registry) -> bool:
    total = sum(s.charge_bytes for s in _resident(registry))
    return total <= registry.manager.memory_budget_bytes


def _idle(spec: ModelSpec) -> str:
    if spec.pinned:
        return "never (pinned)"
    if spec.idle_unload_seconds <= 0:
        return "never"
    return f"after {spec.idle_unload_seconds:g} s idle"


def _charge(spec: ModelSpec) -> str:
    f = spec.footprint
    parts = (
        f"weights {format_bytes(f.weights)} + KV {format_bytes(f.kv_cache)} + "
        f"prefix cache {format_bytes(f.prefix_cache)}"
    )
    if spec.memory_override_bytes is not None:
        return (
            f"{format_bytes(spec.charge_bytes)} (estimated_memory_gb; computed "
            f"{format_bytes(f.total)} = {parts})"
        )
    return f"{format_bytes(spec.charge_bytes)} = {parts}"


def _describe_model(spec: ModelSpec) -> list[str]:
    header = f"  {spec.name} [{spec.kind}]"
    if spec.aliases:
        header += f"  aliases: {', '.join(spec.aliases)}"
    lines = [header]
    if spec.description:
        lines.append(f"    {spec.description}")
    source = "" if spec.source == str(spec.path) else f"  (from {spec.source})"
    lines.append(f"    path: {spec.path}{source}")
    if spec.broken:
        lines.append(f"    cannot be loaded: {spec.broken}")
        return lines
    lines.append(f"    charge: {_charge(spec)}")
    kv = f", KV cache {spec.kv_bits}-bit" if spec.kv_bits else ""
    lines.append(
        f"    context {spec.max_context} tokens x {spec.max_concurrency} concurrent{kv}; "
        f"queue up to {spec.max_queue}"
    )
    yes_no = {True: "yes", False: "no"}
    lines.append(
        f"    preload: {yes_no[spec.preload]}; pinned: {yes_no[spec.pinned]}; "
        f"idle unload: {_idle(spec)}"
    )
    if spec.kind == "text":
        lines.append(f"    tool calls: {_tool_calls(spec)}")
    return lines


def _tool_calls(spec: ModelSpec) -> str:
    from mlxd.tools.formats import resolve_from_files

    if spec.tool_parser == "none":
        return "off (tool_parser: none)"
    name = resolve_from_files(spec.path, spec.tool_parser)
    if name is None:
        return "none (requests with `tools` get a 400; set `tool_parser:` to enable)"
    where = "tool_parser:" if spec.tool_parser else "guessed from the chat template"
    return f"{name} ({where})"


def describe(registry: Registry) -> str:
    """Every model with its charge, and whether the always-resident set fits."""
    m = registry.manager
    budget = m.memory_budget_bytes
    source = str(registry.source_path) if registry.source_path else "(text)"
    lines = [
        f"Registry {source} (sha256 {registry.file_hash[:12]})",
        f"Memory budget: {format_bytes(budget)}",
        f"When a model does not fit: {_contention(m.contention)}",
        "Idle unload by default: "
        + (
            "never"
            if m.default_idle_unload_seconds <= 0
            else f"after {m.default_idle_unload_seconds:g} s"
        ),
        f"Server: {registry.server.host}:{registry.server.port}, "
        f"{len(registry.server.api_keys)} API key(s)",
        "",
        f"Models ({len(registry.models)}):",
    ]
    for spec in registry.models:
        lines += _describe_model(spec)

    resident = _resident(registry)
    total = sum(s.charge_bytes for s in resident)
    lines.append("")
    if not resident:
        lines.append("No model is pinned or preloaded; every model loads on first use.")
    else:
        verdict = "fit together" if pinned_and_preloaded_fit(registry) else "do NOT fit together"
        lines.append(
            f"Pinned + preloaded ({', '.join(s.name for s in resident)}): "
            f"{format_bytes(total)} of {format_bytes(budget)} -- {verdict}"
        )
    largest = max(registry.models, key=lambda s: s.charge_bytes)
    lines.append(f"Largest model: {largest.name} ({format_bytes(largest.charge_bytes)})")
    return "\n".join(lines)
