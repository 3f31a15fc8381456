"""Where recordings put the application's device heap: the recorder's window bases.

A module of constants only, so that a replay worker can name the window without importing
the record agent (its start-up pays for every import).
"""

#: Where the recorder's window of device d starts: DEFAULT_VA_BASE + d * window size
#: (native/common/include/mneme/common/settings.hpp). 32 TiB is far from every zone where
#: Linux puts a process's own mappings (mneme.replay.address_map.kernel_zones: the top-down
#: mmap zone near 0x7f..., where shared libraries, Python's arenas and the CUDA driver's
#: ranges land, that zone under an unlimited stack limit near 0x15..., the legacy bottom-up
#: layout from 0x2aaa..., executables and brk), so a fresh replay process can reserve the
#: recorded addresses again.
#: The old default, 0x7f0000000000, lay inside the mmap zone.
DEFAULT_VA_BASE = 0x200000000000
#: Where the recorder tries next when the driver grants another address (memory_window.cpp).
FALLBACK_VA_BASES = (0x300000000000, 0x100000000000)
