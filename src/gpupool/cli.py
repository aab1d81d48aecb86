"""The `gpupool` command. Each subcommand imports its service lazily so that start-up stays fast."""

from __future__ import annotations

import click

from gpupool import __version__


@click.group()
@click.version_option(__version__, prog_name="gpupool")
def main() -> None:
    """gpupool: share the GPUs of a Kubernetes cluster as one pool."""
