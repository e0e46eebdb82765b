"""The package map of docs/architecture.md, checked: imports point down the
layers, never back up, and no two modules import each other (type-only and
function-level imports count too: a circle is a circle)."""

from __future__ import annotations

import ast
from pathlib import Path

MLXD = Path(__file__).resolve().parents[1] / "mlxd"

# Each package and the packages it may import. ``mlxd`` is the package root
# (``__version__``).
ALLOWED = {
    "errors": set(),
    # Leaves beside errors.py: a folder written once (GGUF import, factory), a
    # file's sha256; the dtype names models are built and imported in.
    "files": set(),
    "dtypes": set(),
    # Who is asking (made at the gatekeeper, read by leases and accounts).
    "caller": set(),
    # An event waited on with a time limit, cancellation kept (Python < 3.12).
    "waiting": set(),
    # The kernel's name for a thread the daemon starts.
    "thread_names": set(),
    # A .gguf path is converted once into the cache when the registry resolves it.
    "registry": {"errors", "gguf"},
    "settings": {"errors", "registry"},
    # The text engine decodes under grammars and splits tool calls; those two
    # import only the engine's contract (engine/types.py) back. An encoder's
    # batch queue takes turns between the callers' priority classes.
    "engine": {"errors", "files", "caller", "thread_names", "registry", "grammar", "tools"},
    # The shell holds engines by their contract (engine/types.py) only.
    "residency": {"errors", "caller", "waiting", "registry", "engine"},
    # Registry entries served by other servers: an engine over HTTP, which
    # forwards the output request (tools/output_request.py) as it was sent.
    "remote": {"errors", "waiting", "registry", "engine", "tools"},
    # A parallel model: the engine contract over a gang of rank processes; its
    # ranks prefill waiting prompts by the callers' priority classes.
    "distributed": {"errors", "caller", "registry", "engine", "grammar", "tools"},
    "factory": {"errors", "files"},
    "service": {"errors", "registry", "settings"},
    # Constrained decoding and tool calls (engine side), GGUF import.
    "grammar": {"errors", "engine"},  # engine.types only, see CONTRACT
    "tools": {"errors", "files", "engine", "grammar"},
    "gguf": {"errors", "files", "dtypes"},
    # Failover entries: the order to try targets in, from residency and the backend poll.
    "failover": {"errors", "registry", "residency", "remote"},
    "monitoring": {"mlxd", "errors", "thread_names", "registry", "engine", "residency", "remote", "failover"},
    # The request path plans tools and splits tool calls for every surface.
    "api": {"mlxd", "errors", "caller", "registry", "settings", "engine", "grammar", "tools", "residency", "monitoring", "remote",
            "failover", "distributed"},
    "daemon": {"mlxd", "errors", "files", "waiting", "registry", "settings", "engine", "residency", "monitoring", "api", "remote",
               "failover"},
    "cli": {"mlxd", "errors", "dtypes", "registry", "settings", "engine", "factory", "service", "gguf", "daemon"},
    "__main__": {"cli"},
}
# What grammar/, tools/ and residency/ may import from the engine: its contract.
CONTRACT = "mlxd.engine.types"
# Arrows pointing up that are still to go, each owned by a change under way;
# when one goes, this test fails until it is taken off the list.
KNOWN_UPWARD = {
    # Checking a registry's tool_parser and reasoning_parser names against what mlx-lm knows.
    "mlxd.registry.check imports mlxd.tools.formats",
    "mlxd.registry.schema imports mlxd.tools.formats",
    "mlxd.registry.check imports mlxd.tools.reasoning",
    "mlxd.registry.schema imports mlxd.tools.reasoning",
}
# Circles still to break, each owned by a change under way; when one goes,
# this test fails until it is taken off the list.
KNOWN_CIRCLES: set[str] = set()


def module_name(path: Path) -> str:
    parts = path.relative_to(MLXD.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, modules: set[str]) -> set[str]:
    """The mlxd modules ``path`` imports: ``from pkg import module`` is an
    import of ``pkg.module`` (and of ``pkg``, whose ``__init__`` runs)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "mlxd":
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in modules}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "mlxd"}
    return found


def graph() -> dict[str, set[str]]:
    paths = list(MLXD.rglob("*.py"))
    modules = {module_name(p) for p in paths}
    return {module_name(p): imports(p, modules) for p in paths}


def package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "mlxd"


def test_every_package_is_on_the_map():
    on_disk = {package(m) for m in graph()} - {"mlxd"}
    assert on_disk - set(ALLOWED) == set(), "add the package to ALLOWED and to docs/architecture.md"


def test_imports_only_point_down_the_layers():
    wrong = {
        f"{module} imports {target}"
        for module, targets in graph().items()
        for target in targets
        if package(target) != package(module)
        and (
            package(target) not in ALLOWED[package(module)]
            or (package(module) in ("grammar", "tools", "residency") and package(target) == "engine" and target != CONTRACT)
        )
    }
    assert wrong == KNOWN_UPWARD


def _resolve(target: str, modules: set[str]) -> str | None:
    # ``from mlxd.api import x`` may name a module or a package's attribute.
    while target and target not in modules:
        target = target.rpartition(".")[0]
    return target or None


def test_no_two_modules_import_each_other_even_indirectly():
    edges = graph()
    modules = set(edges)
    deps = {m: {r for t in ts if (r := _resolve(t, modules)) and r != m} for m, ts in edges.items()}
    # Depth-first search for a back edge.
    state: dict[str, int] = {}
    cycles = []

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(deps[node]):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join([*trail[trail.index(nxt):], nxt]))
            elif nxt not in state:
                visit(nxt, [*trail, nxt])
        state[node] = 2

    for module in sorted(modules):
        if module not in state:
            visit(module, [module])
    # The same circle, whichever module the search entered it from.
    assert {_canonical(c) for c in cycles} == {_canonical(c) for c in KNOWN_CIRCLES}


def _canonical(cycle: str) -> str:
    ring = cycle.split(" -> ")[:-1]
    start = ring.index(min(ring))
    ring = ring[start:] + ring[:start]
    return " -> ".join([*ring, ring[0]])


# The layers this page describes module by module; the others it names.
DESCRIBED = {"api", "monitoring", "daemon", "cli"}


def test_the_architecture_page_names_the_packages_and_the_request_path_modules():
    page = (MLXD.parent / "docs" / "architecture.md").read_text()

    def named(module: str) -> bool:
        path = MLXD / Path(*module.split(".")[1:])
        return f"{path.name}/" in page if path.is_dir() else f"{path.name}.py" in page

    modules = graph()
    packages = {m for m in modules if m.count(".") == 1 and (MLXD / m.split(".")[1]).is_dir()}
    described = {m for m in modules if package(m) in DESCRIBED and m.count(".") > 1}
    assert sorted(m for m in packages | described if not named(m)) == []


def test_the_daemon_stack_starts_without_the_http_clients_it_only_needs_for_remote_work():
    """aiohttp (remote backends) and httpx (remote ranks, and the rich console
    its CLI pulls in) cost ~0.9 s of a cold start on a 2-core machine: a
    daemon whose registry has no remote entries must not pay for them."""
    import subprocess
    import sys

    probe = "import sys, mlxd.cli.main, mlxd.daemon.runner; print(sorted({'aiohttp', 'httpx'} & set(sys.modules)))"
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "[]"
