#include "spool.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include "driver_api.hpp"

namespace mneme::rec {

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += char(c);
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += char(c);
    }
  }
  return out + "\"";
}

std::string hex(const void* data, size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string out(n * 2, '0');
  auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) {
    out[2 * i] = digits[p[i] >> 4];
    out[2 * i + 1] = digits[p[i] & 15];
  }
  return out;
}

bool make_dirs(const std::string& path) {
  std::string cur;
  for (size_t i = 0; i <= path.size(); ++i) {
    if (i == path.size() || path[i] == '/') {
      if (!cur.empty() && mkdir(cur.c_str(), 0755) != 0 && errno != EEXIST) return false;
    }
    if (i < path.size()) cur += path[i];
  }
  return true;
}

static bool write_all(int fd, const void* data, size_t n, uint64_t offset) {
  auto* p = static_cast<const char*>(data);
  while (n) {
    ssize_t w = pwrite(fd, p, n, static_cast<off_t>(offset));
    if (w < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    p += w;
    n -= size_t(w);
    offset += uint64_t(w);
  }
  return true;
}

bool write_file_atomic(const std::string& path, const void* data, size_t n, std::string* error) {
  std::string tmp = path + ".tmp";
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0 || !write_all(fd, data, n, 0) || close(fd) != 0) {
    *error = "cannot write " + tmp + ": " + std::strerror(errno);
    if (fd >= 0) close(fd);
    unlink(tmp.c_str());
    return false;
  }
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    *error = "cannot rename " + tmp + ": " + std::strerror(errno);
    unlink(tmp.c_str());
    return false;
  }
  return true;
}

void remove_tree(const std::string& path) {
  if (DIR* d = opendir(path.c_str())) {
    while (dirent* e = readdir(d)) {
      std::string n = e->d_name;
      if (n == "." || n == "..") continue;
      remove_tree(path + "/" + n);
    }
    closedir(d);
    rmdir(path.c_str());
  } else {
    unlink(path.c_str());
  }
}

uint64_t tree_bytes(const std::string& path) {
  struct stat st;
  if (lstat(path.c_str(), &st) != 0) return 0;
  if (!S_ISDIR(st.st_mode)) return uint64_t(st.st_size);
  uint64_t total = 0;
  if (DIR* d = opendir(path.c_str())) {
    while (dirent* e = readdir(d)) {
      std::string n = e->d_name;
      if (n != "." && n != "..") total += tree_bytes(path + "/" + n);
    }
    closedir(d);
  }
  return total;
}

// ---------------------------------------------------------------------------

namespace {
constexpr int kBuffers = 8;
constexpr size_t kChunk = 16ull << 20;
constexpr int kWriters = SnapshotWriter::kStripes;
}  // namespace

struct SnapshotWriter::Impl {
  bool ready = false;
  CUstream stream = nullptr;
  unsigned char* buf[kBuffers] = {};
  CUevent ev[kBuffers] = {};
  bool busy[kBuffers] = {};

  std::mutex mu;
  std::condition_variable cv;
  struct Job {
    int buffer;
    size_t len;
    int fd;
    uint64_t offset;
  };
  std::deque<Job> jobs;
  bool failed = false;
  int err = 0;
  bool stop = false;
  std::thread writers[kWriters];

  bool init(std::string* error) {
    if (ready) return true;
    auto& d = driver();
    if (d.cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) {
      *error = "cannot create the snapshot copy stream";
      return false;
    }
    for (int i = 0; i < kBuffers; ++i) {
      void* p = nullptr;
      if (d.cuMemAllocHost_v2(&p, kChunk) != CUDA_SUCCESS || d.cuEventCreate(&ev[i], CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) {
        *error = "cannot allocate pinned staging buffers for snapshots";
        return false;
      }
      buf[i] = static_cast<unsigned char*>(p);
    }
    for (auto& t : writers) t = std::thread([this] { writer_loop(); });
    ready = true;
    return true;
  }

  void writer_loop() {
    for (;;) {
      Job job;
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return stop || !jobs.empty(); });
        if (stop && jobs.empty()) return;
        job = jobs.front();
        jobs.pop_front();
      }
      bool ok = write_all(job.fd, buf[job.buffer], job.len, job.offset);
      int e = errno;
      std::lock_guard<std::mutex> lock(mu);
      if (!ok && !failed) {
        failed = true;
        err = e;
      }
      busy[job.buffer] = false;
      cv.notify_all();
    }
  }

  double writer_wait_s = 0, copy_wait_s = 0;  // where the capture thread waited (last write)

  void wait_free(int b) {
    auto t0 = std::chrono::steady_clock::now();
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return !busy[b]; });
    writer_wait_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
};

SnapshotWriter::SnapshotWriter() : impl_(new Impl) {}

double SnapshotWriter::last_writer_wait_seconds() const { return impl_->writer_wait_s; }
double SnapshotWriter::last_copy_wait_seconds() const { return impl_->copy_wait_s; }

SnapshotWriter::~SnapshotWriter() {
  // Process exit: the writer threads may be parked; detach rather than join.
  for (auto& t : impl_->writers)
    if (t.joinable()) t.detach();
}

bool SnapshotWriter::write(const std::string& prefix, std::vector<DeviceRegion>& regions,
                           const std::function<void(const DeviceRegion&, const unsigned char*, size_t)>& scan,
                           uint64_t byte_cap, uint64_t* bytes_written, std::string* error) {
  Impl& m = *impl_;
  if (!m.init(error)) return false;
  auto& d = driver();
  int fds[kStripes];
  uint64_t stripe_end[kStripes] = {};
  for (int k = 0; k < kStripes; ++k) {
    std::string path = prefix + "." + std::to_string(k) + ".bin";
    fds[k] = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fds[k] < 0) {
      *error = "cannot create " + path + ": " + std::strerror(errno);
      for (int j = 0; j < k; ++j) close(fds[j]);
      return false;
    }
  }
  {
    std::lock_guard<std::mutex> lock(m.mu);
    m.failed = false;
  }
  uint64_t chunk_index = 0;
  m.writer_wait_s = m.copy_wait_s = 0;
  uint64_t offset = 0;
  int next = 0;
  std::deque<std::pair<int, Impl::Job>> in_flight;  // copies issued, not yet handed to writers
  auto hand_over_oldest = [&]() -> bool {
    auto [b, job] = in_flight.front();
    in_flight.pop_front();
    auto t0 = std::chrono::steady_clock::now();
    bool synced = d.cuEventSynchronize(m.ev[b]) == CUDA_SUCCESS;
    m.copy_wait_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return synced;
  };
  bool ok = true;
  std::string local_error;
  // Regions may grow while we go (scan); index, not iterators.
  for (size_t r = 0; ok && r < regions.size(); ++r) {
    regions[r].pieces.clear();
    if (byte_cap && offset + regions[r].size > byte_cap) {
      local_error = "snapshot exceeds the byte cap";
      ok = false;
      break;
    }
    for (uint64_t done = 0; ok && done < regions[r].size; done += kChunk) {
      size_t len = size_t(std::min<uint64_t>(kChunk, regions[r].size - done));
      int b = next;
      next = (next + 1) % kBuffers;
      m.wait_free(b);
      {
        std::lock_guard<std::mutex> lock(m.mu);
        m.busy[b] = true;
      }
      CUresult cr = d.cuMemcpyDtoHAsync_v2(m.buf[b], regions[r].base + done, len, m.stream);
      if (cr == CUDA_SUCCESS) cr = d.cuEventRecord(m.ev[b], m.stream);
      if (cr != CUDA_SUCCESS) {
        local_error = std::string("device-to-host copy failed: ") + error_string(cr);
        std::lock_guard<std::mutex> lock(m.mu);
        m.busy[b] = false;
        ok = false;
        break;
      }
      // Keep the copy engine busy: wait only for the oldest copy once all but
      // one buffer are in flight. Scanning needs the bytes, so it waits at once.
      int stripe = int(chunk_index++ % kStripes);
      regions[r].pieces.push_back(Piece{stripe, stripe_end[stripe], len});
      in_flight.push_back({b, Impl::Job{b, len, fds[stripe], stripe_end[stripe]}});
      stripe_end[stripe] += len;
      offset += len;
      bool must_drain = scan || in_flight.size() >= size_t(kBuffers - 1);
      while (ok && must_drain && !in_flight.empty()) {
        auto [ob, job] = in_flight.front();
        if (!hand_over_oldest()) {
          local_error = "device-to-host copy failed";
          ok = false;
          break;
        }
        if (scan) {
          DeviceRegion current = regions[r];  // scan may grow `regions`
          scan(current, m.buf[ob], job.len);
        }
        std::lock_guard<std::mutex> lock(m.mu);
        m.jobs.push_back(job);
        m.cv.notify_all();
        if (!scan) break;
      }
    }
  }
  while (!in_flight.empty()) {
    auto [ob, job] = in_flight.front();
    bool synced = hand_over_oldest();
    std::lock_guard<std::mutex> lock(m.mu);
    if (synced && ok) {
      m.jobs.push_back(job);
      m.cv.notify_all();
    } else {
      m.busy[ob] = false;
    }
  }
  {
    std::unique_lock<std::mutex> lock(m.mu);
    m.cv.wait(lock, [&] {
      if (!m.jobs.empty()) return false;
      for (bool b : m.busy)
        if (b) return false;
      return true;
    });
    if (m.failed && ok) {
      local_error = "cannot write " + prefix + ".*.bin: " + std::strerror(m.err);
      ok = false;
    }
  }
  for (int k = 0; k < kStripes; ++k) {
    if (close(fds[k]) != 0 && ok) {
      local_error = "cannot write " + prefix + "." + std::to_string(k) + ".bin: " + std::strerror(errno);
      ok = false;
    }
  }
  *bytes_written = offset;
  if (!ok) *error = local_error;
  return ok;
}

}  // namespace mneme::rec
