#include "parallax/zero/parameter_interception.h"

#include "parallax/zero/deferred_internal.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

#include <mutex>
#include <unordered_map>

namespace parallax::zero {
namespace {

constexpr c10::DispatchKey kInterceptKey = c10::DispatchKey::TESTING_ONLY_GenericMode;

void report_use(const c10::IValue& value, bool in_step) {
  detail::for_each_tensor(value, [in_step](const at::Tensor& tensor) {
    if (!tensor.has_storage()) return;
    const auto entry = ParameterRegistry::instance().find(tensor.storage().unsafeGetStorageImpl());
    if (entry.listener != nullptr) entry.listener->on_parameter_use(entry.unit, in_step);
  });
}

// Operators the caller called directly are at depth 0; those they call internally are
// deeper. Deferred construction acts on depth 0 only (see deferred_construction.h).
thread_local int tls_depth = 0;
// ParameterUseScopes open on this thread, and whether the thread is watched between them.
thread_local int tls_open_scopes = 0;
thread_local bool tls_watching = false;

void intercept(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  const std::size_t arguments = op.schema().arguments().size();
  const bool top = tls_depth == 0;
  const bool in_step = tls_open_scopes > 0 || detail::constructing();
  if (!in_step && tls_watching && ParameterRegistry::instance().empty()) {
    // Every watched model is gone (perhaps destroyed on another thread): the watch ends
    // here, on its own thread, and this thread's operators cost nothing from now on.
    tls_watching = false;
    c10::impl::tls_set_dispatch_key_included(kInterceptKey, false);
    op.redispatchBoxed(keys & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, kInterceptKey), stack);
    return;
  }
  {
    // The listeners work with ordinary operators: they must not come back here.
    c10::impl::ExcludeDispatchKeyGuard paused(kInterceptKey);
    if (top) detail::before_operator(op, *stack);
    for (std::size_t i = stack->size() - arguments; i < stack->size(); ++i) report_use((*stack)[i], in_step);
  }
  ++tls_depth;
  try {
    op.redispatchBoxed(keys & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, kInterceptKey), stack);
  } catch (...) {
    --tls_depth;
    throw;
  }
  --tls_depth;
  if (top) {
    c10::impl::ExcludeDispatchKeyGuard paused(kInterceptKey);
    detail::after_operator(op, *stack);
  }
}

}  // namespace

TORCH_LIBRARY_IMPL(_, TESTING_ONLY_GenericMode, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&intercept>());
}

struct ParameterRegistry::Impl {
  mutable std::mutex mutex;
  std::unordered_map<const c10::StorageImpl*, Entry> entries;
};

ParameterRegistry::ParameterRegistry() : impl_(std::make_unique<Impl>()) {}

ParameterRegistry& ParameterRegistry::instance() {
  static ParameterRegistry registry;
  return registry;
}

void ParameterRegistry::add(const c10::StorageImpl* storage, ParameterUseListener* listener, std::size_t unit) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->entries[storage] = Entry{listener, unit};
}

void ParameterRegistry::remove(const ParameterUseListener* listener) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  for (auto it = impl_->entries.begin(); it != impl_->entries.end();) {
    it = it->second.listener == listener ? impl_->entries.erase(it) : std::next(it);
  }
}

ParameterRegistry::Entry ParameterRegistry::find(const c10::StorageImpl* storage) const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  const auto found = impl_->entries.find(storage);
  return found == impl_->entries.end() ? Entry{} : found->second;
}

bool ParameterRegistry::empty() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->entries.empty();
}

void watch_parameter_use_on_this_thread() {
  if (tls_watching) return;
  tls_watching = true;
  c10::impl::tls_set_dispatch_key_included(kInterceptKey, true);
}

struct ParameterUseScope::Guard {
  Guard() { ++tls_open_scopes; }
  ~Guard() { --tls_open_scopes; }
  c10::impl::IncludeDispatchKeyGuard include{kInterceptKey};
};

ParameterUseScope::ParameterUseScope(bool enabled) {
  if (enabled) guard_ = std::make_unique<Guard>();
}
ParameterUseScope::ParameterUseScope(ParameterUseScope&&) noexcept = default;
ParameterUseScope::~ParameterUseScope() = default;

}  // namespace parallax::zero
