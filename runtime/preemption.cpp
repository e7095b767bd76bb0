#include "parallax/runtime/preemption.h"

#include <atomic>
#include <csignal>
#include <mutex>

namespace parallax {
namespace {

// Written by the handler, so a lock-free atomic: the one async-signal-safe kind of state.
std::atomic<int> recorded_signal{0};
static_assert(std::atomic<int>::is_always_lock_free);

std::mutex installed_mutex;
int installed_count = 0;
struct sigaction previous_term {};
struct sigaction previous_usr1 {};

extern "C" void record_signal(int signal) {
  recorded_signal.store(signal, std::memory_order_relaxed);
}

}  // namespace

PreemptionSignals::PreemptionSignals() {
  const std::lock_guard<std::mutex> lock(installed_mutex);
  if (installed_count++ > 0) return;
  struct sigaction action {};
  action.sa_handler = record_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // a blocking read or collective goes on; the step boundary looks
  sigaction(SIGTERM, &action, &previous_term);
  sigaction(SIGUSR1, &action, &previous_usr1);
}

PreemptionSignals::~PreemptionSignals() {
  const std::lock_guard<std::mutex> lock(installed_mutex);
  if (--installed_count > 0) return;
  sigaction(SIGTERM, &previous_term, nullptr);
  sigaction(SIGUSR1, &previous_usr1, nullptr);
}

int PreemptionSignals::received() const {
  return recorded_signal.load(std::memory_order_relaxed);
}

void PreemptionSignals::clear() {
  recorded_signal.store(0, std::memory_order_relaxed);
}

const char* signal_name(int signal) {
  switch (signal) {
    case SIGTERM:
      return "SIGTERM";
    case SIGUSR1:
      return "SIGUSR1";
    default:
      return "a signal";
  }
}

}  // namespace parallax
