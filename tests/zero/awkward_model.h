// The small awkward model the ZeRO contract and interception tests share, its config,
// batches and loss. Header-only; one copy per test executable.
#pragma once

#include <torch/torch.h>

#include <string>
#include <vector>

#include "parallax/core/config_loader.h"
#include "parallax/runtime/parallax.h"

namespace parallax::zero_test {

inline const InitOptions kQuiet{{}, /*print_summary=*/false};
constexpr std::int64_t kGlobalBatch = 8;
constexpr std::int64_t kSteps = 6;

inline Config awkward_config(int stage, std::int64_t grad_accum, const std::vector<std::string>& extra = {}) {
  ConfigSources sources;
  sources.overrides = {"train.global_batch_size=" + std::to_string(kGlobalBatch),
                       "train.grad_accum=" + std::to_string(grad_accum), "train.steps=" + std::to_string(kSteps),
                       "optimizer.type=\"adamw\"", "optimizer.lr=0.01",
                       // Decoupled decay would shrink the unused parameter here (its
                       // gradient is a zero in a flat buffer) but not in the reference.
                       "optimizer.weight_decay=0", "optimizer.grad_clip=0.5", "zero.stage=" + std::to_string(stage),
                       "zero.bucket_mb=0.001",  // 262 fp32 elements: `big` is larger than a bucket
                       "zero.wrap=[\"Linear\"]", "logging.every=0"};
  for (const auto& e : extra) sources.overrides.push_back(e);
  return load_config(sources);
}

// 48 + 2408 + 2 + 3 elements: sizes that do not divide by 4, a 2-element scale (fewer
// elements than 4 ranks), `first.weight` also registered as `tied`, `unused` never read.
struct Awkward : torch::nn::Module {
  Awkward() {
    first = register_module("first", torch::nn::Linear(7, 6));
    big = register_module("big", torch::nn::Linear(7, 301));
    scale = register_parameter("scale", torch::tensor({1.5f, 0.25f}));
    unused = register_parameter("unused", torch::randn({3}));
    register_parameter("tied", first->weight);
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = torch::relu(first(x)) * scale[0] + scale[1];          // [B, 6]
    auto z = torch::nn::functional::linear(h, first->weight.t());  // [B, 7], the shared weight again
    return big(z);                                                 // [B, 301]
  }
  torch::nn::Linear first{nullptr}, big{nullptr};
  torch::Tensor scale, unused;
};

inline torch::Tensor batch(std::int64_t step) {
  torch::manual_seed(100 + step);
  return torch::randn({kGlobalBatch, 7});
}

inline torch::Tensor loss_of(const torch::Tensor& out) {
  return out.to(torch::kFloat32).pow(2).mean();
}

// An Awkward model with the weights every test starts from, and its engine on `rt`.
struct SeededEngine {
  explicit SeededEngine(Runtime& rt)
      : model((torch::manual_seed(5), std::make_shared<Awkward>())),
        engine(rt.engine(model, OptimizerSpec::from(rt.config()))) {}
  std::shared_ptr<Awkward> model;
  ModuleEngine<Awkward> engine;
};

// This rank's micro-batch of step `step`'s global batch (grad_accum 1).
inline torch::Tensor local_batch(Runtime& rt, std::int64_t step) {
  const std::int64_t micro = rt.config().train.micro_batch_size;
  return batch(step).narrow(0, rt.mesh().coord().dp * micro, micro);
}

// One forward, backward and step on this rank's part of step `step`'s batch.
inline bool train_step(Runtime& rt, ModuleEngine<Awkward>& engine, std::int64_t step) {
  engine.backward(loss_of(engine.forward(local_batch(rt, step))));
  return engine.step();
}

// The trainable parameters once each, in registration order (as the engine sees them).
inline std::vector<torch::Tensor> unique_parameters(torch::nn::Module& module) {
  std::vector<torch::Tensor> out;
  for (const auto& p : module.parameters()) {
    bool seen = false;
    for (const auto& q : out) seen = seen || q.is_same(p);
    if (!seen) out.push_back(p);
  }
  return out;
}

}  // namespace parallax::zero_test
