// Private to zero/: what the dispatcher fallback (parameter_interception.cpp) and
// deferred construction share.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

namespace parallax::zero::detail {

/// Calls `visit(tensor)` for every defined tensor in an operator argument: a tensor, a
/// tensor list, or a list of optional tensors.
template <typename Visit>
void for_each_tensor(const c10::IValue& value, const Visit& visit) {
  if (value.isTensor()) {
    const at::Tensor& tensor = value.toTensor();
    if (tensor.defined()) visit(tensor);
  } else if (value.isList()) {  // tensor lists included: no copy of the list or its tensors
    for (const c10::IValue& element : value.toListRef()) for_each_tensor(element, visit);
  }
}

/// Around every intercepted operator: before it runs (its arguments on the stack's
/// top: rematerializes sealed arguments, records writes into deferred tensors), and
/// after (its results on top: defers new factory tensors while constructing).
void before_operator(const c10::OperatorHandle& op, const torch::jit::Stack& stack);
void after_operator(const c10::OperatorHandle& op, const torch::jit::Stack& stack);
/// True when a DeferredConstruction scope is open on this thread.
bool constructing();

}  // namespace parallax::zero::detail
