// Private to zero/: the dispatcher fallback's calls into deferred construction.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

namespace parallax::zero::detail {

/// Around every intercepted operator: before it runs (its arguments on the stack's
/// top: rematerializes sealed arguments, records writes into deferred tensors), and
/// after (its results on top: defers new factory tensors while constructing).
void before_operator(const c10::OperatorHandle& op, const torch::jit::Stack& stack);
void after_operator(const c10::OperatorHandle& op, const torch::jit::Stack& stack);
/// True when a DeferredConstruction scope is open on this thread.
bool constructing();

}  // namespace parallax::zero::detail
