// Pipeline schedules as pure functions, and the simulator that checks and times them.
//
// A model of L layers is cut into Q = stages × virtual_stages contiguous parts. Part q
// runs on stage q mod stages as that stage's chunk q / stages (Megatron's interleaved
// layout; with one virtual stage, part q is stage q). A micro-batch's forward visits
// parts 0, 1, ..., Q-1; its backward visits them in reverse.
//
// make_schedule(shape, stage) is that stage's instruction list for one train_batch:
// compute (Forward, Backward, or BackwardInput + BackwardWeight for zb-h1), the
// point-to-point transfers around them, then ReduceGradients, ReduceTiedGradients and
// OptimizerStep. How the lists are made:
//  a. Every stage's compute order comes from one deterministic simulation of all stages
//     with unit costs (forward 1, backward 2; zb-h1: 1, 1, 1). A free stage takes, in
//     this order of preference: the next backward of its backward sequence once it is
//     ready (gpipe: only after its last forward); the next forward of its forward
//     sequence when it is ready and fewer than activation_bound() micro-batches hold
//     activations there; zb-h1 only: the oldest deferred weight gradient.
//  b. Forward sequences run micro-batches in order (interleaved: in groups of `stages`
//     micro-batches, chunk by chunk, as Megatron does; a last, smaller group is allowed,
//     so any micro-batch count works). Backward sequences are the same groups with the
//     chunks reversed.
//  c. A receive is placed just before the compute that consumes it, a send just after
//     the compute that produces it. Sends are non-blocking; receives block.
// Because every list follows one feasible execution, no combination of lists can wait
// in a cycle: there is no deadlock for any (stages, micro_batches, virtual_stages),
// including fewer micro-batches than stages. check_schedules() proves it for a given
// shape by running all lists together (tests do so for every shape up to 8 stages, 32
// micro-batches and 4 virtual stages).
//
//   auto list = pipeline::make_schedule({PipelineSchedule::k1F1B, 4, 8, 1}, /*stage=*/2);
//   auto report = pipeline::check_schedules({PipelineSchedule::k1F1B, 4, 8, 1});
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "parallax/core/config.h"

namespace parallax::pipeline {

enum class Op : std::uint8_t {
  kRecvActivation,       ///< the input of (micro_batch, chunk) from `peer`
  kForward,              ///< forward of (micro_batch, chunk); keeps what its backward needs
  kSendActivation,       ///< the output of (micro_batch, chunk) to `peer` (non-blocking)
  kRecvGradient,         ///< the gradient of (micro_batch, chunk)'s output from `peer`
  kBackward,             ///< input and weight gradients of (micro_batch, chunk); frees its activations
  kBackwardInput,        ///< zb-h1: the input gradient only (what the previous stage waits for)
  kBackwardWeight,       ///< zb-h1: the deferred weight gradient; frees the activations
  kSendGradient,         ///< the gradient of (micro_batch, chunk)'s input to `peer` (non-blocking)
  kReduceGradients,      ///< data-parallel gradient reduction (finishes what backward started)
  kReduceTiedGradients,  ///< sum tied weights' gradients between the stages that hold them
  kOptimizerStep,
};

/// "forward", "send_activation", ... (also the trace span names).
const char* to_string(Op op);

/// Forward, Backward, BackwardInput or BackwardWeight: the ops that take compute time.
bool is_compute(Op op);

struct Instruction {
  Op op = Op::kForward;
  int micro_batch = -1;  ///< -1 for the last three ops
  int chunk = 0;         ///< this stage's model chunk (0 .. virtual_stages - 1)
  int peer = -1;         ///< stage sent to or received from; -1 for other ops

  bool operator==(const Instruction& other) const {
    return op == other.op && micro_batch == other.micro_batch && chunk == other.chunk && peer == other.peer;
  }
};

struct ScheduleShape {
  PipelineSchedule kind = PipelineSchedule::k1F1B;
  int stages = 1;          ///< pipeline ranks, e.g. 4
  int micro_batches = 1;   ///< micro-batches per train_batch (train.grad_accum), e.g. 8
  int virtual_stages = 1;  ///< chunks per stage; > 1 only for interleaved

  int parts() const { return stages * virtual_stages; }
};

/// Throws ConfigError unless stages, micro_batches, virtual_stages >= 1, interleaved has
/// virtual_stages > 1 and stages > 1, and the others have virtual_stages == 1.
void validate(const ScheduleShape& shape);

/// Model part of `chunk` on `stage`: chunk × stages + stage.
inline int part_of(const ScheduleShape& shape, int stage, int chunk) {
  return chunk * shape.stages + stage;
}

/// Most micro-batches whose activations `stage` holds at once under this schedule:
/// gpipe all of them (micro_batches × virtual_stages); 1f1b stages - stage;
/// interleaved 2·(stages - stage - 1) + (virtual_stages - 1)·stages + 1 (Megatron's
/// warm-up plus one); zb-h1 stages (1F1B's peak, which the deferred weight gradients
/// may use on every stage). Never more than the micro-batches it runs.
int activation_bound(const ScheduleShape& shape, int stage);

/// `stage`'s instruction list for one train_batch (see the protocol above). Pure and
/// deterministic: every rank computes its own list. Throws ConfigError (validate).
std::vector<Instruction> make_schedule(const ScheduleShape& shape, int stage);

/// make_schedule for every stage, from one shared computation of the orders (what a
/// planner scoring many shapes, and check_schedules, want).
std::vector<std::vector<Instruction>> make_schedules(const ScheduleShape& shape);

/// Durations for simulate(), in any unit (e.g. milliseconds), per stage.
struct StageCosts {
  double forward = 1.0;
  double backward = 2.0;        ///< a whole backward (not zb-h1)
  double backward_input = 1.0;  ///< zb-h1
  double backward_weight = 1.0;
};

/// One op as simulated: [start, end) on its stage.
struct SimulatedSpan {
  Instruction instruction;
  double start = 0.0;
  double end = 0.0;
};

struct Simulation {
  double makespan = 0.0;                          ///< time when the last stage's last compute ends
  std::vector<double> busy;                       ///< compute time per stage
  std::vector<std::vector<SimulatedSpan>> spans;  ///< compute spans per stage, in order
  std::vector<int> peak_activations;              ///< most micro-batches holding activations, per stage

  /// 1 − busy / makespan for `stage`: the fraction of the pipeline's time it idles.
  double bubble_fraction(int stage) const { return makespan > 0 ? 1.0 - busy[stage] / makespan : 0.0; }
};

/// Runs every stage's list together: compute takes its cost, a send is non-blocking and
/// its message arrives `transfer` later, a receive waits for the matching message.
/// Checks what check_schedules() promises and throws InternalError naming the stage,
/// instruction and rule on the first violation (a deadlock names every blocked stage).
Simulation simulate(const ScheduleShape& shape,
                    const std::vector<std::vector<Instruction>>& lists,
                    const std::vector<StageCosts>& costs,
                    double transfer = 0.0);

/// make_schedule for every stage, then simulate() with unit costs: proves for this
/// shape that (1) every (micro-batch, chunk) is forwarded and backwarded exactly once on
/// every stage, forward first (and zb-h1's input gradient before its weight gradient);
/// (2) every send has a receive on its peer in the same order, with the same micro-batch
/// and the next (activation) or previous (gradient) part; (3) nothing deadlocks; (4)
/// activations held never exceed activation_bound(). Throws InternalError otherwise.
Simulation check_schedules(const ScheduleShape& shape);

/// ASCII timeline of the schedule under unit costs, one row per stage, one 4-character
/// cell per time unit: "F3" forward of micro-batch 3, "B3" backward, "I3"/"W3" zb-h1's
/// input and weight gradients, a chunk letter after the number when virtual_stages > 1
/// ("F3b"), "." idle; then each stage's bubble fraction against (p−1)/(m+p−1).
std::string format_timeline(const ScheduleShape& shape);

}  // namespace parallax::pipeline
