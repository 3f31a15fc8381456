// Bounded waits for the recorder (docs/recording.md, "Threads and deadlines").
//
// Everything the recorder makes the application wait for has a deadline:
// its locks (timed acquisition), the recording gate (other threads' launches
// wait while one launch is recorded), and the blocking work of a snapshot
// (synchronizations, prefetches, digests, copies, file writes), which runs on
// a worker thread the application thread waits for until the deadline. When
// a deadline passes, the recorder abandons that instance (the agent writes it
// `supported: false` with the reason), never waits for it again, and the
// application goes on.
//
// Nothing here calls the CUDA driver: the gate and the worker are plain C++
// (tests/record/test_deadlines_native.py exercises them without a GPU).
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace mneme::rec {

using Clock = std::chrono::steady_clock;

// MNEME_RECORD_DEADLINE (seconds, default 5), MNEME_RECORD_MAX_ABANDONED
// (default 3: then recording stops, the application goes on) and the debug
// stall MNEME_DEBUG_STALL_SNAPSHOT_MS (each snapshot job sleeps this long
// first; MNEME_DEBUG_STALL_PHASE=prologue|epilogue limits it to one phase).
struct DeadlineSettings {
  double base_s = 5.0;
  double bytes_per_s = 1e9;  // snapshot waits add the time to move their bytes at this rate
  long max_abandoned = 3;
  long stall_ms = 0;
  std::string stall_phase;  // "" (both), "prologue", "epilogue"
};
const DeadlineSettings& deadline_settings();

// The deadline of one wait: the base, plus `bytes` at the snapshot rate.
double deadline_seconds(uint64_t bytes = 0);
Clock::time_point deadline_after(double seconds);
double seconds_until(Clock::time_point t);

// Runs jobs on its own thread for a caller that waits until a deadline. A job
// still running at its deadline is left to finish on its own (its caller
// abandons what the job was for: a job must own everything it touches, e.g.
// through a shared_ptr); until it ends the worker refuses new jobs, so no job
// ever waits behind an abandoned one.
class Worker {
 public:
  // `on_start` runs first on the worker's thread (thread-local set-up).
  explicit Worker(std::function<void()> on_start = {});
  enum class Result { done, late, busy };
  Result run(std::function<void()> job, Clock::time_point deadline);
  bool busy() const;

 private:
  struct State;
  std::shared_ptr<State> s_;
};

// The recording gate: from the prologue of a recorded launch to its epilogue,
// launches of other threads wait before they enter the driver, so that only
// the recorded kernel changes device memory between the two snapshots.
//
// Every watched launch calls enter() as the last step of its enter callback
// (right before the driver runs it) and leave() when it returned from the
// driver. A launch that is to be recorded calls acquire() before: the gate
// closes, and the launches already past it are waited for (they are in the
// driver for microseconds). The owner publishes its deadline (acquire,
// extend); a waiter waits at most until that deadline plus a grace, then
// gives up on the owner: the gate is then *broken* (the owner's instance is
// abandoned with the reason) and nobody waits for that owner again.
namespace gate {

// Why a thread counts as being inside a launch: bits, so that a launch of a
// graph node inside the recorder's own graph launch counts once, and a lost
// exit callback does not count twice.
enum Holder : unsigned { launch_callback = 1, graph_launch = 2 };

void enter(Holder h);
void leave(Holder h);

// While the calling thread waits for something long of its own (the spool's
// back-pressure, a module load) it does not count as inside a launch, so an
// owner does not wait for it; on leaving scope it counts again (waiting at the
// gate first, if closed).
class Away {
 public:
  Away();
  ~Away();
  Away(const Away&) = delete;
  Away& operator=(const Away&) = delete;

 private:
  unsigned held_;
};

enum class Acquired { yes, refused, late };
// The calling thread (entered) becomes the owner. `refused`: another owner
// holds the gate and was given up on (it is stuck): nothing was waited for.
// `late`: waited until `until` (for another owner, or for launches to leave
// the driver); *why says what.
Acquired acquire(Clock::time_point until, std::string* why);
void extend(Clock::time_point until);  // the owner's new deadline
// Whether a waiter gave up on the calling owner's recording (and why).
bool broken(std::string* why);
void release();  // by the owner; no-op for any other thread
bool owned();

// Closes the gate like acquire(), waits until no other thread is inside a
// launch, runs `action`, opens the gate. False (nothing run) when another
// owner holds the gate or launches did not leave the driver by `until`. Used
// to switch the launch callbacks off (one launching thread only): no launch is
// then between its enter and exit callbacks, so none loses its exit.
bool quiesce(Clock::time_point until, const std::function<void()>& action);

// Tests: launches currently counted as inside the driver.
int launching();

}  // namespace gate

}  // namespace mneme::rec
