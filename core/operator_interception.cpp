#include "parallax/core/operator_interception.h"

#include <array>
#include <atomic>
#include <mutex>
#include <string>

#include "parallax/core/error.h"

namespace parallax::interception {
namespace {

constexpr std::size_t kLayers = 2;

std::size_t index(Layer layer) {
  return static_cast<std::size_t>(layer);
}

// Each layer's scope state rides on one of LibTorch's debug-info slots: the two that
// LibTorch itself leaves to tests, as the keys are.
c10::DebugInfoKind info_kind(Layer layer) {
  return layer == Layer::kParameters ? c10::DebugInfoKind::TEST_INFO : c10::DebugInfoKind::TEST_INFO_2;
}

// Write-once per layer: the handler a claim installed, read by the registered trampoline.
std::array<std::atomic<Handler>, kLayers> claimed_handlers{};
std::mutex claim_mutex;
std::array<c10::RegistrationHandleRAII*, kLayers> kept_registrations{};  // under claim_mutex

template <Layer kLayer>
void trampoline(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  claimed_handlers[index(kLayer)].load(std::memory_order_acquire)(op, keys, stack);
}

c10::KernelFunction trampoline_of(Layer layer) {
  return layer == Layer::kParameters
             ? c10::KernelFunction::makeFromBoxedFunction<&trampoline<Layer::kParameters>>()
             : c10::KernelFunction::makeFromBoxedFunction<&trampoline<Layer::kTensorParallel>>();
}

Layer require_claimed(Layer layer) {
  PARALLAX_CHECK(claimed_handlers[index(layer)].load(std::memory_order_acquire) != nullptr, InternalError,
                 "a scope of the ", to_string(layer), " was opened before the layer was claimed");
  return layer;
}

}  // namespace

const char* to_string(Layer layer) {
  return layer == Layer::kParameters ? "ZeRO-3 parameter interception" : "tensor-parallel rewrite";
}

c10::DispatchKey dispatch_key(Layer layer) {
  return layer == Layer::kParameters ? c10::DispatchKey::TESTING_ONLY_GenericMode
                                     : c10::DispatchKey::TESTING_ONLY_GenericWrapper;
}

void claim(Layer layer, Handler handler) {
  PARALLAX_CHECK(handler != nullptr, InternalError, "claim(", to_string(layer), ") without a handler");
  std::atomic<Handler>& slot = claimed_handlers[index(layer)];
  const Handler installed = slot.load(std::memory_order_acquire);
  if (installed == handler) return;
  std::lock_guard<std::mutex> lock(claim_mutex);
  const Handler now = slot.load(std::memory_order_acquire);
  if (now == handler) return;
  PARALLAX_CHECK(now == nullptr, InternalError, "the ", to_string(layer), " was claimed by two different handlers");
  const c10::DispatchKey key = dispatch_key(layer);
  auto& dispatcher = c10::Dispatcher::singleton();
  PARALLAX_CHECK(!dispatcher.hasBackendFallbackForDispatchKey(key), UsageError, "the ", to_string(layer),
                 " needs LibTorch's dispatch key ", c10::toString(key),
                 ", but another library in this process has already registered a fallback on it. Parallax "
                 "cannot share it: load that library in another process, or use Parallax's explicit layers "
                 "(tensor_parallel/ layers, ZeRO stage 1-2), which intercept nothing");
  slot.store(handler, std::memory_order_release);
  // Registered for the life of the process: the handle is kept, never released (not even
  // at exit), so the fallback cannot be removed while some thread still has the key
  // included. A global points at it: it is held, not leaked.
  kept_registrations[index(layer)] = new c10::RegistrationHandleRAII(
      dispatcher.registerFallback(key, trampoline_of(layer), std::string("parallax: ") + to_string(layer)));
}

void call_below(Layer layer, const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  op.redispatchBoxed(keys & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, dispatch_key(layer)), stack);
}

Scope::Scope(Layer layer, std::shared_ptr<ScopeState> state)
    : checked_(require_claimed(layer)), include_(dispatch_key(layer)), state_(info_kind(layer), std::move(state)) {}

Scope::~Scope() = default;

ScopeState* current(Layer layer) {
  return dynamic_cast<ScopeState*>(c10::ThreadLocalDebugInfo::get(info_kind(layer)));
}

Paused::Paused(Layer layer) : exclude_(dispatch_key(layer)) {}

void set_included_on_this_thread(Layer layer, bool included) {
  if (included) require_claimed(layer);
  c10::impl::tls_set_dispatch_key_included(dispatch_key(layer), included);
}

}  // namespace parallax::interception
