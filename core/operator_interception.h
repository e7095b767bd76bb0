// The one way Parallax watches operator calls: one fallback on one c10 dispatch key,
// routing each operator through the *layers* open on the calling thread.
//
// Where a strategy must see operators a user's forward and backward run (ZeRO-3's
// gather-on-use and deferred construction, the tensor-parallel rewrite, context-parallel
// attention in place of scaled_dot_product_attention), it claims a layer: a handler,
// and either every operator or a list of operator names. The layers are declared here
// (Layer) in the order they see an operator, and all share one dispatch key, whose
// fallback is registered once per process, here and nowhere else. An operator reaches
// the first layer that is open on the thread, not paused and routes it; that handler
// runs the operator itself or hands it on with call_below() to the next such layer, and
// after the last, to the rest of LibTorch's dispatch.
//
// A layer is open while a Scope of it is alive. The Scope includes the key and lends
// the layer's handler its state (a registry owned by the engine that opened it): all
// open layers' states ride together on one of LibTorch's thread-local debug-info slots,
// so the handler finds its own with current(). Key and states travel with LibTorch's
// thread-local state: into autograd's device threads and at::launch tasks, not only the
// thread that opened the scope. Nothing here is a process-wide registry: the only
// process-wide facts are the claims, made once and never changed.
//
// The key is c10's TESTING_ONLY_GenericMode, one of the two out-of-tree keys LibTorch
// 1.13 and 2.x both offer; it sits above Autograd, so a handler sees composite operators
// (scaled_dot_product_attention) before they decompose. If another library in the
// process registered a fallback on it first, the first claim refuses with a UsageError
// saying so; Parallax's explicit layers (`tensor_parallel/`, explicit ZeRO units,
// context_parallel's attention call) need no interception. Adding a layer is a line in
// Layer and to_string(); the key, the slot and the routing stay as they are.
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
#include <string>
#include <vector>

namespace parallax::interception {

/// The layers, in the order an operator meets them: a ZeRO-3 gather runs before the
/// tensor-parallel rewrite sees the gathered weight. kAttention stays the last (the
/// layer count is derived from it).
enum class Layer { kParameters, kTensorParallel, kAttention };

/// "ZeRO-3 parameter interception", "tensor-parallel rewrite" or "context-parallel
/// attention": how messages name it.
const char* to_string(Layer layer);
/// The c10 dispatch key every layer sits on.
c10::DispatchKey dispatch_key();

/// A layer's handler: called for each operator the layer routes while it is open on the
/// calling thread. Runs the operator itself, or hands it on with call_below().
using Handler = void (*)(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack);

/// Makes `handler` the layer's, for the operators named in `operators` (schema names
/// such as "aten::scaled_dot_product_attention", every overload) or, when it is empty,
/// for every operator. The first claim in the process registers the key's fallback with
/// LibTorch's dispatcher; a later claim of a layer with the same handler returns at
/// once. Throws UsageError when another library registered a fallback on the key first
/// (naming the key and the layer), InternalError when a different handler claimed the
/// layer. Thread-safe. Opening a Scope claims nothing: claim first.
void claim(Layer layer, Handler handler, std::vector<std::string> operators = {});

/// Hands `op` on from `layer`'s handler: to the next open layer that routes it, or to
/// the rest of the dispatch.
void call_below(Layer layer, const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack);

/// What a scope lends its layer's handler; each layer's owner derives its own.
class ScopeState {
 public:
  virtual ~ScopeState() = default;
};

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

/// While alive: `layer` is open on this thread and the work LibTorch carries this
/// thread's state to, and current(layer) is `state` (which may be null). Nests (the
/// inner state is current until it ends); ends on the thread that opened it, in LIFO
/// order. Throws InternalError when the layer was never claimed.
class Scope {
 public:
  Scope(Layer layer, std::shared_ptr<ScopeState> state);
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;
  ~Scope();

 private:
  Layer checked_;  ///< construction checks the claim before the guards below
  c10::impl::IncludeDispatchKeyGuard include_;
  c10::DebugInfoGuard layers_;
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

/// While alive, `layer`'s handler is skipped on this thread and the work it launches (a
/// handler's own operators run normally); the other layers still see them. Scopes
/// opened inside do not resume it.
class Paused {
 public:
  explicit Paused(Layer layer);
  Paused(const Paused&) = delete;
  Paused& operator=(const Paused&) = delete;

 private:
  c10::DebugInfoGuard layers_;
};

/// Opens (or closes) `layer` on this thread alone, with no scope and no state: for a
/// watch that outlives any one call and ends on its own thread. Not carried to other
/// threads.
void set_included_on_this_thread(Layer layer, bool included);

}  // namespace parallax::interception
