"""The `gpupool` command. Subcommands live in gpupool.commands.<name> and are imported only when used,
so that `gpupool simulate` does not pay for the web or gRPC stacks."""

from __future__ import annotations

import importlib

import click

from gpupool import __version__

# subcommand -> module in gpupool.commands that defines a click command of the same name
SUBCOMMANDS = {
    "simulate": "Replay a GPU cluster trace against placement policies (no cluster needed).",
    "demo": "Run the scheduler over HTTP against an embedded cluster of fake GPU nodes.",
    "scheduler": "Serve the kube-scheduler extender against a real cluster.",
    "agent": "Run the node agent (kubelet device plugin, discovery, health).",
    "webhook": "Serve the admission webhook.",
    "top": "Show the pool in the terminal.",
    "hook": "The CUDA interception library behind hook isolation (gpupool hook path).",
    "mig": "MIG geometry, layouts and what-if planning per isolation.",
    "doctor": "Check an installation end to end and say what is wrong and how to fix it.",
    "migrate": "Move a pod's remote GPU share to another GPU server while it runs.",
    "drain": "Cordon a GPU node, move the remote shares it serves elsewhere and evict the pods holding its GPUs.",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(name for name in SUBCOMMANDS if self._load(name) is not None)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        return self._load(cmd_name)

    @staticmethod
    def _load(name: str) -> click.Command | None:
        if name not in SUBCOMMANDS:
            return None
        try:
            module = importlib.import_module(f"gpupool.commands.{name}")
        except ModuleNotFoundError as e:
            if e.name == f"gpupool.commands.{name}":
                return None  # not built yet
            raise
        command: click.Command = getattr(module, name)
        return command


@click.group(cls=LazyGroup)
@click.version_option(__version__, prog_name="gpupool")
def main() -> None:
    """gpupool: share the GPUs of a Kubernetes cluster as one pool."""
