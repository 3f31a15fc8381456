// Shared helpers of the mneme example workloads: error checks, argument
// parsing, and the kernel timer whose report line the headline benchmark reads.
//
// Each example times its main kernel with CUDA events around every launch and
// prints one line
//
//   KERNEL_TIME kernel=<name> launches=<n> mean_us=<f> median_us=<f> min_us=<f>
//
// so that a replay of a recorded launch can be compared with the same kernel's
// time inside the application (replay fidelity). Then it prints PASS or
// "FAIL: <reason>" after checking its own result on the host, and exits 0 or 1.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <utility>
#include <vector>

// Abort with the failing call and the CUDA error string: an example that cannot
// run must say why, never print a misleading PASS.
#define CUDA_CHECK(call)                                                              \
  do {                                                                                \
    cudaError_t err_ = (call);                                                        \
    if (err_ != cudaSuccess) {                                                        \
      std::fprintf(stderr, "FAIL: %s:%d: %s returned %s (%s)\n", __FILE__, __LINE__, \
                   #call, cudaGetErrorName(err_), cudaGetErrorString(err_));          \
      std::exit(2);                                                                   \
    }                                                                                 \
  } while (0)

// Check the launch itself (bad configuration) right after a <<<>>> launch.
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())

namespace example {

// Parse argv[index] as a positive integer no larger than max_value, or return
// fallback when it is absent. A malformed value ends the program with usage.
inline long arg_or(int argc, char** argv, int index, long fallback, long max_value,
                   const char* what, const char* usage) {
  if (index >= argc) return fallback;
  errno = 0;
  char* end = nullptr;
  long value = std::strtol(argv[index], &end, 10);
  if (errno != 0 || end == argv[index] || *end != '\0' || value < 1 || value > max_value) {
    std::fprintf(stderr, "error: %s must be an integer in 1..%ld, got '%s'\nusage: %s %s\n",
                 what, max_value, argv[index], argv[0], usage);
    std::exit(2);
  }
  return value;
}

// Times every launch of one kernel with a pair of CUDA events on the launch
// stream. The events are read only at report time, so timing adds no host
// synchronization between launches (the application keeps its own pacing).
class KernelTimer {
 public:
  explicit KernelTimer(const char* kernel_name) : name_(kernel_name) {}
  KernelTimer(const KernelTimer&) = delete;
  KernelTimer& operator=(const KernelTimer&) = delete;
  ~KernelTimer() {
    for (auto& pair : events_) {
      cudaEventDestroy(pair.first);
      cudaEventDestroy(pair.second);
    }
  }

  // Record the start event; call immediately before the launch.
  void start(cudaStream_t stream = 0) {
    cudaEvent_t begin, end;
    CUDA_CHECK(cudaEventCreate(&begin));
    CUDA_CHECK(cudaEventCreate(&end));
    events_.emplace_back(begin, end);
    CUDA_CHECK(cudaEventRecord(begin, stream));
  }

  // Record the stop event; call immediately after the launch.
  void stop(cudaStream_t stream = 0) { CUDA_CHECK(cudaEventRecord(events_.back().second, stream)); }

  // Milliseconds of every timed launch (synchronizes on the last event).
  std::vector<float> times_ms() const {
    std::vector<float> out;
    if (events_.empty()) return out;
    CUDA_CHECK(cudaEventSynchronize(events_.back().second));
    for (const auto& pair : events_) {
      float ms = 0.0f;
      CUDA_CHECK(cudaEventElapsedTime(&ms, pair.first, pair.second));
      out.push_back(ms);
    }
    return out;
  }

  // Print the KERNEL_TIME line the headline benchmark parses.
  void report() const {
    std::vector<float> t = times_ms();
    if (t.empty()) {
      std::printf("KERNEL_TIME kernel=%s launches=0\n", name_);
      return;
    }
    double sum = 0.0;
    for (float v : t) sum += v;
    std::vector<float> sorted = t;
    std::sort(sorted.begin(), sorted.end());
    double median = sorted.size() % 2 ? sorted[sorted.size() / 2]
                                      : 0.5 * (sorted[sorted.size() / 2 - 1] + sorted[sorted.size() / 2]);
    std::printf("KERNEL_TIME kernel=%s launches=%zu mean_us=%.3f median_us=%.3f min_us=%.3f\n", name_,
                t.size(), 1000.0 * sum / t.size(), 1000.0 * median, 1000.0 * sorted.front());
  }

 private:
  const char* name_;
  std::vector<std::pair<cudaEvent_t, cudaEvent_t>> events_;
};

// Print the verdict line and return the process exit status.
inline int verdict(bool ok, const char* reason) {
  if (ok) {
    std::printf("PASS\n");
    return 0;
  }
  std::printf("FAIL: %s\n", reason);
  return 1;
}

}  // namespace example
