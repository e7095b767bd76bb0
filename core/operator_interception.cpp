#include "parallax/core/operator_interception.h"

#include <array>
#include <atomic>
#include <bitset>
#include <mutex>

#include "parallax/core/error.h"

namespace parallax::interception {
namespace {

constexpr std::size_t kLayers = static_cast<std::size_t>(Layer::kAttention) + 1;  // the last Layer's index + 1
constexpr c10::DispatchKey kKey = c10::DispatchKey::TESTING_ONLY_GenericMode;
// The open layers' states ride on one of LibTorch's debug-info slots: one it leaves to
// tests, as the key is.
constexpr c10::DebugInfoKind kSlot = c10::DebugInfoKind::TEST_INFO;

std::size_t index(Layer layer) {
  return static_cast<std::size_t>(layer);
}

// What a thread's scopes opened and paused, every layer together: each Scope and Paused
// pushes a copy with its own change, so LIFO guards restore the enclosing one.
struct Layers final : c10::DebugInfoBase {
  std::array<std::shared_ptr<ScopeState>, kLayers> states{};
  std::bitset<kLayers> open;
  std::bitset<kLayers> paused;
};

const Layers* open_layers() {
  return static_cast<const Layers*>(c10::ThreadLocalDebugInfo::get(kSlot));
}

std::shared_ptr<Layers> copy_of_open_layers() {
  const Layers* enclosing = open_layers();
  return enclosing != nullptr ? std::make_shared<Layers>(*enclosing) : std::make_shared<Layers>();
}

// Layers opened by set_included_on_this_thread: this thread's only.
thread_local std::bitset<kLayers> tls_watching;

// Write-once per layer: the operators it routes (empty: all), then its handler.
std::array<std::vector<std::string>, kLayers> claimed_operators;
std::array<std::atomic<Handler>, kLayers> claimed_handlers{};
std::mutex claim_mutex;
c10::RegistrationHandleRAII* kept_registration = nullptr;  // under claim_mutex

bool routes(std::size_t layer, const c10::OperatorHandle& op) {
  const auto& names = claimed_operators[layer];
  if (names.empty()) return true;
  const std::string& name = op.operator_name().name;
  for (const auto& wanted : names) {
    if (name == wanted) return true;
  }
  return false;
}

// Hands `op` to the first layer from `first` on that is open here, not paused, claimed
// and routes it; after the last, to the dispatch below the key.
void route_from(std::size_t first, const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                torch::jit::Stack* stack) {
  const Layers* layers = open_layers();
  for (std::size_t i = first; i < kLayers; ++i) {
    const bool open = tls_watching[i] || (layers != nullptr && layers->open[i]);
    if (!open || (layers != nullptr && layers->paused[i])) continue;
    const Handler handler = claimed_handlers[i].load(std::memory_order_acquire);
    if (handler == nullptr || !routes(i, op)) continue;
    handler(op, keys, stack);
    return;
  }
  // A key left included with nothing open (a watch ended inside a scope that found the
  // key already included) stops costing anything from here on.
  if (first == 0 && layers == nullptr && tls_watching.none()) c10::impl::tls_set_dispatch_key_included(kKey, false);
  op.redispatchBoxed(keys & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, kKey), stack);
}

void fallback(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  route_from(0, op, keys, stack);
}

Layer require_claimed(Layer layer) {
  PARALLAX_CHECK(claimed_handlers[index(layer)].load(std::memory_order_acquire) != nullptr, InternalError,
                 "a scope of the ", to_string(layer), " was opened before the layer was claimed");
  return layer;
}

std::shared_ptr<Layers> with_open(Layer layer, std::shared_ptr<ScopeState> state) {
  auto layers = copy_of_open_layers();
  layers->open.set(index(layer));
  layers->states[index(layer)] = std::move(state);
  return layers;
}

std::shared_ptr<Layers> with_paused(Layer layer) {
  auto layers = copy_of_open_layers();
  layers->paused.set(index(layer));
  return layers;
}

}  // namespace

const char* to_string(Layer layer) {
  switch (layer) {
    case Layer::kParameters:
      return "ZeRO-3 parameter interception";
    case Layer::kTensorParallel:
      return "tensor-parallel rewrite";
    case Layer::kAttention:
      return "context-parallel attention";
  }
  return "?";
}

c10::DispatchKey dispatch_key() {
  return kKey;
}

void claim(Layer layer, Handler handler, std::vector<std::string> operators) {
  PARALLAX_CHECK(handler != nullptr, InternalError, "claim(", to_string(layer), ") without a handler");
  std::atomic<Handler>& slot = claimed_handlers[index(layer)];
  if (slot.load(std::memory_order_acquire) == handler) return;
  std::lock_guard<std::mutex> lock(claim_mutex);
  const Handler now = slot.load(std::memory_order_acquire);
  if (now == handler) return;
  PARALLAX_CHECK(now == nullptr, InternalError, "the ", to_string(layer), " was claimed by two different handlers");
  if (kept_registration == nullptr) {
    auto& dispatcher = c10::Dispatcher::singleton();
    PARALLAX_CHECK(!dispatcher.hasBackendFallbackForDispatchKey(kKey), UsageError, "the ", to_string(layer),
                   " needs LibTorch's dispatch key ", c10::toString(kKey),
                   ", but another library in this process has already registered a fallback on it. Parallax "
                   "cannot share it: load that library in another process, or use Parallax's explicit layers "
                   "(tensor_parallel/ layers, ZeRO stage 1-2, context_parallel's attention call), which "
                   "intercept nothing");
    // Registered for the life of the process: the handle is kept, never released (not
    // even at exit), so the fallback cannot be removed while some thread still has the
    // key included. A global points at it: it is held, not leaked.
    kept_registration = new c10::RegistrationHandleRAII(dispatcher.registerFallback(
        kKey, c10::KernelFunction::makeFromBoxedFunction<&fallback>(), "parallax: operator interception"));
  }
  claimed_operators[index(layer)] = std::move(operators);
  slot.store(handler, std::memory_order_release);
}

void call_below(Layer layer, const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  route_from(index(layer) + 1, op, keys, stack);
}

Scope::Scope(Layer layer, std::shared_ptr<ScopeState> state)
    : checked_(require_claimed(layer)), include_(kKey), layers_(kSlot, with_open(layer, std::move(state))) {}

Scope::~Scope() = default;

ScopeState* current(Layer layer) {
  const Layers* layers = open_layers();
  return layers != nullptr ? layers->states[index(layer)].get() : nullptr;
}

Paused::Paused(Layer layer) : layers_(kSlot, with_paused(layer)) {}

void set_included_on_this_thread(Layer layer, bool included) {
  if (included) require_claimed(layer);
  tls_watching.set(index(layer), included);
  if (included) {
    c10::impl::tls_set_dispatch_key_included(kKey, true);
  } else if (tls_watching.none() && open_layers() == nullptr) {
    c10::impl::tls_set_dispatch_key_included(kKey, false);
  }
}

}  // namespace parallax::interception
