// A model as a list of layer specs, so each pipeline stage builds only its own layers.
//
// A spec is a name, a factory and a forward adapter. Between layers flows an Activation:
// a tensor or a tuple of tensors (one vector). Layer i is built with LibTorch's CPU
// generator seeded from (seed, i), so a layer gets the same initial values whichever
// stage builds it, and a single-process model built from the same specs (or from the
// same factories, as the GPT example's plain model is) starts identical.
//
//   std::vector<pipeline::LayerSpec> specs;
//   specs.push_back(pipeline::layer<EmbeddingsImpl>("embeddings", [&] { return Embeddings(opt); })
//                       .tie("wte", "token_embedding.weight"));
//   for (int i = 0; i < n; ++i) specs.push_back(pipeline::layer<BlockImpl>("blocks." + std::to_string(i),
//                                                                          [&] { return Block(opt); }));
//   specs.push_back(pipeline::layer<LmHeadImpl>("head", [&] { return LmHead(opt); }).tie("wte", "head.weight"));
//
// Tied weights: layers that declare the same key hold one logical parameter (an
// embedding and the LM head that reuses it). Each holder keeps its own copy; the
// pipeline engine makes the copies equal at construction (from the first holder) and
// sums their gradients before every step, so they stay equal.
#pragma once

#include <torch/nn/module.h>
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace parallax::pipeline {

/// What flows between layers: one tensor, or several (a tuple).
using Activation = std::vector<torch::Tensor>;

struct TiedParameter {
  std::string key;        ///< shared by every holder, e.g. "wte"
  std::string parameter;  ///< the parameter's path inside the layer, e.g. "head.weight"
};

struct LayerSpec {
  /// For logs and messages, e.g. "blocks.3".
  std::string name;
  /// Builds the layer's module (on the CPU, with the generator already seeded).
  std::function<std::shared_ptr<torch::nn::Module>()> build;
  /// Runs the module built by `build` on an activation.
  std::function<Activation(torch::nn::Module&, const Activation&)> forward;
  std::vector<TiedParameter> tied;
  /// Where this layer's modules sit in the whole model's module tree: the prefix that
  /// path rules written for the whole model (a [tensor_parallel.plan]) see in front of
  /// the layer's own module paths, e.g. "blocks.3" (then "blocks.3.qkv"), or "" for a
  /// layer whose modules sit at the top ("token_embedding"). Default: the name.
  std::optional<std::string> model_path;

  /// The prefix path rules see for this layer's modules (see model_path).
  const std::string& path_in_model() const { return model_path ? *model_path : name; }
  /// Sets model_path.
  LayerSpec& at(std::string path) {
    model_path = std::move(path);
    return *this;
  }

  /// Declares `parameter` (a path in this layer, as named_parameters() spells it) one
  /// logical weight with every other layer's parameter tied under `key`.
  LayerSpec& tie(std::string key, std::string parameter) {
    tied.push_back({std::move(key), std::move(parameter)});
    return *this;
  }
};

/// The spec of a layer of type `ModuleImpl` made by `factory()` (returning a
/// std::shared_ptr<ModuleImpl> or its ModuleHolder). Its forward is called with the
/// activation's tensors as arguments (forward(x), forward(x, mask), ...) and may return
/// a tensor or an Activation; a forward that takes an Activation receives it whole.
template <typename ModuleImpl, typename Factory>
LayerSpec layer(std::string name, Factory factory) {
  LayerSpec spec;
  spec.name = std::move(name);
  spec.build = [factory]() -> std::shared_ptr<torch::nn::Module> {
    auto made = factory();
    if constexpr (std::is_convertible_v<decltype(made), std::shared_ptr<ModuleImpl>>) {
      return std::shared_ptr<ModuleImpl>(made);
    } else {
      return made.ptr();
    }
  };
  spec.forward = [](torch::nn::Module& module, const Activation& input) -> Activation {
    auto& impl = static_cast<ModuleImpl&>(module);
    auto wrap = [](auto&& output) -> Activation {
      if constexpr (std::is_convertible_v<decltype(output), torch::Tensor>) {
        return {std::forward<decltype(output)>(output)};
      } else {
        return Activation(std::forward<decltype(output)>(output));
      }
    };
    if constexpr (std::is_invocable_v<decltype(&ModuleImpl::forward), ModuleImpl&, const Activation&>) {
      return wrap(impl.forward(input));
    } else if constexpr (std::is_invocable_v<decltype(&ModuleImpl::forward), ModuleImpl&, const torch::Tensor&>) {
      return wrap(impl.forward(input.at(0)));
    } else {
      return wrap(impl.forward(input.at(0), input.at(1)));
    }
  };
  return spec;
}

/// Seed of layer `index` of a model seeded with `seed` (a splitmix64 mix of both).
std::uint64_t layer_seed(std::uint64_t seed, std::int64_t index);

/// Calls `build` with LibTorch's CPU generator seeded with layer_seed(seed, index),
/// then restores the generator's previous state, so what runs after construction draws
/// the same numbers however many layers this process built.
std::shared_ptr<torch::nn::Module> build_seeded(const std::function<std::shared_ptr<torch::nn::Module>()>& build,
                                                std::uint64_t seed,
                                                std::int64_t index);

/// Layers [begin, end) of `specs`, built with build_seeded, as one module whose children
/// are named by layer index ("3", "4", ...). forward() runs them in order.
class LayerSequenceImpl : public torch::nn::Module {
 public:
  LayerSequenceImpl(const std::vector<LayerSpec>& specs, std::int64_t begin, std::int64_t end, std::uint64_t seed);

  Activation forward(const Activation& input);

  std::int64_t begin() const { return begin_; }
  std::int64_t end() const { return end_; }
  /// The tied parameters of these layers: (key, tensor), in layer order.
  std::vector<std::pair<std::string, torch::Tensor>> tied_parameters() const;

 private:
  std::int64_t begin_;
  std::int64_t end_;
  std::vector<LayerSpec> specs_;  // [begin, end)
  std::vector<std::shared_ptr<torch::nn::Module>> layers_;
};
TORCH_MODULE(LayerSequence);

/// Trainable parameter elements of each layer, building one layer at a time (at most
/// one layer's parameters are held at once). For partition = "parameters".
std::vector<double> parameter_counts(const std::vector<LayerSpec>& specs, std::uint64_t seed);

/// Milliseconds of forward + backward of each layer on `inputs` passed through the
/// layers in order, building one layer at a time; the last layer's time includes
/// `loss_of_output`. The least of `repeats` runs per layer. For partition = "profile".
std::vector<double> profile_layers(const std::vector<LayerSpec>& specs,
                                   std::uint64_t seed,
                                   const Activation& inputs,
                                   const std::function<torch::Tensor(const Activation&)>& loss_of_output,
                                   int repeats = 3);

}  // namespace parallax::pipeline
