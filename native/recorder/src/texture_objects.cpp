#include "texture_objects.hpp"

#include <cmath>
#include <cstdio>
#include <map>
#include <mutex>
#include <set>
#include <sstream>

#include "mneme/common/driver_api.hpp"
#include "mneme/common/text.hpp"

using namespace mneme::common;

namespace mneme::rec {
namespace {

struct ObjectRecord {
  bool surface = false;
  uint64_t handle = 0;
  CUDA_RESOURCE_DESC resource{};
  CUDA_TEXTURE_DESC texture{};
  bool has_view = false;
  CUDA_RESOURCE_VIEW_DESC view{};
};

std::mutex g_mu;
std::map<uint64_t, ObjectRecord> g_textures, g_surfaces;  // handle -> record
std::map<CUarray, std::string> g_arrays;                  // array -> origin

// CUarray_format -> bytes per channel, for the formats the recorder copies (mneme/format/textures.py).
size_t channel_bytes(CUarray_format f) {
  switch (f) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8:
      return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF:
      return 2;
    case CU_AD_FORMAT_UNSIGNED_INT32:
    case CU_AD_FORMAT_SIGNED_INT32:
    case CU_AD_FORMAT_FLOAT:
      return 4;
    default:
      return 0;
  }
}

bool known_format(CUarray_format f, unsigned channels, std::string* why) {
  if (channel_bytes(f) && (channels == 1 || channels == 2 || channels == 4)) return true;
  char buf[160];
  std::snprintf(buf, sizeof buf, "its format (0x%x, %u channel(s)) is not one the recorder copies", unsigned(f),
                channels);
  *why = buf;
  return false;
}

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", v);  // exact for a float
  return buf;
}

std::string hex_text(uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%llx", (unsigned long long)v);
  return buf;
}

// Why an array cannot be copied ("" when it can), its descriptor in *desc.
std::string array_problem(CUarray array, CUDA_ARRAY3D_DESCRIPTOR* desc) {
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (!g_arrays.count(array))
      return "its CUDA array " + hex_text(reinterpret_cast<uint64_t>(array)) +
             " was not made by cuArrayCreate or cuArray3DCreate (graphics interop?), and the recorder copies no "
             "other";
  }
  auto& d = driver();
  if (!d.cuArray3DGetDescriptor_v2) return "the driver cannot describe its CUDA array (cuArray3DGetDescriptor)";
  CUresult r = d.cuArray3DGetDescriptor_v2(desc, array);
  if (r != CUDA_SUCCESS) return std::string("cuArray3DGetDescriptor failed on its CUDA array: ") + error_string(r);
  if (desc->Flags & CUDA_ARRAY3D_LAYERED) return "layered CUDA arrays are not captured";
  if (desc->Flags & CUDA_ARRAY3D_CUBEMAP) return "cubemap CUDA arrays are not captured";
  if (desc->Flags & (CUDA_ARRAY3D_SPARSE | CUDA_ARRAY3D_DEFERRED_MAPPING)) return "sparse CUDA arrays are not captured";
  const unsigned allowed = CUDA_ARRAY3D_SURFACE_LDST | CUDA_ARRAY3D_TEXTURE_GATHER;
  if (desc->Flags & ~allowed) return "CUDA arrays with flags " + hex_text(desc->Flags) + " are not captured";
  std::string why;
  if (!known_format(desc->Format, desc->NumChannels, &why)) return "its CUDA array: " + why;
  if (!desc->Width || (desc->Depth && !desc->Height)) return "its CUDA array has an empty extent";
  return "";
}

std::string resource_json(const CUDA_RESOURCE_DESC& r, std::string* why) {
  std::ostringstream os;
  switch (r.resType) {
    case CU_RESOURCE_TYPE_ARRAY:
      os << "{\"type\": \"array\", \"array\": " << reinterpret_cast<uint64_t>(r.res.array.hArray) << "}";
      break;
    case CU_RESOURCE_TYPE_MIPMAPPED_ARRAY:
      os << "{\"type\": \"mipmapped_array\", \"mipmapped_array\": "
         << reinterpret_cast<uint64_t>(r.res.mipmap.hMipmappedArray) << "}";
      *why = "mipmapped array texture objects are not captured";
      break;
    case CU_RESOURCE_TYPE_LINEAR:
      os << "{\"type\": \"linear\", \"address\": " << r.res.linear.devPtr << ", \"format\": "
         << unsigned(r.res.linear.format) << ", \"channels\": " << r.res.linear.numChannels << ", \"size\": " << r.res.linear.sizeInBytes << "}";
      known_format(r.res.linear.format, r.res.linear.numChannels, why);
      break;
    case CU_RESOURCE_TYPE_PITCH2D:
      os << "{\"type\": \"pitch2d\", \"address\": " << r.res.pitch2D.devPtr << ", \"format\": "
         << unsigned(r.res.pitch2D.format) << ", \"channels\": " << r.res.pitch2D.numChannels << ", \"width\": "
         << r.res.pitch2D.width << ", \"height\": " << r.res.pitch2D.height << ", \"pitch\": "
         << r.res.pitch2D.pitchInBytes << "}";
      known_format(r.res.pitch2D.format, r.res.pitch2D.numChannels, why);
      break;
    default:
      os << "null";
      *why = "its resource type (" + std::to_string(int(r.resType)) + ") is not one the recorder knows";
  }
  return os.str();
}

std::string texture_json(const CUDA_TEXTURE_DESC& t, std::string* why) {
  const double floats[] = {t.mipmapLevelBias, t.minMipmapLevelClamp, t.maxMipmapLevelClamp, t.borderColor[0],
                           t.borderColor[1], t.borderColor[2], t.borderColor[3]};
  for (double v : floats)
    if (!std::isfinite(v)) {
      *why = "its texture descriptor holds a value that is not a finite number";
      return "null";
    }
  std::ostringstream os;
  os << "{\"address_mode\": [" << int(t.addressMode[0]) << ", " << int(t.addressMode[1]) << ", "
     << int(t.addressMode[2]) << "], \"filter_mode\": " << int(t.filterMode) << ", \"flags\": " << t.flags << ", \"max_anisotropy\": "
     << t.maxAnisotropy << ", \"mipmap_filter_mode\": " << int(t.mipmapFilterMode) << ", \"mipmap_level_bias\": "
     << number(t.mipmapLevelBias) << ", \"min_mipmap_level_clamp\": " << number(t.minMipmapLevelClamp)
     << ", \"max_mipmap_level_clamp\": " << number(t.maxMipmapLevelClamp) << ", \"border_color\": ["
     << number(t.borderColor[0]) << ", " << number(t.borderColor[1]) << ", " << number(t.borderColor[2]) << ", "
     << number(t.borderColor[3]) << "]}";
  return os.str();
}

std::string view_json(const CUDA_RESOURCE_VIEW_DESC& v) {
  std::ostringstream os;
  os << "{\"format\": " << int(v.format) << ", \"width\": " << v.width << ", \"height\": " << v.height
     << ", \"depth\": " << v.depth << ", \"first_mipmap_level\": " << v.firstMipmapLevel << ", \"last_mipmap_level\": "
     << v.lastMipmapLevel << ", \"first_layer\": " << v.firstLayer << ", \"last_layer\": " << v.lastLayer << "}";
  return os.str();
}

}  // namespace

void note_texture_object(uint64_t handle, const CUDA_RESOURCE_DESC* resource, const CUDA_TEXTURE_DESC* texture,
                         const CUDA_RESOURCE_VIEW_DESC* view) {
  ObjectRecord o;
  o.handle = handle;
  if (resource) o.resource = *resource;
  if (texture) o.texture = *texture;
  if (view) {
    o.has_view = true;
    o.view = *view;
  }
  std::lock_guard<std::mutex> lock(g_mu);
  g_textures[handle] = o;
}

void note_surface_object(uint64_t handle, const CUDA_RESOURCE_DESC* resource) {
  ObjectRecord o;
  o.surface = true;
  o.handle = handle;
  if (resource) o.resource = *resource;
  std::lock_guard<std::mutex> lock(g_mu);
  g_surfaces[handle] = o;
}

void forget_texture_object(uint64_t handle) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_textures.erase(handle);
}

void forget_surface_object(uint64_t handle) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_surfaces.erase(handle);
}

void note_array(CUarray array, const char* origin) {
  if (!array) return;
  std::lock_guard<std::mutex> lock(g_mu);
  g_arrays[array] = origin;
}

void forget_array(CUarray array) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_arrays.erase(array);
}

bool any_live_object() {
  std::lock_guard<std::mutex> lock(g_mu);
  return !g_textures.empty() || !g_surfaces.empty();
}

std::string ArrayCapture::shape_json() const {
  std::ostringstream os;
  os << "{\"width\": " << desc.Width << ", \"height\": " << desc.Height << ", \"depth\": " << desc.Depth
     << ", \"format\": " << unsigned(desc.Format) << ", \"channels\": " << desc.NumChannels << ", \"flags\": "
     << desc.Flags << "}";
  return os.str();
}

ObjectsAtLaunch objects_at_launch() {
  std::vector<ObjectRecord> live;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    for (const auto* table : {&g_textures, &g_surfaces})
      for (const auto& kv : *table) live.push_back(kv.second);
  }
  ObjectsAtLaunch out;
  std::set<CUarray> planned;
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < live.size(); ++i) {
    const ObjectRecord& o = live[i];
    std::string why;
    std::string resource = resource_json(o.resource, &why);
    std::string texture = o.surface ? "null" : texture_json(o.texture, &why);
    if (why.empty() && o.surface && o.resource.resType != CU_RESOURCE_TYPE_ARRAY)
      why = "a surface object over anything but a CUDA array";
    if (why.empty() && o.resource.resType == CU_RESOURCE_TYPE_ARRAY) {
      ArrayCapture a;
      a.array = o.resource.res.array.hArray;
      why = array_problem(a.array, &a.desc);
      if (why.empty() && planned.insert(a.array).second) {
        a.row_bytes = a.desc.Width * channel_bytes(a.desc.Format) * a.desc.NumChannels;
        a.rows = a.desc.Height ? a.desc.Height : 1;
        a.slices = a.desc.Depth ? a.desc.Depth : 1;
        out.arrays.push_back(a);
      }
    }
    if (o.resource.resType == CU_RESOURCE_TYPE_LINEAR) out.linear_addresses.push_back(o.resource.res.linear.devPtr);
    if (o.resource.resType == CU_RESOURCE_TYPE_PITCH2D) out.linear_addresses.push_back(o.resource.res.pitch2D.devPtr);
    os << (i ? ", " : "") << "{\"kind\": \"" << (o.surface ? "surface" : "texture") << "\", \"handle\": " << o.handle
       << ", \"resource\": " << resource << ", \"texture\": " << texture << ", \"view\": "
       << (o.has_view ? view_json(o.view) : "null") << ", \"unsupported\": " << json_string(why) << "}";
  }
  os << "]";
  out.json = os.str();
  return out;
}

CUresult copy_array_async(const ArrayCapture& a, CUdeviceptr staging, CUstream stream) {
  auto& d = driver();
  if (!d.cuMemcpy3DAsync_v2) return CUDA_ERROR_NOT_SUPPORTED;
  CUDA_MEMCPY3D p{};
  p.srcMemoryType = CU_MEMORYTYPE_ARRAY;
  p.srcArray = a.array;
  p.dstMemoryType = CU_MEMORYTYPE_DEVICE;
  p.dstDevice = staging;
  p.dstPitch = a.row_bytes;
  p.dstHeight = a.rows;
  p.WidthInBytes = a.row_bytes;
  p.Height = a.rows;
  p.Depth = a.slices;
  return d.cuMemcpy3DAsync_v2(&p, stream);
}

}  // namespace mneme::rec
