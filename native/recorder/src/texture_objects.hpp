// Texture and surface objects, and the CUDA arrays behind them (docs/recording.md, "Texture and
// surface objects"). The CUPTI exit callbacks of the calls that create and destroy them keep a
// registry here: each object with the descriptors its creation passed (resource, texture, view),
// each CUDA array with where it came from (cuArrayCreate, cuArray3DCreate, a level of a mipmapped
// array), each mipmapped array. At a recorded launch, objects_at_launch() describes every live
// object for the spool entry ("objects") and says which CUDA arrays the snapshots copy (regions of
// kind "array") and which device memory the objects read (roots of the reachable scope). Which
// objects the kernel really reaches, and through which words, the agent decides
// (record_agent/textures.py).
#pragma once
#include <cuda.h>

#include <cstdint>
#include <string>
#include <vector>

namespace mneme::rec {

// Registry (any thread; a leaf lock, no driver call under it).
void note_texture_object(uint64_t handle, const CUDA_RESOURCE_DESC* resource, const CUDA_TEXTURE_DESC* texture,
                         const CUDA_RESOURCE_VIEW_DESC* view);
void note_surface_object(uint64_t handle, const CUDA_RESOURCE_DESC* resource);
void forget_texture_object(uint64_t handle);
void forget_surface_object(uint64_t handle);
void note_array(CUarray array, const char* origin);  // origin: "created" | "mipmap level"
void forget_array(CUarray array);
bool any_live_object();

// A CUDA array a snapshot copies: its contents as packed rows (row_bytes per row, rows per slice,
// slices), through a staging buffer in device memory (copy_array_async).
struct ArrayCapture {
  CUarray array = nullptr;
  CUDA_ARRAY3D_DESCRIPTOR desc{};
  uint64_t row_bytes = 0, rows = 1, slices = 1;
  uint64_t bytes() const { return row_bytes * rows * slices; }
  std::string shape_json() const;  // the region's "array": {width, height, depth, format, channels, flags}
};

struct ObjectsAtLaunch {
  std::string json = "[]";                  // launch.json "objects"
  std::vector<ArrayCapture> arrays;         // the arrays behind the objects that can be captured
  std::vector<uint64_t> linear_addresses;   // device memory the objects read (linear and pitched resources)
};

// Describes every live object (asks the driver for the arrays' descriptors: call it outside the
// recorder's lock, on the recording thread).
ObjectsAtLaunch objects_at_launch();

// Enqueues the copy of an array's contents into `staging` (packed rows) on `stream`.
CUresult copy_array_async(const ArrayCapture& a, CUdeviceptr staging, CUstream stream);

}  // namespace mneme::rec
