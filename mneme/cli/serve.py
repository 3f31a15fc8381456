"""`mneme serve`: run a per-GPU gRPC replay server (the command line lives with the server)."""

from __future__ import annotations

from mneme.cli.command import Command
from replay_server.server import cli

COMMANDS = [Command("serve", cli.HELP, cli.configure, cli.run)]
