// Preemption: the signals schedulers send before they kill a job (SIGTERM from Slurm,
// Kubernetes and the clouds' spot instances; SIGUSR1 when a batch script asks for it,
// e.g. sbatch --signal=USR1@120) ask the engine to save at the next step boundary. The
// handlers only record the signal; the engine's step boundary reads it (see
// StepApplier::save_if_due), so one rank's signal is enough for every rank to save.
#pragma once

namespace parallax {

/// While at least one is alive, SIGTERM and SIGUSR1 are recorded instead of ending the
/// process; the last one to go restores the handlers found before the first. A signal
/// is process-wide, so the record is too: every live PreemptionSignals sees it.
class PreemptionSignals {
 public:
  PreemptionSignals();
  ~PreemptionSignals();
  PreemptionSignals(const PreemptionSignals&) = delete;
  PreemptionSignals& operator=(const PreemptionSignals&) = delete;

  /// The last signal recorded (SIGTERM or SIGUSR1), 0 when none has come.
  int received() const;
  /// Forgets a recorded signal (after the save it asked for).
  void clear();
};

/// "SIGTERM", "SIGUSR1", or "a signal" for another.
const char* signal_name(int signal);

}  // namespace parallax
