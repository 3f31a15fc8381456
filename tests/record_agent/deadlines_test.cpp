// The recorder's bounded waits (native/recorder/src/deadlines.cpp) without a GPU:
// the worker, the recording gate, the deadline settings. Built and run by
// tests/record/test_deadlines_native.py; prints "ok <case>" per case, exits 1
// at the first failure.
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "deadlines.hpp"

using namespace mneme::rec;
using namespace std::chrono_literals;

namespace {

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

void check(bool ok, const char* what, double value = 0) {
  if (ok) return;
  std::printf("FAILED %s (%.3f)\n", what, value);
  std::exit(1);
}

void settings_scale_with_bytes() {
  // MNEME_RECORD_DEADLINE=0.4 (set by the test): a snapshot wait adds 1 s per GB.
  check(std::fabs(deadline_seconds() - 0.4) < 1e-9, "base deadline", deadline_seconds());
  check(std::fabs(deadline_seconds(2000000000ull) - 2.4) < 1e-9, "deadline for 2 GB", deadline_seconds(2000000000ull));
  check(deadline_settings().max_abandoned == 3, "max abandoned default");
  std::printf("ok settings\n");
}

void worker_deadlines() {
  Worker w([] {});
  auto t0 = Clock::now();
  std::atomic<int> ran{0};
  check(w.run([&] { ran = 1; }, deadline_after(1.0)) == Worker::Result::done && ran == 1, "a quick job is done");
  t0 = Clock::now();
  auto slow_done = std::make_shared<std::atomic<bool>>(false);
  auto r = w.run([slow_done] { std::this_thread::sleep_for(600ms); *slow_done = true; }, deadline_after(0.15));
  double waited = since(t0);
  check(r == Worker::Result::late, "a slow job is late");
  check(waited >= 0.14 && waited < 0.4, "the caller waited until the deadline only", waited);
  t0 = Clock::now();
  check(w.run([] {}, deadline_after(1.0)) == Worker::Result::busy, "a busy worker refuses");
  check(since(t0) < 0.05, "a refusal does not wait", since(t0));
  check(w.busy(), "busy while the abandoned job runs");
  std::this_thread::sleep_for(700ms);
  check(*slow_done && !w.busy(), "the abandoned job ends on its own");
  check(w.run([] {}, deadline_after(1.0)) == Worker::Result::done, "then the worker takes jobs again");
  std::printf("ok worker\n");
}

void gate_waits_for_the_owner() {
  std::atomic<bool> acquired{false};
  std::thread owner([&] {
    gate::enter(gate::launch_callback);
    std::string why;
    check(gate::acquire(deadline_after(2.0), &why) == gate::Acquired::yes, "owner acquires");
    check(gate::owned(), "owned");
    acquired = true;
    std::this_thread::sleep_for(200ms);
    std::string broken;
    check(!gate::broken(&broken), "not broken when released in time");
    gate::release();
    gate::leave(gate::launch_callback);
  });
  while (!acquired) std::this_thread::yield();
  auto t0 = Clock::now();
  gate::enter(gate::launch_callback);  // waits for the owner
  double waited = since(t0);
  check(waited >= 0.15 && waited < 1.0, "a launch waits while another is recorded", waited);
  owner.join();  // the owner releases before it leaves: count once it has left
  check(gate::launching() == 1, "counted once inside", gate::launching());
  gate::leave(gate::launch_callback);
  check(gate::launching() == 0, "nobody inside", gate::launching());
  std::printf("ok gate_waits_for_the_owner\n");
}

void gate_gives_up_on_a_late_owner() {
  std::atomic<int> phase{0};
  std::string owner_why;
  std::thread owner([&] {
    gate::enter(gate::launch_callback);
    std::string why;
    check(gate::acquire(deadline_after(0.2), &why) == gate::Acquired::yes, "owner acquires");
    phase = 1;
    while (phase < 2) std::this_thread::sleep_for(10ms);  // stuck past its deadline
    check(gate::broken(&owner_why), "the owner learns it was given up on");
    gate::release();
    gate::leave(gate::launch_callback);
  });
  while (phase < 1) std::this_thread::yield();
  auto t0 = Clock::now();
  gate::enter(gate::launch_callback);
  double waited = since(t0);
  // deadline 0.2 s + grace 1 s
  check(waited >= 1.1 && waited < 1.6, "a waiter gives up at the owner's deadline plus the grace", waited);
  gate::leave(gate::launch_callback);
  t0 = Clock::now();
  gate::enter(gate::launch_callback);  // never waits for that owner again
  check(since(t0) < 0.05, "nobody waits for a broken owner", since(t0));
  std::string why;
  check(gate::acquire(deadline_after(1.0), &why) == gate::Acquired::refused, "no recording while it is stuck");
  check(since(t0) < 0.05, "a refusal does not wait", since(t0));
  gate::leave(gate::launch_callback);
  phase = 2;
  owner.join();
  check(owner_why.find("waited") != std::string::npos, "the reason says a launch waited");
  std::printf("ok gate_gives_up_on_a_late_owner\n");
}

void gate_drains_launches_inside_the_driver() {
  std::atomic<int> phase{0};
  std::thread inside([&] {
    gate::enter(gate::launch_callback);  // a launch inside the driver
    phase = 1;
    std::this_thread::sleep_for(150ms);
    gate::leave(gate::launch_callback);
  });
  while (phase < 1) std::this_thread::yield();
  gate::enter(gate::launch_callback);
  auto t0 = Clock::now();
  std::string why;
  check(gate::acquire(deadline_after(2.0), &why) == gate::Acquired::yes, "acquires once the launch left");
  double waited = since(t0);
  check(waited >= 0.1 && waited < 1.0, "the owner waited for the launch inside the driver", waited);
  gate::release();
  inside.join();
  // A launch that never leaves: the owner gives up at its deadline, the gate opens.
  std::atomic<bool> stop{false};
  std::thread stuck([&] {
    gate::enter(gate::graph_launch);
    while (!stop) std::this_thread::sleep_for(5ms);
    gate::leave(gate::graph_launch);
  });
  while (gate::launching() < 2) std::this_thread::yield();
  t0 = Clock::now();
  check(gate::acquire(deadline_after(0.2), &why) == gate::Acquired::late, "late when a launch stays inside");
  waited = since(t0);
  check(waited >= 0.19 && waited < 0.5, "gave up at its deadline", waited);
  check(why.find("did not leave the driver") != std::string::npos, "the reason names the launches");
  check(!gate::owned(), "the gate is open again");
  stop = true;
  stuck.join();
  gate::leave(gate::launch_callback);
  std::printf("ok gate_drains_launches_inside_the_driver\n");
}

void two_recorders_take_turns() {
  // Both inside a launch; A takes the gate and waits for B to leave the driver,
  // B wants the gate too: B waits uncounted, so A goes on; then B records.
  std::atomic<int> phase{0};
  std::atomic<bool> b_done{false};
  std::thread b([&] {
    gate::enter(gate::launch_callback);
    phase = 1;
    while (phase < 2) std::this_thread::yield();
    std::this_thread::sleep_for(50ms);  // A is draining by now
    std::string why;
    check(gate::acquire(deadline_after(3.0), &why) == gate::Acquired::yes, "B records after A");
    gate::release();
    gate::leave(gate::launch_callback);
    b_done = true;
  });
  while (phase < 1) std::this_thread::yield();
  gate::enter(gate::launch_callback);
  phase = 2;
  auto t0 = Clock::now();
  std::string why;
  check(gate::acquire(deadline_after(3.0), &why) == gate::Acquired::yes, "A records");
  double waited = since(t0);
  check(waited < 1.0, "A did not wait for B's deadline", waited);
  std::this_thread::sleep_for(100ms);
  check(!b_done, "B waits while A records");
  gate::release();
  gate::leave(gate::launch_callback);
  b.join();
  check(gate::launching() == 0, "nobody inside", gate::launching());
  std::printf("ok two_recorders_take_turns\n");
}

void holders_count_once() {
  gate::enter(gate::graph_launch);
  gate::enter(gate::launch_callback);  // a node of the recorder's own graph launch
  check(gate::launching() == 1, "nested: counted once", gate::launching());
  gate::leave(gate::launch_callback);
  check(gate::launching() == 1, "still inside the graph launch", gate::launching());
  gate::enter(gate::launch_callback);
  gate::enter(gate::launch_callback);  // an exit callback was lost: not counted twice
  gate::leave(gate::launch_callback);
  gate::leave(gate::graph_launch);
  check(gate::launching() == 0, "left", gate::launching());
  gate::leave(gate::graph_launch);  // a second leave changes nothing
  check(gate::launching() == 0, "no negative count", gate::launching());
  std::printf("ok holders_count_once\n");
}

void away_does_not_hold_up_an_owner() {
  std::atomic<int> phase{0};
  std::thread graph([&] {
    gate::enter(gate::graph_launch);  // inside the recorder's graph launch
    {
      gate::Away away;  // waiting for the agent
      phase = 1;
      while (phase < 2) std::this_thread::sleep_for(5ms);
    }  // counts again: waits while the owner records
    phase = 3;
    gate::leave(gate::graph_launch);
  });
  while (phase < 1) std::this_thread::yield();
  gate::enter(gate::launch_callback);
  auto t0 = Clock::now();
  std::string why;
  check(gate::acquire(deadline_after(2.0), &why) == gate::Acquired::yes, "acquires");
  check(since(t0) < 0.1, "the away thread is not waited for", since(t0));
  phase = 2;
  std::this_thread::sleep_for(100ms);
  check(phase == 2, "coming back waits at the closed gate");
  gate::release();
  gate::leave(gate::launch_callback);
  graph.join();
  check(phase == 3 && gate::launching() == 0, "then it went on", gate::launching());
  std::printf("ok away\n");
}

void quiesce_runs_alone() {
  std::atomic<int> phase{0};
  std::thread inside([&] {
    gate::enter(gate::launch_callback);
    phase = 1;
    std::this_thread::sleep_for(100ms);
    gate::leave(gate::launch_callback);
  });
  while (phase < 1) std::this_thread::yield();
  bool ran = false;
  auto t0 = Clock::now();
  check(gate::quiesce(deadline_after(2.0), [&] { ran = gate::launching() == 0; }), "quiesce");
  check(ran, "the action ran with no launch inside");
  check(since(t0) >= 0.08, "after the launch left", since(t0));
  inside.join();
  std::printf("ok quiesce\n");
}

}  // namespace

int main() {
  settings_scale_with_bytes();
  worker_deadlines();
  gate_waits_for_the_owner();
  gate_gives_up_on_a_late_owner();
  gate_drains_launches_inside_the_driver();
  two_recorders_take_turns();
  holders_count_once();
  away_does_not_hold_up_an_owner();
  quiesce_runs_alone();
  std::printf("all ok\n");
  return 0;
}
