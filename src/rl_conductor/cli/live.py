"""Live-worker commands: ``worker serve`` (a local OpenAI-compatible model server) and
``record export`` (the response cache as a bring-your-own recordings file)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from rl_conductor.cli.app import app
from rl_conductor.cli.core import console

worker_app = typer.Typer(help="Live workers: serve a local model as an OpenAI-compatible endpoint.")
record_app = typer.Typer(help="Recordings: turn cached live completions into a replay pool.")
app.add_typer(worker_app, name="worker", no_args_is_help=True)
app.add_typer(record_app, name="record", no_args_is_help=True)


@worker_app.command("serve")
def worker_serve(
    model: Annotated[str, typer.Option(help="tiny | smol | a model folder")] = "smol",
    port: Annotated[int, typer.Option(help="HTTP port (binds all interfaces, as KServe does)")] = 8080,
    name: Annotated[
        str | None, typer.Option(help="served model name (default: tiny / smol / folder)")
    ] = None,
    model_dir: Annotated[
        Path | None, typer.Option(help="where tiny / smol are built (default .conductor/models)")
    ] = None,
    threads: Annotated[int | None, typer.Option(help="torch CPU threads")] = None,
    default_max_tokens: Annotated[int, typer.Option(help="max_tokens when a request gives none")] = 256,
) -> None:
    """Serve a causal LM at /openai/v1/chat/completions and /openai/v1/models on a KServe ModelServer."""
    from rl_conductor.workers.live.server import serve

    if not 0 < port < 65536:
        raise typer.BadParameter("--port must be between 1 and 65535")
    if default_max_tokens < 1:
        raise typer.BadParameter("--default-max-tokens must be >= 1")
    serve(
        model,
        port=port,
        name=name,
        model_dir=model_dir,
        threads=threads,
        default_max_tokens=default_max_tokens,
    )


@record_app.command("export")
def record_export(
    cache: Annotated[str, typer.Option(help="the cache: a sqlite path or s3://bucket/prefix")],
    out: Annotated[Path, typer.Option(help="recordings file to write (.jsonl or .jsonl.gz)")],
    worker: Annotated[
        list[str] | None, typer.Option(help="only these workers (repeatable; default all)")
    ] = None,
    pool_out: Annotated[
        Path | None, typer.Option(help="also write a replay pool YAML over the recordings here")
    ] = None,
    include_serving: Annotated[
        bool, typer.Option(help="also export serving traffic (users' questions); private entries never")
    ] = False,
) -> None:
    """Write the cached completions as a recordings file (docs/recordings.md), graded with the
    project's graders, so a replay pool can retrain and re-evaluate offline. Serving traffic is
    left out unless --include-serving; private entries are never exported."""
    from rl_conductor.workers.cache import open_store
    from rl_conductor.workers.cache_export import export_cache, replay_pool_yaml

    if not cache.startswith("s3://") and not Path(cache).is_file():
        raise typer.BadParameter(f"no cache at {cache} (a sqlite file written by a pool with `cache:`)")
    store = open_store(cache)
    stats = export_cache(store, out, workers=worker, include_serving=include_serving)
    console.print(
        f"wrote {stats['items']} items, {stats['responses']} responses of {len(stats['models'])} "
        f"workers ({', '.join(stats['models'])}) from {stats['entries']} cache entries -> {out} "
        f"(left out: {stats['serving_skipped']} serving, {stats['private_skipped']} private)"
    )
    if pool_out is not None:
        pool_out.write_text(replay_pool_yaml(out, stats["model_facts"]), encoding="utf-8")
        console.print(f"wrote {pool_out}")
