#include "parallax/zero/parameter_interception.h"

#include "parallax/core/operator_interception.h"
#include "parallax/zero/deferred_internal.h"

#include <algorithm>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace parallax::zero {
namespace {

constexpr interception::Layer kLayer = interception::Layer::kParameters;

// What a ParameterUseScope lends the fallback: its registry and its enclosing scopes'.
using UseScopeState = interception::StackedState<ParameterRegistry>;

// Operators the caller called directly are at depth 0; those they call internally are
// deeper. Deferred construction acts on depth 0 only (see deferred_construction.h).
thread_local int tls_depth = 0;
// The registries this thread watches between steps; empty when it watches none.
thread_local std::vector<std::weak_ptr<ParameterRegistry>> tls_watched;

// The unit of `storage` in the first registry that has it (in_step: the scope's), or a
// null listener.
ParameterRegistry::Entry find_use(const c10::StorageImpl* storage, const UseScopeState* scope) {
  if (scope != nullptr) {
    for (const auto& registry : scope->registries()) {
      const auto entry = registry->find(storage);
      if (entry.listener != nullptr) return entry;
    }
    return {};
  }
  for (const auto& watched : tls_watched) {
    const auto registry = watched.lock();
    if (!registry) continue;
    const auto entry = registry->find(storage);
    if (entry.listener != nullptr) return entry;
  }
  return {};
}

// Reports the units the operator's arguments read, once per listener with all of its
// units (almost always one listener, one unit).
void report_uses(const torch::jit::Stack& stack, std::size_t first, const UseScopeState* scope, bool nested) {
  std::vector<ParameterRegistry::Entry> used;
  for (std::size_t i = first; i < stack.size(); ++i) {
    detail::for_each_tensor(stack[i], [&](const at::Tensor& tensor) {
      if (!tensor.has_storage()) return;
      const auto entry = find_use(tensor.storage().unsafeGetStorageImpl(), scope);
      if (entry.listener == nullptr) return;
      const bool seen = std::any_of(used.begin(), used.end(), [&](const ParameterRegistry::Entry& e) {
        return e.listener == entry.listener && e.unit == entry.unit;
      });
      if (!seen) used.push_back(entry);
    });
  }
  for (std::size_t i = 0; i < used.size(); ++i) {
    ParameterUseListener* listener = used[i].listener;
    if (listener == nullptr) continue;
    std::vector<std::size_t> units;
    for (std::size_t j = i; j < used.size(); ++j) {
      if (used[j].listener != listener) continue;
      units.push_back(used[j].unit);
      used[j].listener = nullptr;
    }
    listener->on_parameter_uses(units, scope != nullptr, nested);
  }
}

// Forgets watched registries that are gone; true while some are left.
bool still_watching() {
  tls_watched.erase(std::remove_if(tls_watched.begin(), tls_watched.end(),
                                   [](const std::weak_ptr<ParameterRegistry>& r) { return r.expired(); }),
                    tls_watched.end());
  return !tls_watched.empty();
}

void intercept(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  const std::size_t arguments = op.schema().arguments().size();
  const bool top = tls_depth == 0;
  const UseScopeState* scope = UseScopeState::open(kLayer);
  const bool in_step = scope != nullptr || detail::constructing();
  if (!in_step && !still_watching()) {
    // Every watched model is gone (perhaps destroyed on another thread): the watch ends
    // here, on its own thread, and this thread's operators cost nothing from now on.
    interception::set_included_on_this_thread(kLayer, false);
    interception::call_below(kLayer, op, keys, stack);
    return;
  }
  {
    // The listeners work with ordinary operators: they must not come back here.
    interception::Paused paused(kLayer);
    if (top) detail::before_operator(op, *stack);
    report_uses(*stack, stack->size() - arguments, scope, /*nested=*/!top);
  }
  ++tls_depth;
  try {
    interception::call_below(kLayer, op, keys, stack);
  } catch (...) {
    --tls_depth;
    throw;
  }
  --tls_depth;
  if (top) {
    interception::Paused paused(kLayer);
    detail::after_operator(op, *stack);
  }
}

}  // namespace

struct ParameterRegistry::Impl {
  mutable std::mutex mutex;
  std::unordered_map<const c10::StorageImpl*, Entry> entries;
};

ParameterRegistry::ParameterRegistry() : impl_(std::make_unique<Impl>()) {}
ParameterRegistry::~ParameterRegistry() = default;

void ParameterRegistry::add(const c10::StorageImpl* storage, ParameterUseListener* listener, std::size_t unit) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->entries[storage] = Entry{listener, unit};
}

void ParameterRegistry::clear() {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->entries.clear();
}

ParameterRegistry::Entry ParameterRegistry::find(const c10::StorageImpl* storage) const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  const auto found = impl_->entries.find(storage);
  return found == impl_->entries.end() ? Entry{} : found->second;
}

void claim_parameter_interception() {
  interception::claim(kLayer, &intercept);
}

void watch_parameter_use_on_this_thread(const std::shared_ptr<ParameterRegistry>& registry) {
  still_watching();  // forget the dead first
  for (const auto& watched : tls_watched) {
    if (watched.lock() == registry) return;
  }
  tls_watched.push_back(registry);
  interception::set_included_on_this_thread(kLayer, true);
}

struct ParameterUseScope::Open {
  explicit Open(std::shared_ptr<UseScopeState> state) : scope(kLayer, std::move(state)) {}
  interception::Scope scope;
};

ParameterUseScope::ParameterUseScope() = default;

ParameterUseScope::ParameterUseScope(std::shared_ptr<ParameterRegistry> registry) {
  if (!registry) return;
  open_ = std::make_unique<Open>(UseScopeState::pushed(kLayer, std::move(registry)));
}

ParameterUseScope::ParameterUseScope(ParameterUseScope&&) noexcept = default;
ParameterUseScope::~ParameterUseScope() = default;

}  // namespace parallax::zero
