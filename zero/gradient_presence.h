// Which parameters an optimizer step updates, agreed over the ranks that share them.
//
// LibTorch's optimizers skip a parameter whose .grad is undefined: no weight decay, no
// momentum, no step count (a branch no loss reached since the trainer's zero_grad()
// set gradients to none, an expert no token was routed to). A distributed step must
// skip exactly the parameters the single-process program would: those no rank's
// backward reached, over the whole global batch. Each rank knows its own part
// (GradientLedger::has_gradient); one all_reduce (max of one byte per parameter) over
// the data-parallel group gives the union, and one over the experts' own group for
// theirs (their indices name different experts on different ranks of dp).
//
//   std::vector<bool> present = agree_on_gradients(local, dp, experts);
#pragma once

#include <c10/core/Device.h>

#include <vector>

#include "parallax/core/communicator.h"
#include "parallax/zero/reduction_group.h"

namespace parallax::zero {

/// `local`[i]: this rank's backwards gave params[i] a gradient in this window. Returns
/// whether any rank of `dense` (for `experts`' members: of experts.comm) did. Collective
/// over each group of more than one rank (every rank of both calls it in the same
/// order); the flags travel as bytes on `device` (a CUDA device's for NCCL). Throws
/// CommError.
std::vector<bool> agree_on_gradients(const std::vector<bool>& local,
                                     Communicator& dense,
                                     const OtherReductionGroup& experts,
                                     c10::Device device);

}  // namespace parallax::zero
