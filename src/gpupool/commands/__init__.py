"""Entry-layer click commands, one module per `gpupool` subcommand (loaded lazily by gpupool.cli)."""
