#include "parallax/context_parallel/sdpa_interception.h"

#include <torch/version.h>

#include <ATen/core/stack.h>

#include <string>

#include "parallax/context_parallel/context_parallel.h"
#include "parallax/core/error.h"

namespace parallax::context_parallel {
#if TORCH_VERSION_MAJOR >= 2
namespace {

constexpr interception::Layer kLayer = interception::Layer::kAttention;
constexpr const char* kOperator = "aten::scaled_dot_product_attention";

struct Intercepting final : interception::ScopeState {
  explicit Intercepting(const ContextParallel& handle) : handle(&handle) {}
  const ContextParallel* handle;
};

// One call's arguments, read by name from the operator's schema.
struct SdpaCall {
  torch::Tensor query, key, value;
  bool causal = false;
  double scale = 0;  ///< 0: the default, 1/√head_dim
  bool grouped = false;
};

SdpaCall read_call(const c10::FunctionSchema& schema, const torch::jit::Stack& stack, const ContextParallel& cp) {
  const auto& arguments = schema.arguments();
  const std::size_t first = stack.size() - arguments.size();
  SdpaCall call;
  for (std::size_t i = 0; i < arguments.size(); ++i) {
    const std::string& name = arguments[i].name();
    const c10::IValue& value = stack[first + i];
    if (name == "query") {
      call.query = value.toTensor();
    } else if (name == "key") {
      call.key = value.toTensor();
    } else if (name == "value") {
      call.value = value.toTensor();
    } else if (name == "attn_mask") {
      PARALLAX_CHECK(value.isNone(), UsageError, "context parallelism (cp = ", cp.size(),
                     ") runs scaled_dot_product_attention over the cp group, but this call passes an attn_mask: "
                     "a mask's rows and columns would have to follow the sequence split. Pass is_causal = true for "
                     "a causal mask, or call context_parallel::current()->attention() from the model");
    } else if (name == "dropout_p") {
      PARALLAX_CHECK(value.toDouble() == 0.0, UsageError, "context parallelism (cp = ", cp.size(),
                     ") runs scaled_dot_product_attention over the cp group, but this call asks for dropout_p = ",
                     value.toDouble(), ": attention dropout is not split over the group; pass 0");
    } else if (name == "is_causal") {
      call.causal = value.toBool();
    } else if (name == "scale") {
      call.scale = value.isNone() ? 0.0 : value.toDouble();
    } else if (name == "enable_gqa") {
      call.grouped = value.toBool();
    } else {
      PARALLAX_CHECK(false, UsageError, "context parallelism cannot run this LibTorch's ", schema,
                     ": its argument '", name, "' is not one Parallax knows");
    }
  }
  PARALLAX_CHECK(call.query.dim() == 4 && call.key.dim() == 4 && call.value.dim() == 4, UsageError,
                 "context parallelism (cp = ", cp.size(), ") runs scaled_dot_product_attention on [batch, heads, "
                 "positions, head_dim] tensors; this call passes query ", call.query.sizes(), ", key ",
                 call.key.sizes(), ", value ", call.value.sizes());
  PARALLAX_CHECK(call.grouped || call.key.size(1) == call.query.size(1), UsageError,
                 "scaled_dot_product_attention: ", call.key.size(1), " key/value heads for ", call.query.size(1),
                 " query heads need enable_gqa = true");
  return call;
}

void attend(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  const auto* state = dynamic_cast<const Intercepting*>(interception::current(kLayer));
  if (state == nullptr) {
    interception::call_below(kLayer, op, keys, stack);
    return;
  }
  const SdpaCall call = read_call(op.schema(), *stack, *state->handle);
  torch::jit::drop(*stack, op.schema().arguments().size());
  interception::Paused paused(kLayer);  // the ring's and all-to-all's own operators pass
  torch::jit::push(*stack, state->handle->attention(call.query, call.key, call.value, call.causal, call.scale));
}

}  // namespace

std::unique_ptr<interception::Scope> intercept_sdpa(const ContextParallel& handle) {
  interception::claim(kLayer, &attend, {kOperator});
  return std::make_unique<interception::Scope>(kLayer, std::make_shared<Intercepting>(handle));
}
#else
std::unique_ptr<interception::Scope> intercept_sdpa(const ContextParallel& /*handle*/) {
  return nullptr;  // LibTorch 1.13 has no scaled_dot_product_attention
}
#endif

}  // namespace parallax::context_parallel
