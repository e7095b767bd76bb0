#include "parallax/pipeline/schedule.h"

#include <algorithm>
#include <cstdio>
#include <deque>
#include <limits>
#include <map>
#include <sstream>
#include <tuple>

#include "parallax/core/config_loader.h"
#include "parallax/core/error.h"

namespace parallax::pipeline {
namespace {

struct Slot {
  int micro = 0;
  int chunk = 0;
};

bool zero_bubble(const ScheduleShape& shape) {
  return shape.kind == PipelineSchedule::kZbH1;
}

// Forward sequence of one stage (step b of the protocol): groups of `stages`
// micro-batches, chunk by chunk within a group. With one chunk: micro-batches in order.
std::vector<Slot> forward_sequence(const ScheduleShape& shape) {
  std::vector<Slot> sequence;
  for (int group = 0; group < shape.micro_batches; group += shape.stages) {
    const int end = std::min(group + shape.stages, shape.micro_batches);
    for (int chunk = 0; chunk < shape.virtual_stages; ++chunk) {
      for (int micro = group; micro < end; ++micro) sequence.push_back({micro, chunk});
    }
  }
  return sequence;
}

std::vector<Slot> backward_sequence(const ScheduleShape& shape) {
  std::vector<Slot> sequence;
  for (int group = 0; group < shape.micro_batches; group += shape.stages) {
    const int end = std::min(group + shape.stages, shape.micro_batches);
    for (int chunk = shape.virtual_stages - 1; chunk >= 0; --chunk) {
      for (int micro = group; micro < end; ++micro) sequence.push_back({micro, chunk});
    }
  }
  return sequence;
}

struct ComputeOp {
  Op op;
  Slot slot;
};

// Step a of the protocol: one unit-cost simulation of all stages, greedy by the
// preference order, recording each stage's compute order.
std::vector<std::vector<ComputeOp>> compute_orders(const ScheduleShape& shape) {
  const int stages = shape.stages;
  const int parts = shape.parts();
  const bool zb = zero_bubble(shape);
  const std::vector<Slot> forwards = forward_sequence(shape);
  const std::vector<Slot> backwards = backward_sequence(shape);
  constexpr long kNever = std::numeric_limits<long>::max();
  // Finish times by (micro-batch, part).
  std::vector<long> forward_done(static_cast<std::size_t>(shape.micro_batches) * parts, kNever);
  std::vector<long> backward_done(forward_done.size(), kNever);
  auto at = [parts](int micro, int part) { return static_cast<std::size_t>(micro) * parts + part; };

  struct StageState {
    std::size_t next_forward = 0;
    std::size_t next_backward = 0;
    std::deque<Slot> deferred_weights;
    int held = 0;
    long free_at = 0;
    bool prefer_forward = true;
  };
  std::vector<StageState> state(stages);
  std::vector<std::vector<ComputeOp>> orders(stages);
  const std::size_t per_stage = forwards.size() + backwards.size() * (zb ? 2 : 1);
  std::size_t remaining = per_stage * stages;
  const long horizon = static_cast<long>(4 * per_stage * stages + 16);
  for (long t = 0; remaining > 0; ++t) {
    PARALLAX_ASSERT(t < horizon, "pipeline schedule simulation did not finish (", to_string(shape.kind), ", ",
                    shape.stages, " stages, ", shape.micro_batches, " micro-batches)");
    for (int s = 0; s < stages; ++s) {
      StageState& st = state[s];
      if (st.free_at > t) continue;
      const int bound = activation_bound(shape, s);
      auto try_backward = [&]() {
        const bool allowed = shape.kind != PipelineSchedule::kGPipe || st.next_forward == forwards.size();
        if (!allowed || st.next_backward >= backwards.size()) return false;
        const Slot slot = backwards[st.next_backward];
        const int part = part_of(shape, s, slot.chunk);
        const bool ready = forward_done[at(slot.micro, part)] <= t &&
                           (part == parts - 1 || backward_done[at(slot.micro, part + 1)] <= t);
        if (!ready) return false;
        const long cost = zb ? 1 : 2;
        backward_done[at(slot.micro, part)] = t + cost;
        orders[s].push_back({zb ? Op::kBackwardInput : Op::kBackward, slot});
        ++st.next_backward;
        if (zb) {
          st.deferred_weights.push_back(slot);
        } else {
          --st.held;
        }
        st.free_at = t + cost;
        st.prefer_forward = true;
        return true;
      };
      auto try_forward = [&]() {
        if (st.next_forward >= forwards.size() || st.held >= bound) return false;
        const Slot slot = forwards[st.next_forward];
        const int part = part_of(shape, s, slot.chunk);
        if (part > 0 && forward_done[at(slot.micro, part - 1)] > t) return false;
        forward_done[at(slot.micro, part)] = t + 1;
        orders[s].push_back({Op::kForward, slot});
        ++st.next_forward;
        ++st.held;
        st.free_at = t + 1;
        st.prefer_forward = false;
        return true;
      };
      // One forward, one backward in the steady state; whichever is ready when the
      // preferred one is not.
      bool chosen = st.prefer_forward ? (try_forward() || try_backward()) : (try_backward() || try_forward());
      if (!chosen && !st.deferred_weights.empty()) {
        orders[s].push_back({Op::kBackwardWeight, st.deferred_weights.front()});
        st.deferred_weights.pop_front();
        --st.held;
        st.free_at = t + 1;
        chosen = true;
      }
      if (chosen) --remaining;
    }
  }
  return orders;
}

std::string describe(const Instruction& in) {
  std::ostringstream out;
  out << to_string(in.op);
  if (in.micro_batch >= 0) out << "(micro-batch " << in.micro_batch << ", chunk " << in.chunk;
  if (in.peer >= 0) out << ", peer " << in.peer;
  if (in.micro_batch >= 0) out << ")";
  return out.str();
}

double compute_cost(const StageCosts& costs, Op op) {
  switch (op) {
    case Op::kForward:
      return costs.forward;
    case Op::kBackward:
      return costs.backward;
    case Op::kBackwardInput:
      return costs.backward_input;
    case Op::kBackwardWeight:
      return costs.backward_weight;
    default:
      return 0.0;
  }
}

}  // namespace

bool is_compute(Op op) {
  return op == Op::kForward || op == Op::kBackward || op == Op::kBackwardInput || op == Op::kBackwardWeight;
}

const char* to_string(Op op) {
  switch (op) {
    case Op::kRecvActivation:
      return "recv_activation";
    case Op::kForward:
      return "forward";
    case Op::kSendActivation:
      return "send_activation";
    case Op::kRecvGradient:
      return "recv_gradient";
    case Op::kBackward:
      return "backward";
    case Op::kBackwardInput:
      return "backward_input";
    case Op::kBackwardWeight:
      return "backward_weight";
    case Op::kSendGradient:
      return "send_gradient";
    case Op::kReduceTiedGradients:
      return "reduce_tied_gradients";
    case Op::kReduceGradients:
      return "reduce_gradients";
    case Op::kOptimizerStep:
      return "optimizer_step";
  }
  return "?";
}

void validate(const ScheduleShape& shape) {
  const std::string name = std::string("pipeline.schedule = \"") + to_string(shape.kind) + "\"";
  PARALLAX_CHECK(shape.stages >= 1 && shape.micro_batches >= 1 && shape.virtual_stages >= 1, ConfigError, name,
                 ": stages (", shape.stages, "), micro-batches (", shape.micro_batches, ") and virtual stages (",
                 shape.virtual_stages, ") must be >= 1");
  if (shape.kind == PipelineSchedule::kInterleaved) {
    PARALLAX_CHECK(shape.virtual_stages > 1 && shape.stages > 1, ConfigError, name,
                   ": interleaving needs virtual_stages > 1 and more than one stage (got ", shape.virtual_stages,
                   " virtual stages, ", shape.stages, " stages)");
  } else {
    PARALLAX_CHECK(shape.virtual_stages == 1, ConfigError, name, ": virtual_stages = ", shape.virtual_stages,
                   " needs schedule = \"interleaved\"");
  }
}

int activation_bound(const ScheduleShape& shape, int stage) {
  const int total = shape.micro_batches * shape.virtual_stages;
  int bound = total;
  switch (shape.kind) {
    case PipelineSchedule::kGPipe:
      bound = total;
      break;
    case PipelineSchedule::k1F1B:
      bound = shape.stages - stage;
      break;
    case PipelineSchedule::kInterleaved:
      bound = 2 * (shape.stages - stage - 1) + (shape.virtual_stages - 1) * shape.stages + 1;
      break;
    case PipelineSchedule::kZbH1:
      bound = shape.stages;
      break;
  }
  return std::min(bound, total);
}

namespace {

// `stage`'s list from the compute orders of every stage (protocol step c).
std::vector<Instruction> list_of(const ScheduleShape& shape,
                                 const std::vector<std::vector<ComputeOp>>& orders,
                                 int stage) {
  const int parts = shape.parts();
  auto stage_of = [&shape](int part) { return part % shape.stages; };
  std::vector<Instruction> list;
  for (const ComputeOp& op : orders[stage]) {
    const int micro = op.slot.micro;
    const int chunk = op.slot.chunk;
    const int part = part_of(shape, stage, chunk);
    switch (op.op) {
      case Op::kForward:
        if (part > 0) list.push_back({Op::kRecvActivation, micro, chunk, stage_of(part - 1)});
        list.push_back({Op::kForward, micro, chunk, -1});
        if (part < parts - 1) list.push_back({Op::kSendActivation, micro, chunk, stage_of(part + 1)});
        break;
      case Op::kBackward:
      case Op::kBackwardInput:
        if (part < parts - 1) list.push_back({Op::kRecvGradient, micro, chunk, stage_of(part + 1)});
        list.push_back({op.op, micro, chunk, -1});
        if (part > 0) list.push_back({Op::kSendGradient, micro, chunk, stage_of(part - 1)});
        break;
      default:
        list.push_back({op.op, micro, chunk, -1});
        break;
    }
  }
  // Data-parallel reduction first: the tied sum then reads finished (averaged) gradients;
  // both are sums, so the order does not change the result.
  list.push_back({Op::kReduceGradients, -1, 0, -1});
  list.push_back({Op::kReduceTiedGradients, -1, 0, -1});
  list.push_back({Op::kOptimizerStep, -1, 0, -1});
  return list;
}

}  // namespace

std::vector<Instruction> make_schedule(const ScheduleShape& shape, int stage) {
  validate(shape);
  PARALLAX_CHECK(stage >= 0 && stage < shape.stages, UsageError, "pipeline stage ", stage, " is not in [0, ",
                 shape.stages, ")");
  return list_of(shape, compute_orders(shape), stage);
}

std::vector<std::vector<Instruction>> make_schedules(const ScheduleShape& shape) {
  validate(shape);
  const std::vector<std::vector<ComputeOp>> orders = compute_orders(shape);
  std::vector<std::vector<Instruction>> lists;
  for (int stage = 0; stage < shape.stages; ++stage) lists.push_back(list_of(shape, orders, stage));
  return lists;
}

Simulation simulate(const ScheduleShape& shape,
                    const std::vector<std::vector<Instruction>>& lists,
                    const std::vector<StageCosts>& costs,
                    double transfer) {
  validate(shape);
  const int stages = shape.stages;
  const int parts = shape.parts();
  PARALLAX_ASSERT(static_cast<int>(lists.size()) == stages && static_cast<int>(costs.size()) == stages,
                  "simulate: one list and one cost per stage expected");
  const bool zb = zero_bubble(shape);
  auto stage_of = [&shape](int part) { return part % shape.stages; };
  struct Message {
    int micro;
    int part;  // the part that consumes it
    double arrival;
  };
  // (src, dst, is_gradient) → messages in send order.
  std::map<std::tuple<int, int, bool>, std::deque<Message>> channels;
  enum Done : std::uint8_t { kForwarded = 1, kBackwarded = 2, kWeighted = 4, kReceived = 8, kGradReceived = 16 };
  std::vector<std::vector<std::uint8_t>> done(
      stages, std::vector<std::uint8_t>(static_cast<std::size_t>(shape.micro_batches) * shape.virtual_stages, 0));
  std::vector<std::size_t> pc(stages, 0);
  std::vector<double> clock(stages, 0.0);
  std::vector<int> held(stages, 0);
  Simulation result;
  result.busy.assign(stages, 0.0);
  result.spans.resize(stages);
  result.peak_activations.assign(stages, 0);

  auto fail = [](int stage, const Instruction& in, const std::string& rule) {
    throw InternalError("pipeline schedule check: stage " + std::to_string(stage) + ", " + describe(in) + ": " + rule);
  };
  bool progressed = true;
  while (progressed) {
    progressed = false;
    for (int s = 0; s < stages; ++s) {
      while (pc[s] < lists[s].size()) {
        const Instruction& in = lists[s][pc[s]];
        const bool per_micro = in.micro_batch >= 0;
        if (per_micro && (in.micro_batch >= shape.micro_batches || in.chunk < 0 || in.chunk >= shape.virtual_stages)) {
          fail(s, in, "micro-batch or chunk out of range");
        }
        std::uint8_t* flags =
            per_micro ? &done[s][static_cast<std::size_t>(in.micro_batch) * shape.virtual_stages + in.chunk] : nullptr;
        const int part = part_of(shape, s, in.chunk);
        if (in.op == Op::kRecvActivation || in.op == Op::kRecvGradient) {
          const bool gradient = in.op == Op::kRecvGradient;
          const int from_part = gradient ? part + 1 : part - 1;
          if (from_part < 0 || from_part >= parts || in.peer != stage_of(from_part)) {
            fail(s, in, "no such peer part (expected stage " + std::to_string(stage_of(std::max(0, from_part))) + ")");
          }
          std::deque<Message>& channel = channels[{in.peer, s, gradient}];
          if (channel.empty()) break;  // blocked until the peer sends
          const Message message = channel.front();
          if (message.micro != in.micro_batch || message.part != part) {
            fail(s, in,
                 "receives out of order: the next message from stage " + std::to_string(in.peer) + " is micro-batch " +
                     std::to_string(message.micro) + " for part " + std::to_string(message.part));
          }
          channel.pop_front();
          clock[s] = std::max(clock[s], message.arrival);
          *flags |= gradient ? kGradReceived : kReceived;
        } else if (in.op == Op::kSendActivation || in.op == Op::kSendGradient) {
          const bool gradient = in.op == Op::kSendGradient;
          const int to_part = gradient ? part - 1 : part + 1;
          if (to_part < 0 || to_part >= parts || in.peer != stage_of(to_part)) fail(s, in, "no such peer part");
          const bool produced = gradient ? (*flags & kBackwarded) != 0 : (*flags & kForwarded) != 0;
          if (!produced) fail(s, in, "sends what it has not computed yet");
          channels[{s, in.peer, gradient}].push_back({in.micro_batch, to_part, clock[s] + transfer});
        } else if (is_compute(in.op)) {
          if (in.op == Op::kForward) {
            if (*flags & kForwarded) fail(s, in, "forwarded twice");
            if (part > 0 && !(*flags & kReceived)) fail(s, in, "forward before its input arrived");
            *flags |= kForwarded;
            result.peak_activations[s] = std::max(result.peak_activations[s], ++held[s]);
            if (held[s] > activation_bound(shape, s)) {
              fail(s, in,
                   "holds activations of " + std::to_string(held[s]) + " micro-batches, above the schedule's bound " +
                       std::to_string(activation_bound(shape, s)));
            }
          } else if (in.op == Op::kBackwardWeight) {
            if (!zb) fail(s, in, "a weight-gradient pass outside zb-h1");
            if (!(*flags & kBackwarded) || (*flags & kWeighted))
              fail(s, in, "weight gradient not after its input gradient, or twice");
            *flags |= kWeighted;
            --held[s];
          } else {
            if ((in.op == Op::kBackwardInput) != zb) fail(s, in, "backward kind does not match the schedule");
            if (!(*flags & kForwarded)) fail(s, in, "backward before forward");
            if (*flags & kBackwarded) fail(s, in, "backwarded twice");
            if (part < parts - 1 && !(*flags & kGradReceived))
              fail(s, in, "backward before its output gradient arrived");
            *flags |= kBackwarded;
            if (!zb) --held[s];
          }
          const double cost = compute_cost(costs[s], in.op);
          result.spans[s].push_back({in, clock[s], clock[s] + cost});
          clock[s] += cost;
          result.busy[s] += cost;
          result.makespan = std::max(result.makespan, clock[s]);
        }
        ++pc[s];
        progressed = true;
      }
    }
  }
  std::string blocked;
  for (int s = 0; s < stages; ++s) {
    if (pc[s] < lists[s].size()) blocked += " stage " + std::to_string(s) + " at " + describe(lists[s][pc[s]]) + ";";
  }
  PARALLAX_CHECK(blocked.empty(), InternalError, "pipeline schedule check: deadlock:", blocked);
  for (const auto& [key, channel] : channels) {
    PARALLAX_CHECK(channel.empty(), InternalError, "pipeline schedule check: ", channel.size(),
                   " message(s) from stage ", std::get<0>(key), " to stage ", std::get<1>(key), " never received");
  }
  const std::uint8_t complete = zb ? (kForwarded | kBackwarded | kWeighted) : (kForwarded | kBackwarded);
  for (int s = 0; s < stages; ++s) {
    for (std::size_t i = 0; i < done[s].size(); ++i) {
      PARALLAX_CHECK((done[s][i] & complete) == complete, InternalError, "pipeline schedule check: stage ", s,
                     " never completed micro-batch ", i / shape.virtual_stages, " chunk ", i % shape.virtual_stages);
    }
  }
  return result;
}

Simulation check_schedules(const ScheduleShape& shape) {
  return simulate(shape, make_schedules(shape), std::vector<StageCosts>(shape.stages));
}

std::string format_timeline(const ScheduleShape& shape) {
  const Simulation sim = check_schedules(shape);
  const auto units = static_cast<int>(sim.makespan + 0.5);
  std::ostringstream out;
  out << "schedule " << to_string(shape.kind) << ": " << shape.stages << " stage(s), " << shape.micro_batches
      << " micro-batch(es)";
  if (shape.virtual_stages > 1) out << ", " << shape.virtual_stages << " chunks per stage (a, b, ...)";
  out << "; unit costs: forward 1, backward " << (zero_bubble(shape) ? "1 (I) + weight 1 (W)" : "2") << "\n";
  const double ideal = static_cast<double>(shape.stages - 1) / (shape.micro_batches + shape.stages - 1);
  for (int s = 0; s < shape.stages; ++s) {
    std::vector<std::string> cells(units, " .  ");
    for (const SimulatedSpan& span : sim.spans[s]) {
      char label = 'F';
      if (span.instruction.op == Op::kBackward) label = 'B';
      if (span.instruction.op == Op::kBackwardInput) label = 'I';
      if (span.instruction.op == Op::kBackwardWeight) label = 'W';
      char cell[16];
      std::snprintf(cell, sizeof(cell), "%c%d", label, span.instruction.micro_batch);
      std::string text = cell;
      if (shape.virtual_stages > 1) text += static_cast<char>('a' + span.instruction.chunk);
      text.resize(4, ' ');
      for (auto t = static_cast<int>(span.start + 0.5); t < static_cast<int>(span.end + 0.5); ++t) cells[t] = text;
    }
    char head[32];
    std::snprintf(head, sizeof(head), "stage %d |", s);
    out << head;
    for (const std::string& cell : cells) out << cell;
    char tail[96];
    std::snprintf(tail, sizeof(tail), "| bubble %.3f (ideal 1F1B (p-1)/(m+p-1) = %.3f), peak %d in flight\n",
                  sim.bubble_fraction(s), ideal, sim.peak_activations[s]);
    out << tail;
  }
  return out.str();
}

}  // namespace parallax::pipeline
