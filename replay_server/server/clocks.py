"""``mneme serve --lock-clocks base|max|off``: the server's GPU at fixed clocks while it serves.

Locked clocks take the GPU's boost out of the measurements: a configuration's time no longer depends on
how warm the GPU is or what ran before. The lock is NVML's (``mneme._internal.nvml.ClockLock``) on the
GPU the server's ``--gpu`` names (found by the PCI bus id the CUDA driver gives for it, as the workers see
it); the server puts the clocks back when it stops (SIGTERM and SIGINT stop it, and so does its idle
time), and at the process's exit. Where locking is not permitted (no root, a virtualized GPU) or NVML is
not there, the server says so once and serves at the GPU's own clocks; every result records the clocks
it was measured at (``conditions``).
"""

from __future__ import annotations

import logging
from typing import Callable

from mneme._internal import nvml
from mneme.errors import ConfigurationError, NotAvailableError

log = logging.getLogger("mneme.serve")

#: ``--lock-clocks`` values.
LOCK_MODES = nvml.LOCK_MODES


class ServerClocks:
    """The clocks of one server's GPU: locked by :meth:`lock`, put back by :meth:`restore`.

    Args:
        gpu: the server's ``--gpu``.
        mode: ``off``, ``base`` or ``max``.
        device_of: finds the NVML device of a CUDA ordinal (default :func:`mneme._internal.nvml.cuda_device`).
    """

    def __init__(self, gpu: int, mode: str, device_of: Callable[[int], nvml.Device] | None = None) -> None:
        if mode not in LOCK_MODES:
            raise ConfigurationError(f"--lock-clocks {mode!r}: use one of {', '.join(LOCK_MODES)}")
        self.gpu, self.mode = gpu, mode
        self._device_of = device_of or nvml.cuda_device
        self._lock: nvml.ClockLock | None = None
        self.problem = ""

    def lock(self) -> str:
        """Lock the clocks as ``mode`` says (nothing for ``off``).

        Returns:
            What was locked, for the server's listening line; '' when nothing was (``off``, or a refusal:
            logged once, and kept in ``problem``).
        """
        if self.mode == "off":
            return ""
        try:
            device = self._device_of(self.gpu)
        except NotAvailableError as exc:
            self.problem = f"--lock-clocks {self.mode}: the clocks are not locked: {exc}"
            nvml.say_once(self.problem, log)
            return ""
        self._lock = nvml.ClockLock(device, self.mode)
        self.problem = self._lock.apply()  # (a refusal is said once there)
        if not self._lock.locked:
            return ""
        locked = " and ".join(f"{'SM' if key == 'sm_clock_mhz' else 'memory'} {value}"
                              + ("" if value == "base" else " MHz") for key, value in self._lock.locked.items())
        return f"clocks locked at {self.mode}: {locked} until it stops"

    def restore(self) -> None:
        """Put the clocks back (once; nothing when none were locked)."""
        if self._lock is not None:
            self._lock.restore()
            if self._lock.locked:
                log.info("clocks of GPU %d restored", self.gpu)
            self._lock = None
