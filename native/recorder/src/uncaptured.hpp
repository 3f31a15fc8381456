// What the recorder sees but does not capture: pinned host memory the device
// can address and memory opened from another process over IPC. Each recorded
// launch lists them (the spool entry's "foreign_memory"), so that the agent can
// mark a launch that reaches any of them unsupported instead of recording
// something that replays into a fault. The handles of the texture and surface
// objects alive are listed too ("texture_objects", "surface_objects"); the
// objects themselves are captured (texture_objects.hpp).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace mneme::rec {

struct ForeignRange {
  const char* kind = "";  // "host" | "ipc" (managed memory is captured: memory_window.hpp)
  uint64_t base = 0;
  uint64_t size = 0;
};

enum class ObjectKind { texture, surface };

void note_foreign_range(const char* kind, uint64_t base, uint64_t size);
void forget_foreign_range(uint64_t base);  // no-op for an address that is not a foreign range's base
bool find_foreign(uint64_t addr, ForeignRange* out);
std::vector<ForeignRange> foreign_ranges();

void note_object(ObjectKind kind, uint64_t handle, bool alive);
std::vector<uint64_t> live_objects(ObjectKind kind);

// The spool entry's keys: "foreign_memory", "texture_objects", "surface_objects".
std::string uncaptured_json();

}  // namespace mneme::rec
