#include "parallax/tensor_parallel/parallelize.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/nn/functional/embedding.h>
#include <torch/nn/functional/linear.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>

#include <functional>
#include <map>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include "parallax/core/config_loader.h"
#include "parallax/core/error.h"
#include "parallax/core/operator_interception.h"
#include "parallax/core/tensor_cut.h"
#include "parallax/tensor_parallel/parallel_blocks.h"
#include "parallax/tensor_parallel/parallel_linear.h"
#include "parallax/tensor_parallel/regions.h"
#include "parallax/tensor_parallel/vocab_parallel.h"

namespace parallax::tensor_parallel {
namespace {

constexpr interception::Layer kLayer = interception::Layer::kTensorParallel;

// One planned module: what the operators that use its weight become.
struct PlannedLayer {
  std::string path;
  torch::Tensor weight;  ///< the module's parameter (its storage identifies the uses)
  TpStyle style = TpStyle::kReplicate;
  Communicator* tp = nullptr;
  bool sequence_parallel = false;
  std::int64_t sequence_dim = -2;
  bool gather_output = false;
  std::int64_t local_in = 0;    ///< row: this rank's input features
  VocabRange vocabulary;        ///< vocab styles: this rank's rows
  std::int64_t vocab_size = 0;  ///< vocab_output: the real vocabulary, for gather_output
};

// (Weight storage, offset) → its planned layer: a use may be the weight or a view of it
// (weight.t()), and ZeRO may have moved the weight into a flat buffer shared with other
// parameters. One per ParallelizedModel; its scopes lend it to the handler.
class PlannedWeights {
 public:
  /// Registers `layer` under its weight's current place, replacing a stale entry.
  void key(const PlannedLayer* layer) {
    const Place place = place_of(layer->weight);
    std::lock_guard<std::mutex> lock(mutex_);
    auto found = places_.find(layer);
    if (found != places_.end()) {
      if (found->second == place) return;
      // The old place may already hold another layer: freed storage is reused.
      const auto old = layers_.find(found->second);
      if (old != layers_.end() && old->second == layer) layers_.erase(old);
    }
    places_[layer] = place;
    layers_[place] = layer;
  }
  void remove(const PlannedLayer* layer) {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto found = places_.find(layer);
    if (found == places_.end()) return;
    const auto entry = layers_.find(found->second);
    if (entry != layers_.end() && entry->second == layer) layers_.erase(entry);
    places_.erase(found);
  }
  /// The layer whose weight `value` is (or views whole).
  const PlannedLayer* find(const c10::IValue& value) const {
    if (!value.isTensor() || !value.toTensor().has_storage()) return nullptr;
    const torch::Tensor& tensor = value.toTensor();
    std::lock_guard<std::mutex> lock(mutex_);
    const auto found = layers_.find(place_of(tensor));
    if (found == layers_.end() || found->second->weight.numel() != tensor.numel()) return nullptr;
    return found->second;
  }

 private:
  using Place = std::pair<const c10::StorageImpl*, std::int64_t>;
  struct PlaceHash {
    std::size_t operator()(const Place& p) const {
      return std::hash<const void*>()(p.first) ^ (std::hash<std::int64_t>()(p.second) * 31);
    }
  };
  static Place place_of(const torch::Tensor& t) { return {t.storage().unsafeGetStorageImpl(), t.storage_offset()}; }

  mutable std::mutex mutex_;
  std::unordered_map<Place, const PlannedLayer*, PlaceHash> layers_;
  std::unordered_map<const PlannedLayer*, Place> places_;
};

// What a Scope lends the handler: its model's weights and its enclosing scopes'.
using RewriteState = interception::StackedState<const PlannedWeights>;

torch::Tensor entering_region(const PlannedLayer& layer, const torch::Tensor& input) {
  return layer.sequence_parallel ? gather_from_sequence_region(input, *layer.tp, layer.sequence_dim)
                                 : copy_to_region(input, *layer.tp);
}

torch::Tensor leaving_region(const PlannedLayer& layer, const torch::Tensor& partial) {
  return layer.sequence_parallel ? reduce_scatter_to_sequence_region(partial, *layer.tp, layer.sequence_dim)
                                 : reduce_from_region(partial, *layer.tp);
}

// `multiply` is the local product input · weightᵀ; `b` (may be undefined) is added
// where the layer's bias belongs: to the local output of a column layer (its part of
// the bias), to the gathered output (the whole bias), after the sum of a row layer.
torch::Tensor parallel_linear(const PlannedLayer& layer,
                              const torch::Tensor& input,
                              const std::function<torch::Tensor(const torch::Tensor&)>& multiply,
                              const torch::Tensor& b) {
  switch (layer.style) {
    case TpStyle::kColumn:
    case TpStyle::kVocabOutput: {
      torch::Tensor out = multiply(entering_region(layer, input));
      if (layer.gather_output) {
        out = gather_from_region(out, *layer.tp);
        if (layer.style == TpStyle::kVocabOutput) out = out.narrow(-1, 0, layer.vocab_size);
      }
      return b.defined() ? out + b : out;
    }
    case TpStyle::kRow: {
      torch::Tensor own = input;
      if (input.size(-1) != layer.local_in) {
        PARALLAX_CHECK(input.size(-1) == layer.local_in * layer.tp->size(), UsageError, layer.path,
                       " (row-parallel) got an input of ", input.size(-1), " features; expected this rank's ",
                       layer.local_in, " or all ", layer.local_in * layer.tp->size());
        own = scatter_to_region(input, *layer.tp);
      }
      torch::Tensor out = leaving_region(layer, multiply(own));
      return b.defined() ? out + b : out;
    }
    default:
      throw InternalError(layer.path + ": no parallel linear for style " + to_string(layer.style));
  }
}

torch::Tensor parallel_embedding(const PlannedLayer& layer, const torch::Tensor& weight, const torch::Tensor& ids) {
  if (layer.style == TpStyle::kVocabEmbedding)
    return leaving_region(layer, embed_vocab_part(ids, weight, layer.vocabulary));
  PARALLAX_CHECK(layer.style == TpStyle::kReplicate, UsageError, "the weight of ", layer.path, " (style ",
                 to_string(layer.style), ") is used by aten::embedding; only an Embedding's own weight can be");
  // A replicated embedding under sequence parallelism: its output joins the split stream.
  const torch::Tensor whole = torch::nn::functional::embedding(ids, weight);
  const std::int64_t dim = whole.dim() + layer.sequence_dim;
  PARALLAX_CHECK(dim >= 0 && whole.size(dim) % layer.tp->size() == 0, UsageError, layer.path, ": its output ",
                 whole.sizes(), " has no sequence dimension ", layer.sequence_dim,
                 " that splits over tp = ", layer.tp->size());
  const std::int64_t part = whole.size(dim) / layer.tp->size();
  return whole.narrow(dim, layer.tp->rank() * part, part);
}

// The operators through which torch::nn::Linear and Embedding use their weights:
// LibTorch 2.x's F::linear calls aten::linear; 1.13's calls aten::addmm(bias, x, wᵀ)
// for a 2-D input with bias, else aten::matmul(x, wᵀ) and then adds the bias itself.
enum class WeightUse { kNone, kLinear, kAddmm, kMatmul, kEmbedding };

struct Use {
  WeightUse kind = WeightUse::kNone;
  std::size_t arguments = 0;
  std::size_t weight = 0;  ///< the weight's argument index
};

Use use_of(const c10::OperatorName& name) {
  if (!name.overload_name.empty()) return {};
  if (name.name == "aten::linear") return {WeightUse::kLinear, 3, 1};        // (input, weight, bias?)
  if (name.name == "aten::addmm") return {WeightUse::kAddmm, 5, 2};          // (bias, input, wᵀ, beta, alpha)
  if (name.name == "aten::matmul") return {WeightUse::kMatmul, 2, 1};        // (input, wᵀ)
  if (name.name == "aten::embedding") return {WeightUse::kEmbedding, 5, 0};  // (weight, ids, padding_idx, ...)
  return {};
}

torch::Tensor run_parallel(const Use& use, const PlannedLayer& layer, const torch::jit::Stack& stack) {
  namespace F = torch::nn::functional;
  const std::size_t first = stack.size() - use.arguments;
  auto argument = [&](std::size_t i) -> const c10::IValue& { return stack[first + i]; };
  switch (use.kind) {
    case WeightUse::kLinear: {
      const torch::Tensor weight = argument(1).toTensor();
      const auto bias = argument(2).toOptional<at::Tensor>();
      return parallel_linear(
          layer, argument(0).toTensor(), [&weight](const torch::Tensor& x) { return F::linear(x, weight); },
          bias.has_value() ? *bias : torch::Tensor());
    }
    case WeightUse::kAddmm: {
      PARALLAX_CHECK(argument(3).toScalar().toDouble() == 1.0 && argument(4).toScalar().toDouble() == 1.0, UsageError,
                     layer.path, ": its weight is used by addmm with beta/alpha other than 1, not as a Linear layer");
      const torch::Tensor transposed = argument(2).toTensor();
      return parallel_linear(
          layer, argument(1).toTensor(), [&transposed](const torch::Tensor& x) { return torch::mm(x, transposed); },
          argument(0).toTensor());
    }
    case WeightUse::kMatmul: {
      const torch::Tensor transposed = argument(1).toTensor();
      return parallel_linear(
          layer, argument(0).toTensor(), [&transposed](const torch::Tensor& x) { return torch::matmul(x, transposed); },
          torch::Tensor());
    }
    case WeightUse::kEmbedding:
      PARALLAX_CHECK(argument(2).toInt() < 0 && !argument(4).toBool(), UsageError, layer.path,
                     ": a planned embedding takes no padding_idx and is not sparse");
      return parallel_embedding(layer, argument(0).toTensor(), argument(1).toTensor());
    case WeightUse::kNone:
      break;
  }
  throw InternalError("no parallel version of this operator");
}

void rewrite(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  const Use use = use_of(op.operator_name());
  const PlannedLayer* layer = nullptr;
  const RewriteState* scope = RewriteState::open(kLayer);
  if (use.kind != WeightUse::kNone && scope != nullptr) {
    const c10::IValue& weight = (*stack)[stack->size() - use.arguments + use.weight];
    for (const auto& weights : scope->registries()) {
      if ((layer = weights->find(weight)) != nullptr) break;
    }
  }
  // A replicated layer changes only its embedding (under sequence parallelism).
  if (layer == nullptr || (layer->style == TpStyle::kReplicate && use.kind != WeightUse::kEmbedding)) {
    interception::call_below(kLayer, op, keys, stack);
    return;
  }
  interception::Paused paused(kLayer);
  torch::Tensor out = run_parallel(use, *layer, *stack);
  torch::jit::drop(*stack, use.arguments);
  torch::jit::push(*stack, std::move(out));
}

// `*` matches any run of characters other than '.'.
bool glob_matches(const char* pattern, const char* path) {
  if (*pattern == '\0') return *path == '\0';
  if (*pattern == '*') {
    for (const char* p = path;; ++p) {
      if (glob_matches(pattern + 1, p)) return true;
      if (*p == '\0' || *p == '.') return false;
    }
  }
  return *pattern == *path && glob_matches(pattern + 1, path + 1);
}

std::string rule_name(const TpPlanRule& rule) {
  return "tensor_parallel.plan.\"" + rule.pattern + "\"" + rule.position;
}

/// How a split parameter was cut from its dense tensor, per parameter.
using Cuts = std::unordered_map<const c10::TensorImpl*, ParallelizedModel::Split>;

}  // namespace

struct ParallelizedModel::State {
  Communicator* tp = nullptr;
  bool planned = false;
  std::vector<std::unique_ptr<PlannedLayer>> layers;
  std::shared_ptr<PlannedWeights> weights = std::make_shared<PlannedWeights>();
  std::unordered_map<const c10::TensorImpl*, std::int64_t> copies;  ///< absent: tp (replicated)
  /// A split parameter's cut: its dense tensor (or state of that shape) → this rank's part.
  Cuts cuts;
  /// Replicated biases added after a gathered output: complete gradients even under
  /// sequence parallelism.
  std::unordered_set<const c10::TensorImpl*> whole_gradients;
  std::vector<torch::Tensor> partial;
  std::int64_t output_vocabulary = 0;
  std::vector<bool> rules_matched;  ///< per plan rule
  std::vector<std::string> description;

  ~State() {
    // A scope still open elsewhere may keep the weights: they must no longer name our layers.
    for (const auto& layer : layers) weights->remove(layer.get());
  }
};

namespace {

using ModulePtr = std::shared_ptr<torch::nn::Module>;

// Checks that `features` (per part) split over tp without cutting a head.
void check_split(const std::string& what,
                 const TpPlanRule& rule,
                 const std::string& path,
                 std::int64_t features,
                 const Communicator& tp) {
  PARALLAX_CHECK(features % rule.parts == 0, ConfigError, rule_name(rule), ": ", path, " has ", features, " ", what,
                 ", which do not form parts = ", rule.parts, " equal blocks");
  const std::int64_t block = features / rule.parts;
  PARALLAX_CHECK(block % tp.size() == 0, ConfigError, rule_name(rule), ": ", path, " has ", block, " ", what,
                 rule.parts > 1 ? " per part" : "", ", which do not divide by parallel.tp = ", tp.size());
  if (rule.heads > 0) {
    PARALLAX_CHECK(block % rule.heads == 0, ConfigError, rule_name(rule), ": ", path, " has ", block, " ", what,
                   rule.parts > 1 ? " per part" : "", ", which do not form heads = ", rule.heads, " equal heads");
    PARALLAX_CHECK(rule.heads % tp.size() == 0, ConfigError, rule_name(rule), ": ", path, "'s ", rule.heads,
                   " attention heads do not divide by parallel.tp = ", tp.size(),
                   "; choose a tp that divides the head count");
  }
}

// Replaces `parameter`'s data by this rank's part and remembers the cut (part_of).
void cut_in_place(Cuts& cuts, torch::Tensor& parameter, TensorCut how, const Communicator& tp) {
  ParallelizedModel::Split split{how, parameter.sizes().vec(), tp.rank(), tp.size()};
  parameter.set_data(cut(parameter.detach(), how, tp.rank(), tp.size()));
  cuts[parameter.unsafeGetTensorImpl()] = std::move(split);
}

}  // namespace

ParallelizedModel::ParallelizedModel(torch::nn::Module& model,
                                     const TensorParallelOptions& options,
                                     Communicator& tp,
                                     const ParallelizeOptions& how)
    : state_(std::make_unique<State>()) {
  State& s = *state_;
  s.tp = &tp;
  s.planned = !options.plan.empty();
  if (s.planned) interception::claim(kLayer, &rewrite);
  const auto modules = model.named_modules("", /*include_self=*/false);

  if (!s.planned) {
    PARALLAX_CHECK(!options.sequence_parallel, ConfigError,
                   "tensor_parallel.sequence_parallel = true needs a [tensor_parallel.plan]: the hand-written "
                   "tensor_parallel/ layers are not sequence-parallel in this build");
    std::size_t found = 0;
    for (const auto& item : modules) {
      torch::nn::Module* module = item.value().get();
      auto hold = [&s](const torch::Tensor& t, std::int64_t copies) {
        if (t.defined()) s.copies[t.unsafeGetTensorImpl()] = copies;
      };
      if (auto* column = dynamic_cast<ColumnParallelLinearImpl*>(module)) {
        hold(column->weight, 1);
        hold(column->bias, 1);
      } else if (auto* row = dynamic_cast<RowParallelLinearImpl*>(module)) {
        hold(row->weight, 1);
      } else if (auto* embedding = dynamic_cast<VocabParallelEmbeddingImpl*>(module)) {
        hold(embedding->weight, 1);
      } else if (auto* attention = dynamic_cast<ParallelCausalSelfAttentionImpl*>(module)) {
        hold(attention->q_weight, 1);
        hold(attention->q_bias, 1);
        hold(attention->kv_weight, attention->kv_copies());
        hold(attention->kv_bias, attention->kv_copies());
      } else {
        continue;
      }
      ++found;
    }
    PARALLAX_CHECK(found > 0, ConfigError, "parallel.tp = ", tp.size(),
                   ", but the model has no tensor-parallel layers and [tensor_parallel] has no plan: every rank "
                   "would compute the whole model; add a [tensor_parallel.plan] (see configs/tp.toml) or build the "
                   "model from tensor_parallel/ layers");
    s.description.push_back(std::to_string(found) + " tensor_parallel/ layers written into the model");
    return;
  }

  // Match: every Linear and Embedding to exactly one rule; every rule to something.
  std::map<std::size_t, std::vector<std::string>> matched;  // rule index → paths
  std::vector<std::string> unmatched;
  std::vector<std::pair<const TpPlanRule*, ModulePtr>> plan;
  std::vector<std::string> paths;
  std::unordered_set<const torch::nn::Module*> seen;
  for (const auto& item : modules) {
    const std::string path = how.plan_path ? how.plan_path(item.key()) : item.key();
    const ModulePtr& module = item.value();
    const bool linear = dynamic_cast<torch::nn::LinearImpl*>(module.get()) != nullptr;
    const bool embedding = dynamic_cast<torch::nn::EmbeddingImpl*>(module.get()) != nullptr;
    if (!linear && !embedding) continue;
    if (!seen.insert(module.get()).second) continue;  // one module under two paths: split once
    const TpPlanRule* rule = nullptr;
    for (std::size_t i = 0; i < options.plan.size(); ++i) {
      const TpPlanRule& candidate = options.plan[i];
      if (!glob_matches(candidate.pattern.c_str(), path.c_str())) continue;
      PARALLAX_CHECK(rule == nullptr, ConfigError, path, " is matched by two rules, ", rule_name(*rule), " and ",
                     rule_name(candidate), "; make the patterns disjoint");
      rule = &candidate;
      matched[i].push_back(path);
    }
    if (rule == nullptr) {
      unmatched.push_back(path + (linear ? " (Linear)" : " (Embedding)"));
      continue;
    }
    const bool fits =
        rule->style == TpStyle::kReplicate || (rule->style == TpStyle::kVocabEmbedding ? embedding : linear);
    PARALLAX_CHECK(fits, ConfigError, rule_name(*rule), ": style \"", to_string(rule->style), "\" applies to ",
                   rule->style == TpStyle::kVocabEmbedding ? "an Embedding" : "a Linear", ", but ", path, " is ",
                   linear ? "a Linear" : "an Embedding");
    plan.emplace_back(rule, module);
    paths.push_back(path);
  }
  if (!unmatched.empty()) {
    std::string list;
    for (std::size_t i = 0; i < unmatched.size() && i < 20; ++i) list += (i ? ", " : "") + unmatched[i];
    if (unmatched.size() > 20) list += ", and " + std::to_string(unmatched.size() - 20) + " more";
    const std::string& where = options.plan.front().position;
    throw ConfigError("[tensor_parallel.plan]" + (where.empty() ? std::string() : " (" + where.substr(1) + ")") +
                      " leaves " + std::to_string(unmatched.size()) + " Linear/Embedding module(s) unmatched: " + list +
                      "; give each a rule (style \"replicate\" keeps a module whole on every rank)");
  }
  for (std::size_t i = 0; i < options.plan.size(); ++i) {
    s.rules_matched.push_back(matched.count(i) > 0);
    PARALLAX_CHECK(how.part_of_model || matched.count(i), ConfigError, rule_name(options.plan[i]),
                   " matches no Linear or Embedding of the model; module paths look like \"",
                   paths.empty() ? std::string("(none)") : paths.front(), "\"");
  }

  // Check everything before changing anything, so a failure leaves the model whole.
  std::unordered_map<const c10::TensorImpl*, std::size_t> weight_owner;
  const TpPlanRule* split_output = nullptr;
  for (std::size_t i = 0; i < plan.size(); ++i) {
    const TpPlanRule& rule = *plan[i].first;
    const auto* linear = dynamic_cast<torch::nn::LinearImpl*>(plan[i].second.get());
    const auto* embedding = dynamic_cast<torch::nn::EmbeddingImpl*>(plan[i].second.get());
    if (rule.style == TpStyle::kColumn) check_split("output features", rule, paths[i], linear->weight.size(0), tp);
    if (rule.style == TpStyle::kRow) check_split("input features", rule, paths[i], linear->weight.size(1), tp);
    if (rule.style == TpStyle::kVocabOutput && !rule.gather_output) {
      PARALLAX_CHECK(split_output == nullptr, ConfigError, rule_name(rule), " and ", rule_name(*split_output),
                     ": two vocab_output layers whose logits stay split; the loss can split one vocabulary only");
      split_output = &rule;
    }
    if (embedding != nullptr && rule.style != TpStyle::kReplicate) {
      const auto& o = embedding->options;
      PARALLAX_CHECK(
          !o.padding_idx().has_value() && !o.max_norm().has_value() && !o.sparse() && !o.scale_grad_by_freq(),
          ConfigError, rule_name(rule), ": ", paths[i],
          " uses padding_idx, max_norm, scale_grad_by_freq or sparse gradients, which a planned embedding "
          "does not support");
    }
    const torch::Tensor& weight = linear != nullptr ? linear->weight : embedding->weight;
    const auto [owner, first] = weight_owner.emplace(weight.unsafeGetTensorImpl(), i);
    const bool both_whole =
        rule.style == TpStyle::kReplicate && plan[owner->second].first->style == TpStyle::kReplicate;
    PARALLAX_CHECK(first || both_whole, ConfigError, paths[i], " and ", paths[owner->second],
                   " share one weight (tied weights); a plan cannot split a tied weight in this build (rules ",
                   rule_name(rule), " and ", rule_name(*plan[owner->second].first), ")");
  }

  for (std::size_t i = 0; i < plan.size(); ++i) {
    const TpPlanRule& rule = *plan[i].first;
    const ModulePtr& module = plan[i].second;
    if (rule.style == TpStyle::kReplicate && !options.sequence_parallel) continue;
    if (rule.style == TpStyle::kReplicate && dynamic_cast<torch::nn::LinearImpl*>(module.get())) continue;
    auto layer = std::make_unique<PlannedLayer>();
    layer->path = paths[i];
    layer->style = rule.style;
    layer->tp = &tp;
    layer->sequence_parallel = options.sequence_parallel;
    layer->sequence_dim = options.sequence_dim;
    layer->gather_output = rule.gather_output;
    torch::NoGradGuard no_grad;
    torch::Tensor weight;
    torch::Tensor bias;
    if (auto* linear = dynamic_cast<torch::nn::LinearImpl*>(module.get())) {
      weight = linear->weight;
      bias = linear->bias;
      switch (rule.style) {
        case TpStyle::kColumn: {
          const TensorCut rows{0, rule.parts};
          cut_in_place(s.cuts, weight, rows, tp);
          // A gathered output gets the whole bias, added after the gather.
          if (bias.defined() && !rule.gather_output) cut_in_place(s.cuts, bias, rows, tp);
          break;
        }
        case TpStyle::kRow:
          cut_in_place(s.cuts, weight, TensorCut{1, 1}, tp);
          layer->local_in = weight.size(1);
          break;
        case TpStyle::kVocabOutput: {
          layer->vocab_size = weight.size(0);
          layer->vocabulary = VocabRange::of(weight.size(0), tp.rank(), tp.size());
          // Rows past the vocabulary (padding to a multiple of tp) are zero: VocabRange's.
          cut_in_place(s.cuts, weight, TensorCut{0, 1}, tp);
          if (bias.defined() && !rule.gather_output) cut_in_place(s.cuts, bias, TensorCut{0, 1}, tp);
          if (!rule.gather_output) s.output_vocabulary = layer->vocab_size;
          break;
        }
        default:
          break;
      }
      linear->options.in_features(weight.size(1)).out_features(weight.size(0));
      const bool column = rule.style == TpStyle::kColumn || rule.style == TpStyle::kVocabOutput;
      if (column && bias.defined()) {
        // Split, or whole and added after the gather: either way its gradient is complete.
        if (rule.gather_output) {
          s.whole_gradients.insert(bias.unsafeGetTensorImpl());
        } else {
          s.copies[bias.unsafeGetTensorImpl()] = 1;
        }
      }
    } else {
      auto* embedding = dynamic_cast<torch::nn::EmbeddingImpl*>(module.get());
      weight = embedding->weight;
      if (rule.style == TpStyle::kVocabEmbedding) {
        layer->vocabulary = VocabRange::of(weight.size(0), tp.rank(), tp.size());
        cut_in_place(s.cuts, weight, TensorCut{0, 1}, tp);
        embedding->options.num_embeddings(weight.size(0));
      }
    }
    if (rule.style != TpStyle::kReplicate) s.copies[weight.unsafeGetTensorImpl()] = 1;
    layer->weight = weight;
    s.weights->key(layer.get());
    s.layers.push_back(std::move(layer));
  }

  for (const auto& [index, matched_paths] : matched) {
    const TpPlanRule& rule = options.plan[index];
    std::string line = "\"" + rule.pattern + "\" = " + to_string(rule.style);
    if (rule.parts > 1) line += " (" + std::to_string(rule.parts) + " fused parts)";
    if (rule.gather_output) line += " (output gathered)";
    line += ": " + std::to_string(matched_paths.size()) + " module(s), e.g. " + matched_paths.front();
    s.description.push_back(line);
  }
  if (options.sequence_parallel) {
    std::unordered_set<const c10::TensorImpl*> listed;
    for (const auto& p : model.parameters()) {
      const c10::TensorImpl* impl = p.unsafeGetTensorImpl();
      if (!s.copies.count(impl) && !s.whole_gradients.count(impl) && listed.insert(impl).second) {
        s.partial.push_back(p);
      }
    }
  }
}

ParallelizedModel::ParallelizedModel(ParallelizedModel&&) noexcept = default;
ParallelizedModel& ParallelizedModel::operator=(ParallelizedModel&&) noexcept = default;
ParallelizedModel::~ParallelizedModel() = default;

struct ParallelizedModel::Scope::Open {
  explicit Open(std::shared_ptr<RewriteState> state) : scope(kLayer, std::move(state)) {}
  interception::Scope scope;
};

ParallelizedModel::Scope::Scope() = default;
ParallelizedModel::Scope::Scope(std::unique_ptr<Open> open) : open_(std::move(open)) {}
ParallelizedModel::Scope::Scope(Scope&&) noexcept = default;
ParallelizedModel::Scope::~Scope() = default;

ParallelizedModel::Scope ParallelizedModel::scope() const {
  if (state_->layers.empty()) return Scope();
  // A cast (model->to(bf16)) or ZeRO's flat buffers move the weights: key them afresh.
  for (const auto& layer : state_->layers) state_->weights->key(layer.get());
  return Scope(std::make_unique<Scope::Open>(RewriteState::pushed(kLayer, state_->weights)));
}

std::int64_t ParallelizedModel::copies(const torch::Tensor& parameter) const {
  const auto found = state_->copies.find(parameter.unsafeGetTensorImpl());
  return found == state_->copies.end() ? state_->tp->size() : found->second;
}

std::optional<ParallelizedModel::Split> ParallelizedModel::split_of(const torch::Tensor& parameter) const {
  const auto found = state_->cuts.find(parameter.unsafeGetTensorImpl());
  if (found == state_->cuts.end()) return std::nullopt;
  return found->second;
}

torch::Tensor ParallelizedModel::part_of(const torch::Tensor& parameter, const torch::Tensor& whole) const {
  const std::optional<Split> split = split_of(parameter);
  PARALLAX_CHECK(split.has_value(), UsageError, "part_of: a parameter of shape ", parameter.sizes(),
                 " that no plan rule split (a replicated one, or one of tensor_parallel/'s own layers, which are "
                 "built split)");
  PARALLAX_CHECK(whole.sizes().vec() == split->whole_shape, UsageError, "part_of: a dense tensor of shape ",
                 whole.sizes(), ", this parameter's is ", c10::IntArrayRef(split->whole_shape));
  torch::NoGradGuard no_grad;
  return cut(whole, split->cut, split->index, split->count);
}

std::vector<torch::Tensor> ParallelizedModel::partial_gradient_parameters() const {
  return state_->partial;
}

std::int64_t ParallelizedModel::split_output_vocabulary() const {
  return state_->output_vocabulary;
}

std::vector<bool> ParallelizedModel::rules_matched() const {
  return state_->rules_matched;
}

std::vector<std::string> ParallelizedModel::describe() const {
  return state_->description;
}

}  // namespace parallax::tensor_parallel
