"""``python -m sandboxd`` runs the CLI."""

from sandboxd.cli import main

main()
