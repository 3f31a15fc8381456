"""Listen addresses: which ones stay on this machine (servers refuse to listen beyond it unprotected)."""

from __future__ import annotations

import ipaddress


def is_loopback(host: str) -> bool:
    """Whether the listen address ``host`` (a name, an IPv4 address or an ``[IPv6]`` one) is loopback only.

    Args:
        host: as given to ``--host``.

    Returns:
        True for ``localhost`` and loopback addresses; False for all-interfaces, other addresses and names.
    """
    name = host.strip("[]")
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False
