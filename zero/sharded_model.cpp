#include "parallax/zero/sharded_model.h"

#include <algorithm>
#include <cmath>
#include <mutex>

#include <unistd.h>

#include "parallax/core/config_loader.h"
#include "parallax/core/error.h"
#include "parallax/zero/gradient_presence.h"
#include "parallax/zero/group_plan.h"
#include "parallax/zero/sharded_model_state.h"

namespace parallax::zero {
namespace {

offload::CpuAdamOptions cpu_adam_options(const OptimizerOptions& optimizer) {
  PARALLAX_CHECK(is_adam_family(optimizer.type), ConfigError,
                 "offload.optimizer: the offloaded step is the fused CPU Adam; optimizer.type = \"",
                 to_string(optimizer.type), "\" cannot be offloaded");
  return offload::CpuAdamOptions(optimizer.lr)
      .betas(optimizer.betas[0], optimizer.betas[1])
      .eps(optimizer.eps)
      .weight_decay(optimizer.weight_decay)
      .decoupled(optimizer.type == OptimizerType::kAdamW);
}

// `groups[k]`: optimizer group k's options; shard g steps with group shard_group[g]'s.
offload::OffloadedAdamOptions offloaded_adam_options(const OffloadOptions& offload,
                                                     const std::vector<OptimizerOptions>& groups,
                                                     std::vector<std::size_t> shard_group,
                                                     std::vector<std::int64_t> segment_starts,
                                                     const Communicator& dp,
                                                     bool device_is_cuda) {
  offload::OffloadedAdamOptions options;
  options.adam = cpu_adam_options(groups.front());
  for (std::size_t k = 1; k < groups.size(); ++k) options.other_groups.push_back(cpu_adam_options(groups[k]));
  options.shard_group = std::move(shard_group);
  options.segment_starts = std::move(segment_starts);
  options.moments_on_nvme = offload.optimizer == OffloadTarget::kNvme;
  options.masters_on_nvme = offload.param == OffloadTarget::kNvme;
  options.nvme_path = offload.nvme_path;
  options.buffer_bytes = offload.buffer_bytes();
  options.buffer_count = offload.buffer_count;
  options.pin_memory = offload.pin_memory && device_is_cuda;
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  options.owner = detail::concat("rank ", dp.rank(), " of group '", dp.name(), "' on ", host);
  return options;
}

}  // namespace

ShardedModel::ShardedModel(torch::nn::Module& model,
                           std::vector<torch::Tensor> params,
                           const ZeroOptions& options,
                           const OffloadOptions& offload,
                           const std::vector<OptimizerOptions>& optimizer,
                           Communicator& dp,
                           Tracer& tracer,
                           const OptimizerFactory& make_optimizer,
                           const OtherReductionGroup& other,
                           const std::vector<std::size_t>& optimizer_group_of_param)
    : state_(std::make_unique<State>()), options_(options) {
  State& s = *state_;
  PARALLAX_CHECK(options_.stage >= 1 && options_.stage <= 3, ConfigError, "zero.stage = ", options_.stage,
                 ": a sharded model needs stage 1, 2 or 3");
  PARALLAX_CHECK(options_.bucket_bytes() > 0, ConfigError, "zero.bucket_mb must be > 0");
  if (options_.stage == 3) claim_parameter_interception();
  s.dp = &dp;
  s.tracer = &tracer;
  s.params = std::move(params);
  for (std::size_t i = 0; i < s.params.size(); ++i) {
    const torch::Tensor& p = s.params[i];
    PARALLAX_CHECK(p.requires_grad() && p.layout() == torch::kStrided && p.is_leaf(), UsageError, "parameter ", i,
                   " must be a dense leaf tensor that requires grad");
    PARALLAX_CHECK(p.numel() <= kMaxGroupElements, UsageError, "parameter ", i, " has ", p.numel(),
                   " elements; one collective carries at most ", kMaxGroupElements);
  }
  std::vector<Communicator*> comm_of_param(s.params.size(), &dp);
  for (std::size_t i : other.members) {
    PARALLAX_CHECK(other.comm != nullptr && i < s.params.size(), UsageError, "ShardedModel: other group member ", i,
                   " is out of range (", s.params.size(), " parameters) or has no communicator");
    comm_of_param[i] = other.comm;
  }
  std::vector<std::size_t> optimizer_group = optimizer_group_of_param;
  if (optimizer_group.empty()) optimizer_group.assign(s.params.size(), 0);
  PARALLAX_CHECK(optimizer_group.size() == s.params.size(), UsageError, "ShardedModel: ", optimizer_group.size(),
                 " optimizer groups given for ", s.params.size(), " parameters");
  const std::size_t optimizer_groups = *std::max_element(optimizer_group.begin(), optimizer_group.end()) + 1;
  PARALLAX_CHECK(!optimizer.empty() && optimizer_groups <= optimizer.size(), UsageError, "ShardedModel: ",
                 optimizer.size(), " optimizer groups' options for group indices up to ", optimizer_groups - 1);
  GroupPlan plan = plan_groups(model, s.params, options_);
  // A flat group is sharded over one communicator and stepped with one set of options:
  // a stage-3 unit holding parameters of several (experts beside dense parameters, or
  // parameters of several optimizer groups) becomes one unit per kind, gathered each on
  // its own first use; a bucket holding several is cut likewise.
  const auto by_kind = [&](const std::vector<std::size_t>& set) {
    std::vector<std::pair<std::pair<bool, std::size_t>, std::vector<std::size_t>>> kinds;
    for (std::size_t i : set) {
      const std::pair<bool, std::size_t> kind{comm_of_param[i] != &dp, optimizer_group[i]};
      auto found = std::find_if(kinds.begin(), kinds.end(), [&](const auto& k) { return k.first == kind; });
      if (found == kinds.end()) found = kinds.insert(kinds.end(), {kind, {}});
      found->second.push_back(i);
    }
    std::stable_sort(kinds.begin(), kinds.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    return kinds;
  };
  if (!other.members.empty() || optimizer_groups > 1) {
    std::vector<std::vector<std::size_t>> units;
    std::vector<std::string> names;
    for (std::size_t u = 0; u < plan.units.size(); ++u) {
      for (auto& [kind, members] : by_kind(plan.units[u])) {
        names.push_back(plan.unit_names[u] + (kind.first ? " (its experts)" : "") +
                        (kind.second > 0 ? " (optimizer group " + std::to_string(kind.second) + ")" : ""));
        units.push_back(std::move(members));
      }
    }
    plan.units = std::move(units);
    plan.unit_names = std::move(names);
    std::vector<std::vector<std::size_t>> buckets;
    for (const auto& set : plan.replicated) {
      for (auto& [kind, members] : by_kind(set)) buckets.push_back(std::move(members));
    }
    plan.replicated = std::move(buckets);
  }

  s.group_of_param.assign(s.params.size(), 0);
  s.index_in_group.assign(s.params.size(), 0);
  std::vector<std::size_t> group_of_shard;  // each flat group's optimizer group
  auto add_group = [&](const std::vector<std::size_t>& members, Residency residency) {
    group_of_shard.push_back(optimizer_group[members.front()]);
    Communicator& comm = *comm_of_param[members.front()];
    s.group_comm.push_back(&comm);
    const int rank = comm.rank();
    const int ranks = comm.size();
    std::vector<torch::Tensor> tensors;
    for (std::size_t k = 0; k < members.size(); ++k) {
      tensors.push_back(s.params[members[k]]);
      s.group_of_param[members[k]] = s.groups.size();
      s.index_in_group[members[k]] = k;
    }
    s.groups.push_back(std::make_unique<FlatGroup>(std::move(tensors), rank, ranks, residency,
                                                   /*keep_full_gradients=*/options_.stage == 1));
  };
  for (const auto& set : plan.units) {
    s.unit_groups.push_back(s.groups.size());
    add_group(set, Residency::kSharded);
  }
  for (const auto& set : plan.replicated) add_group(set, Residency::kReplicated);
  s.unit_of_group.assign(s.groups.size(), -1);
  for (std::size_t u = 0; u < s.unit_groups.size(); ++u)
    s.unit_of_group[s.unit_groups[u]] = static_cast<std::ptrdiff_t>(u);

  // Two buckets of full gradients in flight, as DeepSpeed's double buffer (stage 1 keeps
  // every full buffer until the window's end: nothing to bound).
  if (options_.stage >= 2) s.reduction_budget_bytes = 2 * options_.bucket_bytes();
  if (!s.unit_groups.empty()) {
    std::vector<std::int64_t> unit_bytes;
    for (std::size_t g : s.unit_groups) unit_bytes.push_back(s.groups[g]->full_bytes());
    s.schedule = std::make_unique<GatherSchedule>(unit_bytes, options_.prefetch_bytes(), options_.max_live_bytes(),
                                                  options_.reshard_after_forward, options_.reshard_after_backward);
    s.gathers.resize(s.unit_groups.size());
    s.registry = std::make_shared<ParameterRegistry>();
    for (std::size_t u = 0; u < s.unit_groups.size(); ++u) {
      s.registry->add(s.groups[s.unit_groups[u]]->storage(), this, u);
    }
  }

  // This rank's pieces: each parameter's part of a shard, stepped as LibTorch steps a
  // parameter (its own state and step count, skipped without a gradient). The shard's
  // padding goes with its last part (or, in a shard of padding only, is a piece of its
  // own), so the state still covers the whole shard, as ZeRO's formulas count it.
  std::vector<std::vector<std::size_t>> members(s.groups.size());
  for (std::size_t i = 0; i < s.params.size(); ++i) members[s.group_of_param[i]].push_back(i);
  std::vector<std::int64_t> segment_starts;  // of the pieces in the shards laid end to end
  std::int64_t shards_before = 0;
  for (std::size_t g = 0; g < s.groups.size(); ++g) {
    const ShardLayout& layout = s.groups[g]->layout();
    std::sort(members[g].begin(), members[g].end(),
              [&](std::size_t a, std::size_t b) { return s.index_in_group[a] < s.index_in_group[b]; });
    const std::size_t first = s.pieces.size();
    for (std::size_t i : members[g]) {
      if (const auto fragment = layout.fragment(s.index_in_group[i], s.comm_of(g).rank())) {
        State::Piece piece;
        piece.part = MasterPart{i, *fragment, {}, s.pieces.size()};
        piece.group = g;
        piece.begin = fragment->shard_offset;
        s.pieces.push_back(std::move(piece));
      }
    }
    if (s.pieces.size() == first) {
      State::Piece padding;
      padding.part = MasterPart{State::kPadding, Fragment{}, {}, s.pieces.size()};
      padding.group = g;
      s.pieces.push_back(std::move(padding));
    }
    for (std::size_t k = first; k < s.pieces.size(); ++k) {
      s.pieces[k].end = k + 1 < s.pieces.size() ? s.pieces[k + 1].begin : layout.shard_numel();
      segment_starts.push_back(shards_before + s.pieces[k].begin);
    }
    shards_before += layout.shard_numel();
  }

  if (offload.optimizer_offloaded()) {
    PARALLAX_CHECK(offload.param == OffloadTarget::kNone || options_.stage == 3, ConfigError,
                   "offload.param: only zero.stage = 3 shards the parameters, so only it can offload them");
    std::vector<torch::Tensor> initial;
    for (const auto& group : s.groups) initial.push_back(group->shard());
    // A rank whose node cannot take the NVMe tier must not leave its peers waiting in
    // the first collective: every rank learns whether all of them succeeded.
    std::exception_ptr failure;
    try {
      s.offloaded = std::make_unique<offload::OffloadedAdam>(
          offloaded_adam_options(offload, optimizer, group_of_shard, segment_starts, dp, s.params.front().is_cuda()),
          initial);
    } catch (const Error&) {
      failure = std::current_exception();
    }
    torch::Tensor failed_ranks = torch::full({1}, failure ? 1 : 0, torch::kInt64);
    dp.all_reduce(failed_ranks)->wait();
    if (failure) std::rethrow_exception(failure);
    PARALLAX_CHECK(failed_ranks.item<std::int64_t>() == 0, ConfigError, failed_ranks.item<std::int64_t>(),
                   " rank(s) of group '", dp.name(),
                   "' could not set up the offloaded optimizer (their own errors give the reason, e.g. "
                   "offload.nvme_path); rank ",
                   dp.rank(), " could");
    s.copies = std::make_unique<offload::SideStreamCopies>(s.params.front().device());
    for (std::size_t g = 0; g < s.groups.size(); ++g) {
      FlatGroup& group = *s.groups[g];
      group.use_host_gradient(s.offloaded->gradient(g), *s.copies);
      if (offload.param != OffloadTarget::kNone && group.residency() == Residency::kSharded) {
        State* state = &s;
        group.fetch_shard_from(
            [state, g](const torch::Tensor& slot) { state->read_master(g, slot).order_current_stream(); });
      }
    }
  } else {
    // One stepped tensor per piece, so that each keeps LibTorch's own state and step
    // count, and a step can skip a parameter without a gradient.
    std::vector<torch::Tensor> stepped;
    std::vector<std::size_t> stepped_group;
    for (State::Piece& piece : s.pieces) {
      const FlatGroup& group = *s.groups[piece.group];
      piece.part.stepped = group.master().narrow(0, piece.begin, piece.end - piece.begin);
      piece.grad = group.gradient_shard().narrow(0, piece.begin, piece.end - piece.begin);
      piece.part.stepped.mutable_grad() = piece.grad;
      stepped.push_back(piece.part.stepped);
      stepped_group.push_back(group_of_shard[piece.group]);
    }
    s.optimizer = make_optimizer(stepped, stepped_group);
  }
  s.experts = other;
  s.complete.assign(s.groups.size(), false);
  s.reductions.resize(s.groups.size());

  GradientKeeper keeper;
  keeper.before = [this](std::size_t i, bool own) {
    if (own) check_scale_of_live_gradient(i);
  };
  keeper.after = [this](std::size_t i, bool own) {
    if (own) on_gradient_ready(i);  // another model's backward leaves its gradient in .grad
  };
  keeper.discard = [this](std::size_t i) {
    State& st = *state_;
    std::lock_guard<std::mutex> lock(st.mutex);
    st.groups[st.group_of_param[i]]->discard_gradient(st.index_in_group[i]);
  };
  s.ledger = std::make_unique<GradientLedger>(s.params, std::move(keeper));
  if (!s.unit_groups.empty()) {
    // A parameter read between steps on the constructing thread (a print, a direct
    // model->forward) is refused clearly instead of reading released memory.
    s.unit_names = std::move(plan.unit_names);
    watch_parameter_use_on_this_thread(s.registry);
  }
}

ParameterUseScope ShardedModel::use_scope() const {
  return state_->registry ? ParameterUseScope(state_->registry) : ParameterUseScope();
}

ShardedModel::~ShardedModel() {
  State& s = *state_;
  // A scope still open elsewhere may keep the registry: it must no longer name us.
  if (s.registry) s.registry->clear();
  s.own_backward.reset();
  s.ledger.reset();
  // Never free buffers a collective still reads; never throw from a destructor.
  for (auto* works : {&s.reductions, &s.gathers}) {
    for (WorkPtr& work : *works) {
      if (!work) continue;
      try {
        work->wait();
      } catch (const std::exception&) {
      }
    }
  }
  try {
    if (s.copies) s.copies->wait_all();  // copies into the host buffers about to be freed
  } catch (const std::exception&) {
  }
}

void ShardedModel::check_scale_of_live_gradient(std::size_t i) const {
  const State& s = *state_;
  PARALLAX_CHECK(s.params[i].scalar_type() != torch::kFloat16 || !s.ledger->foreign(i), UsageError, "parameter ", i,
                 " (shape ", s.params[i].sizes(),
                 ") trains in fp16 with loss scaling, and another backward left a gradient in its .grad whose scale "
                 "this engine cannot know; call zero_grad() before this engine's backward, or train in bf16");
}

void ShardedModel::absorb_live_gradients() {
  State& s = *state_;
  auto guard = s.ledger->lock();
  for (std::size_t i = 0; i < s.params.size(); ++i) {
    const torch::Tensor live = s.ledger->live(i);
    if (!live.defined()) continue;
    check_scale_of_live_gradient(i);
    {
      std::lock_guard<std::mutex> lock(s.mutex);
      s.groups[s.group_of_param[i]]->absorb_gradient(s.index_in_group[i], live);
    }
    s.ledger->hold(i);
  }
}

void ShardedModel::on_gradient_ready(std::size_t i) {
  State& s = *state_;
  const std::size_t g = s.group_of_param[i];
  std::lock_guard<std::mutex> lock(s.mutex);
  // .grad also holds what other backwards left there since the trainer last cleared it.
  const bool group_complete = s.groups[g]->add_gradient(s.index_in_group[i], s.params[i].grad());
  s.ledger->hold(i);  // the group holds it now
  if (!group_complete) return;
  s.complete[g] = true;
  if (s.unit_of_group[g] >= 0) s.apply_locked(s.schedule->backward_done(static_cast<std::size_t>(s.unit_of_group[g])));
  if (s.reduce_this_micro_step && options_.overlap_comm) {
    s.launch_reductions_locked(/*all=*/false);
    s.reap_finished_reductions_locked();
  }
}

void ShardedModel::on_parameter_uses(const std::vector<std::size_t>& units, bool in_step, bool nested) {
  State& s = *state_;
  std::lock_guard<std::mutex> lock(s.mutex);
  if (!in_step) {
    for (const std::size_t unit : units) {
      if (s.schedule->gathered(unit)) continue;  // still held (e.g. between backward and step)
      throw UsageError("zero.stage = 3: an operator read " + s.unit_names[unit] + " (unit " + std::to_string(unit) +
                       ") outside a step, where this rank holds only its shard of it; read the weights between "
                       "steps with engine.master_parameters() (collective: every rank calls it), and run the model "
                       "through engine.forward()");
    }
    return;
  }
  const auto phase = s.in_backward ? GatherSchedule::Phase::kBackward : GatherSchedule::Phase::kForward;
  for (const std::size_t unit : units) {
    const bool gathered_before = s.schedule->gathered(unit);
    if (!gathered_before) ++s.gathers_on_use;
    if (gathered_before && s.gathers[unit]) ++s.prefetched_uses;  // launched by an earlier touch
  }
  s.apply_locked(s.schedule->touch(units, phase, /*may_release=*/!nested));
  for (const std::size_t unit : units) {
    if (!s.gathers[unit]) continue;
    auto span = s.tracer->span("zero gather wait", "comm");
    s.gathers[unit]->wait();
    s.gathers[unit].reset();
  }
}

void ShardedModel::begin_backward(bool last_micro_step, bool reduce_untouched) {
  State& s = *state_;
  s.ledger->sync_all();  // what the trainer cleared since the last backward
  s.own_backward.emplace(s.ledger->own_backward());
  std::lock_guard<std::mutex> lock(s.mutex);
  PARALLAX_ASSERT(!s.in_backward, "begin_backward twice without end_backward");
  if (s.schedule) s.apply_locked(s.schedule->end_forward());
  s.in_backward = true;
  s.reduce_this_micro_step = options_.stage >= 2 || last_micro_step;
  s.reduce_untouched = reduce_untouched || options_.stage == 1;
  s.next_to_reduce = 0;
  s.next_to_reap = 0;
  std::fill(s.complete.begin(), s.complete.end(), false);
  for (auto& group : s.groups) group->begin_micro_step();
}

void ShardedModel::end_backward() {
  State& s = *state_;
  s.own_backward.reset();
  // Gradients other backwards left on parameters this one did not reach: their groups
  // have not launched yet, so the reductions below carry them.
  absorb_live_gradients();
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    PARALLAX_ASSERT(s.in_backward, "end_backward without begin_backward");
    s.in_backward = false;
    // Groups with a parameter this micro-step did not use never reported complete.
    if (s.reduce_this_micro_step) s.launch_reductions_locked(/*all=*/true, s.reduce_untouched);
  }
  if (s.reduce_this_micro_step) {
    s.window_reduced = true;
    auto span = s.tracer->span("zero reduce_scatter wait", "comm");
    for (std::size_t g = s.next_to_reap; g < s.groups.size(); ++g) {
      if (s.reductions[g]) s.finish_reduction(g);
    }
    for (const auto& group : s.groups) group->finish_host_gradient();
  }
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.schedule) s.apply_locked(s.schedule->end_backward());
}

void ShardedModel::set_model_parallel(const ModelParallel& model_parallel) {
  State& s = *state_;
  const ModelParallel& mp = model_parallel;
  PARALLAX_CHECK(mp.norm_weights.size() == s.params.size() && mp.partial.size() == s.params.size(), UsageError,
                 "set_model_parallel: ", mp.norm_weights.size(), " norm weights and ", mp.partial.size(),
                 " partial flags for ", s.params.size(), " parameters");
  s.tp = mp.tp;
  s.norm_groups = mp.norm_groups;
  s.shared_fragments.clear();
  s.partial_fragments.clear();
  for (std::size_t i = 0; i < s.params.size(); ++i) {
    const std::size_t g = s.group_of_param[i];
    const auto fragment = s.groups[g]->layout().fragment(s.index_in_group[i], s.comm_of(g).rank());
    if (!fragment) continue;
    if (mp.norm_weights[i] != 1.0) s.shared_fragments.push_back({g, *fragment, mp.norm_weights[i]});
    if (mp.partial[i]) {
      PARALLAX_CHECK(mp.tp != nullptr, UsageError, "set_model_parallel: a partial gradient needs a tp group");
      s.partial_fragments.emplace_back(g, *fragment);
    }
  }
}

std::optional<GradientPart> ShardedModel::gradient_part(std::size_t i) const {
  const State& s = *state_;
  const std::size_t g = s.group_of_param.at(i);
  const auto fragment = s.groups[g]->layout().fragment(s.index_in_group[i], s.comm_of(g).rank());
  if (!fragment) return std::nullopt;
  return GradientPart{fragment->param_offset,
                      s.groups[g]->gradient_shard().narrow(0, fragment->shard_offset, fragment->numel)};
}

void ShardedModel::finish_window() {
  State& s = *state_;
  s.ledger->sync_all();
  bool late = false;
  for (std::size_t i = 0; i < s.params.size() && !late; ++i) late = s.ledger->live(i).defined();
  // Gradients that reached .grad after this window's last backward (every rank runs the
  // same backwards, so every rank has the same ones): one more reduction of the groups
  // that hold them (stage 1: of every group, as it is when no backward reduced yet).
  if (!late && s.window_reduced) return;
  if (late) ++s.late_reductions;
  begin_backward(/*last_micro_step=*/true, /*reduce_untouched=*/false);
  end_backward();
}

void ShardedModel::commit_micro_batch() {
  state_->ledger->commit();
}

void ShardedModel::watch_zero_grad(torch::Tensor sentinel) {
  state_->ledger->watch_zero_grad(std::move(sentinel));
}

std::int64_t ShardedModel::late_reductions() const {
  return state_->late_reductions;
}

StepOutcome ShardedModel::step(double gradient_scale, double clip_norm, bool skip_non_finite) {
  State& s = *state_;
  torch::NoGradGuard no_grad;
  StepOutcome outcome;
  if (s.schedule) {
    // Units kept gathered through the step (reshard_after_backward = false) would be
    // stale once the shards change.
    std::lock_guard<std::mutex> lock(s.mutex);
    s.apply_locked(s.schedule->end_step());
  }
  std::vector<bool> local(s.params.size());
  for (std::size_t i = 0; i < s.params.size(); ++i) local[i] = s.ledger->has_gradient(i);
  const std::vector<bool> present =
      agree_on_gradients(local, *s.dp, s.experts, s.params.empty() ? c10::Device(c10::kCPU) : s.params.front().device());
  if (!s.partial_fragments.empty()) {
    std::vector<torch::Tensor> parts;
    for (const auto& [g, fragment] : s.partial_fragments) {
      parts.push_back(s.groups[g]->gradient_shard().narrow(0, fragment.shard_offset, fragment.numel));
    }
    sum_in_place(*s.tp, parts);
  }
  for (const auto& group : s.groups) {
    if (gradient_scale != 1.0) group->gradient_shard().mul_(gradient_scale);
  }
  if (clip_norm > 0 || skip_non_finite) {
    // On the gradients' device: the reduction then stays there (NCCL for CUDA shards).
    torch::Tensor sum_of_squares =
        torch::zeros({1}, s.groups.front()->gradient_shard().options().dtype(torch::kFloat64));
    for (const auto& group : s.groups) {
      sum_of_squares += group->gradient_shard().to(torch::kFloat64).pow(2).sum();
    }
    // Elements several tensor-parallel ranks hold count once: (1/copies − 1) of them back out.
    for (const auto& [g, fragment, weight] : s.shared_fragments) {
      const torch::Tensor part = s.groups[g]->gradient_shard().narrow(0, fragment.shard_offset, fragment.numel);
      sum_of_squares += part.to(torch::kFloat64).pow(2).sum() * (weight - 1.0);
    }
    s.dp->all_reduce(sum_of_squares)->wait();
    for (Communicator* group : s.norm_groups) group->all_reduce(sum_of_squares)->wait();
    outcome.grad_norm = std::sqrt(sum_of_squares.item<double>());
    if (skip_non_finite && !std::isfinite(outcome.grad_norm)) {
      outcome.skipped = true;
      for (const auto& group : s.groups) group->zero_gradients();
      s.ledger->end_window();
      s.window_reduced = false;
      return outcome;
    }
    // As torch::nn::utils::clip_grad_norm_: scale by max_norm / (norm + 1e-6) when < 1.
    const double coefficient = clip_norm / (outcome.grad_norm + 1e-6);
    if (clip_norm > 0 && coefficient < 1.0) {
      for (const auto& group : s.groups) group->gradient_shard().mul_(coefficient);
    }
  }
  // As LibTorch's optimizer skips an undefined .grad.
  const auto skipped = [&](const State::Piece& piece) {
    return piece.part.param != State::kPadding && !present[piece.part.param];
  };
  if (s.offloaded) {
    std::vector<bool> skip;  // per piece: the offloaded optimizer's segments
    for (const State::Piece& piece : s.pieces) skip.push_back(skipped(piece));
    s.offloaded->step(skip);
  } else {
    for (State::Piece& piece : s.pieces) {
      if (skipped(piece)) piece.part.stepped.mutable_grad() = torch::Tensor();
    }
    s.optimizer->step();
    for (State::Piece& piece : s.pieces) piece.part.stepped.mutable_grad() = piece.grad;
  }
  s.publish_masters();
  for (const auto& group : s.groups) group->zero_gradients();
  s.ledger->end_window();
  s.window_reduced = false;
  return outcome;
}

}  // namespace parallax::zero
