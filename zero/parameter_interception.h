// Notices when an operator uses a sharded parameter, so stage 3 can gather it first.
//
// LibTorch's C++ modules have no forward hooks, and a user's forward reads its
// parameters directly (`torch::linear(x, weight_, bias_)`). Parallax therefore watches
// at the operator dispatcher: while a ParameterUseScope is alive on a thread (the
// engine opens one around forward and backward), every operator first passes a
// fallback that looks up the storage of each tensor argument; if the storage belongs
// to a registered unit, the unit's owner is told (and gathers it) before the operator
// runs. Views of a parameter (`weight.t()`) share its storage, so they are caught too.
// Autograd carries the scope into backward (the dispatch-key state is part of the
// thread-local state autograd propagates; CPU backward runs on the calling thread).
//
// Between steps a thread may also be *watched* (watch_parameter_use_on_this_thread): a
// use outside any scope is reported with in_step = false, so the owner can refuse it
// with a clear error instead of letting an operator read a released parameter. A watch
// is no guard object: it needs no end on the thread that began it, and it ends itself
// at the thread's next operator once no listener is registered, so a model may be
// destroyed on any thread.
//
// Cost: one boxed call and a hash lookup per tensor argument per operator while a
// scope is open. The fallback sits on c10's TESTING_ONLY_GenericMode key, the only
// out-of-tree "mode" key LibTorch 1.13 and 2.x both offer; no other library in the
// process may register a fallback on it.
//
//   struct Owner : ParameterUseListener { void on_parameter_use(std::size_t unit, bool in_step) override; };
//   ParameterRegistry::instance().add(storage, &owner, unit);
//   { ParameterUseScope scope; model->forward(x); }   // owner hears about each use
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
  /// An operator is about to read a tensor on `unit`'s storage. Called on the thread
  /// running the operator, with interception paused (operators called here run
  /// normally). `in_step`: a ParameterUseScope (or DeferredConstruction) is open on the
  /// thread; false when only the thread's watch saw the use. May throw: the exception
  /// propagates out of the operator.
  virtual void on_parameter_use(std::size_t unit, bool in_step) = 0;
};

/// Storage → (listener, unit). Process-wide because the dispatcher is; thread-safe.
class ParameterRegistry {
 public:
  static ParameterRegistry& instance();
  /// `storage` must stay registered only while it and `listener` live.
  void add(const c10::StorageImpl* storage, ParameterUseListener* listener, std::size_t unit);
  /// Removes every storage of `listener`.
  void remove(const ParameterUseListener* listener);

  struct Entry {
    ParameterUseListener* listener = nullptr;
    std::size_t unit = 0;
  };
  /// The entry for `storage`, or one with a null listener.
  Entry find(const c10::StorageImpl* storage) const;
  bool empty() const;

 private:
  struct Impl;
  ParameterRegistry();
  std::unique_ptr<Impl> impl_;
};

/// From now until no listener is registered, operators this thread runs outside any
/// scope report uses of registered storages with in_step = false. Call outside scopes
/// (a scope that ends restores the thread's earlier state). Idempotent.
void watch_parameter_use_on_this_thread();

/// While alive, operators on this thread (and the autograd work it starts) report
/// parameter uses with in_step = true. Nesting is allowed. Inactive when constructed with
/// `enabled` false. Ends on the thread that opened it.
class ParameterUseScope {
 public:
  explicit ParameterUseScope(bool enabled = true);
  ParameterUseScope(ParameterUseScope&&) noexcept;
  ParameterUseScope& operator=(ParameterUseScope&&) = delete;
  ParameterUseScope(const ParameterUseScope&) = delete;
  ~ParameterUseScope();

 private:
  struct Guard;
  std::unique_ptr<Guard> guard_;
};

}  // namespace parallax::zero
