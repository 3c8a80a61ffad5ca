"""The repository's tools, each run as `python -m tools.NAME` from the repository root or as `python -m a2a.cli
COMMAND` from anywhere (a2a.cli.COMMANDS lists them)."""
