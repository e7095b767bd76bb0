// Parameters' gradients as a LibTorch trainer sees them, kept true while an engine holds
// them elsewhere: in ZeRO's shards, in fp32 buckets, in flight in a reduction. Shared by
// the data-parallel buckets (runtime/gradient_buckets.h) and ZeRO (sharded_model.h).
//
// In LibTorch a parameter's gradient is its .grad: every backward that reaches the
// parameter adds to it (whichever loss, whichever model started it), zero_grad() on the
// module or the optimizer clears it, and the optimizer steps what it holds. An engine
// that moves a gradient out of .grad must keep those rules, or gradients the trainer
// cleared reach its step (a GAN's generator loss, back-propagated through the
// discriminator, would train the discriminator). The ledger keeps them:
//
//  a. Hooks on each parameter's gradient accumulator run before and after autograd adds
//     a backward's contribution, for every backward. Only inside the owner's backward
//     (own_backward()) does the keeper take the gradient; another backward's gradient
//     stays in .grad, as LibTorch leaves it, until the trainer clears it or the owner's
//     next backward (or the step) takes it.
//  b. Where the keeper took a gradient (hold(i)), .grad shows a *marker*: zeros of the
//     parameter's shape over one element of memory. zero_grad() reaches it: set to none,
//     or detached and zeroed in place (its version counter moves). Before every
//     accumulation, at the owner's backward and at the step the ledger compares .grad
//     with what it left there (sync); what the trainer cleared, the keeper discards.
//     Before autograd accumulates, a marker is taken out of .grad, so autograd never adds
//     into it.
//  c. Where the keeper's own buffer is the gradient (show(i, view): fp32 data
//     parallelism, where autograd adds straight into the bucket), .grad is that view:
//     zeroing it in place clears the buffer; set to none or replaced, the view comes back
//     holding zeros or the new tensor's values.
//  d. A trainer's own optimizer, handed to the engine, keeps one *sentinel* parameter
//     (watch_zero_grad): its zero_grad() clears the sentinel's gradient, and the ledger,
//     seeing it at the next accumulation or sync, clears every parameter's gradient.
//  e. A trainer's in-place edit of a gradient the keeper partly holds (clipping .grad by
//     hand) cannot reach what the keeper holds: a UsageError, never a silent difference.
//  g. Whether a parameter has a gradient at all, as LibTorch's optimizer sees it
//     (has_gradient(i)): any backward that accumulates into it, or the trainer's own
//     tensor in .grad, gives it one; zero_grad() that sets .grad to none takes it away
//     (LibTorch 2.x's default), zeroing in place keeps it (1.13's), and so does the
//     step. Between commit() and end_window() it is only gained: the window's earlier
//     micro-batches have it. LibTorch's optimizers skip a parameter without one (no
//     weight decay, no momentum, no step count), and so must the engine's step.
//  f. With several micro-batches per optimizer step, each is one iteration of the plain
//     loop: commit() at its end makes what the keeper holds the window's, beyond the
//     trainer's zero_grad() (as the plain loop's optimizer step would have consumed it).
//     A later clear of a gradient the keeper took since then would have to separate it
//     from the committed ones in the same buffer: a UsageError.
//
// Every callback runs with the ledger's lock held (recursive: the keeper may call back
// into the ledger), on the thread that runs the backward or the caller's.
//
//   GradientLedger ledger(params, {before, after, discard});
//   { auto own = ledger.own_backward(); loss.backward(); }   // after(i, true) takes .grad
//   ledger.sync_all();                                          // before the step
#pragma once

#include <torch/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

namespace torch::autograd {
struct Node;
}

namespace parallax::zero {

/// What the engine does when the ledger tells it (see the protocol above).
struct GradientKeeper {
  /// Before autograd adds a backward's gradient into params[i].grad; `own`: inside the
  /// owner's backward. A marker is already out of .grad. The keeper may take a gradient
  /// still in .grad (live(i)) first, or lend a buffer to accumulate into (lend()).
  std::function<void(std::size_t i, bool own)> before;
  /// After autograd added it (this backward's whole contribution to params[i]).
  std::function<void(std::size_t i, bool own)> after;
  /// The trainer cleared params[i]'s gradient (zero_grad(), set to none, replaced) while
  /// the keeper held it or showed its buffer: drop what it holds of it.
  std::function<void(std::size_t i)> discard;
};

class GradientLedger {
 public:
  /// `params`: distinct dense leaf tensors that require grad. Installs the hooks; throws
  /// UsageError naming the index of a parameter that is not a leaf. .grad is left as it is.
  GradientLedger(std::vector<torch::Tensor> params, GradientKeeper keeper);
  GradientLedger(const GradientLedger&) = delete;
  GradientLedger& operator=(const GradientLedger&) = delete;
  /// Removes the hooks (.grad keeps what it shows).
  ~GradientLedger();

  /// While alive, backwards on any thread are the owner's: after(i, true) and
  /// before(i, true). Not nested.
  class OwnBackward {
   public:
    explicit OwnBackward(std::atomic<bool>& flag) : flag_(&flag) { flag_->store(true); }
    OwnBackward(OwnBackward&& other) noexcept : flag_(std::exchange(other.flag_, nullptr)) {}
    OwnBackward(const OwnBackward&) = delete;
    OwnBackward& operator=(const OwnBackward&) = delete;
    OwnBackward& operator=(OwnBackward&&) = delete;
    ~OwnBackward() {
      if (flag_) flag_->store(false);
    }

   private:
    std::atomic<bool>* flag_;
  };
  OwnBackward own_backward() { return OwnBackward(own_); }

  /// The ledger's lock, for a keeper that changes .grad outside a callback.
  std::unique_lock<std::recursive_mutex> lock() const { return std::unique_lock<std::recursive_mutex>(mutex_); }

  // ---- what .grad shows (the keeper calls these; each records what it left) ----
  /// The keeper holds params[i]'s gradient of this window: .grad becomes the marker.
  void hold(std::size_t i);
  /// .grad becomes `view`, the keeper's buffer that autograd accumulates into and the
  /// trainer's zero_grad() zeroes; it stays until end_window(keep_views = false).
  void show(std::size_t i, torch::Tensor view);
  /// .grad becomes `buffer` for one accumulation (the keeper's after() then takes it).
  void lend(std::size_t i, torch::Tensor buffer);
  /// .grad becomes undefined (the keeper took what it held: a late gradient, see live()).
  void clear(std::size_t i);
  /// A gradient in params[i].grad the keeper neither holds nor shows (another backward's,
  /// or the owner's after the keeper's reduction began), or undefined.
  torch::Tensor live(std::size_t i) const;
  /// Whether .grad is the buffer show() gave.
  bool showing(std::size_t i) const;
  /// Whether live(i) holds a contribution of a backward that was not the owner's (whose
  /// fp16 loss scale, if any, the keeper cannot know).
  bool foreign(std::size_t i) const;

  /// What the trainer did to .grad since the ledger last looked, acted on (protocol b–e);
  /// runs before every accumulation by itself. Throws UsageError for an in-place edit of
  /// a gradient the keeper holds part of.
  void sync(std::size_t i);
  void sync_all();
  /// A micro-batch of several ended (protocol f): nothing is held any more, markers and
  /// shown views leave .grad until end_window().
  void commit();
  /// The optimizer step consumed the window's gradients: nothing is held any more;
  /// markers leave .grad, shown views return.
  void end_window();

  /// The trainer's optimizer holds `sentinel` (a 1-element tensor of its first parameter
  /// group): its .grad is set to one, and a zero_grad() that clears it clears every
  /// gradient here (as if it had reached every parameter).
  void watch_zero_grad(torch::Tensor sentinel);

  /// Protocol g: LibTorch's optimizer would step params[i] now (its .grad would be defined).
  bool has_gradient(std::size_t i) const;

  std::size_t size() const { return entries_.size(); }

 private:
  struct Entry {
    torch::Tensor param;
    torch::Tensor marker;  ///< zeros of the parameter's shape over one element
    torch::Tensor shown;   ///< show()'s view, or undefined
    bool held = false;
    bool foreign = false;  ///< .grad holds another backward's (non-zero) contribution
    bool has_gradient = false;  ///< protocol g
    const void* seen = nullptr;  ///< .grad's TensorImpl when last recorded; null: undefined
    std::int64_t seen_version = 0;
  };
  void before_accumulation(std::size_t i);
  void after_accumulation(std::size_t i);
  void record(Entry& entry);
  bool is_marker(const Entry& entry, const torch::Tensor& grad) const;
  /// What the trainer's optimizer's zero_grad() did to the sentinel since last seen.
  enum class ZeroGrad { kNotCalled, kZeroed, kSetToNone };
  ZeroGrad zero_grad_called();
  void clear_everything(bool set_to_none);
  void refuse_clear_after_commit(std::size_t i) const;

  GradientKeeper keeper_;
  std::vector<Entry> entries_;
  std::atomic<bool> own_{false};
  bool committed_ = false;  ///< commit() since end_window()
  torch::Tensor sentinel_;
  const void* sentinel_seen_ = nullptr;
  std::int64_t sentinel_version_ = 0;
  mutable std::recursive_mutex mutex_;
  /// The accumulators (kept alive: autograd holds them weakly), our post-hooks' keys and
  /// pre-hooks' addresses.
  struct Installed {
    std::shared_ptr<torch::autograd::Node> accumulator;
    std::uintptr_t post_key = 0;
    const void* pre_hook = nullptr;
  };
  std::vector<Installed> hooks_;
};

}  // namespace parallax::zero
