#include "parallax/tensor_parallel/regions.h"

#include <torch/csrc/autograd/custom_function.h>

#include <cstdint>

#include "parallax/core/autograd_context.h"
#include "parallax/core/error.h"

namespace parallax::tensor_parallel {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

using parallax::detail::recall;
using parallax::detail::remember;

torch::Tensor summed(const torch::Tensor& x, Communicator& tp) {
  torch::Tensor out = x.contiguous().clone();
  tp.all_reduce(out)->wait();
  return out;
}

torch::Tensor own_part(const torch::Tensor& x, Communicator& tp) {
  const std::int64_t last = x.size(-1);
  PARALLAX_CHECK(last % tp.size() == 0, UsageError, "the last dimension (", last, ") does not split over the ",
                 tp.size(), " ranks of group '", tp.name(), "'");
  return x.chunk(tp.size(), -1)[static_cast<std::size_t>(tp.rank())].contiguous();
}

// `front` with its first dimension moved back to `dim`, as a new tensor, never a view:
// callers may modify a custom Function's output in place (1.13's F::linear adds its
// bias with +=), which autograd forbids on a view created inside the Function.
torch::Tensor moved_back(const torch::Tensor& front, std::int64_t dim) {
  if (dim == 0 || dim == -front.dim()) return front;
  return front.movedim(0, dim).clone(at::MemoryFormat::Contiguous);
}

// Along `dim`: moved to the front, so the communicator's flat chunks are its slices
// (rank r's part lands at [r·n, (r+1)·n) of the dimension).
torch::Tensor gathered_along(const torch::Tensor& x, Communicator& tp, std::int64_t dim) {
  const torch::Tensor front = x.movedim(dim, 0).contiguous();
  std::vector<std::int64_t> sizes(front.sizes().begin(), front.sizes().end());
  sizes[0] *= tp.size();
  torch::Tensor out = torch::empty(sizes, front.options());
  tp.all_gather(out, front)->wait();
  return moved_back(out, dim);
}

torch::Tensor reduce_scattered_along(const torch::Tensor& x, Communicator& tp, std::int64_t dim) {
  const torch::Tensor front = x.movedim(dim, 0).contiguous();
  PARALLAX_CHECK(front.size(0) % tp.size() == 0, UsageError, "dimension ", dim, " (", front.size(0),
                 ") does not split over the ", tp.size(), " ranks of group '", tp.name(), "'");
  std::vector<std::int64_t> sizes(front.sizes().begin(), front.sizes().end());
  sizes[0] /= tp.size();
  torch::Tensor out = torch::empty(sizes, front.options());
  tp.reduce_scatter(out, front)->wait();
  return moved_back(out, dim);
}

struct GatherFromSequenceRegion : torch::autograd::Function<GatherFromSequenceRegion> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& input, Communicator* tp, std::int64_t dim) {
    remember(ctx, *tp);
    ctx->saved_data["dim"] = dim;
    return gathered_along(input, *tp, dim);
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    return {reduce_scattered_along(grads[0], recall(ctx), ctx->saved_data["dim"].toInt()), torch::Tensor(),
            torch::Tensor()};
  }
};

struct ReduceScatterToSequenceRegion : torch::autograd::Function<ReduceScatterToSequenceRegion> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& input, Communicator* tp, std::int64_t dim) {
    remember(ctx, *tp);
    ctx->saved_data["dim"] = dim;
    return reduce_scattered_along(input, *tp, dim);
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    return {gathered_along(grads[0], recall(ctx), ctx->saved_data["dim"].toInt()), torch::Tensor(), torch::Tensor()};
  }
};

struct CopyToRegion : torch::autograd::Function<CopyToRegion> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& input, Communicator* tp) {
    remember(ctx, *tp);
    return input.view_as(input);
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    return {summed(grads[0], recall(ctx)), torch::Tensor()};
  }
};

struct ReduceFromRegion : torch::autograd::Function<ReduceFromRegion> {
  static torch::Tensor forward(AutogradContext*, const torch::Tensor& input, Communicator* tp) {
    return summed(input, *tp);
  }
  static tensor_list backward(AutogradContext*, tensor_list grads) { return {grads[0], torch::Tensor()}; }
};

struct ScatterToRegion : torch::autograd::Function<ScatterToRegion> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& input, Communicator* tp) {
    remember(ctx, *tp);
    return own_part(input, *tp);
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    return {gathered_along(grads[0], recall(ctx), -1), torch::Tensor()};
  }
};

struct GatherFromRegion : torch::autograd::Function<GatherFromRegion> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& input, Communicator* tp) {
    remember(ctx, *tp);
    return gathered_along(input, *tp, -1);
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    return {own_part(grads[0], recall(ctx)), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor copy_to_region(const torch::Tensor& input, Communicator& tp) {
  return CopyToRegion::apply(input, &tp);
}
torch::Tensor reduce_from_region(const torch::Tensor& input, Communicator& tp) {
  return ReduceFromRegion::apply(input, &tp);
}
torch::Tensor scatter_to_region(const torch::Tensor& input, Communicator& tp) {
  return ScatterToRegion::apply(input, &tp);
}
torch::Tensor gather_from_region(const torch::Tensor& input, Communicator& tp) {
  return GatherFromRegion::apply(input, &tp);
}
torch::Tensor gather_from_sequence_region(const torch::Tensor& input, Communicator& tp, std::int64_t dim) {
  return GatherFromSequenceRegion::apply(input, &tp, dim);
}
torch::Tensor reduce_scatter_to_sequence_region(const torch::Tensor& input, Communicator& tp, std::int64_t dim) {
  return ReduceScatterToSequenceRegion::apply(input, &tp, dim);
}

}  // namespace parallax::tensor_parallel
