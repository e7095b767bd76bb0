// The one way Parallax watches operator calls: a fallback on a c10 dispatch key,
// switched on per thread by a scope that lends the fallback its state.
//
// Where a strategy must see every operator a user's forward and backward run (ZeRO-3's
// gather-on-use and deferred construction, the tensor-parallel rewrite), it claims one
// of two *layers*. A layer is a dispatch key with a fallback (its handler) registered
// once per process, here and nowhere else. The key is off on every thread until a Scope
// includes it; the Scope also pushes the layer's state (a registry owned by the engine
// that opened the scope) onto LibTorch's thread-local debug info, so the handler finds
// it with current(). Both travel with LibTorch's thread-local state: into autograd's
// device threads and at::launch tasks, not only the thread that opened the scope.
// Nothing here is a process-wide registry: the only process-wide facts are the two
// registrations, made once and never changed.
//
// The keys are c10's TESTING_ONLY_GenericMode (kParameters) and
// TESTING_ONLY_GenericWrapper (kTensorParallel): the only out-of-tree keys LibTorch 1.13
// and 2.x both offer. kParameters sits above kTensorParallel, so a ZeRO-3 gather runs
// before the tensor-parallel rewrite sees the gathered weight. If another library in
// the process registered a fallback on either key first, claim() refuses with a
// UsageError saying so; Parallax's explicit layers (`tensor_parallel/`, explicit ZeRO
// units) need no interception.
//
//   void handler(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
//     if (auto* mine = dynamic_cast<MyState*>(interception::current(Layer::kParameters))) { ... }
//     interception::call_below(Layer::kParameters, op, keys, stack);
//   }
//   interception::claim(Layer::kParameters, &handler);           // at engine start
//   { interception::Scope scope(Layer::kParameters, state); model->forward(x); }
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/ThreadLocalDebugInfo.h>

#include <memory>
#include <vector>

namespace parallax::interception {

enum class Layer { kParameters, kTensorParallel };

/// "ZeRO-3 parameter interception" or "tensor-parallel rewrite": how messages name it.
const char* to_string(Layer layer);
/// The c10 dispatch key a layer sits on.
c10::DispatchKey dispatch_key(Layer layer);

/// A layer's fallback: called for every operator while the layer's key is included on
/// the calling thread. Runs the operator itself, or hands it on with call_below().
using Handler = void (*)(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack);

/// Makes `handler` the layer's fallback. The first call in the process registers it
/// with LibTorch's dispatcher; later calls with the same handler return at once.
/// Throws UsageError when another library registered a fallback on the layer's key
/// first (naming the key and the layer), or when a different handler claimed the
/// layer. Thread-safe. Opening a Scope claims nothing: claim first.
void claim(Layer layer, Handler handler);

/// Runs the rest of the dispatch of `op`, below `layer`.
void call_below(Layer layer, const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack);

/// What a scope lends its layer's handler; each layer's owner derives its own.
class ScopeState : public c10::DebugInfoBase {};

/// The usual state: the registries of one scope and of every enclosing scope of the
/// same layer (innermost last), so an inner engine's scope still sees the outer's.
/// Each layer's owner picks its Registry type; a layer has one owner, so current()
/// of that layer is always its StackedState.
template <typename Registry>
class StackedState final : public ScopeState {
 public:
  using Registries = std::vector<std::shared_ptr<Registry>>;

  /// A state holding the enclosing scope's registries of `layer` plus `innermost`.
  static std::shared_ptr<StackedState> pushed(Layer layer, std::shared_ptr<Registry> innermost);
  /// The innermost open scope's state of `layer` on this thread, or null.
  static const StackedState* open(Layer layer);

  const Registries& registries() const { return registries_; }

 private:
  Registries registries_;
};

/// While alive: operators on this thread, and the work LibTorch carries this thread's
/// state to, pass `layer`'s handler, and current(layer) is `state`. Nests (the inner
/// state is current until it ends); ends on the thread that opened it, in LIFO order.
/// Throws InternalError when the layer was never claimed.
class Scope {
 public:
  Scope(Layer layer, std::shared_ptr<ScopeState> state);
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;
  ~Scope();

 private:
  Layer checked_;  ///< construction checks the claim before the guards below
  c10::impl::IncludeDispatchKeyGuard include_;
  c10::DebugInfoGuard state_;
};

/// The state of the innermost Scope of `layer` whose thread-local state this thread
/// carries, or null.
ScopeState* current(Layer layer);

template <typename Registry>
std::shared_ptr<StackedState<Registry>> StackedState<Registry>::pushed(Layer layer,
                                                                       std::shared_ptr<Registry> innermost) {
  auto state = std::make_shared<StackedState>();
  if (const StackedState* enclosing = open(layer)) state->registries_ = enclosing->registries_;
  state->registries_.push_back(std::move(innermost));
  return state;
}

template <typename Registry>
const StackedState<Registry>* StackedState<Registry>::open(Layer layer) {
  return static_cast<const StackedState*>(current(layer));
}

/// While alive, `layer`'s handler is skipped on this thread (a handler's own operators
/// run normally).
class Paused {
 public:
  explicit Paused(Layer layer);
  Paused(const Paused&) = delete;
  Paused& operator=(const Paused&) = delete;

 private:
  c10::impl::ExcludeDispatchKeyGuard exclude_;
};

/// Includes (or no longer includes) `layer`'s key on this thread with no scope and no
/// state: for a watch that outlives any one call and ends on its own thread.
void set_included_on_this_thread(Layer layer, bool included);

}  // namespace parallax::interception
