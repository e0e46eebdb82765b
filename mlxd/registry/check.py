"""A human summary of a registry, for ``mlxd check FILE``."""

from __future__ import annotations

import fnmatch

from mlxd.registry.model import RERANK_INSTRUCTION, ContentionSpec, FailoverSpec, ModelSpec, Registry
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


def _speculative(spec: ModelSpec) -> str:
    s = spec.speculative
    if s is None:
        return "off (no `speculative:`)"
    how = {
        "prompt_lookup": "prompt_lookup (n-gram drafts from the prompt and the output so far)",
        "draft": f"draft with `{s.draft_model}` (loaded and unloaded with this model, counted in its charge)",
    }.get(s.method, s.method)
    if s.cannot_pay:
        return f"off: {s.cannot_pay}"
    when = "off by itself while it does not pay" if s.auto_off else "at every step, paying or not (auto_off: false)"
    return f"{how}, {s.tokens} drafted tokens a step verified in one pass, also in the batch; {when}"


def _charge(spec: ModelSpec, registry: Registry) -> str:
    f = spec.footprint
    parts = f.parts(registry.kind_of(spec))
    if spec.memory_override_bytes is not None:
        return (
            f"{format_bytes(spec.charge_bytes)} (estimated_memory_gb; computed "
            f"{format_bytes(f.total)} = {parts})"
        )
    return f"{format_bytes(spec.charge_bytes)} = {parts}"


def _remote(spec: ModelSpec, registry: Registry) -> list[str]:
    backend = registry.backend(spec.backend or "")
    url = f" ({backend.url})" if backend else ""
    return [
        f"    served by backend `{spec.backend}`{url} as `{spec.remote_model}`; nothing held here",
        f"    up to {spec.max_concurrency} at once (the backend's max_concurrency, shared by its entries); "
        f"queue up to {spec.max_queue}",
    ]


def _describe_model(spec: ModelSpec, registry: Registry) -> list[str]:
    header = f"  {spec.name}" + ("" if spec.is_remote else f" [{spec.kind}]")
    if spec.aliases:
        header += f"  aliases: {', '.join(spec.aliases)}"
    lines = [header]
    if spec.description:
        lines.append(f"    {spec.description}")
    if spec.is_remote:
        return lines + _remote(spec, registry)
    source = "" if spec.source == str(spec.path) else f"  (from {spec.source})"
    lines.append(f"    path: {spec.path}{source}")
    if spec.broken:
        lines.append(f"    cannot be loaded: {spec.broken}")
        return lines
    lines.append(f"    charge: {_charge(spec, registry)}")
    if spec.parallel is not None:
        p = spec.parallel
        lines.append(f"    parallel: {p.mode} over {p.size} ranks ({', '.join(p.hosts)}) by {p.transport}; "
                     f"deadlines load {p.load_timeout_s:g} s, prefill {p.prefill_timeout_s:g} s, "
                     f"decode step {p.step_timeout_s:g} s")
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
    if registry.kind_of(spec).grammars:  # tool calls need the kind's tool-call format
        lines.append(f"    tool calls: {_tool_calls(spec)}")
        lines.append(f"    reasoning: {_reasoning(spec)}")
    if spec.kind == "text":
        lines.append(f"    speculative decoding: {_speculative(spec)}")
    if registry.kind_of(spec).encodes:
        lines += _encoder(spec)
    if spec.chat_template_kwargs:
        given = ", ".join(f"{name}={text}" for name, text in spec.chat_template_kwargs)
        lines.append(f"    chat_template_kwargs: {given}")
    return lines


def _encoder(spec: ModelSpec) -> list[str]:
    from mlxd.registry.resolve import is_llm_reranker, read_model_config

    cut = "cut at the model's length" if spec.truncate else "refused past the model's length (truncate: false)"
    lines = [f"    inputs: {cut}; up to {spec.batch_tokens} padded tokens a forward pass"]
    if spec.kind == "rerank" and is_llm_reranker(read_model_config(spec.path)):
        said = ("instruction:" if spec.instruction is not None else "the model card's default")
        lines.append(f"    instruction: {spec.instruction or RERANK_INSTRUCTION!r} ({said})")
    return lines


def _reasoning(spec: ModelSpec) -> str:
    from mlxd.tools.reasoning import resolve_from_files

    return _parser_line(
        "reasoning_parser", spec.reasoning_parser, resolve_from_files(spec.path, spec.reasoning_parser),
        off="; any reasoning stays in the answer's text",
        missing="none found (no think markers in the vocabulary; set `reasoning_parser:` if it has some)",
        guessed="detected from the vocabulary",
    )


def _tool_calls(spec: ModelSpec) -> str:
    from mlxd.tools.formats import resolve_from_files

    if spec.tool_parser == "none":
        return "off (tool_parser: none)"
    found = resolve_from_files(spec.path, spec.tool_parser)
    if found.name is None:
        return "none (its chat template renders tools in a markup mlxd cannot parse; set `tool_parser:`)"
    if found.source == "mlxd's default":
        where = "mlxd's default: the chat template names no format"
    else:
        where = found.source
    said = f"{found.name} ({where})"
    if not found.template_renders_tools:
        said += "; the chat template has no place for tools, so mlxd writes them into the system prompt in json_tools markup"
    return said


def _parser_line(key: str, configured: str | None, found: str | None, *, off: str, missing: str,
                 guessed: str) -> str:
    """What `mlxd check` says of a parser: off, missing, or which one and why."""
    if configured == "none":
        return f"off ({key}: none{off})"
    if found is None:
        return missing
    return f"{found} ({key + ':' if configured else guessed})"


def _describe_failover(failover: FailoverSpec, registry: Registry) -> list[str]:
    header = f"  {failover.name} [failover, {failover.strategy}]"
    if failover.aliases:
        header += f"  aliases: {', '.join(failover.aliases)}"
    rule = {
        "warm": "a target that has the model loaded first, else the first listed",
        "spillover": "the first target with a free slot, else the first listed",
    }[failover.strategy]
    lines = [header, f"    tries {rule}; the next when one fails before any output"]
    by_name = {m.name: m for m in registry.models}
    for target in failover.targets:
        spec = by_name[target]
        where = f"on backend `{spec.backend}` as `{spec.remote_model}`" if spec.is_remote else "here"
        lines.append(f"    -> {target} ({where})")
    return lines


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
    ]
    if registry.apps is not None:
        lines.append(f"Apps ({len(registry.apps)}):")
        if not registry.apps and not (registry.server.api_keys or registry.server.read_only_keys):
            # `apps:` turns keys on; with none defined every request is a 401.
            lines.append("  warning: `apps:` is empty and the file sets no server.api_keys: every request will be "
                         "refused (401) unless a key comes from --api-key or MLXD_API_KEYS; add an app, or leave "
                         "`apps:` out")
        for a in registry.apps:
            limits = ", ".join(f"{k} {getattr(a, k)}" for k in ("max_concurrency", "rpm", "tpm", "tokens_per_day")
                               if getattr(a, k) is not None)
            key = "keyless loopback" if a.key_sha256 is None else "keyed"
            lines.append(f"  {a.name} [{a.priority}{', admin' if a.admin else ''}] {key}, models "
                         f"{', '.join(a.models)}, routes {', '.join(a.routes)}" + (f", {limits}" if limits else ""))
            if not any(fnmatch.fnmatchcase(n, p) for n in registry.model_names() for p in a.models):
                # Valid (a model may be added later), but likely a typo: say so before a client finds out.
                lines.append(f"    warning: its models ({', '.join(a.models)}) match no model in this file; "
                             "it can use none")
        lines.append("")
    if registry.backends:
        lines.append(f"Backends ({len(registry.backends)}):")
        for b in registry.backends:
            key = f", key from ${b.api_key_env}" if b.api_key_env else ""
            lines.append(f"  {b.name} [{b.kind}] {b.url}, up to {b.max_concurrency} at once{key}")
        lines.append("")
    named = [m for m in registry.models if not m.implicit]
    lines.append(f"Models ({len(named)}):")
    for spec in named:
        lines += _describe_model(spec, registry)
    if registry.failovers:
        lines += ["", f"Failover ({len(registry.failovers)}):"]
        for failover in registry.failovers:
            lines += _describe_failover(failover, registry)

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
    local = [m for m in registry.models if not m.is_remote]
    if local:
        largest = max(local, key=lambda s: s.charge_bytes)
        lines.append(f"Largest model: {largest.name} ({format_bytes(largest.charge_bytes)})")
    return "\n".join(lines)
