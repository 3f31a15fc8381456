"""The shape every subcommand has."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Callable

from mneme.errors import NotAvailableError


@dataclass(frozen=True)
class Command:
    """One ``mneme NAME`` subcommand: its help line, its arguments, its action."""

    name: str
    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


def not_landed(feature: str, issue: int) -> Callable[[argparse.Namespace], int]:
    """A ``run`` for a subcommand whose implementation has not landed yet."""

    def run(args: argparse.Namespace) -> int:
        raise NotAvailableError(
            f"{feature} is not implemented in this version of mneme yet (tracked in issue #{issue}); "
            "upgrade mneme or use another subcommand"
        )

    return run
