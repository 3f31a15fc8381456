"""The replay engine as the server sees it: a small interface with two sides.

``EngineSpec`` is a picklable description that crosses into worker processes
(``spawn``) and, there, proves the GPU works (``self_test``) and opens
``PreparedInstance``s: one recorded instance restored on the device, ready to
replay configurations. ``compiler()`` names a top-level function the CPU
compile pool may run ahead of the GPU (or None).

This module is the interface only and imports no implementation. The real
implementation is ``replay_server.server.cuda_engine.CudaEngineSpec`` (over
``mneme.replay``), which depends on it; ``replay_server.server.engines`` picks the
implementation a server runs. The CPU tests plug in a test engine that
crashes, hangs or dawdles on request, so that fault isolation is tested with
real processes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from mneme.model.experiment import ExperimentConfiguration, ExperimentResult
from mneme.model.measurement import DEFAULT_MEASUREMENT, MeasurementSettings
from mneme.model.verification import ResetDecision, VerificationSettings

DEFAULT_VERIFICATION = VerificationSettings().key()


@dataclass(frozen=True)
class InstanceKey:
    """One recorded instance inside one store, verified one way: what a worker prepares."""

    store: str  # store URL (a directory or s3://bucket/prefix)
    record_db: str  # validated store key of the recording database
    record_id: str  # dynamic hash
    # How its replays verify: VerificationSettings.key() (InstanceRef.verification). A text, so that a key is
    # cheap to hash and to send to a worker with every job; ``verification_settings()`` gives the object back.
    verification: str = DEFAULT_VERIFICATION
    # Which version of the database file (a local store's; "" for remote stores, whose objects are not rewritten):
    # a server that runs long (kept for later tuners) must not replay a database rewritten since from its caches.
    revision: str = ""
    # What its replays measure besides times: MeasurementSettings.key() (InstanceRef.measurement), a text for the
    # same reasons; new settings are a new prepared instance, as new verification settings are.
    measurement: str = DEFAULT_MEASUREMENT

    def measurement_settings(self) -> MeasurementSettings:
        """The measurement settings this key names.

        Returns:
            The settings (``MeasurementSettings.from_dict`` of the key's text).
        """
        return MeasurementSettings.from_dict(json.loads(self.measurement))

    def verification_settings(self) -> VerificationSettings:
        """The verification settings this key names.

        Returns:
            The settings (``VerificationSettings.from_dict`` of the key's text).
        """
        return VerificationSettings.from_dict(json.loads(self.verification))


# A compile function: (instance, configuration dict, GPU arch) -> picklable product.
CompileFunction = Callable[[InstanceKey, dict, str], Any]


class PreparedInstance(Protocol):
    """An instance restored on the device; replays configurations of it."""

    @property
    def device_bytes(self) -> int: ...

    @property
    def healthy(self) -> bool:
        """False once a fault destroyed the CUDA context: the worker must go."""
        ...

    def get_ready(self) -> str:
        """The one-time device work a first replay would otherwise pay for, done when the instance is
        prepared (``Prepare``, under the replay watchdog). '' when ready, else why the instance cannot
        replay on this worker (then ``healthy`` may be False: the worker must go)."""
        ...

    def run(
        self, config: ExperimentConfiguration, iterations: int, warmup: int, compiled: Any = None,
        metrics: tuple[str, ...] = (),
    ) -> ExperimentResult:
        """Never raises for a bad configuration: failures come back as failed results. ``metrics``: hardware
        counters to collect after the timed launches (``result.metrics``, else ``result.metrics_error``); an
        engine whose ``run`` takes no ``metrics`` is answered with a ``metrics_error`` saying it does not profile."""
        ...

    def fallback(self) -> ResetDecision | None:
        """When the reset policy's proof lost the CUDA context on a second launch without a reset (a
        kernel that is not idempotent), how the next worker replays the instance: resets before every
        launch, and why. None otherwise."""
        ...

    @property
    def kernel_ns(self) -> int | None:
        """The kernel's time (measured when prepared, else recorded): the replay watchdog's base."""
        ...

    def close(self) -> None: ...


class EngineSpec(Protocol):
    """Picklable factory of prepared instances, used inside worker processes."""

    name: str

    def warm_up(self) -> None:
        """Import what ``open`` will need. A worker runs it on a thread of its own while the driver
        starts (``self_test``), so the imports leave the critical path of its first instance."""
        ...

    def self_test(self, device: int) -> dict:
        """Raise when the device cannot replay; return facts about it ({'arch': 'sm_90', ...})."""
        ...

    def open(self, instance: InstanceKey, device: int, reset_decision: ResetDecision | None = None) -> PreparedInstance:
        """Load and restore ``instance`` (with the reset policy a proof made elsewhere decided: then none is
        made here); raise LookupError for an unknown id, ArtifactError for a bad artifact."""
        ...

    def compiler(self) -> CompileFunction | None: ...
