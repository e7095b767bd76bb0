#include "parallax/planner/transformer_shape.h"

#include <cstdio>
#include <tuple>

#include "parallax/core/config.h"
#include "parallax/core/error.h"

namespace parallax::planner {
namespace {

struct NamedShape {
  const char* name;
  TransformerShape shape;
};

TransformerShape shape_of(std::int64_t layers, std::int64_t hidden, std::int64_t heads, std::int64_t vocab,
                          std::int64_t seq) {
  TransformerShape s;
  s.layers = layers;
  s.hidden = hidden;
  s.heads = heads;
  s.vocab = vocab;
  s.seq = seq;
  s.dropout = true;
  return s;
}

// Published GPT-family models:
//   megatron-1.7b, megatron-1t: Narayanan et al., SC'21, "Efficient Large-Scale Language
//     Model Training on GPU Clusters", Table 1, first and last rows (vocabulary 51,200,
//     sequence 2,048 for every model of the table, section 5.1);
//   gpt3-175b: Brown et al., "Language Models are Few-Shot Learners" (2020), Table 2.1,
//     with GPT-2's 50,257 tokens padded to 51,200 as Megatron-LM pads them (divisible
//     by 128 x 8) and as Narayanan et al. ran it (Table 1, 175B row);
//   megatron-8.3b: Shoeybi et al., "Megatron-LM" (2019), Table 2 (72 layers, hidden
//     3,072, 32 heads, sequence 1,024, the vocabulary padded to 51,200, section 3).
const NamedShape kPresets[] = {
    {"megatron-1.7b", shape_of(24, 2304, 24, 51200, 2048)},
    {"megatron-8.3b", shape_of(72, 3072, 32, 51200, 1024)},
    {"gpt3-175b", shape_of(96, 12288, 96, 51200, 2048)},
    {"megatron-1t", shape_of(128, 25600, 160, 51200, 2048)},
};

std::int64_t positive(const AppTable& table, const char* key, std::int64_t fallback) {
  const std::int64_t value = table.get_int(key, fallback);
  PARALLAX_CHECK(value >= 1, ConfigError, "model.", key, " = ", value, ": must be at least 1");
  return value;
}

}  // namespace

TransformerShape TransformerShape::from_table(const AppTable& table) {
  TransformerShape s;
  s.layers = positive(table, "n_layer", s.layers);
  s.hidden = positive(table, "d_model", s.hidden);
  s.heads = positive(table, "n_head", s.heads);
  s.kv_heads = table.get_int("n_kv_head", 0);
  s.ffn_hidden = table.get_int("d_ff", 0);
  s.vocab = positive(table, "vocab_size", s.vocab);
  s.seq = positive(table, "block_size", s.seq);
  s.tied_embeddings = table.get_bool("tie_embeddings", false);
  s.dropout = table.get_bool("dropout", false);
  PARALLAX_CHECK(s.hidden % s.heads == 0, ConfigError, "model.n_head = ", s.heads, ": must divide model.d_model = ",
                 s.hidden);
  PARALLAX_CHECK(s.kv_heads >= 0 && (s.kv_heads == 0 || s.heads % s.kv_heads == 0), ConfigError,
                 "model.n_kv_head = ", s.kv_heads, ": must divide model.n_head = ", s.heads, " (0 = n_head)");
  PARALLAX_CHECK(s.ffn_hidden >= 0, ConfigError, "model.d_ff = ", s.ffn_hidden, ": must be 0 (4 x d_model) or more");
  return s;
}

TransformerShape TransformerShape::preset(const std::string& name) {
  for (const NamedShape& preset : kPresets) {
    if (name == preset.name) return preset.shape;
  }
  throw UsageError("unknown model preset '" + name + "' (known: " + preset_names() + ")");
}

std::string TransformerShape::preset_names() {
  std::string names;
  for (const NamedShape& preset : kPresets) names += (names.empty() ? "" : ", ") + std::string(preset.name);
  return names;
}

std::int64_t TransformerShape::block_parameters(int tp) const {
  const std::int64_t h = hidden;
  const std::int64_t kv = kv_width();
  const std::int64_t f = ffn_width();
  const std::int64_t split = h * (h + 2 * kv) + (h + 2 * kv)  // qkv weight and bias, by columns
                             + h * h                          // attention projection weight, by rows
                             + h * f + f                      // MLP first layer, by columns
                             + f * h;                         // MLP second layer weight, by rows
  const std::int64_t whole = 4 * h + 2 * h;                   // two LayerNorms; the row layers' biases
  return split / tp + whole;
}

std::int64_t TransformerShape::embedding_parameters(int tp) const {
  return vocab * hidden / tp + seq * hidden;
}

std::int64_t TransformerShape::head_parameters(int tp) const {
  return 2 * hidden + (tied_embeddings ? 0 : vocab * hidden / tp);
}

std::int64_t TransformerShape::parameters() const {
  return embedding_parameters() + layers * block_parameters() + head_parameters();
}

double TransformerShape::block_forward_flops(std::int64_t micro_batch, int tp) const {
  const double tokens = static_cast<double>(micro_batch) * static_cast<double>(seq);
  const double h = static_cast<double>(hidden);
  const double matmul = h * (h + 2.0 * static_cast<double>(kv_width())) + h * h + 2.0 * h * ffn_width();
  const double attention = 4.0 * tokens * static_cast<double>(seq) * h;  // the scores and the context, 2·b·s²·h each
  return (2.0 * tokens * matmul + attention) / tp;
}

double TransformerShape::head_forward_flops(std::int64_t micro_batch, int tp) const {
  return 2.0 * static_cast<double>(micro_batch) * static_cast<double>(seq) * static_cast<double>(hidden) *
         static_cast<double>(vocab) / tp;
}

double TransformerShape::model_flops(std::int64_t samples) const {
  return 3.0 * (static_cast<double>(layers) * block_forward_flops(samples) + head_forward_flops(samples));
}

std::int64_t TransformerShape::block_activation_bytes(std::int64_t micro_batch,
                                                      int element_bytes,
                                                      int tp,
                                                      bool sequence_parallel,
                                                      const ContextSplit& cp) const {
  const std::int64_t local_seq = seq / cp.degree;
  const std::int64_t sb = local_seq * micro_batch;
  const std::int64_t e = element_bytes;
  const std::int64_t mask = dropout ? 1 : 0;
  const std::int64_t kv = kv_width();
  const std::int64_t f = ffn_width();
  // Outside the tensor-parallel region (split only by sequence parallelism): the two
  // LayerNorms' inputs, the inputs of qkv and of the MLP's first layer, and the two
  // dropout masks after the projections.
  const std::int64_t outside = sb * (2 * e * hidden + e * hidden + e * hidden + 2 * mask * hidden);
  // Inside (split by tensor parallelism): Q and K, V, the softmax's output (and its
  // dropout's mask and output), the projection's input, the MLP's GeLU input and its
  // second layer's input. All-to-all holds the same bytes of Q, K, V split by heads.
  std::int64_t inside = sb * (e * (hidden + kv) + e * kv + e * hidden + 2 * e * f);
  // Where the whole sequence's scores are kept, so is their causal mask: one byte per
  // query-key pair, shared by the heads and the batch (unfused attention, as
  // examples/gpt's and all-to-all's).
  std::int64_t causal_mask = seq * seq;
  if (cp.degree == 1) {
    inside += micro_batch * heads * seq * seq * (e + mask * (1 + e));
  } else if (cp.all_to_all && !cp.fused) {
    inside += micro_batch * (heads / cp.degree) * seq * seq * (e + mask * (1 + e));
  } else {
    // The ring (and a fused kernel) keeps no scores: its output beside the projection's
    // input, and the log-sum-exp of each query row in fp32, from which backward
    // recomputes them.
    inside += sb * e * hidden + micro_batch * heads * local_seq * 4;
    causal_mask = 0;
  }
  return (sequence_parallel ? outside / tp : outside) + inside / tp + causal_mask;
}

std::int64_t TransformerShape::block_checkpoint_bytes(std::int64_t micro_batch,
                                                      int element_bytes,
                                                      int tp,
                                                      bool sequence_parallel,
                                                      int cp) const {
  const std::int64_t input = seq / cp * micro_batch * hidden * element_bytes;
  return sequence_parallel ? input / tp : input;
}

std::int64_t TransformerShape::head_activation_bytes(std::int64_t micro_batch, int tp, int cp) const {
  return 2 * 4 * micro_batch * (seq / cp) * vocab / tp;
}

bool TransformerShape::same_sizes(const TransformerShape& o) const {
  return std::tie(layers, hidden, heads, kv_heads, ffn_hidden, vocab, seq, tied_embeddings, dropout) ==
         std::tie(o.layers, o.hidden, o.heads, o.kv_heads, o.ffn_hidden, o.vocab, o.seq, o.tied_embeddings, o.dropout);
}

std::string TransformerShape::describe() const {
  char text[200];
  std::snprintf(text, sizeof(text), "%lld layers, hidden %lld, %lld heads%s, vocabulary %lld, sequence %lld: %.3g parameters",
                static_cast<long long>(layers), static_cast<long long>(hidden), static_cast<long long>(heads),
                kv_heads > 0 && kv_heads != heads ? (" (" + std::to_string(kv_heads) + " for keys and values)").c_str()
                                                  : "",
                static_cast<long long>(vocab), static_cast<long long>(seq), static_cast<double>(parameters()));
  return text;
}

}  // namespace parallax::planner
