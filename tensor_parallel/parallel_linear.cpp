#include "parallax/tensor_parallel/parallel_linear.h"

#include <torch/nn/functional/linear.h>

#include "parallax/core/error.h"
#include "parallax/tensor_parallel/regions.h"

namespace parallax::tensor_parallel {
namespace {

// This rank's `tp`-th part of `t` along `dim`, as a new leaf.
torch::Tensor part_of(const torch::Tensor& t, std::int64_t dim, Communicator& tp, const char* what) {
  PARALLAX_CHECK(t.size(dim) % tp.size() == 0, UsageError, what, " (", t.size(dim), ") does not divide by the ",
                 tp.size(), " ranks of tensor-parallel group '", tp.name(), "'");
  return t.detach().chunk(tp.size(), dim)[static_cast<std::size_t>(tp.rank())].clone();
}

}  // namespace

ColumnParallelLinearImpl::ColumnParallelLinearImpl(const torch::nn::Linear& dense, Communicator& tp, bool gather_output)
    : tp_(&tp), gather_output_(gather_output) {
  weight = register_parameter("weight", part_of(dense->weight, 0, tp, "out_features"));
  if (dense->bias.defined()) bias = register_parameter("bias", part_of(dense->bias, 0, tp, "out_features"));
}

torch::Tensor ColumnParallelLinearImpl::forward(const torch::Tensor& input) {
  torch::Tensor out = torch::nn::functional::linear(copy_to_region(input, *tp_), weight, bias);
  return gather_output_ ? gather_from_region(out, *tp_) : out;
}

RowParallelLinearImpl::RowParallelLinearImpl(const torch::nn::Linear& dense, Communicator& tp, bool input_is_parallel)
    : tp_(&tp), input_is_parallel_(input_is_parallel) {
  weight = register_parameter("weight", part_of(dense->weight, 1, tp, "in_features"));
  if (dense->bias.defined()) bias = register_parameter("bias", dense->bias.detach().clone());
}

torch::Tensor RowParallelLinearImpl::forward(const torch::Tensor& input) {
  const torch::Tensor own = input_is_parallel_ ? input : scatter_to_region(input, *tp_);
  torch::Tensor out = reduce_from_region(torch::nn::functional::linear(own, weight), *tp_);
  return bias.defined() ? out + bias : out;
}

}  // namespace parallax::tensor_parallel
