#include "parallax/zero/gradient_ledger.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>

#include "parallax/core/error.h"

namespace parallax::zero {
namespace {

// Runs before AccumulateGrad reads .grad.
class BeforeAccumulation : public torch::autograd::FunctionPreHook {
 public:
  explicit BeforeAccumulation(std::function<void()> call) : call_(std::move(call)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& grads) override {
    call_();
    return grads;
  }

 private:
  std::function<void()> call_;
};

// Runs after AccumulateGrad has stored this backward's gradient in .grad.
class AfterAccumulation : public torch::autograd::FunctionPostHook {
 public:
  explicit AfterAccumulation(std::function<void()> call) : call_(std::move(call)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& /*inputs*/) override {
    call_();
    return outputs;
  }

 private:
  std::function<void()> call_;
};

const void* impl_of(const torch::Tensor& t) {
  return t.defined() ? static_cast<const void*>(t.unsafeGetTensorImpl()) : nullptr;
}

}  // namespace

GradientLedger::GradientLedger(std::vector<torch::Tensor> params, GradientKeeper keeper) : keeper_(std::move(keeper)) {
  // All checked before any hook is added.
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators;
  for (std::size_t i = 0; i < params.size(); ++i) {
    accumulators.push_back(torch::autograd::impl::grad_accumulator(params[i]));
    PARALLAX_CHECK(accumulators.back() != nullptr, UsageError, "parameter ", i, " is not a leaf tensor");
  }
  for (auto& param : params) {
    Entry entry;
    // One element of memory seen through zero strides: zero_grad() can detach and zero
    // it (fill accepts overlapping memory) and moves its version; any other in-place
    // write into it fails loudly.
    const std::vector<std::int64_t> zero_strides(static_cast<std::size_t>(param.dim()), 0);
    entry.marker = torch::empty_strided(param.sizes(), zero_strides, param.options().requires_grad(false));
    {
      torch::NoGradGuard no_grad;
      entry.marker.zero_();
    }
    entry.param = std::move(param);
    entry.has_gradient = entry.param.grad().defined();
    record(entry);
    entries_.push_back(std::move(entry));
  }
  for (std::size_t i = 0; i < entries_.size(); ++i) {
    Installed installed;
    installed.accumulator = std::move(accumulators[i]);
    auto pre = std::make_unique<BeforeAccumulation>([this, i] { before_accumulation(i); });
    installed.pre_hook = pre.get();
    installed.accumulator->add_pre_hook(std::move(pre));
    installed.post_key =
        installed.accumulator->add_post_hook(std::make_unique<AfterAccumulation>([this, i] { after_accumulation(i); }));
    hooks_.push_back(std::move(installed));
  }
}

GradientLedger::~GradientLedger() {
  for (Installed& installed : hooks_) {
    installed.accumulator->del_post_hook(installed.post_key);
    auto& pre_hooks = installed.accumulator->pre_hooks();
    pre_hooks.erase(std::remove_if(pre_hooks.begin(), pre_hooks.end(),
                                   [&](const auto& hook) { return hook.get() == installed.pre_hook; }),
                    pre_hooks.end());
  }
}

void GradientLedger::record(Entry& entry) {
  const torch::Tensor& grad = entry.param.grad();
  entry.seen = impl_of(grad);
  entry.seen_version = grad.defined() ? static_cast<std::int64_t>(grad._version()) : 0;
}

bool GradientLedger::is_marker(const Entry& entry, const torch::Tensor& grad) const {
  return grad.defined() && grad.storage().unsafeGetStorageImpl() == entry.marker.storage().unsafeGetStorageImpl();
}

void GradientLedger::hold(std::size_t i) {
  auto guard = lock();
  Entry& e = entries_.at(i);
  e.held = true;
  e.foreign = false;
  e.param.mutable_grad() = e.marker;
  record(e);
}

void GradientLedger::show(std::size_t i, torch::Tensor view) {
  auto guard = lock();
  Entry& e = entries_.at(i);
  e.shown = std::move(view);
  e.foreign = false;
  e.param.mutable_grad() = e.shown;
  record(e);
}

void GradientLedger::lend(std::size_t i, torch::Tensor buffer) {
  auto guard = lock();
  Entry& e = entries_.at(i);
  e.foreign = false;
  e.param.mutable_grad() = std::move(buffer);
  record(e);
}

void GradientLedger::clear(std::size_t i) {
  auto guard = lock();
  Entry& e = entries_.at(i);
  e.foreign = false;
  e.param.mutable_grad() = torch::Tensor();
  record(e);
}

torch::Tensor GradientLedger::live(std::size_t i) const {
  auto guard = lock();
  const Entry& e = entries_.at(i);
  const torch::Tensor& grad = e.param.grad();
  if (!grad.defined() || is_marker(e, grad)) return torch::Tensor();
  if (e.shown.defined() && grad.data_ptr() == e.shown.data_ptr()) return torch::Tensor();
  return grad;
}

bool GradientLedger::showing(std::size_t i) const {
  auto guard = lock();
  const Entry& e = entries_.at(i);
  return e.shown.defined() && e.param.grad().defined() && e.param.grad().data_ptr() == e.shown.data_ptr();
}

bool GradientLedger::foreign(std::size_t i) const {
  auto guard = lock();
  return entries_.at(i).foreign;
}

GradientLedger::ZeroGrad GradientLedger::zero_grad_called() {
  if (!sentinel_.defined()) return ZeroGrad::kNotCalled;
  const torch::Tensor& grad = sentinel_.grad();
  if (impl_of(grad) == sentinel_seen_ && (!grad.defined() || grad._version() == sentinel_version_))
    return ZeroGrad::kNotCalled;
  const ZeroGrad what = !grad.defined()               ? ZeroGrad::kSetToNone
                        : grad.item<double>() == 0.0 ? ZeroGrad::kZeroed
                                                     : ZeroGrad::kNotCalled;
  sentinel_.mutable_grad() = torch::ones({1}, sentinel_.options().requires_grad(false));
  sentinel_seen_ = impl_of(sentinel_.grad());
  sentinel_version_ = sentinel_.grad()._version();
  return what;
}

bool GradientLedger::has_gradient(std::size_t i) const {
  auto guard = lock();
  return entries_.at(i).has_gradient;
}

void GradientLedger::watch_zero_grad(torch::Tensor sentinel) {
  auto guard = lock();
  sentinel_ = std::move(sentinel);
  sentinel_.mutable_grad() = torch::ones({1}, sentinel_.options().requires_grad(false));
  sentinel_seen_ = impl_of(sentinel_.grad());
  sentinel_version_ = sentinel_.grad()._version();
}

// The trainer's optimizer.zero_grad(): what Module::zero_grad(set_to_none) does to
// every parameter, and what the keeper holds dropped.
void GradientLedger::clear_everything(bool set_to_none) {
  torch::NoGradGuard no_grad;
  for (std::size_t i = 0; i < entries_.size(); ++i) {
    Entry& e = entries_[i];
    refuse_clear_after_commit(i);
    const bool was_held = e.held;
    if (e.held || (e.shown.defined() && !committed_)) keeper_.discard(i);
    e.held = false;
    e.foreign = false;
    if (set_to_none && !committed_) e.has_gradient = false;
    // A held buffer may be in a reduction: the next gradient waits in .grad (live).
    e.param.mutable_grad() = was_held || committed_ ? torch::Tensor() : e.shown;
    record(e);
  }
}

void GradientLedger::refuse_clear_after_commit(std::size_t i) const {
  PARALLAX_CHECK(!committed_ || !entries_[i].held, UsageError, "the gradient of parameter ", i, " (shape ",
                 entries_[i].param.sizes(),
                 ") was cleared (zero_grad()) after a backward of this micro-batch, while the engine's buffers also "
                 "hold the step's earlier micro-batches (train.grad_accum > 1), which it cannot separate: clear "
                 "gradients before a micro-batch's first backward (zero_grad() at the top of the loop)");
}

void GradientLedger::commit() {
  auto guard = lock();
  for (Entry& e : entries_) {
    e.held = false;
    const torch::Tensor& grad = e.param.grad();
    if (is_marker(e, grad) || (e.shown.defined() && grad.defined() && grad.data_ptr() == e.shown.data_ptr())) {
      e.param.mutable_grad() = torch::Tensor();
    }
    record(e);
  }
  committed_ = true;
}

void GradientLedger::sync(std::size_t i) {
  auto guard = lock();
  if (const ZeroGrad called = zero_grad_called(); called != ZeroGrad::kNotCalled) {
    clear_everything(called == ZeroGrad::kSetToNone);
    return;
  }
  Entry& e = entries_.at(i);
  const torch::Tensor grad = e.param.grad();
  const void* impl = impl_of(grad);
  if (impl == e.seen && (impl == nullptr || grad._version() == e.seen_version)) return;  // untouched
  torch::NoGradGuard no_grad;
  // Set to none: no gradient (unless the window's earlier micro-batches gave one); a
  // tensor of the trainer's own: one; changed in place: as it was.
  if (!grad.defined() && !committed_) e.has_gradient = false;
  if (grad.defined() && impl != e.seen) e.has_gradient = true;
  if (e.shown.defined() && !e.held && !committed_) {
    // Zeroed (or edited) in place: that is the buffer itself, as in LibTorch.
    if (grad.defined() && grad.data_ptr() == e.shown.data_ptr()) {
      record(e);
      return;
    }
    // Set to none, or replaced by another tensor: the buffer takes its values.
    keeper_.discard(i);
    if (grad.defined()) e.shown.copy_(grad);
    e.foreign = false;
    e.param.mutable_grad() = e.shown;
    record(e);
    return;
  }
  const bool marker = is_marker(e, grad);
  if (e.held) {
    refuse_clear_after_commit(i);
    // The same live tensor, changed in place to anything but zeros: an edit the keeper
    // cannot repeat on what it holds.
    const bool edited = grad.defined() && !marker && impl == e.seen && grad.count_nonzero().item<std::int64_t>() != 0;
    PARALLAX_CHECK(!edited, UsageError, "the .grad of parameter ", i, " (shape ", e.param.sizes(),
                   ") was changed in place after the engine took part of its gradient into its own buffers "
                   "(ZeRO shards, fp32 buckets): that change cannot reach them. Clip with optimizer.grad_clip, or "
                   "change the loss instead of the gradient");
    keeper_.discard(i);
    e.held = false;
  }
  if (marker) e.param.mutable_grad() = torch::Tensor();
  const torch::Tensor& now = e.param.grad();
  e.foreign = e.foreign && now.defined() && now.count_nonzero().item<std::int64_t>() != 0;
  record(e);
}

void GradientLedger::sync_all() {
  auto guard = lock();
  for (std::size_t i = 0; i < entries_.size(); ++i) sync(i);
}

void GradientLedger::end_window() {
  auto guard = lock();
  committed_ = false;
  for (Entry& e : entries_) {
    e.held = false;
    if (e.shown.defined()) {
      e.param.mutable_grad() = e.shown;
    } else if (is_marker(e, e.param.grad())) {
      e.param.mutable_grad() = torch::Tensor();
    }
    record(e);
  }
}

void GradientLedger::before_accumulation(std::size_t i) {
  auto guard = lock();
  sync(i);
  Entry& e = entries_[i];
  if (is_marker(e, e.param.grad())) e.param.mutable_grad() = torch::Tensor();  // autograd never adds into it
  const bool own = own_.load();
  keeper_.before(i, own);
  if (!own) e.foreign = true;
  record(e);
}

void GradientLedger::after_accumulation(std::size_t i) {
  auto guard = lock();
  entries_[i].has_gradient = true;
  keeper_.after(i, own_.load());
  record(entries_[i]);
}

}  // namespace parallax::zero
