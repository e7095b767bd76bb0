// Internal to tensor_parallel/ (not installed): how the autograd functions of this
// module carry their communicator from forward to backward.
#pragma once

#include <torch/csrc/autograd/custom_function.h>

#include <cstdint>

#include "parallax/core/communicator.h"

namespace parallax::tensor_parallel::detail {

// The communicator travels through the autograd context as an integer: an IValue holds
// no raw pointer. The caller keeps it alive across backward (the engine owns it).
inline void remember(torch::autograd::AutogradContext* ctx, Communicator& tp) {
  ctx->saved_data["tp"] = static_cast<std::int64_t>(reinterpret_cast<std::intptr_t>(&tp));
}
inline Communicator& recall(torch::autograd::AutogradContext* ctx) {
  return *reinterpret_cast<Communicator*>(static_cast<std::intptr_t>(ctx->saved_data["tp"].toInt()));
}

}  // namespace parallax::tensor_parallel::detail
