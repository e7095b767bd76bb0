#include "parallax/runtime/gradient_reduction.h"

#include <torch/nn/module.h>
#include <torch/nn/utils/clip_grad.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "parallax/core/config_loader.h"
#include "parallax/core/cpu_binding.h"
#include "parallax/core/error.h"
#include "parallax/core/mesh.h"
#include "parallax/core/world.h"
#include "parallax/offload/cpu_adam.h"
#include "parallax/offload/offloaded_adam.h"
#include "parallax/runtime/gradient_buckets.h"
#include "parallax/runtime/plan_options.h"
#include "parallax/runtime/runtime.h"
#include "parallax/runtime/thread_budget.h"
#include "parallax/zero/gradient_presence.h"
#include "parallax/zero/shard_layout.h"

namespace parallax {
namespace {

// The global gradient norm of a model split over other ranks (tensor or pipeline
// parallel): each parameter's squares times its weight (1 / the ranks holding the same
// elements; 0 for a tied copy another stage counts), summed in float64 over `groups`, and
// clipping as torch::nn::utils::clip_grad_norm_ does (clip > 0). Returns the norm (not
// finite: nothing clipped); every rank of the groups reaches the same value.
double clip_model_parallel_gradients(const std::vector<torch::Tensor>& optimized,
                                     const std::vector<double>& weights,
                                     const std::vector<Communicator*>& groups,
                                     double clip) {
  torch::NoGradGuard no_grad;
  torch::Tensor squares = torch::zeros({1}, optimized.front().options().dtype(torch::kFloat64));
  for (std::size_t i = 0; i < optimized.size(); ++i) {
    if (weights[i] == 0.0 || !optimized[i].grad().defined()) continue;
    squares.add_(optimized[i].grad().to(torch::kFloat64).pow(2).sum() * weights[i]);
  }
  for (Communicator* group : groups) group->all_reduce(squares)->wait();
  const double norm = std::sqrt(squares.item<double>());
  if (std::isfinite(norm) && clip > 0 && clip / (norm + 1e-6) < 1.0) {
    for (const auto& p : optimized) {
      if (p.grad().defined()) p.grad().mul_(clip / (norm + 1e-6));
    }
  }
  return norm;
}

// zero.stage = 0: buckets all-reduced during the window's last backward; a LibTorch
// optimizer over the parameters, or over fp32 masters under bf16/fp16 (whose gradients
// are the buckets' fp32 accumulators).
class ReplicatedReduction final : public GradientReduction {
 public:
  ReplicatedReduction(Runtime& runtime,
                      const proto::Plan& plan,
                      std::vector<torch::Tensor> params,
                      torch::ScalarType dtype,
                      const OptimizerGroups& optimizer,
                      ModelSplit split)
      : params_(std::move(params)), split_(std::move(split)), groups_(optimizer) {
    const ZeroOptions zero = zero_options(plan);
    // bf16/fp16 gradients accumulate and are reduced in fp32, straight into the masters' grads.
    const bool keep_masters = dtype != torch::kFloat32;
    replicas_ = &runtime.mesh().replicas();
    dp_rank_ = runtime.mesh().replicas().rank();
    dp_size_ = runtime.mesh().replicas().size();
    buckets_ = std::make_unique<GradientBuckets>(
        params_, zero.bucket_bytes(), runtime.mesh().replicas(), runtime.tracer(), zero.overlap_comm,
        keep_masters ? std::optional<torch::ScalarType>(torch::kFloat32) : std::nullopt, split_.expert);
    // Experts: each rank of the ep group holds others, so the norm sums over it, where
    // every other (dense) parameter is held ep times.
    is_expert_.assign(params_.size(), false);
    for (std::size_t i : split_.expert.members) is_expert_[i] = true;
    if (split_.experts != nullptr) {
      if (split_.norm_weights.empty()) split_.norm_weights.assign(params_.size(), 1.0);
      for (std::size_t i = 0; i < params_.size(); ++i) {
        if (!is_expert_[i]) split_.norm_weights[i] /= static_cast<double>(split_.experts->size());
      }
      split_.norm_groups.push_back(split_.experts);
    }
    if (keep_masters) {
      for (std::size_t i = 0; i < params_.size(); ++i) {
        torch::Tensor master = params_[i].detach().to(torch::kFloat32).clone().requires_grad_(true);
        master.mutable_grad() = buckets_->accumulated_grad(i);
        masters_.push_back(master);
      }
    }
    optimizer_ = make_optimizer(optimizer, optimized(), AdamKernel::kFusedCpu);
    create_optimizer_state(*optimizer_, optimized());
  }

  zero::ParameterUseScope use_scope() const override { return zero::ParameterUseScope(); }

  void run_backward(pipeline::WeightGradients writes, const std::function<void()>& backward) override {
    auto own = buckets_->own_backward(writes == pipeline::WeightGradients::kLast);
    backward();
  }

  void end_micro_batch() override { buckets_->commit(); }

  void finish() override {
    buckets_->finish();
    if (split_.partial.empty()) return;
    std::vector<torch::Tensor> partial;
    for (std::size_t i : split_.partial) partial.push_back(optimized()[i].grad());
    sum_in_place(*split_.tp, partial);
  }

  void edit_gradients(const std::vector<std::size_t>& indices,
                      const std::function<void(std::vector<torch::Tensor>&)>& edit) override {
    std::vector<torch::Tensor> grads;
    grads.reserve(indices.size());
    for (std::size_t i : indices) grads.push_back(optimized().at(i).grad());  // views: edited in place
    edit(grads);
  }

  zero::StepOutcome step(double lr, double loss_scale, double clip, bool skip_non_finite) override {
    torch::NoGradGuard no_grad;
    zero::StepOutcome outcome;
    std::vector<bool> local(params_.size());
    for (std::size_t i = 0; i < params_.size(); ++i) local[i] = buckets_->has_gradient(i);
    const c10::Device device = params_.empty() ? c10::Device(c10::kCPU) : params_.front().device();
    const std::vector<bool> present = zero::agree_on_gradients(local, *replicas_, split_.expert, device);
    if (loss_scale != 1.0) {
      for (const auto& m : masters_) m.mutable_grad().mul_(1.0 / loss_scale);
    }
    if (clip > 0 || skip_non_finite) {
      if (!split_.norm_groups.empty()) {
        outcome.grad_norm = clip_model_parallel_gradients(optimized(), split_.norm_weights, split_.norm_groups, clip);
      } else {
        // Gradients are identical on every rank after the all-reduce, so every rank
        // reaches the same norm without communicating (an infinite bound never clips).
        outcome.grad_norm =
            torch::nn::utils::clip_grad_norm_(optimized(), clip > 0 ? clip : std::numeric_limits<double>::infinity());
      }
      // An overflowing step's gradients are discarded below whatever clipping did to them.
      outcome.skipped = skip_non_finite && !std::isfinite(outcome.grad_norm);
    }
    if (!outcome.skipped) {
      set_learning_rate(*optimizer_, lr, groups_);
      // As LibTorch's optimizer skips an undefined .grad: the gradients no rank's
      // backward reached are hidden from it for the step (the same tensors come back, so
      // the gradient ledger sees nothing the trainer did).
      std::vector<torch::Tensor> hidden(params_.size());
      for (std::size_t i = 0; i < params_.size(); ++i) {
        if (present[i]) continue;
        hidden[i] = optimized()[i].grad();
        optimized()[i].mutable_grad() = torch::Tensor();
      }
      optimizer_->step();
      for (std::size_t i = 0; i < params_.size(); ++i) {
        if (hidden[i].defined()) optimized()[i].mutable_grad() = hidden[i];
      }
      for (std::size_t i = 0; i < masters_.size(); ++i) params_[i].detach().copy_(masters_[i]);
    }
    buckets_->zero();
    return outcome;
  }

  std::vector<torch::Tensor> master_parameters() override {
    std::vector<torch::Tensor> out;
    for (const auto& p : optimized()) out.push_back(p.detach().to(torch::kFloat32));
    return out;
  }

  ModelStateBytes model_state_bytes() const override {
    ModelStateBytes bytes;
    for (const auto& p : params_) bytes.params += payload_bytes(p);
    bytes.grads = buckets_->buffer_bytes();
    bytes.optimizer = optimizer_state_bytes(*optimizer_);
    for (const auto& m : masters_) bytes.optimizer += payload_bytes(m);  // the fp32 master weight
    return bytes;
  }
  std::int64_t gradient_bytes() const override { return buckets_->gradient_bytes(); }
  std::int64_t gradient_padding_bytes() const override { return buckets_->padding_bytes(); }
  std::int64_t expert_gradient_bytes() const override {
    std::int64_t bytes = 0;
    for (std::size_t i : split_.expert.members) bytes += payload_bytes(buckets_->accumulated_grad(i));
    return bytes;
  }
  std::int64_t expert_gradient_padding_bytes() const override { return 0; }  // buckets are packed
  std::size_t bucket_count() const override { return buckets_->bucket_count(); }
  std::int64_t late_reductions() const override { return buckets_->late_reductions(); }
  void watch_zero_grad(torch::Tensor sentinel) override { buckets_->watch_zero_grad(std::move(sentinel)); }

  // Every rank holds everything; rank r of dp owns the r-th of dp even parts of the
  // parameters laid end to end (ZeRO's shard layout), so the ranks write in parallel.
  // Experts: the same over the ranks holding them (each expert's name is its global
  // index, so every expert is written once whole).
  std::vector<StateSlice> state_slices(StateAccess access, bool create_optimizer_state) override {
    std::vector<std::int64_t> dense_numels, expert_numels;
    std::vector<std::size_t> place(optimized().size());
    for (std::size_t i = 0; i < optimized().size(); ++i) {
      auto& numels = is_expert_[i] ? expert_numels : dense_numels;
      place[i] = numels.size();
      numels.push_back(optimized()[i].numel());
    }
    const zero::ShardLayout owners(dense_numels, dp_size_);
    const zero::ShardLayout expert_owners(expert_numels, split_.expert.comm ? split_.expert.comm->size() : 1);
    const int expert_rank = split_.expert.comm ? split_.expert.comm->rank() : 0;
    std::vector<StateSlice> slices;
    for (std::size_t i = 0; i < optimized().size(); ++i) {
      const torch::Tensor& p = optimized()[i];
      PARALLAX_CHECK(p.is_contiguous(), UsageError, "a checkpoint needs contiguous parameters; parameter ", i,
                     " has strides ", p.strides());
      StateSlice slice;
      slice.param = i;
      std::int64_t numel = p.numel();
      if (access == StateAccess::kOwned) {
        const auto part =
            is_expert_[i] ? expert_owners.fragment(place[i], expert_rank) : owners.fragment(place[i], dp_rank_);
        if (!part) continue;
        slice.offset = part->param_offset;
        numel = part->numel;
      }
      slice.tensors.emplace_back("param", p.detach().view({-1}).narrow(0, slice.offset, numel));
      for (const auto& [name, state] : optimizer_state(*optimizer_, p, create_optimizer_state)) {
        slice.tensors.emplace_back(name, state.view({-1}).narrow(0, slice.offset, numel));
      }
      slice.steps = parameter_steps(*optimizer_, p);
      slice.set_steps = [this, p](std::int64_t steps) { set_parameter_steps(*optimizer_, p, steps); };
      slices.push_back(std::move(slice));
    }
    return slices;
  }

  void state_loaded() override {
    torch::NoGradGuard no_grad;
    for (std::size_t i = 0; i < masters_.size(); ++i) params_[i].detach().copy_(masters_[i]);
  }
  std::int64_t optimizer_steps() const override { return parallax::optimizer_steps(*optimizer_); }
  void set_optimizer_steps(std::int64_t steps) override { parallax::set_optimizer_steps(*optimizer_, steps); }

 private:
  const std::vector<torch::Tensor>& optimized() const { return masters_.empty() ? params_ : masters_; }

  std::vector<torch::Tensor> params_;   ///< the model's (compute dtype)
  std::vector<torch::Tensor> masters_;  ///< fp32 copies under bf16/fp16; empty under fp32
  ModelSplit split_;
  std::vector<bool> is_expert_;  ///< per parameter: reduced over split_.expert.comm
  std::unique_ptr<GradientBuckets> buckets_;
  Communicator* replicas_ = nullptr;  ///< the gradients' group (dp × cp)
  int dp_rank_ = 0;
  int dp_size_ = 1;
  OptimizerGroups groups_;  ///< the optimizer's parameter groups, per parameter
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
};

// The CPU Adam streams memory: keep its threads on this rank's own cores, and say where.
void bind_offload_threads(Runtime& runtime, const proto::Plan& plan, const zero::ShardedModel& sharded) {
  const std::vector<int> bound = offload::CpuAdam::bind_threads(runtime.threads().pus);
  std::string where;
  for (std::size_t t = 0; t < bound.size(); ++t) where += (t ? "," : "") + std::to_string(bound[t]);
  const OffloadOptions offload = offload_options(plan);
  runtime.logger().summary("# offload: optimizer ", to_string(offload.optimizer), ", param ", to_string(offload.param),
                           "; fused CPU Adam (", offload::CpuAdam::instruction_set(), "), rank 0's ", bound.size(),
                           " intra-op thread(s) bound to PU(s) {", where, "}; rank 0 holds ", sharded.host_bytes(),
                           " bytes on the host and ", sharded.nvme_bytes(), " in the NVMe tier");
}

// zero.stage 1–3 (zero/sharded_model.h), with [offload].
class ShardedReduction final : public GradientReduction {
 public:
  ShardedReduction(Runtime& runtime,
                   const proto::Plan& plan,
                   torch::nn::Module& model,
                   const std::vector<torch::Tensor>& params,
                   const OptimizerGroups& optimizer,
                   const ModelSplit& split)
      : dp_(&runtime.mesh().replicas()),
        reduce_untouched_(!split.partial_backwards),
        params_(params),
        experts_(split.expert.members) {
    const OffloadOptions offload = offload_options(plan);
    sharded_ = std::make_unique<zero::ShardedModel>(
        model, params, zero_options(plan), offload, optimizer.options, *dp_, runtime.tracer(),
        [this, &optimizer](std::vector<torch::Tensor> shards, const std::vector<std::size_t>& group_of_shard) {
          master_groups_ = OptimizerGroups{optimizer.options, group_of_shard};
          auto made = make_optimizer(master_groups_, shards, AdamKernel::kFusedCpu);
          create_optimizer_state(*made, shards);
          return made;
        },
        split.expert, optimizer.of);
    if (!split.norm_groups.empty()) {
      zero::ModelParallel model_parallel;
      model_parallel.tp = split.tp;
      model_parallel.norm_groups = split.norm_groups;
      model_parallel.norm_weights = split.norm_weights;
      model_parallel.partial.assign(params.size(), false);
      for (std::size_t i : split.partial) model_parallel.partial[i] = true;
      sharded_->set_model_parallel(model_parallel);
    }
    if (offload.optimizer_offloaded()) bind_offload_threads(runtime, plan, *sharded_);
  }

  zero::ParameterUseScope use_scope() const override { return sharded_->use_scope(); }

  void run_backward(pipeline::WeightGradients writes, const std::function<void()>& backward) override {
    if (writes == pipeline::WeightGradients::kNone) {
      auto gathering = sharded_->use_scope();
      backward();
      return;
    }
    sharded_->begin_backward(writes == pipeline::WeightGradients::kLast, reduce_untouched_);
    {
      auto gathering = sharded_->use_scope();
      backward();
    }
    sharded_->end_backward();
  }

  // Every backward waited for its reductions; what came later is reduced here; step()
  // sums partial ones.
  void end_micro_batch() override { sharded_->commit_micro_batch(); }
  void finish() override { sharded_->finish_window(); }

  // Each rank's parts of the parameters' gradients are disjoint: a sum over dp of
  // zero-padded copies assembles them whole on every rank.
  void edit_gradients(const std::vector<std::size_t>& indices,
                      const std::function<void(std::vector<torch::Tensor>&)>& edit) override {
    for (std::size_t i : indices) {
      PARALLAX_CHECK(std::find(experts_.begin(), experts_.end(), i) == experts_.end(), UsageError,
                     "edit_gradients: parameter ", i,
                     " is an expert's, sharded over its own group; only dense "
                     "parameters (tied weights) can be edited whole");
    }
    torch::NoGradGuard no_grad;
    std::int64_t total = 0;
    for (std::size_t i : indices) total += params_.at(i).numel();
    torch::Tensor flat = torch::zeros({total}, params_.at(indices.front()).options().dtype(torch::kFloat32));
    std::vector<torch::Tensor> whole;
    std::vector<std::optional<zero::GradientPart>> parts;
    std::int64_t base = 0;
    for (std::size_t i : indices) {
      whole.push_back(flat.narrow(0, base, params_[i].numel()).view(params_[i].sizes()));
      parts.push_back(sharded_->gradient_part(i));
      if (parts.back())
        flat.narrow(0, base + parts.back()->param_offset, parts.back()->values.numel()).copy_(parts.back()->values);
      base += params_[i].numel();
    }
    dp_->all_reduce(flat)->wait();
    edit(whole);
    base = 0;
    for (std::size_t k = 0; k < indices.size(); ++k) {
      if (parts[k]) parts[k]->values.copy_(flat.narrow(0, base + parts[k]->param_offset, parts[k]->values.numel()));
      base += params_[indices[k]].numel();
    }
  }

  zero::StepOutcome step(double lr, double loss_scale, double clip, bool skip_non_finite) override {
    if (offload::OffloadedAdam* host = sharded_->offloaded_optimizer()) {
      host->set_learning_rate(lr);
    } else {
      set_learning_rate(sharded_->optimizer(), lr, master_groups_);
    }
    return sharded_->step(1.0 / (static_cast<double>(dp_->size()) * loss_scale), clip, skip_non_finite);
  }

  std::vector<torch::Tensor> master_parameters() override { return sharded_->gather_masters(); }

  ModelStateBytes model_state_bytes() const override {
    ModelStateBytes bytes;
    bytes.params = sharded_->parameter_bytes();
    bytes.grads = sharded_->gradient_bytes();
    bytes.optimizer = sharded_->master_bytes();
    if (sharded_->offloaded_optimizer() == nullptr) bytes.optimizer += optimizer_state_bytes(sharded_->optimizer());
    bytes.host = sharded_->host_bytes();
    bytes.nvme = sharded_->nvme_bytes();
    return bytes;
  }
  std::int64_t gradient_bytes() const override {
    std::int64_t elements = 0;
    for (const auto& p : params_) elements += p.numel();
    return elements * 4;  // reduced in fp32
  }
  std::int64_t gradient_padding_bytes() const override { return sharded_->padding_elements() * 4; }
  std::int64_t expert_gradient_bytes() const override {
    std::int64_t elements = 0;
    for (std::size_t i : experts_) elements += params_[i].numel();
    return elements * 4;
  }
  std::int64_t expert_gradient_padding_bytes() const override { return sharded_->other_group_padding_elements() * 4; }
  std::size_t bucket_count() const override { return sharded_->group_count(); }
  std::int64_t late_reductions() const override { return sharded_->late_reductions(); }
  void watch_zero_grad(torch::Tensor sentinel) override { sharded_->watch_zero_grad(std::move(sentinel)); }
  const zero::ShardedModel* sharded_model() const override { return sharded_.get(); }

  // Each rank holds (and owns) its master shards and the optimizer's state over them,
  // in LibTorch's optimizer or in the offloaded one (host buffers, or copies of what
  // lives in the NVMe tier, kept until state_loaded() writes them back).
  std::vector<StateSlice> state_slices(StateAccess access, bool create_optimizer_state) override {
    offload::OffloadedAdam* offloaded = sharded_->offloaded_optimizer();
    const std::vector<zero::MasterShard> shards = sharded_->master_shards();
    offloaded_state_.clear();
    std::vector<StateSlice> slices;
    for (std::size_t g = 0; g < shards.size(); ++g) {
      const zero::MasterShard& shard = shards[g];
      std::vector<std::pair<std::string, torch::Tensor>> offloaded_group;
      if (offloaded != nullptr) {
        offloaded_group = offloaded->state(g);
        if (access == StateAccess::kHeld) offloaded_state_.push_back(offloaded_group);
      }
      for (const zero::MasterPart& part : shard.parts) {
        const auto& f = part.fragment;
        StateSlice slice;
        slice.param = part.param;
        slice.offset = f.param_offset;
        if (offloaded != nullptr) {
          for (const auto& [name, tensor] : offloaded_group) {
            slice.tensors.emplace_back(name, tensor.view({-1}).narrow(0, f.shard_offset, f.numel));
          }
          slice.steps = offloaded->segment_steps(part.segment);
          slice.set_steps = [offloaded, segment = part.segment](std::int64_t steps) {
            offloaded->set_segment_steps(segment, steps);
          };
        } else {
          // The optimizer steps each part as a tensor of its own, with its own state.
          torch::optim::Optimizer& optimizer = sharded_->optimizer();
          slice.tensors.emplace_back("param", part.stepped.detach().narrow(0, 0, f.numel));
          for (const auto& [name, tensor] : optimizer_state(optimizer, part.stepped, create_optimizer_state)) {
            slice.tensors.emplace_back(name, tensor.narrow(0, 0, f.numel));
          }
          slice.steps = parameter_steps(optimizer, part.stepped);
          slice.set_steps = [&optimizer, stepped = part.stepped](std::int64_t steps) {
            set_parameter_steps(optimizer, stepped, steps);
          };
        }
        slices.push_back(std::move(slice));
      }
    }
    return slices;
  }

  void state_loaded() override {
    if (offload::OffloadedAdam* offloaded = sharded_->offloaded_optimizer()) {
      for (std::size_t g = 0; g < offloaded_state_.size(); ++g) offloaded->write_state(g, offloaded_state_[g]);
      offloaded_state_.clear();
    }
    sharded_->masters_changed();
  }
  std::int64_t optimizer_steps() const override {
    const offload::OffloadedAdam* offloaded = sharded_->offloaded_optimizer();
    return offloaded ? offloaded->step_count() : parallax::optimizer_steps(sharded_->optimizer());
  }
  void set_optimizer_steps(std::int64_t steps) override {
    if (offload::OffloadedAdam* offloaded = sharded_->offloaded_optimizer()) {
      offloaded->set_step_count(steps);
    } else {
      parallax::set_optimizer_steps(sharded_->optimizer(), steps);
    }
  }

 private:
  Communicator* dp_;
  bool reduce_untouched_;
  std::vector<torch::Tensor> params_;  ///< the model's (shapes stay while stage 3 releases their data)
  std::vector<std::size_t> experts_;   ///< indices of the experts' parameters (their own group)
  OptimizerGroups master_groups_;  ///< the optimizer's parameter groups, per master shard
  std::unique_ptr<zero::ShardedModel> sharded_;
  /// An offloaded optimizer's state per group, as state_slices(kHeld) gave it out.
  std::vector<std::vector<std::pair<std::string, torch::Tensor>>> offloaded_state_;
};

}  // namespace

std::unique_ptr<GradientReduction> make_gradient_reduction(Runtime& runtime,
                                                           const proto::Plan& plan,
                                                           torch::nn::Module& model,
                                                           std::vector<torch::Tensor> params,
                                                           torch::ScalarType dtype,
                                                           const OptimizerGroups& optimizer,
                                                           ModelSplit split) {
  if (zero_options(plan).stage == 0) {
    return std::make_unique<ReplicatedReduction>(runtime, plan, std::move(params), dtype, optimizer, std::move(split));
  }
  return std::make_unique<ShardedReduction>(runtime, plan, model, params, optimizer, split);
}

}  // namespace parallax
