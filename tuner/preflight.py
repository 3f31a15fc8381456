"""What a run checks before any replay server starts: where its results go, and that the servers it was
given answer.

A run that cannot write its results directory (a read-only project area, a typo, no quota left) or whose
``--servers`` are all unreachable stops here, with one line that names the directory or the addresses,
instead of after its servers started and its baseline ran.
"""

from __future__ import annotations

import errno
import socket

from tuner.errors import ServersUnreachableError
from tuner.results.directory import DEFAULT_ROOT, ResultsDirectory, check_writable

#: Seconds a server's address is given to accept a connection.
CONNECT_TIMEOUT_S = 3.0


def check_results_location(results_dir: str | None, resume: bool) -> None:
    """The results directory can be written and holds what the run expects.

    Args:
        results_dir: ``--results-dir`` (None: a new directory under ``mneme-tune-results/``, whose root is
            checked).
        resume: ``--resume``: the directory must hold a run (``config.json``); otherwise it must hold none.

    Raises:
        ResultsDirectoryError: ``cannot write DIR: REASON``.
        ConfigurationError: a directory that holds a run without ``--resume``, or none with it.
    """
    if results_dir is None:
        check_writable(DEFAULT_ROOT)
    else:
        ResultsDirectory(results_dir).check(resume)


def split_address(address: str) -> tuple[str, int] | None:
    """The host and port a TCP connection to a replay server dials.

    Args:
        address: ``host:port`` or ``[v6]:port`` (or a gRPC form such as ``unix:PATH``).

    Returns:
        (host, port), or None for forms this check does not dial.
    """
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or address.startswith("unix"):
        return None
    return host.strip("[]") or "localhost", int(port)


def connect_error(address: str, timeout: float = CONNECT_TIMEOUT_S) -> str | None:
    """Dial ``address`` once.

    Args:
        address: a replay server's ``host:port``.
        timeout: seconds the connection may take.

    Returns:
        Why a TCP connection cannot be made (``connection refused``, ``unknown host (...)``, ``no answer in
        3 s``, ``no route to host``), or None when it can (or the address is of a form not dialed here).
    """
    where = split_address(address)
    if where is None:
        return None
    try:
        with socket.create_connection(where, timeout=timeout):
            return None
    except socket.gaierror as exc:
        return f"unknown host ({exc.strerror})"
    except (socket.timeout, TimeoutError):
        return f"no answer in {timeout:g} s"
    except ConnectionRefusedError:
        return "connection refused"
    except OSError as exc:
        if exc.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH):
            return "no route to host"
        return (exc.strerror or str(exc)).lower()


def check_servers(addresses: list[str], timeout: float = CONNECT_TIMEOUT_S) -> list[str]:
    """Dial every ``--servers`` address once.

    Args:
        addresses: ``host:port`` of the replay servers.
        timeout: seconds each may take to accept the connection.

    Returns:
        ``cannot reach HOST:PORT: REASON`` for each unreachable one, while at least one answers (the run
        goes on with those; the executor retries the others).

    Raises:
        ServersUnreachableError: none answers: every address with its reason.
    """
    problems = [(address, connect_error(address, timeout)) for address in addresses]
    lines = [f"cannot reach {address}: {reason}" for address, reason in problems if reason]
    if lines and len(lines) == len(addresses):
        raise ServersUnreachableError(
            "; ".join(lines) + "; check that `mneme serve` runs there and that --servers names its host and port")
    return lines

