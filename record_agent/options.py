"""The settings of one ``mneme record`` run, validated once, and their form for the native recorder.

The recorder reads ``MNEME_*`` environment variables (record_agent/README.md);
:meth:`RecordOptions.recorder_environment` is the only place that writes them.

The settings are named tuples, not dataclasses: ``mneme record`` builds them
before it starts the application, and ``dataclasses`` (with ``inspect``)
would add its import to that start-up.
"""

from __future__ import annotations

import re
from collections import namedtuple

from mneme.errors import ConfigurationError
from mneme.recording.window import DEFAULT_VA_BASE

GIB = 1 << 30
DEFAULT_VASS_GIB = 4.0
DEFAULT_MAX_RECORDINGS = 4
DEFAULT_SPOOL_MAX_BYTES = 8 << 30
#: Seconds each wait the recorder adds to the application may last (snapshot waits add 1 s per GB).
DEFAULT_DEADLINE_S = 5.0
SNAPSHOT_SCOPES = ("auto", "all", "reachable")


class InstanceSlice(namedtuple("InstanceSlice", "start stop step", defaults=(0, None, 1))):
    """Launch indices ``start, start+step, ...`` below ``stop`` (None: no end) of each selected kernel."""

    __slots__ = ()

    def contains(self, index: int) -> bool:
        if index < self.start or (self.stop is not None and index >= self.stop):
            return False
        return (index - self.start) % self.step == 0

    def encode(self) -> str:
        return f"{self.start}:{'' if self.stop is None else self.stop}:{self.step}"


# Compiled when --instances is given (re caches them), not at import: `mneme record` imports this before the exec.
_SLICE = r"^(\d*):(\d*)(?::(\d*))?$"
_RANGE = r"^(\d+)-(\d+)$"


def parse_instances(spec: str) -> tuple[InstanceSlice, ...]:
    """Parse ``--instances``: comma-separated ``N`` (the N-th launch, from 0), ``A-B`` (inclusive)
    and ``START:STOP:STEP`` slices (Python's slice notation, parts optional: ``::10`` is every 10th).
    """
    slices = []
    for raw in spec.split(","):
        item = raw.strip()
        if not item:
            continue
        if item.isdigit():
            slices.append(InstanceSlice(int(item), int(item) + 1, 1))
        elif m := re.match(_RANGE, item):
            a, b = int(m.group(1)), int(m.group(2))
            if b < a:
                raise ConfigurationError(f"--instances: range {item!r} ends before it starts; write it as {b}-{a}")
            slices.append(InstanceSlice(a, b + 1, 1))
        elif m := re.match(_SLICE, item):
            start = int(m.group(1) or 0)
            stop = int(m.group(2)) if m.group(2) else None
            step = int(m.group(3)) if m.group(3) else 1
            if step < 1:
                raise ConfigurationError(f"--instances: step in {item!r} must be at least 1")
            slices.append(InstanceSlice(start, stop, step))
        else:
            raise ConfigurationError(
                f"--instances: cannot read {item!r}; use launch indices (3), ranges (2-5) or slices (0:100:10, ::10)"
            )
    if not slices:
        raise ConfigurationError("--instances is empty; give at least one launch index, range or slice")
    return tuple(slices)


def parse_ranks(spec: str) -> frozenset[int] | None:
    """Parse ``-rr``: ``all`` (None) or comma-separated rank numbers."""
    text = spec.strip().lower()
    if text == "all":
        return None
    ranks = set()
    for item in text.split(","):
        item = item.strip()
        if not item.isdigit():
            raise ConfigurationError(f"--record-ranks: {item!r} is not a rank number; use 'all' or a list like 0,2,5")
        ranks.add(int(item))
    if not ranks:
        raise ConfigurationError("--record-ranks is empty; use 'all' or a list like 0,2,5")
    return frozenset(ranks)


_OPTION_DEFAULTS = {
    "vass_gib": DEFAULT_VASS_GIB,
    "kernel_regexes": (),
    "skip_recordings": 0,
    "max_recordings": DEFAULT_MAX_RECORDINGS,
    "instances": (),
    "snapshot_scope": "auto",
    "eager_loading": False,
    "max_snapshot_bytes": 0,
    "record_ranks": frozenset({0}),
    "devices": (),
    "record_duplicates": False,
    "va_base": DEFAULT_VA_BASE,
    "spool_max_bytes": DEFAULT_SPOOL_MAX_BYTES,
    "deadline_s": DEFAULT_DEADLINE_S,
    "durable": False,
    "extra_env": None,
}


class RecordOptions(namedtuple("RecordOptions", ("command", "record_db_dir", *_OPTION_DEFAULTS),
                               defaults=tuple(_OPTION_DEFAULTS.values()))):
    """Everything that decides what one run records and where (checked when made: ConfigurationError).

    * ``command`` (tuple of str): the application and its arguments; ``record_db_dir``: a directory or
      ``s3://bucket/prefix``.
    * ``vass_gib``: the window per GPU; ``kernel_regexes``, ``skip_recordings``, ``max_recordings``,
      ``instances`` (:class:`InstanceSlice` s), ``devices``, ``record_duplicates``: which launches;
      ``record_ranks``: which MPI ranks (None: all).
    * ``snapshot_scope`` (``auto``, ``all``, ``reachable``), ``max_snapshot_bytes`` (0: no limit),
      ``eager_loading`` (``CUDA_MODULE_LOADING=EAGER`` for the application).
    * ``va_base``, ``spool_max_bytes``, ``deadline_s``: the window's base, the spool's bound, the
      recorder's deadline per wait.
    * ``durable``: each database and what it names survive a machine crash (``syncfs`` before the commit).
    * ``extra_env``: more ``MNEME_*`` variables for the recorder.
    """

    __slots__ = ()

    def __new__(cls, *args, **kwargs):
        self = super().__new__(cls, *args, **kwargs)
        if self.extra_env is None:
            self = self._replace(extra_env={})
        errors = self.validation_errors()
        if errors:
            raise ConfigurationError("; ".join(errors))
        return self

    def validation_errors(self) -> list[str]:
        errors = []
        if not self.command:
            errors.append("no application given; write it after '--': mneme record -rdb DIR -- ./app args")
        if not self.record_db_dir:
            errors.append("-rdb/--record-db-dir is required")
        if not (self.vass_gib > 0):
            errors.append(f"-vass {self.vass_gib}: the window size must be a positive number of GiB")
        if self.skip_recordings < 0:
            errors.append(f"-sr {self.skip_recordings} must be >= 0")
        if self.max_recordings < 0:
            errors.append(f"-mr {self.max_recordings} must be >= 0 (0: no limit)")
        if self.snapshot_scope not in SNAPSHOT_SCOPES:
            errors.append(f"--snapshot-scope {self.snapshot_scope!r} is not one of {', '.join(SNAPSHOT_SCOPES)}")
        if self.max_snapshot_bytes < 0:
            errors.append("--max-snapshot-bytes must be >= 0 (0: no limit)")
        if any(d < 0 for d in self.devices):
            errors.append("--device numbers must be >= 0")
        for regex in self.kernel_regexes:
            try:
                re.compile(regex)
            except re.error as exc:
                errors.append(f"--kernel {regex!r} is not a valid regular expression ({exc})")
        if not (self.deadline_s > 0):
            errors.append(f"--deadline {self.deadline_s}: the deadline must be a positive number of seconds")
        if self.va_base <= 0 or self.va_base % (2 << 20):
            errors.append(f"MNEME_VA_BASE {self.va_base:#x} must be a positive multiple of 2 MiB")
        return errors

    @property
    def vass_bytes(self) -> int:
        """The window size, rounded up to the 2 MiB mapping granularity."""
        granule = 2 << 20
        return -(-int(self.vass_gib * GIB) // granule) * granule

    @property
    def is_s3(self) -> bool:
        return self.record_db_dir.startswith("s3://")

    def recorder_environment(self, spool_dir: str, rank: int | None) -> dict[str, str]:
        """The ``MNEME_*`` variables the native recorder reads (README.md, "Settings")."""
        env = {
            "MNEME_SPOOL_DIR": spool_dir,
            "MNEME_VA_BASE": hex(self.va_base),
            "MNEME_VA_SIZE": str(self.vass_bytes),
            "MNEME_SKIP": str(self.skip_recordings),
            "MNEME_MAX": str(self.max_recordings),
            "MNEME_SNAPSHOT_SCOPE": self.snapshot_scope,
            "MNEME_MAX_SNAPSHOT_BYTES": str(self.max_snapshot_bytes),
            "MNEME_SPOOL_MAX_BYTES": str(self.spool_max_bytes),
            "MNEME_RECORD_DUPLICATES": "1" if self.record_duplicates else "0",
            "MNEME_RECORD_DEADLINE": f"{self.deadline_s:g}",
            "MNEME_RANK": "" if rank is None else str(rank),
        }
        if self.kernel_regexes:
            env["MNEME_KERNEL_REGEX"] = "\n".join(self.kernel_regexes)
        if self.instances:
            env["MNEME_INSTANCES"] = ",".join(s.encode() for s in self.instances)
        if self.devices:
            env["MNEME_DEVICES"] = ",".join(str(d) for d in self.devices)
        env.update(self.extra_env)
        return env
