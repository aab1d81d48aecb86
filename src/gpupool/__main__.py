"""`python -m gpupool` runs the CLI (useful where the console script is not on PATH)."""

from gpupool.cli import main

main()
