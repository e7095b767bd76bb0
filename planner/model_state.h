// Model-state bytes per rank by ZeRO's formulas, with and without offload: what the
// engines' own accounting (ModelStateBytes, `--explain`, the metrics) must equal, and
// what the planner predicts before anything is built. The equivalence tests assert
// these against the engine's measured bytes (tests/runtime/pipeline_training.cpp for
// every cell of the matrix tests, tests/offload/offload_equivalence_test.cpp for the
// offload tiers).
#pragma once

#include <cstdint>

#include "parallax/core/config.h"
#include "parallax/core/model_state_bytes.h"

namespace parallax {

/// Model-state bytes of one rank by ZeRO's formulas: Ψ = `elements` trainable parameter
/// elements on this rank (its pipeline stage, its tensor-parallel part), Ψ' = Ψ +
/// `padding` (the flat buffers' padding, below dp per buffer), N = `dp`, e = the compute
/// dtype's bytes, k = `optimizer_bytes_per_element` (Adam/AdamW 8, SGD with momentum 4,
/// plain SGD 0, ...), m = 4 bytes of fp32 master per element when e < 4 (else 0):
///   stage 0: params eΨ,    grads 4Ψ (+ eΨ), optimizer (k + m)Ψ
///   stage 1: params eΨ',   grads 4Ψ',   optimizer (k + m)Ψ'/N
///   stage 2: params eΨ',   grads 4Ψ'/N, optimizer (k + m)Ψ'/N
///   stage 3: params eΨ'/N, grads 4Ψ'/N, optimizer (k + m)Ψ'/N
/// (fp32 gradients: reduced and accumulated in fp32 at every precision; at stage 0 a
/// bf16/fp16 parameter's own-dtype gradient is a staging buffer beside them). Without
/// offload; offloaded_model_state_formula() has the tiers.
ModelStateBytes model_state_formula(
    std::int64_t elements, std::int64_t padding, int dp, int stage, Dtype dtype, int optimizer_bytes_per_element);

/// Expert parallelism: of the Ψ elements and the padding, `expert_elements` and
/// `expert_padding` are this rank's experts', sharded over the `expert_dp` ranks holding
/// them (dp / ep); the rest over `dp`. The sum of model_state_formula over the two parts.
ModelStateBytes model_state_formula(std::int64_t elements,
                                    std::int64_t padding,
                                    int dp,
                                    std::int64_t expert_elements,
                                    std::int64_t expert_padding,
                                    int expert_dp,
                                    int stage,
                                    Dtype dtype,
                                    int optimizer_bytes_per_element);

/// The same with `offload` (ZeRO-Offload / ZeRO-Infinity; stage >= 1, Adam or AdamW),
/// T = Ψ'/N this rank's shard:
///   device: params eΨ' at stages 1–2, eT at stage 3, none with offload.param;
///           grads 4Ψ' at stage 1 (its full buffer persists), none at 2–3 (each
///           bucket is freed once reduced into the host shard); optimizer none;
///   host:   the gradient shard 4T, the fp32 master 4T (unless param = "nvme": in
///           its file), the moments kT (unless optimizer = "nvme": then the tier's
///           host buffers, min(buffer_count, ⌈T / tile⌉) × streams × tile × 4 bytes,
///           tile = min(T, buffer_mb MiB / (4 × streams)), streams = 2, or 3 with the
///           master in the file);
///   nvme:   streams × 4T when optimizer = "nvme".
/// Equals model_state_formula() when nothing is offloaded.
ModelStateBytes offloaded_model_state_formula(std::int64_t elements,
                                              std::int64_t padding,
                                              int dp,
                                              int stage,
                                              Dtype dtype,
                                              int optimizer_bytes_per_element,
                                              const OffloadOptions& offload);

/// Optimizer state bytes per parameter element of `optimizer`: 8 for Adam/AdamW (12 with
/// amsgrad), 4 for SGD with momentum, 0 for plain SGD, 4 for RMSprop (+4 with momentum,
/// +4 centered), 4 for Adagrad.
int optimizer_bytes_per_element(const OptimizerOptions& optimizer);

/// Bytes of one element of `dtype`: 4 for fp32, 2 for bf16 and fp16.
int dtype_bytes(Dtype dtype);

}  // namespace parallax
