// A small decoder-only transformer (GPT) and a synthetic token stream to train it on.
//
// Model: token + position embeddings, n_layer pre-LayerNorm blocks (causal
// self-attention, GELU MLP), a final LayerNorm and an LM head (optionally tied to the
// token embedding). The same model comes in two forms built by the same code: GPT, an
// ordinary module, and layer_specs(), the n_layer + 2 layers a pipeline builds stage by
// stage. Layer i starts from LibTorch's generator seeded with (seed, i) in both forms,
// so they start identical.
// Data: each sample is a sequence whose next token is a fixed permutation of the
// current one, except with probability `noise` a uniformly random token. The
// permutation is learnable, so the loss falls from ln(vocab) towards the noise floor.
// Samples are a pure function of (seed, index): any rank can make any sample, and a
// single-process reference sees exactly the same global batch.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "parallax/expert_parallel/moe_layer.h"
#include "parallax/pipeline/layers.h"

namespace parallax {
class AppTable;
struct Config;
}  // namespace parallax

namespace gpt {

struct GPTOptions {
  std::int64_t vocab_size = 64;  ///< tokens, e.g. 64
  std::int64_t block_size = 32;  ///< sequence length, e.g. 32
  std::int64_t d_model = 64;     ///< hidden size, e.g. 64
  std::int64_t n_layer = 2;
  std::int64_t n_head = 4;  ///< must divide d_model
  std::int64_t d_ff = 0;    ///< MLP hidden size; 0 = 4 × d_model
  /// The LM head reuses the token embedding's weight. Default: false.
  bool tie_embeddings = false;
  /// Attention through torch::scaled_dot_product_attention (LibTorch 2.x), as a model
  /// unaware of Parallax writes it; under parallel.cp > 1 the engine intercepts it.
  /// Otherwise ("explicit") scores and softmax written out, or context_parallel::
  /// current()->attention(). Default: false.
  bool sdpa = false;
  /// Mixture of experts: 0 = every block has a dense MLP; otherwise every moe_every-th
  /// block (blocks moe_every − 1, 2·moe_every − 1, ...) has an expert_parallel::MoeLayer
  /// of n_experts experts of d_ff hidden units instead. Default: 0.
  std::int64_t n_experts = 0;
  std::int64_t moe_every = 1;
  /// The MoE layers' routing (top_k, router, capacity_factor, aux_loss_coef, z_loss_coef).
  parallax::expert_parallel::MoeOptions moe{1, 2};

  /// The [model] table: vocab_size, block_size, d_model, n_layer, n_head, d_ff,
  /// tie_embeddings, attention ("explicit" or "sdpa"); n_experts, moe_every, top_k,
  /// router ("softmax" or "sigmoid"), capacity_factor, aux_loss_coef, z_loss_coef.
  static GPTOptions from_table(const parallax::AppTable& table);
};

class BlockImpl : public torch::nn::Module {
 public:
  /// Block `index` (0-based), whose MLP is a MoeLayer where GPTOptions says.
  BlockImpl(const GPTOptions& options, std::int64_t index);
  torch::Tensor forward(const torch::Tensor& x);

 private:
  std::int64_t n_head_;
  bool sdpa_;
  torch::nn::LayerNorm ln1_{nullptr}, ln2_{nullptr};
  torch::nn::Linear qkv_{nullptr}, attn_proj_{nullptr}, fc_{nullptr}, mlp_proj_{nullptr};
  parallax::expert_parallel::MoeLayer moe_{nullptr};
};
TORCH_MODULE(Block);

/// Layer 0: token + position embeddings. tokens [batch, seq] int64 → [batch, seq, d_model].
class EmbeddingsImpl : public torch::nn::Module {
 public:
  explicit EmbeddingsImpl(const GPTOptions& options);
  torch::Tensor forward(const torch::Tensor& tokens);

  torch::nn::Embedding token_embedding{nullptr}, position_embedding{nullptr};
};
TORCH_MODULE(Embeddings);

/// The last layer: final LayerNorm and LM head. [batch, seq, d_model] → logits [batch, seq, vocab].
class LmHeadImpl : public torch::nn::Module {
 public:
  explicit LmHeadImpl(const GPTOptions& options);
  torch::Tensor forward(const torch::Tensor& x);
  /// With a tied head: logits through `weight` (the token embedding's) instead of head.
  torch::Tensor forward_with(const torch::Tensor& x, const torch::Tensor& weight);

  torch::nn::LayerNorm ln_f{nullptr};
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(LmHead);

/// The model as n_layer + 2 layer specs: "embeddings", "blocks.0" ..., "head". With
/// tie_embeddings, the head's weight is tied to the token embedding's (key "wte").
std::vector<parallax::pipeline::LayerSpec> layer_specs(const GPTOptions& options);

/// Next-token loss of the last layer's output against the micro-batch's targets.
torch::Tensor pipeline_loss(const parallax::pipeline::Activation& output,
                            const parallax::pipeline::Activation& targets);

class GPTImpl : public torch::nn::Module {
 public:
  /// Built from layer_specs(options), layer i seeded with (seed, i). Its parameters keep
  /// flat names: token_embedding, position_embedding, blocks.N..., ln_f, head (no head
  /// with tie_embeddings: the token embedding's weight serves both).
  explicit GPTImpl(const GPTOptions& options, std::uint64_t seed = 1234);
  /// tokens [batch, seq] int64 → logits [batch, seq, vocab]. Inside an engine's forward
  /// with parallel.cp > 1, tokens hold this rank's part of each sequence
  /// (engine.local_batch): the position embeddings take the global positions it holds and
  /// attention crosses the group (context_parallel::current()).
  torch::Tensor forward(const torch::Tensor& tokens);
  const GPTOptions& options() const { return options_; }

 private:
  GPTOptions options_;
  std::shared_ptr<EmbeddingsImpl> embeddings_;
  torch::nn::ModuleList blocks_;
  std::shared_ptr<LmHeadImpl> output_;
};
TORCH_MODULE(GPT);

/// Mean next-token cross-entropy, computed in fp32 whatever the logits' dtype.
torch::Tensor language_model_loss(const torch::Tensor& logits, const torch::Tensor& targets);

class SyntheticTokens {
 public:
  SyntheticTokens(std::int64_t vocab_size, std::int64_t block_size, std::uint64_t seed, double noise = 0.1);
  /// Samples [first, first + count): (inputs, targets), each [count, block_size] int64.
  std::pair<torch::Tensor, torch::Tensor> batch(std::int64_t first, std::int64_t count) const;
  /// The [data] table: noise (default 0.1).
  static SyntheticTokens from_table(const parallax::AppTable& table, const GPTOptions& model, std::uint64_t seed);

 private:
  std::int64_t vocab_size_;
  std::int64_t block_size_;
  std::uint64_t seed_;
  double noise_;
  std::vector<std::int64_t> successor_;
};

/// Index of the first sample of data-parallel rank `dp_rank`'s micro-batch `micro` in
/// optimizer step `step`: the global batch of step s is samples
/// [s·global, (s+1)·global), laid out micro-step-major, then by dp rank.
std::int64_t first_sample(std::int64_t step,
                          std::int64_t micro,
                          std::int64_t dp_rank,
                          std::int64_t dp,
                          std::int64_t micro_batch,
                          std::int64_t grad_accum);

/// What a trainer of this example builds from a loaded config: the [model] options, the
/// [data] stream, and the model (seeded with train.seed). At ZeRO stage 3 in fp32 the
/// model is built under parallax::zero::DeferredConstruction, so no rank ever holds all
/// of it. Call after parallax::init.
struct Example {
  GPTOptions options;
  SyntheticTokens data;
  GPT model;
};
Example build_example(const parallax::Config& config);

}  // namespace gpt
