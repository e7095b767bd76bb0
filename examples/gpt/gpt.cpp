#include "gpt.h"

#include <torch/version.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>

#include "parallax/context_parallel/context_parallel.h"
#include "parallax/core/config.h"
#include "parallax/core/error.h"
#include "parallax/zero/deferred_construction.h"

namespace gpt {
namespace {

// splitmix64: a portable, stateless hash, so every rank and platform makes the same data.
std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

double unit(std::uint64_t h) {
  return static_cast<double>(h >> 11) * (1.0 / 9007199254740992.0);
}

}  // namespace

GPTOptions GPTOptions::from_table(const parallax::AppTable& table) {
  table.expect_only({"vocab_size", "block_size", "d_model", "n_layer", "n_head", "d_ff", "tie_embeddings", "attention",
                     "n_experts", "moe_every", "top_k", "router", "capacity_factor", "aux_loss_coef", "z_loss_coef"});
  GPTOptions o;
  o.vocab_size = table.get_int("vocab_size", o.vocab_size);
  o.block_size = table.get_int("block_size", o.block_size);
  o.d_model = table.get_int("d_model", o.d_model);
  o.n_layer = table.get_int("n_layer", o.n_layer);
  o.n_head = table.get_int("n_head", o.n_head);
  o.d_ff = table.get_int("d_ff", o.d_ff);
  o.tie_embeddings = table.get_bool("tie_embeddings", o.tie_embeddings);
  const std::string attention = table.get_string("attention", "explicit");
  PARALLAX_CHECK(attention == "explicit" || attention == "sdpa", ConfigError, "model.attention = \"", attention,
                 "\": allowed are \"explicit\" and \"sdpa\"");
  o.sdpa = attention == "sdpa";
  PARALLAX_CHECK(!o.sdpa || TORCH_VERSION_MAJOR >= 2, ConfigError, "model.attention = \"sdpa\" needs LibTorch 2.x ",
                 "(scaled_dot_product_attention); this build has LibTorch ", TORCH_VERSION, ": use \"explicit\"");
  PARALLAX_CHECK(o.vocab_size >= 2 && o.block_size >= 1 && o.d_model >= 1 && o.n_layer >= 1 && o.n_head >= 1,
                 ConfigError, "[model]: vocab_size >= 2, block_size, d_model, n_layer, n_head >= 1 expected");
  PARALLAX_CHECK(o.d_model % o.n_head == 0, ConfigError, "model.n_head = ", o.n_head,
                 " must divide model.d_model = ", o.d_model);
  o.n_experts = table.get_int("n_experts", o.n_experts);
  o.moe_every = table.get_int("moe_every", o.moe_every);
  const std::int64_t top_k = table.get_int("top_k", 2);
  PARALLAX_CHECK(o.n_experts >= 0 && o.moe_every >= 1, ConfigError, "model.n_experts = ", o.n_experts,
                 " (0: no MoE) and model.moe_every = ", o.moe_every, " (>= 1) expected");
  PARALLAX_CHECK(o.n_experts == 0 || (top_k >= 1 && top_k <= o.n_experts), ConfigError, "model.top_k = ", top_k,
                 ": expected 1..model.n_experts (", o.n_experts, ")");
  const std::string router = table.get_string("router", "softmax");
  PARALLAX_CHECK(router == "softmax" || router == "sigmoid", ConfigError, "model.router = \"", router,
                 "\": allowed are \"softmax\" and \"sigmoid\"");
  o.moe = parallax::expert_parallel::MoeOptions(std::max<std::int64_t>(o.n_experts, 1), top_k)
              .score(router == "sigmoid" ? parallax::expert_parallel::RouterScore::kSigmoid
                                         : parallax::expert_parallel::RouterScore::kSoftmax)
              .capacity_factor(table.get_double("capacity_factor", 0.0))
              .aux_loss_coef(table.get_double("aux_loss_coef", 0.01))
              .z_loss_coef(table.get_double("z_loss_coef", 0.0));
  PARALLAX_CHECK(o.moe.capacity_factor() >= 0 && o.moe.aux_loss_coef() >= 0 && o.moe.z_loss_coef() >= 0, ConfigError,
                 "model.capacity_factor (", o.moe.capacity_factor(), "), aux_loss_coef (", o.moe.aux_loss_coef(),
                 ") and z_loss_coef (", o.moe.z_loss_coef(), ") must be >= 0");
  return o;
}

BlockImpl::BlockImpl(const GPTOptions& o, std::int64_t index) : n_head_(o.n_head), sdpa_(o.sdpa) {
  const std::int64_t d_ff = o.d_ff > 0 ? o.d_ff : 4 * o.d_model;
  ln1_ = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({o.d_model})));
  qkv_ = register_module("qkv", torch::nn::Linear(o.d_model, 3 * o.d_model));
  attn_proj_ = register_module("attn_proj", torch::nn::Linear(o.d_model, o.d_model));
  ln2_ = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({o.d_model})));
  if (o.n_experts > 0 && (index + 1) % o.moe_every == 0) {
    moe_ = register_module("moe", parallax::expert_parallel::MoeLayer(o.d_model, d_ff, o.moe));
  } else {
    fc_ = register_module("fc", torch::nn::Linear(o.d_model, d_ff));
    mlp_proj_ = register_module("mlp_proj", torch::nn::Linear(d_ff, o.d_model));
  }
}

// Sizes come from the projections' outputs, not from the options: a tensor-parallel
// plan gives qkv a rank's share of the heads, and sequence parallelism gives x a share
// of the sequence that qkv's input gathers back.
torch::Tensor BlockImpl::forward(const torch::Tensor& x) {
  const auto head_dim = x.size(-1) / n_head_;
  auto qkv = qkv_->forward(ln1_->forward(x)).chunk(3, /*dim=*/-1);
  const auto batch = qkv[0].size(0), seq = qkv[0].size(1);
  auto heads = [&](const torch::Tensor& t) { return t.view({batch, seq, -1, head_dim}).transpose(1, 2); };
  auto q = heads(qkv[0]), k = heads(qkv[1]), v = heads(qkv[2]);
  torch::Tensor attended;
  if (sdpa_) {
#if TORCH_VERSION_MAJOR >= 2
    attended = at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0, /*is_causal=*/true);
#endif
  } else if (const auto* cp = parallax::context_parallel::current()) {
    attended = cp->attention(q, k, v);  // x holds this rank's positions of each sequence
  } else {
    auto scores = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(head_dim));
    auto future = torch::ones({seq, seq}, scores.options().dtype(torch::kBool)).triu(1);
    attended = torch::matmul(torch::softmax(scores.masked_fill(future, -INFINITY), -1), v);
  }
  auto y = attended.transpose(1, 2).reshape({batch, seq, -1});
  auto h = x + attn_proj_->forward(y);
  if (moe_) return h + moe_->forward(ln2_->forward(h));
  return h + mlp_proj_->forward(torch::gelu(fc_->forward(ln2_->forward(h))));
}

namespace {

// GPT-2 style small init keeps early losses near ln(vocab).
template <typename Holder>
Holder initialized(Holder layer) {
  torch::NoGradGuard no_grad;
  for (auto& p : layer->parameters()) {
    if (p.dim() >= 2) p.normal_(0.0, 0.02);
  }
  return layer;
}

}  // namespace

EmbeddingsImpl::EmbeddingsImpl(const GPTOptions& o) {
  token_embedding = register_module("token_embedding", torch::nn::Embedding(o.vocab_size, o.d_model));
  position_embedding = register_module("position_embedding", torch::nn::Embedding(o.block_size, o.d_model));
}

torch::Tensor EmbeddingsImpl::forward(const torch::Tensor& tokens) {
  const auto* cp = parallax::context_parallel::current();
  auto positions = cp ? cp->positions(tokens.size(1)).to(tokens.device())
                      : torch::arange(tokens.size(1), tokens.options().dtype(torch::kLong));
  return token_embedding->forward(tokens) + position_embedding->forward(positions).unsqueeze(0);
}

LmHeadImpl::LmHeadImpl(const GPTOptions& o) {
  ln_f = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({o.d_model})));
  head = register_module("head", torch::nn::Linear(torch::nn::LinearOptions(o.d_model, o.vocab_size).bias(false)));
}

torch::Tensor LmHeadImpl::forward(const torch::Tensor& x) {
  return head->forward(ln_f->forward(x));
}

torch::Tensor LmHeadImpl::forward_with(const torch::Tensor& x, const torch::Tensor& weight) {
  return torch::nn::functional::linear(ln_f->forward(x), weight);
}

std::vector<parallax::pipeline::LayerSpec> layer_specs(const GPTOptions& o) {
  namespace pl = parallax::pipeline;
  std::vector<pl::LayerSpec> specs;
  // The plain GPT registers the embeddings' and the head's modules at its top level.
  specs.push_back(pl::layer<EmbeddingsImpl>("embeddings", [o] { return initialized(Embeddings(o)); }).at(""));
  if (o.tie_embeddings) specs.back().tie("wte", "token_embedding.weight");
  for (std::int64_t i = 0; i < o.n_layer; ++i) {
    specs.push_back(pl::layer<BlockImpl>("blocks." + std::to_string(i), [o, i] { return initialized(Block(o, i)); }));
  }
  specs.push_back(pl::layer<LmHeadImpl>("head", [o] { return initialized(LmHead(o)); }).at(""));
  if (o.tie_embeddings) specs.back().tie("wte", "head.weight");
  return specs;
}

torch::Tensor pipeline_loss(const parallax::pipeline::Activation& output,
                            const parallax::pipeline::Activation& targets) {
  return language_model_loss(output.at(0), targets.at(0));
}

GPTImpl::GPTImpl(const GPTOptions& o, std::uint64_t seed) : options_(o) {
  const std::vector<parallax::pipeline::LayerSpec> specs = layer_specs(o);
  auto build = [&](std::size_t i) {
    return parallax::pipeline::build_seeded(specs[i].build, seed, static_cast<std::int64_t>(i));
  };
  embeddings_ = std::dynamic_pointer_cast<EmbeddingsImpl>(build(0));
  register_module("token_embedding", embeddings_->token_embedding);
  register_module("position_embedding", embeddings_->position_embedding);
  blocks_ = register_module("blocks", torch::nn::ModuleList());
  for (std::int64_t i = 0; i < o.n_layer; ++i) blocks_->push_back(build(static_cast<std::size_t>(i) + 1));
  output_ = std::dynamic_pointer_cast<LmHeadImpl>(build(specs.size() - 1));
  register_module("ln_f", output_->ln_f);
  if (!o.tie_embeddings) register_module("head", output_->head);
}

torch::Tensor GPTImpl::forward(const torch::Tensor& tokens) {
  auto x = embeddings_->forward(tokens);
  for (const auto& block : *blocks_) x = block->as<BlockImpl>()->forward(x);
  if (options_.tie_embeddings) return output_->forward_with(x, embeddings_->token_embedding->weight);
  return output_->forward(x);
}

torch::Tensor language_model_loss(const torch::Tensor& logits, const torch::Tensor& targets) {
  const auto vocab = logits.size(-1);
  return torch::nn::functional::cross_entropy(logits.reshape({-1, vocab}).to(torch::kFloat32), targets.reshape({-1}));
}

SyntheticTokens::SyntheticTokens(std::int64_t vocab_size, std::int64_t block_size, std::uint64_t seed, double noise)
    : vocab_size_(vocab_size), block_size_(block_size), seed_(seed), noise_(noise), successor_(vocab_size) {
  // A fixed random permutation of the vocabulary (Fisher–Yates on the portable hash).
  for (std::int64_t i = 0; i < vocab_size; ++i) successor_[i] = i;
  for (std::int64_t i = vocab_size - 1; i > 0; --i) {
    const auto j = static_cast<std::int64_t>(mix(seed ^ (0x5eedULL + i)) % static_cast<std::uint64_t>(i + 1));
    std::swap(successor_[i], successor_[j]);
  }
}

std::pair<torch::Tensor, torch::Tensor> SyntheticTokens::batch(std::int64_t first, std::int64_t count) const {
  auto tokens = torch::empty({count, block_size_ + 1}, torch::kLong);
  auto* out = tokens.data_ptr<std::int64_t>();
  for (std::int64_t s = 0; s < count; ++s) {
    const std::uint64_t sample = mix(seed_ ^ mix(static_cast<std::uint64_t>(first + s)));
    std::int64_t token = static_cast<std::int64_t>(sample % static_cast<std::uint64_t>(vocab_size_));
    for (std::int64_t t = 0; t <= block_size_; ++t) {
      out[s * (block_size_ + 1) + t] = token;
      const std::uint64_t h = mix(sample + static_cast<std::uint64_t>(t) + 1);
      token = unit(h) < noise_ ? static_cast<std::int64_t>(mix(h) % static_cast<std::uint64_t>(vocab_size_))
                               : successor_[token];
    }
  }
  return {tokens.narrow(1, 0, block_size_).contiguous(), tokens.narrow(1, 1, block_size_).contiguous()};
}

SyntheticTokens SyntheticTokens::from_table(const parallax::AppTable& table,
                                            const GPTOptions& model,
                                            std::uint64_t seed) {
  table.expect_only({"noise"});
  const double noise = table.get_double("noise", 0.1);
  PARALLAX_CHECK(noise >= 0.0 && noise <= 1.0, ConfigError, "data.noise = ", noise, ": expected 0..1");
  return SyntheticTokens(model.vocab_size, model.block_size, seed, noise);
}

std::int64_t first_sample(std::int64_t step,
                          std::int64_t micro,
                          std::int64_t dp_rank,
                          std::int64_t dp,
                          std::int64_t micro_batch,
                          std::int64_t grad_accum) {
  const std::int64_t global = micro_batch * grad_accum * dp;
  return step * global + (micro * dp + dp_rank) * micro_batch;
}

Example build_example(const parallax::Config& config) {
  const auto options = GPTOptions::from_table(config.app_table("model"));
  auto data = config.app.count("data")
                  ? SyntheticTokens::from_table(config.app_table("data"), options, config.train.seed)
                  : SyntheticTokens(options.vocab_size, options.block_size, config.train.seed);
  // Each parameter's data is recorded and freed as construction goes, and given back
  // unit by unit while the engine shards it.
  std::optional<parallax::zero::DeferredConstruction> deferred;
  if (config.zero.stage == 3 && config.precision.dtype == parallax::Dtype::kFp32) deferred.emplace();
  GPT model(options, static_cast<std::uint64_t>(config.train.seed));
  deferred.reset();
  return Example{options, std::move(data), std::move(model)};
}

}  // namespace gpt
