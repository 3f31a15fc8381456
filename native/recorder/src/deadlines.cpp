#include "deadlines.hpp"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>

namespace mneme::rec {

namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

DeadlineSettings load_deadline_settings() {
  DeadlineSettings s;
  if (auto v = env("MNEME_RECORD_DEADLINE"); !v.empty()) {
    double d = std::strtod(v.c_str(), nullptr);
    if (d > 0) s.base_s = d;
  }
  if (auto v = env("MNEME_RECORD_MAX_ABANDONED"); !v.empty()) s.max_abandoned = std::strtol(v.c_str(), nullptr, 0);
  if (auto v = env("MNEME_DEBUG_STALL_SNAPSHOT_MS"); !v.empty()) s.stall_ms = std::max(0L, std::strtol(v.c_str(), nullptr, 0));
  s.stall_phase = env("MNEME_DEBUG_STALL_PHASE");
  return s;
}

}  // namespace

const DeadlineSettings& deadline_settings() {
  // Never destroyed: workers may read it while the process exits.
  static const DeadlineSettings* s = new DeadlineSettings(load_deadline_settings());
  return *s;
}

double deadline_seconds(uint64_t bytes) {
  const DeadlineSettings& s = deadline_settings();
  return s.base_s + double(bytes) / s.bytes_per_s;
}

Clock::time_point deadline_after(double seconds) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

double seconds_until(Clock::time_point t) { return std::chrono::duration<double>(t - Clock::now()).count(); }

// ---- worker ----------------------------------------------------------------

struct Worker::State {
  std::mutex mu;
  std::condition_variable cv;
  std::function<void()> job;
  uint64_t posted = 0, finished = 0;
};

Worker::Worker(std::function<void()> on_start) : s_(std::make_shared<State>()) {
  // Detached, never joined: it may be inside a driver call that never returns
  // (the job it runs was abandoned); the process exits without it.
  std::thread([s = s_, on_start = std::move(on_start)] {
    if (on_start) on_start();
    std::unique_lock<std::mutex> lock(s->mu);
    for (;;) {
      s->cv.wait(lock, [&] { return bool(s->job); });
      std::function<void()> job = std::move(s->job);
      s->job = nullptr;
      lock.unlock();
      job();
      job = nullptr;  // what it owned goes before it counts as finished
      lock.lock();
      ++s->finished;
      s->cv.notify_all();
    }
  }).detach();
}

Worker::Result Worker::run(std::function<void()> job, Clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(s_->mu);
  if (s_->posted != s_->finished) return Result::busy;
  const uint64_t mine = ++s_->posted;
  s_->job = std::move(job);
  s_->cv.notify_all();
  if (!s_->cv.wait_until(lock, deadline, [&] { return s_->finished >= mine; })) return Result::late;
  return Result::done;
}

bool Worker::busy() const {
  std::lock_guard<std::mutex> lock(s_->mu);
  return s_->posted != s_->finished;
}

// ---- gate ------------------------------------------------------------------

namespace gate {
namespace {

// A waiter gives up on an owner this long after the owner's own deadline (by
// which the owner, whose waits are bounded by it, has given up itself).
constexpr double kGraceS = 1.0;

struct State {
  std::mutex mu;
  std::condition_variable cv;
  std::atomic<int> launching{0};  // threads counted inside a launch (entered, not left)
  std::atomic<bool> closed{false};
  std::thread::id owner;  // under mu
  Clock::time_point until;
  bool broken = false;
  std::string why;
};

State& state() {
  static State* s = new State;  // never destroyed: used until the process ends
  return *s;
}

thread_local unsigned t_held = 0;

Clock::time_point give_up_at(const State& g) {
  return g.until + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(kGraceS));
}

std::string seconds_text(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", s);
  return buf;
}

// Under g.mu, the calling thread not counted: waits while another thread owns
// the gate, until that owner's deadline (plus the grace); then gives up on it.
// True: the gate is open. False: it is broken (another owner holds it, and
// nobody waits for that owner any more).
bool wait_for_owner(State& g, std::unique_lock<std::mutex>& lock) {
  const auto me = std::this_thread::get_id();
  const auto started = Clock::now();
  while (g.closed.load() && g.owner != me) {
    if (g.broken) return false;
    const auto limit = give_up_at(g);
    if (Clock::now() >= limit) {
      g.broken = true;
      g.why = "a launch of another thread waited " +
              seconds_text(std::chrono::duration<double>(Clock::now() - started).count()) +
              " s for this recording, past its deadline, and went ahead: device memory may have changed between"
              " the snapshots";
      g.cv.notify_all();
      return false;
    }
    g.cv.wait_until(lock, limit);
  }
  return true;
}

void count_in(State& g) {
  for (;;) {
    g.launching.fetch_add(1);
    if (!g.closed.load()) return;
    std::unique_lock<std::mutex> lock(g.mu);
    if (g.broken || g.owner == std::this_thread::get_id()) return;  // counted; a broken owner is not waited for
    g.launching.fetch_sub(1);
    wait_for_owner(g, lock);
  }
}

// The owner (or a thread about to act alone): waits until the threads counted
// inside a launch, other than itself, have left the driver.
bool drain(State& g, Clock::time_point until) {
  const int self = t_held ? 1 : 0;
  for (unsigned spins = 0; g.launching.load() > self; ++spins) {
    if (Clock::now() >= until) return false;
    if (spins < 64) std::this_thread::yield();
    else std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  return true;
}

// Under g.mu: the gate is open; the calling thread owns it from now.
void close(State& g, Clock::time_point until) {
  g.owner = std::this_thread::get_id();
  g.until = until;
  g.broken = false;
  g.why.clear();
  g.closed.store(true);
}

void open(State& g) {
  {
    std::lock_guard<std::mutex> lock(g.mu);
    if (g.owner != std::this_thread::get_id()) return;
    g.owner = std::thread::id();
    g.broken = false;
    g.why.clear();
    g.closed.store(false);
  }
  g.cv.notify_all();
}

}  // namespace

void enter(Holder h) {
  if (t_held == 0) count_in(state());
  t_held |= h;
}

void leave(Holder h) {
  if (!(t_held & h)) return;
  t_held &= ~unsigned(h);
  if (t_held == 0) state().launching.fetch_sub(1);
}

Away::Away() : held_(t_held) {
  if (held_) {
    t_held = 0;
    state().launching.fetch_sub(1);
  }
}

Away::~Away() {
  if (held_) {
    count_in(state());
    t_held = held_;
  }
}

Acquired acquire(Clock::time_point until, std::string* why) {
  State& g = state();
  const auto started = Clock::now();
  {
    std::unique_lock<std::mutex> lock(g.mu);
    if (g.closed.load() && g.owner != std::this_thread::get_id()) {
      if (g.broken) {
        *why = "the recording before it has not finished (it was abandoned)";
        return Acquired::refused;
      }
      // Wait uncounted: the owner waits for counted launches to leave the driver.
      if (t_held) g.launching.fetch_sub(1);
      const bool open_now = wait_for_owner(g, lock);
      if (t_held) g.launching.fetch_add(1);
      if (!open_now) {
        *why = "the recording before it (another thread's) did not finish by its deadline; waited " +
               seconds_text(std::chrono::duration<double>(Clock::now() - started).count()) + " s";
        return Acquired::late;
      }
    }
    close(g, until);
  }
  if (!drain(g, until)) {
    open(g);
    *why = "launches of other threads did not leave the driver within " +
           seconds_text(std::chrono::duration<double>(Clock::now() - started).count()) + " s";
    return Acquired::late;
  }
  return Acquired::yes;
}

void extend(Clock::time_point until) {
  State& g = state();
  {
    std::lock_guard<std::mutex> lock(g.mu);
    if (g.owner != std::this_thread::get_id()) return;
    g.until = until;
  }
  g.cv.notify_all();  // waiters re-read the deadline
}

bool broken(std::string* why) {
  State& g = state();
  std::lock_guard<std::mutex> lock(g.mu);
  if (g.owner != std::this_thread::get_id() || !g.broken) return false;
  if (why) *why = g.why;
  return true;
}

void release() { open(state()); }

bool owned() {
  State& g = state();
  std::lock_guard<std::mutex> lock(g.mu);
  return g.closed.load() && g.owner == std::this_thread::get_id();
}

bool quiesce(Clock::time_point until, const std::function<void()>& action) {
  State& g = state();
  {
    std::lock_guard<std::mutex> lock(g.mu);
    if (g.closed.load()) return false;  // a recording is in progress: its end switches again
    close(g, until);
  }
  const bool drained = drain(g, until);
  if (drained) action();
  open(g);
  return drained;
}

int launching() { return state().launching.load(); }

}  // namespace gate

}  // namespace mneme::rec
