// Internal (not installed; included by .cpp files only): how the autograd functions of
// tensor_parallel/ and context_parallel/ carry their communicator from forward to
// backward.
#pragma once

#include <torch/csrc/autograd/custom_function.h>

#include <cstdint>

#include "parallax/core/communicator.h"

namespace parallax::detail {

// The communicator travels through the autograd context as an integer: an IValue holds
// no raw pointer. The caller keeps it alive across backward (the engine owns it).
inline void remember(torch::autograd::AutogradContext* ctx, Communicator& group) {
  ctx->saved_data["communicator"] = static_cast<std::int64_t>(reinterpret_cast<std::intptr_t>(&group));
}
inline Communicator& recall(torch::autograd::AutogradContext* ctx) {
  return *reinterpret_cast<Communicator*>(static_cast<std::intptr_t>(ctx->saved_data["communicator"].toInt()));
}

}  // namespace parallax::detail
