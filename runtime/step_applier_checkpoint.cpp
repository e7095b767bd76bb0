// StepApplier's checkpoints: which state exists, under which names, and who writes it.
//
// Names: "<kind>/<parameter>", kind "param" (the fp32 tensor the optimizer steps) or an
// optimizer state ("exp_avg", "exp_avg_sq", "max_exp_avg_sq", "momentum_buffer"),
// parameter the whole model's name. A parameter split over the tensor-parallel group
// is saved per part, "<kind>/<parameter>@tp<rank>/<size>", with the plan's cut
// (checkpoint::PartOf) when a plan rule split it; one it replicates over the group is
// saved once, by tensor-parallel rank 0. A part loads from its own name (the same tp),
// or from the whole tensor (saved under tp = 1, a weights file, or parts saved under
// another tp, joined by the reader) cut as the plan cuts it; a replicated parameter
// loads whole from parts too. Per-rank streams are "rank/<world rank>/rng/<stream>".
#include <torch/types.h>

#include <algorithm>
#include <chrono>
#include <sstream>
#include <utility>

#include "parallax/checkpoint/async_saver.h"
#include "parallax/checkpoint/files.h"
#include "parallax/checkpoint/store.h"
#include "parallax/checkpoint/weights_file.h"
#include "parallax/core/config_loader.h"
#include "parallax/core/error.h"
#include "parallax/core/flight_recorder.h"
#include "parallax/core/mesh.h"
#include "parallax/core/world.h"
#include "parallax/runtime/gradient_reduction.h"
#include "parallax/runtime/plan_options.h"
#include "parallax/runtime/runtime.h"
#include "parallax/runtime/step_applier.h"
#include "parallax/runtime/step_telemetry.h"
#include "parallax/tensor_parallel/rng_tracker.h"
#include "parallax/zero/loss_scaler.h"
#include "proto/checkpoint.pb.h"

namespace parallax {
namespace {

std::chrono::milliseconds checkpoint_timeout(const Runtime& runtime) {
  return std::chrono::milliseconds(static_cast<std::int64_t>(runtime.config().checkpoint.timeout_s * 1000.0));
}

std::string rank_stream_name(int rank, const std::string& stream) {
  return "rank/" + std::to_string(rank) + "/rng/" + stream;
}

// "dp=2 tp=1 pp=1 zero=1 bf16, 2 ranks": the saving run, for messages.
std::string layout_text(Runtime& runtime, const proto::Plan& plan, torch::ScalarType dtype) {
  const MeshDegrees& d = runtime.mesh().degrees();
  std::ostringstream text;
  text << "dp=" << d.dp << " tp=" << d.tp << " pp=" << d.pp << " zero=" << zero_options(plan).stage << " "
       << c10::toString(dtype) << ", " << runtime.world().size() << " ranks";
  return text.str();
}

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::ostringstream text;
  text << "[";
  for (std::size_t i = 0; i < shape.size(); ++i) text << (i ? ", " : "") << shape[i];
  text << "]";
  return text.str();
}

// The checkpoint name of a parameter's `kind` of state (see the file comment), and
// whether this rank is the one that saves it (a part replicated over tp: rank 0 only).
struct StateName {
  std::string name;
  bool saved_here = true;
};
// A parameter's optimizer step count where it is not the optimizer's (one element).
constexpr char kStepsKind[] = "optimizer_steps";

std::string whole_name(const std::string& kind, const std::string& param_name) {
  return kind + "/" + param_name;
}
StateName state_name(
    const std::string& kind, const std::string& param_name, bool replicated_over_tp, int tp_rank, int tp_size) {
  if (replicated_over_tp) return {whole_name(kind, param_name), tp_rank == 0};
  return {whole_name(kind, param_name) + "@tp" + std::to_string(tp_rank) + "/" + std::to_string(tp_size), true};
}

// What `where` names: a checkpoint directory, a root to take the newest under
// (`latest`), or a safetensors weights file.
checkpoint::Reader open_checkpoint(const std::string& where, bool latest) {
  const std::optional<checkpoint::WeightsFormat> format = checkpoint::weights_format(where);
  if (!format)
    return checkpoint::Reader::open(where, latest ? checkpoint::Reader::kLatest : checkpoint::Reader::kExactly);
  PARALLAX_CHECK(*format == checkpoint::WeightsFormat::kSafetensors, CheckpointError, where,
                 ": a torch.save file is read whole, so runs start from safetensors, which every rank reads only its "
                 "part of; convert it first: parallax_checkpoint convert ",
                 where, " <name>.safetensors");
  return checkpoint::Reader::open_weights(where);
}

}  // namespace

checkpoint::SaveResult StepApplier::save_checkpoint(const std::string& trainer_state) {
  const auto started = std::chrono::steady_clock::now();
  const CheckpointOptions& options = runtime_->config().checkpoint;
  PARALLAX_CHECK(!checkpoint_root_.empty(), UsageError,
                 "save_checkpoint: checkpoint.dir is not set (the directory checkpoints go under)");
  torch::NoGradGuard no_grad;
  const int tp_rank = runtime_->mesh().coord().tp;
  const int tp_size = runtime_->mesh().degrees().tp;
  checkpoint::SaveRequest request;
  request.root = checkpoint_root_;
  request.step = global_step_;
  request.keep = static_cast<int>(options.keep);
  request.layout = layout_text(*runtime_, *plan_, dtype_);
  request.timeout = checkpoint_timeout(*runtime_);
  // Every parameter's step count is the optimizer's (the most of any rank's), except
  // those a step skipped (no gradient): theirs are saved beside their state.
  torch::Tensor optimizer_steps = torch::full({1}, reduction_->optimizer_steps(), torch::kInt64);
  CollectiveOptions max;
  max.reduce_op = ReduceOp::kMax;
  max.timeout = request.timeout;
  runtime_->world().communicator().all_reduce(optimizer_steps, max)->wait();
  const std::int64_t steps = optimizer_steps.item<std::int64_t>();
  for (const StateSlice& slice : reduction_->state_slices(StateAccess::kOwned, /*create_optimizer_state=*/false)) {
    const torch::Tensor& param = params_[slice.param];
    if (slice.offset == 0 && slice.steps != steps &&
        state_name(kStepsKind, param_names_[slice.param], /*replicated_over_tp=*/true, tp_rank, tp_size).saved_here) {
      request.pieces.push_back({whole_name(kStepsKind, param_names_[slice.param]),
                                {1},
                                0,
                                torch::full({1}, slice.steps, torch::kInt64),
                                {}});
    }
    const bool replicated_over_tp = !split_ || split_->copies(param) == tp_size;
    // A planned cut is recorded with the part, so that readers can join the parts.
    const auto split = replicated_over_tp ? std::nullopt : split_->split_of(param);
    for (const auto& [kind, values] : slice.tensors) {
      const StateName named = state_name(kind, param_names_[slice.param], replicated_over_tp, tp_rank, tp_size);
      if (!named.saved_here) continue;
      checkpoint::PartOf part;
      if (split) {
        part = {whole_name(kind, param_names_[slice.param]), split->whole_shape, split->cut, split->index,
                split->count};
      }
      request.pieces.push_back({named.name, param.sizes().vec(), slice.offset, values, std::move(part)});
    }
  }
  const tensor_parallel::RngTracker::Snapshot rng = runtime_->rng_tracker().capture();
  const int rank = runtime_->world().rank();
  request.pieces.push_back({rank_stream_name(rank, "default"), {rng.default_state.numel()}, 0, rng.default_state, {}});
  for (const auto& [stream, state] : rng.streams) {
    request.pieces.push_back({rank_stream_name(rank, stream), {state.numel()}, 0, state, {}});
  }
  proto::EngineCheckpointState engine;
  engine.set_global_step(global_step_);
  engine.set_optimizer_steps(steps);
  if (scaler_) {
    const zero::LossScalerState scaler = scaler_->state();
    engine.set_loss_scale(scaler.scale);
    engine.set_loss_scale_good_steps(scaler.good_steps);
    engine.set_loss_scale_hysteresis_left(scaler.hysteresis_left);
    engine.set_skipped_steps(scaler.skipped);
  }
  request.engine_state = engine.SerializeAsString();
  request.trainer_state = trainer_state;
  last_saved_step_ = global_step_;
  const auto blocked = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  };
  if (!options.async) {
    checkpoint::SaveResult result = checkpoint::save(runtime_->world().communicator(), request);
    result.blocked_seconds = blocked();
    log_saved(result);
    return result;
  }
  // In the background, over a communicator of its own: training's collectives go on.
  if (!saver_) {
    Communicator& world = runtime_->world().communicator();
    saver_ = std::make_unique<checkpoint::AsyncSaver>(world.split(0, world.rank(), "checkpoint"));
  }
  const std::string directory = request.root + "/" + checkpoint::directory_name(request.step);
  if (std::optional<checkpoint::SaveResult> previous = saver_->start(checkpoint::snapshot(std::move(request)))) {
    log_saved(*previous);
  }
  checkpoint::SaveResult started_save;
  started_save.directory = directory;
  started_save.blocked_seconds = blocked();
  runtime_->logger().summary("# checkpoint: step ", global_step_, " saving to ", directory,
                             " in the background (training blocked ", started_save.blocked_seconds * 1e3, " ms)");
  return started_save;
}

void StepApplier::log_saved(const checkpoint::SaveResult& result) const {
  // One line a bench can read: bytes and seconds are rank 0's.
  runtime_->logger().summary("# checkpoint: saved ", result.directory, " (rank 0 wrote ", result.bytes_written,
                             " bytes in ", result.write_seconds, " s; save ", result.save_seconds, " s; ",
                             result.blocked_seconds > 0 ? "training blocked " : "in the background",
                             result.blocked_seconds > 0 ? std::to_string(result.blocked_seconds * 1e3) + " ms" : "",
                             ")");
}

std::optional<checkpoint::SaveResult> StepApplier::wait_for_checkpoint() {
  if (!saver_) return std::nullopt;
  std::optional<checkpoint::SaveResult> result = saver_->wait();
  if (result) log_saved(*result);
  return result;
}

std::string StepApplier::load_checkpoint(const std::string& where, bool latest) {
  const MemoryPhase phase("a checkpoint load");
  wait_for_checkpoint();  // a save in flight may be the one asked for
  torch::NoGradGuard no_grad;
  Communicator& world = runtime_->world().communicator();
  const std::chrono::milliseconds timeout = checkpoint_timeout(*runtime_);
  const int tp_rank = runtime_->mesh().coord().tp;
  const int tp_size = runtime_->mesh().degrees().tp;
  std::unique_ptr<checkpoint::Reader> reader;
  proto::EngineCheckpointState engine;
  std::string error = checkpoint::error_of([&] {
    reader = std::make_unique<checkpoint::Reader>(open_checkpoint(where, latest));
    PARALLAX_CHECK(engine.ParseFromString(reader->engine_state()), CheckpointError, reader->directory(),
                   ": the engine state in manifest.pb does not parse");
  });
  checkpoint::raise_if_any_failed(world, "opening checkpoint " + where, error, timeout);
  // Every rank must take the same checkpoint (a rank that saw a directory torn later
  // than another would otherwise load a different step).
  torch::Tensor steps = torch::tensor({reader->step(), -reader->step()});
  CollectiveOptions max;
  max.reduce_op = ReduceOp::kMax;
  max.timeout = timeout;
  world.all_reduce(steps, max)->wait();
  PARALLAX_CHECK(steps[0].item<std::int64_t>() == -steps[1].item<std::int64_t>(), CheckpointError, "ranks found ",
                 "different checkpoints under ", where, " (steps ", -steps[1].item<std::int64_t>(), " to ",
                 steps[0].item<std::int64_t>(), "): is the directory shared by every node?");

  const bool fresh_optimizer = engine.optimizer_steps() == 0;
  // Parameters whose step count is not the optimizer's (a step skipped them): set after it.
  std::vector<std::pair<std::function<void(std::int64_t)>, std::int64_t>> own_steps;
  error = checkpoint::error_of([&] {
    std::vector<std::string> differences;  // every one, not just the first
    for (const StateSlice& slice : reduction_->state_slices(StateAccess::kHeld, /*create_optimizer_state=*/true)) {
      const torch::Tensor& param = params_[slice.param];
      const bool replicated_over_tp = !split_ || split_->copies(param) == tp_size;
      std::int64_t steps = engine.optimizer_steps();
      if (const std::string name = whole_name(kStepsKind, param_names_[slice.param]); reader->has(name)) {
        torch::Tensor saved = torch::empty({1}, torch::kInt64);
        reader->read(name, 0, saved);
        steps = saved.item<std::int64_t>();
        if (slice.set_steps) own_steps.emplace_back(slice.set_steps, steps);
      }
      for (const auto& [kind, values] : slice.tensors) {
        const std::string name = state_name(kind, param_names_[slice.param], replicated_over_tp, tp_rank, tp_size).name;
        const std::string whole = whole_name(kind, param_names_[slice.param]);
        const auto split = replicated_over_tp ? std::nullopt : split_->split_of(param);
        if (!reader->has(name) && reader->has_whole(whole) && (replicated_over_tp || split)) {
          // Saved under another tp (whole, or as parts that the reader joins): every
          // rank of the group reads the whole tensor and takes its part, cut as the
          // plan cut the parameter.
          const std::vector<std::int64_t> dense_shape = split ? split->whole_shape : param.sizes().vec();
          if (reader->shape(whole) != dense_shape) {
            differences.push_back("'" + whole + "' has shape " + shape_text(reader->shape(whole)) +
                                  ", this model's parameter " + shape_text(dense_shape));
            continue;
          }
          const torch::Tensor dense = reader->read_whole(whole).to(values.scalar_type());
          const torch::Tensor part = (split ? split_->part_of(param, dense) : dense).reshape({-1});
          values.copy_(part.narrow(0, slice.offset, values.numel()));
          continue;
        }
        if (!reader->has(name)) {
          if (kind != checkpoint::kParamKind && (fresh_optimizer || steps == 0)) {
            values.zero_();  // saved before the parameter's first step, or weights only
          } else {
            differences.push_back("'" + name + "' is missing");
          }
          continue;
        }
        const std::vector<std::int64_t> saved = reader->shape(name);
        if (saved != param.sizes().vec()) {
          differences.push_back("'" + name + "' has shape " + shape_text(saved) + ", this model's parameter " +
                                shape_text(param.sizes().vec()));
          continue;
        }
        // A weights file may hold another dtype (bf16 weights into fp32 masters).
        torch::Tensor host =
            torch::empty({values.numel()}, values.options().device(torch::kCPU).dtype(reader->dtype(name)));
        reader->read(name, slice.offset, host);
        values.copy_(host);
      }
    }
    if (!differences.empty()) {
      std::string list;
      for (std::size_t i = 0; i < differences.size() && i < 20; ++i) list += "\n  " + differences[i];
      if (differences.size() > 20) list += "\n  ... and " + std::to_string(differences.size() - 20) + " more";
      throw CheckpointError(detail::concat(reader->directory(), " (saved under ", reader->layout(),
                                           ") does not fit this model: ", differences.size(), " difference(s)", list));
    }
  });
  checkpoint::raise_if_any_failed(world, "loading checkpoint " + reader->directory(), error, timeout);

  reduction_->state_loaded();
  reduction_->set_optimizer_steps(engine.optimizer_steps());
  for (const auto& [set_steps, steps] : own_steps) set_steps(steps);
  global_step_ = engine.global_step();
  FlightRecorder::instance().set_step(global_step_ + 1);
  if (scaler_ && !reader->weights_only()) {
    scaler_->restore({engine.loss_scale(), engine.loss_scale_good_steps(), engine.loss_scale_hysteresis_left(),
                      engine.skipped_steps()});
  }
  // This rank's random streams, when the checkpoint has this rank (same world size).
  const int rank = runtime_->world().rank();
  if (reader->has(rank_stream_name(rank, "default"))) {
    tensor_parallel::RngTracker::Snapshot rng = runtime_->rng_tracker().capture();
    const auto restore = [&](const std::string& stream, torch::Tensor& state) {
      if (!reader->has(rank_stream_name(rank, stream))) return;
      torch::Tensor loaded = torch::empty_like(state);
      reader->read(rank_stream_name(rank, stream), 0, loaded);
      state = loaded;
    };
    restore("default", rng.default_state);
    for (auto& [stream, state] : rng.streams) restore(stream, state);
    runtime_->rng_tracker().restore(rng);
  }
  for (const std::string& skipped : reader->skipped()) {
    runtime_->logger().summary("# checkpoint: passed over ", skipped);
  }
  if (reader->weights_only()) {
    runtime_->logger().summary("# checkpoint: started from the weights in ", where, " (rank 0 read ",
                               reader->bytes_read(), " bytes)");
    return "";
  }
  runtime_->logger().summary("# checkpoint: resumed at step ", global_step_, " from ", reader->directory(),
                             " (saved under ", reader->layout(), "; rank 0 read ", reader->bytes_read(), " bytes)");
  return reader->trainer_state();
}

std::optional<std::string> StepApplier::resume() {
  const CheckpointOptions& options = runtime_->config().checkpoint;
  if (options.load.empty() || options.load == "none") return std::nullopt;
  if (options.load == "latest") return load_checkpoint(checkpoint_root_, /*latest=*/true);
  PARALLAX_CHECK(name_.empty(), UsageError, "checkpoint.load = \"", options.load, "\"", runtime_->config().position_of("checkpoint.load"),
                 " names one checkpoint, and engine '", name_,
                 "' keeps its own under checkpoint.dir/", name_, ": use checkpoint.load = \"latest\", or load each "
                 "engine's with engine.load_checkpoint(directory)");
  return load_checkpoint(options.load, /*latest=*/false);
}

void StepApplier::save_if_due() {
  if (preemption_ && !preempted_ && save_if_preempted()) return;
  const std::int64_t every = runtime_->config().checkpoint.every;
  if (every > 0 && global_step_ % every == 0) save_checkpoint("");
}

bool StepApplier::save_if_preempted() {
  // The largest (signal, lowest rank) over the world: one rank's signal reaches all.
  Communicator& world = runtime_->world().communicator();
  const std::int64_t signal = preemption_->received();
  torch::Tensor heard = torch::tensor({signal == 0 ? std::int64_t{0} : (signal << 32) | (world.size() - world.rank())});
  CollectiveOptions max;
  max.reduce_op = ReduceOp::kMax;
  world.all_reduce(heard, max)->wait();
  const std::int64_t agreed = heard.item<std::int64_t>();
  if (agreed == 0) return false;
  const int rank = world.size() - static_cast<int>(agreed & 0xffffffff);
  runtime_->logger().summary("# checkpoint: preempted (", signal_name(static_cast<int>(agreed >> 32)), " on rank ",
                             rank, "): saving step ", global_step_, ", then training stops");
  if (last_saved_step_ != global_step_) save_checkpoint("");
  wait_for_checkpoint();
  preemption_->clear();
  preempted_ = true;
  return true;
}

void StepApplier::finish() {
  const CheckpointOptions& options = runtime_->config().checkpoint;
  if (checkpoint_root_.empty()) return;
  if (last_saved_step_ != global_step_) save_checkpoint("");
  wait_for_checkpoint();
  if (options.export_on_finish.empty()) return;
  // A named engine's weights: "gan.safetensors" becomes "gan.generator.safetensors".
  std::string target = options.export_on_finish;
  if (!name_.empty()) {
    const std::size_t dot = target.rfind('.');
    const std::size_t slash = target.rfind('/');
    const bool has_extension = dot != std::string::npos && (slash == std::string::npos || dot > slash);
    target.insert(has_extension ? dot : target.size(), "." + name_);
  }
  const std::string directory = checkpoint_root_ + "/" + checkpoint::directory_name(global_step_);
  std::string error;
  if (runtime_->world().rank() == 0) {
    error = checkpoint::error_of([&] {
      const checkpoint::Reader saved = checkpoint::Reader::open(directory, checkpoint::Reader::kExactly);
      const checkpoint::ExportResult result = checkpoint::export_weights(saved, target);
      runtime_->logger().summary("# checkpoint: exported ", result.tensors, " tensors (", result.bytes, " bytes) of ",
                                 directory, " to ", target);
    });
  }
  checkpoint::raise_if_any_failed(runtime_->world().communicator(), "exporting " + directory + " to " + target, error,
                                  checkpoint_timeout(*runtime_));
}

}  // namespace parallax
