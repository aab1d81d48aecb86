"""`gpupool hook`: the CUDA interception library that enforces `hook` isolation."""

from __future__ import annotations

import click


@click.group("hook")
def hook() -> None:
    """gpupool's CUDA interception library (memory cap, compute pacing, pod-wide accounting)."""


@hook.command("path")
def path() -> None:
    """Print the absolute path of the built libgpupool_hook.so."""
    from gpupool.hook import library_path

    lib = library_path()
    if not lib.is_file():
        click.echo(
            f"gpupool hook: {lib} is missing: the library is built at install time "
            "(pip install . or pip install -e ., which need a C compiler)",
            err=True,
        )
        raise SystemExit(2)
    click.echo(str(lib))
