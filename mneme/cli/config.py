"""`mneme config`: print the paths and flags of the instrumented build.

As in the reference: ``cmake -DCMAKE_CUDA_COMPILER=$(mneme config cxx)
-DCMAKE_PREFIX_PATH=$(mneme config cmakedir)`` and ``add_mneme(target)`` in
CMakeLists.txt, or ``$(mneme config cxx) -arch=sm_90 -o app app.cu`` by hand.
"""

from __future__ import annotations

import argparse
import os
import stat
import sys
from pathlib import Path

from mneme.cli.command import Command
from mneme.errors import NotAvailableError

PACKAGE_DIR = Path(__file__).resolve().parent.parent
TOOLCHAIN_DIR = PACKAGE_DIR / "toolchain"
WRAPPERS = {"cc": "mneme-cc", "cxx": "mneme-c++"}


def _launcher(kind: str) -> Path:
    """The wrapper script; when the install lost its executable bit, an executable copy
    in the user's cache that runs with this Python."""
    shipped = TOOLCHAIN_DIR / "bin" / WRAPPERS[kind]
    if not shipped.exists():
        raise NotAvailableError(f"{shipped} is missing; reinstall mneme")
    if os.access(shipped, os.X_OK):
        return shipped
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "mneme" / "bin"
    cache.mkdir(parents=True, exist_ok=True)
    copy = cache / WRAPPERS[kind]
    mode = "c++" if kind == "cxx" else "cc"
    copy.write_text(
        f"#!{sys.executable}\nimport sys\nsys.path.insert(0, {str(PACKAGE_DIR.parent)!r})\n"
        f"from mneme.toolchain.wrapper import main\nsys.exit(main({mode!r}, sys.argv[1:]))\n"
    )
    copy.chmod(copy.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return copy


def value(what: str) -> str:
    """What ``mneme config WHAT`` prints."""
    if what in WRAPPERS:
        return str(_launcher(what))
    include = TOOLCHAIN_DIR / "include"
    return {
        "prefix": str(PACKAGE_DIR),
        "libdir": str(PACKAGE_DIR / "lib"),  # libmneme_recorder.so (LD_PRELOADed by `mneme record`)
        "includedir": str(include),  # mneme_section.h: the embedded-bitcode section format
        "cmakedir": str(PACKAGE_DIR / "cmake"),  # mneme-config.cmake: find_package(mneme), add_mneme()
        "cflags": f"-I{include}",
        "ldflags": "",  # the instrumented build links nothing of mneme's
    }[what]


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "what",
        choices=["cc", "cxx", "prefix", "libdir", "includedir", "cmakedir", "cflags", "ldflags"],
        help="cc/cxx: compiler wrappers that embed kernel LLVM IR; cmakedir: for CMAKE_PREFIX_PATH "
        "(find_package(mneme) then add_mneme(target)); prefix/libdir/includedir/cflags/ldflags: install paths",
    )


def run(args: argparse.Namespace) -> int:
    print(value(args.what))
    return 0


COMMANDS = [Command("config", "print paths and flags of mneme's instrumented build", configure, run)]
