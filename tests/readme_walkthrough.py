"""The README's walkthrough as data: its shell block split into commands, and the Python example it names.

Used by tests/gpu/test_readme.py (which runs them, verbatim, from a copy of
the checkout) and by a CPU test that checks the README still has them.
Importable from any test folder (the tests folder is on sys.path through its conftest.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
ASSIGNMENT = re.compile(r"([A-Z_][A-Z0-9_]*)=\$\((.*)\)\s*(#.*)?")


@dataclass(frozen=True)
class Step:
    """One command of the walkthrough: ``text`` as written (continuations joined), or a variable assignment."""

    text: str
    variable: str = ""  # NAME of `NAME=$(command)`: the command's output fills $NAME in later steps

    @property
    def words(self) -> list[str]:
        """The command's words, without a trailing comment."""
        return self.text.split("#", 1)[0].split()


def section(text: str, heading: str) -> str:
    """The body of the ``## heading`` section of a markdown text."""
    match = re.search(rf"^## {re.escape(heading)}\s*$(.*?)(?=^## |\Z)", text, re.M | re.S)
    if match is None:
        raise AssertionError(f"README.md has no '## {heading}' section")
    return match.group(1)


def walkthrough_steps(text: str | None = None) -> list[Step]:
    """The commands of the first ``sh`` block of the README's Walkthrough section, in order."""
    body = section(README.read_text() if text is None else text, "Walkthrough")
    block = re.search(r"^```sh\s*$(.*?)^```\s*$", body, re.M | re.S)
    if block is None:
        raise AssertionError("the README's Walkthrough has no ```sh block")
    steps, pending = [], ""
    for line in block.group(1).splitlines():
        code = line.split("#", 1)[0].rstrip()
        if code.endswith("\\"):
            pending += code[:-1].rstrip() + " "
            continue
        whole = (pending + line.strip()) if pending else line.strip()
        pending = ""
        if not whole or whole.startswith("#"):
            continue
        assigned = ASSIGNMENT.fullmatch(whole)
        steps.append(Step(assigned.group(2).strip(), assigned.group(1)) if assigned else Step(whole))
    return steps


def python_example(text: str | None = None) -> str:
    """The ``python examples/...`` command the Walkthrough names (in backticks)."""
    body = section(README.read_text() if text is None else text, "Walkthrough")
    match = re.search(r"`(python3? examples/[^`]+)`", body)
    if match is None:
        raise AssertionError("the README's Walkthrough names no `python examples/...` command")
    return match.group(1)
