#include "spool.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

#include "mneme/common/driver_api.hpp"
#include "mneme/common/settings.hpp"

using namespace mneme::common;

namespace mneme::rec {

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
constexpr size_t kChunk = SnapshotWriter::kChunk;
constexpr int kBuffersPerWriter = 2;
constexpr size_t kCopiesAhead = 3;  // copies queued on the copy stream before the oldest is handed to a writer
constexpr size_t kHugePage = 2ull << 20;

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int writer_count() {
  if (settings().spool_writers > 0) return std::min(settings().spool_writers, 64);
  int cpus = int(std::thread::hardware_concurrency());
  return std::clamp(cpus / 2, 4, 16);
}
}  // namespace

struct SnapshotWriter::Impl {
  const int nwriters = writer_count();
  bool ready = false;
  CUstream stream = nullptr;
  std::vector<unsigned char*> buf;
  std::vector<CUevent> ev;

  std::mutex mu;
  std::condition_variable cv;  // the capture thread: a buffer came free, a job finished
  std::unique_ptr<std::condition_variable[]> work_cv{new std::condition_variable[nwriters]};
  struct Job {
    int buffer;
    size_t len;
    int fd;
    uint64_t offset;
    int stripe;
  };
  std::vector<std::deque<Job>> queues = std::vector<std::deque<Job>>(nwriters);  // writer k writes stripe k only
  std::vector<int> free_buffers;
  int outstanding = 0;  // jobs queued or being written
  bool failed = false;
  int err = 0;
  double first_start = 0, last_end = 0;  // of the current write(): span of its file writes
  std::vector<std::thread> writers;

  // Of the last write().
  double setup_s = 0, writer_wait_s = 0, copy_wait_s = 0, write_span_s = 0, digest_s = 0;
  int stripes_used = 0;
  uint64_t copied_bytes = 0;

  GpuDigest gpu;
  // Digests of pieces in committed entries: the agent has them, or will before any entry committed later
  // (entries are numbered in commit order, and a snapshot consults this set only for entries committed
  // before it). Written at commits, read by snapshots: under known_mu.
  std::mutex known_mu;
  DigestSet known;
  bool io_failure = false;  // of the last write()

  // The staging pool: one slab of anonymous memory (transparent huge pages
  // where the kernel offers them), faulted in by several threads at once and
  // page-locked with cuMemHostRegister. On a VM, cuMemAllocHost spends most of
  // its time faulting pages in one thread (1.6 GB/s measured on the H100
  // machine). Fallback: cuMemAllocHost per buffer. The slab is never freed:
  // it stays valid host memory even after the CUDA context is gone.
  bool allocate_staging(int n, std::string* error) {
    auto& d = driver();
    size_t first = buf.size();
    size_t bytes = size_t(n) * kChunk;
    void* raw = mmap(nullptr, bytes + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw != MAP_FAILED && d.cuMemHostRegister_v2) {
      auto* p = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(raw) + kHugePage - 1) & ~(kHugePage - 1));
      madvise(p, bytes, MADV_HUGEPAGE);
      madvise(p, bytes, MADV_DONTFORK);
      std::vector<std::thread> touch;
      for (int t = 0; t < nwriters; ++t) {
        touch.emplace_back([=] {
          size_t lo = bytes / nwriters * t, hi = t + 1 == nwriters ? bytes : bytes / nwriters * (t + 1);
          for (size_t off = lo; off < hi; off += 4096) p[off] = 0;
        });
      }
      for (auto& t : touch) t.join();
      if (d.cuMemHostRegister_v2(p, bytes, CU_MEMHOSTREGISTER_PORTABLE) == CUDA_SUCCESS) {
        for (int i = 0; i < n; ++i) buf.push_back(p + size_t(i) * kChunk);
        return add_events(first, error);
      }
    }
    if (raw != MAP_FAILED) munmap(raw, bytes + kHugePage);
    for (int i = 0; i < n; ++i) {
      void* p = nullptr;
      if (d.cuMemAllocHost_v2(&p, kChunk) != CUDA_SUCCESS) {
        *error = "cannot allocate pinned staging buffers for snapshots";
        return false;
      }
      buf.push_back(static_cast<unsigned char*>(p));
    }
    return add_events(first, error);
  }

  bool add_events(size_t first, std::string* error) {
    for (size_t i = first; i < buf.size(); ++i) {
      CUevent e = nullptr;
      if (driver().cuEventCreate(&e, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) {
        *error = "cannot create the snapshot copy events";
        buf.resize(ev.size());
        return false;
      }
      ev.push_back(e);
      std::lock_guard<std::mutex> lock(mu);
      free_buffers.push_back(int(i));
    }
    return true;
  }

  bool init(std::string* error) {
    if (ready) return true;
    if (driver().cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) {
      *error = "cannot create the snapshot copy stream";
      return false;
    }
    for (int k = 0; k < nwriters; ++k) writers.emplace_back([this, k] { writer_loop(k); });
    ready = true;
    return true;
  }

  // The pool grows with the snapshots it has seen, up to kBuffersPerWriter per
  // writer: a small snapshot pins little host memory.
  bool ensure_buffers(uint64_t snapshot_bytes, std::string* error) {
    int want = int(std::min<uint64_t>(uint64_t(nwriters) * kBuffersPerWriter, (snapshot_bytes + kChunk - 1) / kChunk));
    want = std::max(want, 1);
    return int(buf.size()) >= want || allocate_staging(want - int(buf.size()), error);
  }

  void writer_loop(int k) {
    for (;;) {
      Job job;
      {
        std::unique_lock<std::mutex> lock(mu);
        work_cv[k].wait(lock, [&] { return !queues[k].empty(); });
        job = queues[k].front();
        queues[k].pop_front();
        if (first_start == 0) first_start = now_seconds();
      }
      bool ok = write_all(job.fd, buf[job.buffer], job.len, job.offset);
      int e = errno;
      {
        std::lock_guard<std::mutex> lock(mu);
        if (!ok && !failed) {
          failed = true;
          err = e;
        }
        free_buffers.push_back(job.buffer);
        --outstanding;
        last_end = now_seconds();
      }
      cv.notify_all();
    }
  }

  // A free staging buffer, or -1 once a file write failed.
  int acquire() {
    double t0 = now_seconds();
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return failed || !free_buffers.empty(); });
    writer_wait_s += now_seconds() - t0;
    if (failed) return -1;
    int b = free_buffers.back();
    free_buffers.pop_back();
    return b;
  }

  void release(int b) {
    {
      std::lock_guard<std::mutex> lock(mu);
      free_buffers.push_back(b);
    }
    cv.notify_all();
  }

  void hand_to_writer(const Job& job) {
    {
      std::lock_guard<std::mutex> lock(mu);
      queues[job.stripe].push_back(job);
      ++outstanding;
    }
    work_cv[job.stripe].notify_one();
  }
};

SnapshotWriter::SnapshotWriter() : impl_(new Impl) {}

int SnapshotWriter::last_stripes() const { return impl_->stripes_used; }
double SnapshotWriter::last_writer_wait_seconds() const { return impl_->writer_wait_s; }
double SnapshotWriter::last_copy_wait_seconds() const { return impl_->copy_wait_s; }
double SnapshotWriter::last_setup_seconds() const { return impl_->setup_s; }
double SnapshotWriter::last_write_seconds() const { return impl_->write_span_s; }
uint64_t SnapshotWriter::last_copied_bytes() const { return impl_->copied_bytes; }
double SnapshotWriter::last_digest_seconds() const { return impl_->digest_s; }
void SnapshotWriter::remember(const DigestSet& digests) {
  std::lock_guard<std::mutex> lock(impl_->known_mu);
  impl_->known.insert(digests.begin(), digests.end());
}
bool SnapshotWriter::last_failure_was_io() const { return impl_->io_failure; }
CUstream SnapshotWriter::copy_stream(std::string* error) { return impl_->init(error) ? impl_->stream : nullptr; }

SnapshotWriter::~SnapshotWriter() {
  // Process exit: the writer threads are parked; detach rather than join.
  for (auto& t : impl_->writers)
    if (t.joinable()) t.detach();
}

bool SnapshotWriter::write(const std::string& prefix, std::vector<DeviceRegion>& regions,
                           const std::function<void(const DeviceRegion&, const unsigned char*, size_t)>& scan,
                           uint64_t byte_cap, uint64_t* bytes_written, std::string* error, DigestSet* entry_digests) {
  Impl& m = *impl_;
  m.setup_s = m.writer_wait_s = m.copy_wait_s = m.write_span_s = m.digest_s = 0;
  m.copied_bytes = 0;
  m.io_failure = false;
  {
    double t0 = now_seconds();
    uint64_t total = 0;
    for (const auto& r : regions) total += r.size;
    if (!m.init(error) || !m.ensure_buffers(total, error)) return false;
    m.setup_s = now_seconds() - t0;
  }
  // Change detection: every piece's digest, computed on the GPU (the regions
  // are fixed without `scan`; reachable-scope discovery needs every byte).
  std::vector<Digest> digests;
  if (entry_digests && !scan && m.gpu.available()) {
    double t0 = now_seconds();
    std::vector<std::pair<CUdeviceptr, uint64_t>> pieces;
    for (const auto& r : regions)
      for (uint64_t done = 0; done < r.size; done += kChunk)
        pieces.emplace_back(r.source() + done, std::min<uint64_t>(kChunk, r.size - done));
    std::string why;
    if (!m.gpu.compute(pieces, m.stream, &digests, &why)) {
      digests.clear();
      std::fprintf(stderr, "mneme record: warning: %s; snapshots copy every byte from now on\n", why.c_str());
    }
    m.digest_s = now_seconds() - t0;
  }
  size_t piece_index = 0;
  // Copies queued ahead of the writers; fewer than the buffers, or the
  // capture would wait for a buffer it holds itself.
  const size_t ahead = std::min<size_t>(kCopiesAhead, m.buf.size() - 1);
  auto& d = driver();
  // Chunk i goes to stripe i % nwriters, and stripe files are opened as their
  // first chunk comes: a snapshot of C chunks has min(nwriters, C) stripe
  // files (stripe 0 always, even for an empty snapshot), the same count for
  // the same region list, so the epilogue repeats the prologue's layout.
  const int max_stripes = m.nwriters;
  std::vector<int> fds;
  std::vector<uint64_t> stripe_end(max_stripes, 0);
  std::string open_error;
  auto open_stripe = [&](int k) -> bool {  // stripes open in order: k == fds.size()
    std::string path = prefix + "." + std::to_string(k) + ".bin";
    int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
      open_error = "cannot create " + path + ": " + std::strerror(errno);
      return false;
    }
    fds.push_back(fd);
    return true;
  };
  m.stripes_used = 0;
  if (!open_stripe(0)) {
    *error = open_error;
    m.io_failure = true;
    return false;
  }
  {
    std::lock_guard<std::mutex> lock(m.mu);
    m.failed = false;
    m.first_start = m.last_end = 0;
  }
  uint64_t chunk_index = 0;
  uint64_t offset = 0;
  std::deque<Impl::Job> in_flight;  // copies issued, not yet handed to writers
  // Waits for the oldest copy; hands its buffer to its stripe's writer (after
  // `scan` saw the bytes), or back to the pool when `keep` is false.
  auto hand_over_oldest = [&](bool keep, const DeviceRegion* scanned) -> bool {
    Impl::Job job = in_flight.front();
    in_flight.pop_front();
    double t0 = now_seconds();
    bool synced = d.cuEventSynchronize(m.ev[job.buffer]) == CUDA_SUCCESS;
    m.copy_wait_s += now_seconds() - t0;
    if (!synced || !keep) {
      m.release(job.buffer);
      return synced;
    }
    if (scanned) scan(*scanned, m.buf[job.buffer], job.len);
    m.hand_to_writer(job);
    return true;
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
      const int stripe = int(chunk_index % uint64_t(max_stripes));
      if (stripe == int(fds.size()) && !open_stripe(stripe)) {
        local_error = open_error;
        m.io_failure = true;
        ok = false;
        break;
      }
      if (!digests.empty()) {
        const Digest& g = digests[piece_index++];
        Piece piece;
        piece.stripe = stripe;
        piece.offset = stripe_end[stripe];
        piece.size = len;
        piece.has_digest = true;
        piece.digest = g;
        bool known;
        {
          std::lock_guard<std::mutex> lock(m.known_mu);
          known = m.known.count(g) > 0;
        }
        if (known || entry_digests->count(g)) {  // captured before: leave a hole
          piece.copied = false;
          ++chunk_index;
          regions[r].pieces.push_back(piece);
          stripe_end[stripe] += len;
          offset += len;
          continue;
        }
        entry_digests->insert(g);
      }
      int b = m.acquire();
      if (b < 0) {
        ok = false;  // a file write failed: reported below
        break;
      }
      CUresult cr = d.cuMemcpyDtoHAsync_v2(m.buf[b], regions[r].source() + done, len, m.stream);
      if (cr == CUDA_SUCCESS) cr = d.cuEventRecord(m.ev[b], m.stream);
      if (cr != CUDA_SUCCESS) {
        local_error = std::string("device-to-host copy failed: ") + error_string(cr);
        m.release(b);
        ok = false;
        break;
      }
      // Keep the copy engine busy: hand over the oldest copy once a few are
      // queued behind it. Scanning needs the bytes, so it hands over at once.
      ++chunk_index;
      Piece piece;
      piece.stripe = stripe;
      piece.offset = stripe_end[stripe];
      piece.size = len;
      if (!digests.empty()) {
        piece.has_digest = true;
        piece.digest = digests[piece_index - 1];
      }
      regions[r].pieces.push_back(piece);
      m.copied_bytes += len;
      in_flight.push_back(Impl::Job{b, len, fds[stripe], stripe_end[stripe], stripe});
      stripe_end[stripe] += len;
      offset += len;
      while (ok && !in_flight.empty() && (scan || in_flight.size() > ahead)) {
        DeviceRegion current;
        if (scan) current = regions[r];  // scan may grow `regions`
        if (!hand_over_oldest(true, scan ? &current : nullptr)) {
          local_error = "device-to-host copy failed";
          ok = false;
        }
      }
    }
  }
  while (!in_flight.empty()) {
    if (!hand_over_oldest(ok, nullptr) && ok) {
      local_error = "device-to-host copy failed";
      ok = false;
    }
  }
  {
    std::unique_lock<std::mutex> lock(m.mu);
    m.cv.wait(lock, [&] { return m.outstanding == 0; });
    if (m.failed && local_error.empty()) {
      local_error = "cannot write " + prefix + ".*.bin: " + std::strerror(m.err);
      m.io_failure = true;
      ok = false;
    }
    if (m.first_start > 0) m.write_span_s = m.last_end - m.first_start;
  }
  m.stripes_used = int(fds.size());
  for (int k = 0; k < int(fds.size()); ++k) {
    // Pieces not copied are holes: the file keeps the layout's size (sparse).
    if (ok && ftruncate(fds[k], off_t(stripe_end[k])) != 0) {
      local_error = "cannot write " + prefix + "." + std::to_string(k) + ".bin: " + std::strerror(errno);
      m.io_failure = true;
      ok = false;
    }
    if (close(fds[k]) != 0 && ok) {
      local_error = "cannot write " + prefix + "." + std::to_string(k) + ".bin: " + std::strerror(errno);
      m.io_failure = true;
      ok = false;
    }
  }
  *bytes_written = offset;
  if (!ok) *error = local_error;
  return ok;
}

}  // namespace mneme::rec
