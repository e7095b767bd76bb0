#include "parallax/pipeline/layers.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <mutex>

#include <torch/autograd.h>

#include "parallax/core/cpu_generator.h"
#include "parallax/core/error.h"

namespace parallax::pipeline {

std::uint64_t layer_seed(std::uint64_t seed, std::int64_t index) {
  std::uint64_t x = seed ^ (0x9e3779b97f4a7c15ULL * static_cast<std::uint64_t>(index + 1));
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

std::shared_ptr<torch::nn::Module> build_seeded(const std::function<std::shared_ptr<torch::nn::Module>()>& build,
                                                std::uint64_t seed,
                                                std::int64_t index) {
  std::shared_ptr<torch::nn::Module> module;
  {
    RestoreCpuGenerator restore;
    seed_cpu_generator(layer_seed(seed, index));
    module = build();
  }
  PARALLAX_CHECK(module != nullptr, UsageError, "layer ", index, "'s factory returned no module");
  return module;
}

LayerSequenceImpl::LayerSequenceImpl(const std::vector<LayerSpec>& specs,
                                     std::int64_t begin,
                                     std::int64_t end,
                                     std::uint64_t seed)
    : begin_(begin), end_(end) {
  PARALLAX_CHECK(begin >= 0 && begin < end && end <= static_cast<std::int64_t>(specs.size()), UsageError, "layers [",
                 begin, ", ", end, ") are not a non-empty range of the ", specs.size(), " layer specs");
  for (std::int64_t i = begin; i < end; ++i) {
    const LayerSpec& spec = specs[i];
    PARALLAX_CHECK(spec.build && spec.forward, UsageError, "layer spec ", i, " ('", spec.name,
                   "') has no factory or forward; make it with pipeline::layer<Module>(name, factory)");
    specs_.push_back(spec);
    layers_.push_back(register_module(std::to_string(i), build_seeded(spec.build, seed, i)));
  }
  (void)tied_parameters();  // throws UsageError for a tied path the layer lacks
}

Activation LayerSequenceImpl::forward(const Activation& input) {
  Activation x = input;
  for (std::size_t i = 0; i < layers_.size(); ++i) x = specs_[i].forward(*layers_[i], x);
  return x;
}

std::vector<std::pair<std::string, torch::Tensor>> LayerSequenceImpl::tied_parameters() const {
  std::vector<std::pair<std::string, torch::Tensor>> tied;
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    const auto named = layers_[i]->named_parameters();
    for (const TiedParameter& t : specs_[i].tied) {
      const torch::Tensor* found = named.find(t.parameter);
      PARALLAX_CHECK(found != nullptr, UsageError, "layer ", begin_ + static_cast<std::int64_t>(i), " ('",
                     specs_[i].name, "') ties '", t.parameter, "' under key '", t.key,
                     "', but has no such parameter; it has: ", [&named] {
                       std::string names;
                       for (const auto& item : named) names += (names.empty() ? "" : ", ") + item.key();
                       return names;
                     }());
      tied.emplace_back(t.key, *found);
    }
  }
  return tied;
}

std::vector<double> parameter_counts(const std::vector<LayerSpec>& specs, std::uint64_t seed) {
  std::vector<double> counts;
  for (std::size_t i = 0; i < specs.size(); ++i) {
    const auto module = build_seeded(specs[i].build, seed, static_cast<std::int64_t>(i));
    double count = 0.0;
    for (const auto& p : module->parameters()) {
      if (p.requires_grad()) count += static_cast<double>(p.numel());
    }
    counts.push_back(count);
  }
  return counts;
}

std::vector<double> profile_layers(const std::vector<LayerSpec>& specs,
                                   std::uint64_t seed,
                                   const Activation& inputs,
                                   const std::function<torch::Tensor(const Activation&)>& loss_of_output,
                                   int repeats) {
  std::vector<double> times;
  Activation x = inputs;
  for (std::size_t i = 0; i < specs.size(); ++i) {
    const auto module = build_seeded(specs[i].build, seed, static_cast<std::int64_t>(i));
    double best = std::numeric_limits<double>::infinity();
    Activation output;
    for (int r = 0; r < std::max(1, repeats); ++r) {
      Activation leaves;
      for (const torch::Tensor& t : x) {
        leaves.push_back(t.defined() && t.is_floating_point() ? t.detach().requires_grad_(true) : t);
      }
      const auto start = std::chrono::steady_clock::now();
      output = specs[i].forward(*module, leaves);
      torch::Tensor scalar;
      if (i + 1 == specs.size()) {
        scalar = loss_of_output(output);
      } else {
        for (const torch::Tensor& t : output) {
          if (t.defined() && t.requires_grad()) scalar = scalar.defined() ? scalar + t.sum() : t.sum();
        }
      }
      if (scalar.defined()) scalar.backward();
      best =
          std::min(best, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
    }
    times.push_back(best);
    x.clear();
    for (const torch::Tensor& t : output) x.push_back(t.defined() ? t.detach() : t);
  }
  return times;
}

}  // namespace parallax::pipeline
