"""The recorder's window lies where no process of ours has host mappings (model and /proc/self/maps)."""

from __future__ import annotations

import platform
import resource
import subprocess
import sys

import pytest

from mneme.recording.window import DEFAULT_VA_BASE, FALLBACK_VA_BASES
from mneme.replay.address_map import (
    Mapping,
    describe_taken,
    kernel_zones,
    mappings_in,
    parse_maps,
    read_maps,
    zones_overlapping,
)

OLD_DEFAULT_BASE = 0x7F0000000000
#: The windows of 8 GPUs at the largest -vass the docs suggest (device d at base + d * size).
WINDOW_SPAN = 8 * (64 << 30)
x86_64_only = pytest.mark.skipif(platform.machine() != "x86_64", reason="the zone model is of x86-64's layout")

MAPS = """\
55d0c0000000-55d0c0021000 r--p 00000000 fe:00 260131                     /usr/bin/python3.11
7f00000a0000-7f00000b0000 rw-p 00000000 00:00 0 
7f0000200000-7f0000400000 r-xp 00000000 fe:00 1234                       /usr/lib/x86_64-linux-gnu/libz.so.1
7fff105e9000-7fff1060a000 rw-p 00000000 00:00 0                          [stack]
"""


def test_maps_are_parsed_and_searched():
    maps = parse_maps(MAPS)
    assert maps[0] == Mapping(0x55D0C0000000, 0x55D0C0021000, "r--p", "/usr/bin/python3.11")
    assert maps[1].path == "" and maps[3].path == "[stack]"
    assert mappings_in(0x7F0000000000, 0x7F0000100000, maps) == [maps[1]]
    assert mappings_in(0x7F00000B0000, 0x7F0000200000, maps) == []  # half-open on both sides
    text = describe_taken(0x7F0000000000, 0x7F0100000000, maps, limit=1)
    assert text == "/proc/self/maps has there: 0x7f00000a0000-0x7f00000b0000 rw-p [anonymous]; and 1 more"
    assert describe_taken(0x200000000000, 0x200100000000, maps) == ""
    assert read_maps("/nonexistent/maps") is None


@x86_64_only
@pytest.mark.parametrize("base", [DEFAULT_VA_BASE, *FALLBACK_VA_BASES])
def test_the_recorders_windows_are_outside_every_zone_of_the_kernels_layout(base):
    assert zones_overlapping(base, base + WINDOW_SPAN) == []


@x86_64_only
def test_the_old_default_base_was_inside_the_mmap_zone():
    assert [z.name for z in zones_overlapping(OLD_DEFAULT_BASE, OLD_DEFAULT_BASE + (4 << 30))] == ["mmap"]


_PROBE = """
import grpc, numpy, zstandard, yaml
import mneme.cli, mneme.recording.execution, mneme.replay, mneme.replay.replayer, mneme.replay.state
import replay_server.server.serve, replay_server.server.worker, replay_server.server.cuda_engine
print(open("/proc/self/maps").read())
"""


def _unlimited_stack() -> None:
    resource.setrlimit(resource.RLIMIT_STACK, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))


@x86_64_only
@pytest.mark.parametrize("stack", ["default", "unlimited"])
def test_fresh_processes_importing_the_replay_stack_map_nothing_in_the_windows(stack):
    """Several fresh interpreters (each with its own randomized layout) import what `mneme replay` and a
    replay server import: every mapping lies in a modelled zone and none in a recorder window."""
    if stack == "unlimited" and resource.getrlimit(resource.RLIMIT_STACK)[1] != resource.RLIM_INFINITY:
        pytest.skip("the hard stack limit here is finite: cannot raise it to unlimited")
    zones = kernel_zones()
    windows = [(b, b + WINDOW_SPAN) for b in (DEFAULT_VA_BASE, *FALLBACK_VA_BASES)]
    for _ in range(4):
        out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, check=True, timeout=120,
                             preexec_fn=_unlimited_stack if stack == "unlimited" else None).stdout
        maps = [m for m in parse_maps(out) if m.path != "[vsyscall]"]  # the fixed legacy page at the top
        assert len(maps) > 50  # the probe imported the stack
        for lo, hi in windows:
            assert mappings_in(lo, hi, maps) == [], f"{lo:#x}: {describe_taken(lo, hi, maps)}"
        outside = [m.describe() for m in maps if not any(z.overlaps(m.start, m.end) for z in zones)]
        assert outside == [], "mappings outside the modelled zones: the model is wrong for this kernel"
