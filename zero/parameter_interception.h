// Notices when an operator uses a sharded parameter, so stage 3 can gather it first.
//
// LibTorch's C++ modules have no forward hooks, and a user's forward reads its
// parameters directly (`torch::linear(x, weight_, bias_)`). Parallax therefore watches
// at the operator dispatcher, on the kParameters layer of core/operator_interception.h:
// while a ParameterUseScope is open, every operator first passes a fallback that looks
// up the storage of each tensor argument in the scope's registries; if the storage
// belongs to a registered unit, the unit's owner is told (and gathers it) before the
// operator runs. Views of a parameter (`weight.t()`) share its storage, so they are
// caught too. The scope travels with LibTorch's thread-local state, so backward on
// autograd's device threads (and at::launch tasks) is seen like the forward.
//
// A registry belongs to the model whose units it lists (held by shared_ptr: an open
// scope keeps it alive); nothing is process-wide but the fallback's registration.
//
// Between steps a thread may also *watch* a registry (watch_parameter_use_on_this_thread):
// a use outside any scope is reported with in_step = false, so the owner can refuse it
// with a clear error instead of letting an operator read a released parameter. A watch
// is no guard object: it holds its registries weakly, needs no end on the thread that
// began it, and ends itself at the thread's next operator once every registry it
// watches is destroyed, so a model may be destroyed on any thread.
//
// Cost: one boxed call and a hash lookup per tensor argument per operator while a
// scope is open.
//
//   struct Owner : ParameterUseListener {
//     void on_parameter_uses(const std::vector<std::size_t>& units, bool in_step, bool nested) override;
//   };
//   claim_parameter_interception();                        // at start: the key must be free
//   auto registry = std::make_shared<ParameterRegistry>();
//   registry->add(storage, &owner, unit);
//   { ParameterUseScope scope(registry); model->forward(x); }   // owner hears about each use
#pragma once

#include <cstddef>
#include <memory>

namespace c10 {
struct StorageImpl;
}

namespace parallax::zero {

class ParameterUseListener {
 public:
  virtual ~ParameterUseListener() = default;
  /// An operator is about to read tensors on the storages of `units` (this listener's,
  /// distinct; all of them at once: an operator may read two units' parameters, and
  /// both must be there while it runs). Called on the thread running the operator, with
  /// interception paused (operators called here run normally). `in_step`: a
  /// ParameterUseScope (or DeferredConstruction) is open on the thread; false when only
  /// the thread's watch saw the use. `nested`: the operator runs inside another that
  /// reported its own uses (addmm's expand of its bias): nothing may be released to make
  /// room, since the outer operator may still read it. May throw: the exception
  /// propagates out of the operator.
  virtual void on_parameter_uses(const std::vector<std::size_t>& units, bool in_step, bool nested) = 0;
};

/// Storage → (listener, unit) for one model's units. Thread-safe.
class ParameterRegistry {
 public:
  ParameterRegistry();
  ~ParameterRegistry();
  ParameterRegistry(const ParameterRegistry&) = delete;
  ParameterRegistry& operator=(const ParameterRegistry&) = delete;

  /// `storage` must stay registered only while it and `listener` live.
  void add(const c10::StorageImpl* storage, ParameterUseListener* listener, std::size_t unit);
  /// Forgets every storage: a listener about to be destroyed calls it first.
  void clear();

  struct Entry {
    ParameterUseListener* listener = nullptr;
    std::size_t unit = 0;
  };
  /// The entry for `storage`, or one with a null listener.
  Entry find(const c10::StorageImpl* storage) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Makes the interception usable in this process. Throws UsageError when another
/// library holds its dispatch key (see core/operator_interception.h). Call at start,
/// before any scope or watch; idempotent.
void claim_parameter_interception();

/// From now until `registry` is destroyed, operators this thread runs outside any scope
/// report uses of its storages with in_step = false. Call outside scopes (a scope that
/// ends restores the thread's earlier state). Watching the same registry twice is one watch.
void watch_parameter_use_on_this_thread(const std::shared_ptr<ParameterRegistry>& registry);

/// While alive, operators on this thread (and the work LibTorch carries its state to:
/// autograd's device threads, at::launch) report uses of `registry`'s storages, and of
/// the registries of enclosing scopes, with in_step = true. Inactive without a
/// registry. Ends on the thread that opened it. Claim first.
class ParameterUseScope {
 public:
  ParameterUseScope();
  explicit ParameterUseScope(std::shared_ptr<ParameterRegistry> registry);
  ParameterUseScope(ParameterUseScope&&) noexcept;
  ParameterUseScope& operator=(ParameterUseScope&&) = delete;
  ParameterUseScope(const ParameterUseScope&) = delete;
  ~ParameterUseScope();

 private:
  struct Open;
  std::unique_ptr<Open> open_;
};

}  // namespace parallax::zero
