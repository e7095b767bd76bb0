#include "parallax/runtime/pipeline_engine.h"

#include <algorithm>
#include <map>

#include "parallax/core/config_loader.h"
#include "parallax/core/error.h"
#include "parallax/core/mesh.h"
#include "parallax/core/world.h"
#include "parallax/expert_parallel/moe_layer.h"
#include "parallax/pipeline/partition.h"
#include "parallax/runtime/gradient_reduction.h"
#include "parallax/runtime/plan_options.h"
#include "parallax/runtime/step_telemetry.h"

namespace parallax {
namespace {

constexpr int kTieValueTag = 3;  // first holder → other holders, at construction
constexpr int kTieGradTag = 4;   // holder → first holder: its copies' gradient sum
constexpr int kTieSumTag = 5;    // first holder → holders: the total
constexpr int kTieDecayTag = 6;  // first holder → other holders, at construction: no_decay exempts it

// Step 1 of the construction protocol.
PipelineLayout choose_layout(Runtime& runtime,
                             const std::vector<pipeline::LayerSpec>& specs,
                             const pipeline::LossFunction& loss,
                             const PipelineEngineOptions& options) {
  const proto::Plan& plan = runtime.plan();
  const PipelineOptions pipeline = pipeline_options(plan);
  const auto layers = static_cast<std::int64_t>(specs.size());
  const int pp = plan.degrees().pp();
  const int virtual_stages = pipeline.virtual_stages;
  const int parts = pp * virtual_stages;
  PARALLAX_CHECK(layers >= pp, ConfigError, "parallel.pp = ", pp, " pipeline stages need at least ", pp,
                 " layers (one per stage), but the model has ", layers, " layer spec(s)");
  PARALLAX_CHECK(layers >= parts, ConfigError, "pipeline.virtual_stages = ", virtual_stages, " with parallel.pp = ", pp,
                 " cuts the model into ", parts, " parts of at least one layer each, but it has ", layers,
                 " layer spec(s); interleave with at most virtual_stages = ", layers / pp, " or use a deeper model");
  PipelineLayout layout;
  layout.partition = to_string(pipeline.partition);
  const auto seed = static_cast<std::uint64_t>(batch_options(plan).seed);
  switch (pipeline.partition) {
    case PipelinePartition::kUniform:
      layout.boundaries = pipeline::uniform_boundaries(layers, parts);
      break;
    case PipelinePartition::kParameters:
      layout.layer_weights = pipeline::parameter_counts(specs, seed);
      layout.boundaries = pipeline::balanced_boundaries(layout.layer_weights, parts);
      break;
    case PipelinePartition::kProfile: {
      PARALLAX_CHECK(options.profile_batch.has_value(), ConfigError,
                     "pipeline.partition = \"profile\" times each layer on a sample micro-batch: pass one in "
                     "PipelineEngineOptions::profile_batch (or use \"parameters\")");
      const pipeline::MicroBatch& sample = *options.profile_batch;
      std::vector<double> times = pipeline::profile_layers(
          specs, seed, sample.inputs, [&](const pipeline::Activation& output) { return loss(output, sample.targets); });
      // Every rank measured; all use the mean, so every rank cuts the model the same way.
      torch::Tensor sum = torch::tensor(times, torch::kFloat64);
      runtime.telemetry().all_reduce(sum)->wait();
      sum.div_(runtime.telemetry().size());
      layout.layer_weights.assign(sum.data_ptr<double>(), sum.data_ptr<double>() + sum.numel());
      layout.boundaries = pipeline::balanced_boundaries(layout.layer_weights, parts);
      break;
    }
    case PipelinePartition::kExplicit:
      layout.boundaries = pipeline.boundaries;
      PARALLAX_CHECK(layout.boundaries.back() == layers, ConfigError, "pipeline.partition = [...] ends at ",
                     layout.boundaries.back(), ", but the model has ", layers,
                     " layer spec(s): the last boundary must be the layer count");
      break;
  }
  return layout;
}

void describe_layout(Runtime& runtime,
                     const PipelineLayout& layout,
                     const std::vector<pipeline::LayerSpec>& specs,
                     const pipeline::ScheduleShape& shape) {
  const PipelineOptions pipeline = pipeline_options(runtime.plan());
  runtime.logger().summary(
      "# pipeline: pp = ", shape.stages, " x dp = ", runtime.mesh().degrees().dp, ", schedule ",
      to_string(pipeline.schedule), ", ", shape.micro_batches, " micro-batch(es)",
      shape.virtual_stages > 1 ? ", " + std::to_string(shape.virtual_stages) + " chunks per stage" : std::string(),
      ", recompute ", to_string(pipeline.recompute), ", partition ", layout.partition, ": ",
      pipeline::describe_boundaries(layout.boundaries, layout.layer_weights));
  for (int part = 0; part < shape.parts(); ++part) {
    const std::int64_t first = layout.boundaries[part];
    const std::int64_t last = layout.boundaries[part + 1] - 1;
    runtime.logger().summary("#   stage ", part % shape.stages, " chunk ", part / shape.stages, ": layers ", first,
                             "..", last, " (", specs[first].name, first == last ? "" : " .. " + specs[last].name, ")");
  }
}

// One tied key: the stages holding it (ascending), the first holder's stage, and this
// stage's copies in layer order.
struct TiedWeight {
  std::string key;
  int owner = 0;
  std::vector<int> stages;
  std::vector<torch::Tensor> local;
  std::vector<std::size_t> indices;  ///< of `local` among the engine's trained parameters
};

// The tied keys of the whole model, with their holders' stages, and this stage's copies.
std::vector<TiedWeight> find_ties(const std::vector<pipeline::LayerSpec>& specs,
                                  const PipelineLayout& layout,
                                  const pipeline::ScheduleShape& shape,
                                  const std::vector<pipeline::LayerSequence>& chunks) {
  std::map<std::string, TiedWeight> by_key;
  for (std::size_t layer = 0; layer < specs.size(); ++layer) {
    const auto part = static_cast<int>(
        std::upper_bound(layout.boundaries.begin(), layout.boundaries.end(), static_cast<std::int64_t>(layer)) -
        layout.boundaries.begin() - 1);
    for (const pipeline::TiedParameter& tied : specs[layer].tied) {
      TiedWeight& tie = by_key[tied.key];
      if (tie.stages.empty()) {
        tie.key = tied.key;
        tie.owner = part % shape.stages;
      }
      tie.stages.push_back(part % shape.stages);
    }
  }
  for (const pipeline::LayerSequence& chunk : chunks) {
    for (const auto& [key, tensor] : chunk->tied_parameters()) by_key[key].local.push_back(tensor);
  }
  std::vector<TiedWeight> ties;
  for (auto& [key, tie] : by_key) {
    std::sort(tie.stages.begin(), tie.stages.end());
    tie.stages.erase(std::unique(tie.stages.begin(), tie.stages.end()), tie.stages.end());
    ties.push_back(std::move(tie));
  }
  return ties;
}

// "chunkC.L.rest" (a stage module's path) → layer L's path in the whole model + ".rest".
std::string path_in_model(const std::string& path, const std::vector<std::string>& prefixes) {
  const auto first = path.find('.');
  if (first == std::string::npos) return path;
  const auto second = path.find('.', first + 1);
  const std::string layer =
      path.substr(first + 1, second == std::string::npos ? std::string::npos : second - first - 1);
  const auto index = static_cast<std::size_t>(std::stoll(layer));
  const std::string& prefix = prefixes.at(index);
  if (second == std::string::npos) return prefix;
  const std::string rest = path.substr(second + 1);
  return prefix.empty() ? rest : prefix + "." + rest;
}

// A LossFunction receives whole logits: `loss`, unless the plan leaves them split, which
// is refused on every rank (they all hold the plan) before anything is built.
pipeline::LossFunction whole_logits_loss(const proto::Plan& plan, pipeline::LossFunction loss) {
  if (plan.degrees().tp() == 1) return loss;
  for (const TpPlanRule& rule : tensor_parallel_options(plan).plan) {
    PARALLAX_CHECK(rule.style != TpStyle::kVocabOutput || rule.gather_output, ConfigError, "[tensor_parallel.plan] \"",
                   rule.pattern, "\" = \"vocab_output\"", rule.position,
                   ": the pipeline's loss function receives whole logits, but this rule leaves them split over "
                   "the vocabulary; pass parallax::CrossEntropyLoss{} as the loss (vocabulary-parallel), or give "
                   "the rule gather_output = true");
  }
  return loss;
}

}  // namespace

struct PipelineEngine::Built {
  Runtime* runtime = nullptr;
  pipeline::ScheduleShape shape;
  int stage = 0;
  PipelineLayout layout;
  pipeline::LossFunction loss;
  std::shared_ptr<torch::nn::Module> module;  // children "chunk0", "chunk1", ...
  std::vector<pipeline::LayerSequence> chunks;
  StageCoupling coupling;
  std::unique_ptr<StepApplier> applier;

  std::vector<TiedWeight> ties;
  std::unique_ptr<pipeline::Transport> transport;
  std::unique_ptr<pipeline::StageExecutor> executor;
};

PipelineEngine::PipelineEngine(Runtime& runtime,
                               std::vector<pipeline::LayerSpec> specs,
                               pipeline::LossFunction loss,
                               const OptimizerSpec& spec,
                               const PipelineEngineOptions& options)
    : PipelineEngine(
          runtime, build(runtime, specs, whole_logits_loss(runtime.plan(), std::move(loss)), options), spec) {}

PipelineEngine::PipelineEngine(Runtime& runtime,
                               std::vector<pipeline::LayerSpec> specs,
                               CrossEntropyLoss /*loss*/,
                               const OptimizerSpec& spec,
                               const PipelineEngineOptions& options)
    : PipelineEngine(runtime,
                     build(
                         runtime,
                         specs,
                         [](const pipeline::Activation& output, const pipeline::Activation& targets) {
                           return dense_cross_entropy(output.at(0), targets.at(0));
                         },
                         options),
                     spec) {
  // Profiling (in build) timed the dense layers; the stage's loss may see split logits.
  StepApplier* applier = built_->applier.get();
  built_->loss = [applier](const pipeline::Activation& output, const pipeline::Activation& targets) {
    return applier->cross_entropy(output.at(0), targets.at(0));
  };
}

// Steps 1–3 of the construction protocol (the StepApplier, step 4, needs their module).
std::shared_ptr<PipelineEngine::Built> PipelineEngine::build(Runtime& runtime,
                                                             const std::vector<pipeline::LayerSpec>& specs,
                                                             pipeline::LossFunction loss,
                                                             const PipelineEngineOptions& options) {
  const proto::Plan& plan = runtime.plan();
  const PipelineOptions pipeline = pipeline_options(plan);
  const TrainOptions batch = batch_options(plan);
  auto built = std::make_shared<Built>();
  built->runtime = &runtime;
  built->loss = std::move(loss);
  built->stage = runtime.mesh().coord().pp;
  built->shape = {pipeline.schedule, plan.degrees().pp(), static_cast<int>(batch.grad_accum), pipeline.virtual_stages};
  pipeline::validate(built->shape);
  built->layout = choose_layout(runtime, specs, built->loss, options);
  describe_layout(runtime, built->layout, specs, built->shape);
  // Step 2: only this stage's parts.
  built->module = std::make_shared<torch::nn::Module>("PipelineStage");
  for (int chunk = 0; chunk < built->shape.virtual_stages; ++chunk) {
    const int part = pipeline::part_of(built->shape, built->stage, chunk);
    built->chunks.push_back(built->module->register_module(
        "chunk" + std::to_string(chunk),
        pipeline::LayerSequence(specs, built->layout.boundaries[part], built->layout.boundaries[part + 1],
                                static_cast<std::uint64_t>(batch.seed))));
  }
  // A plan's rules name the whole model's modules: "chunk0.3.qkv" is layer 3's "qkv".
  std::vector<std::string> prefixes;
  prefixes.reserve(specs.size());
  for (const pipeline::LayerSpec& spec : specs) prefixes.push_back(spec.path_in_model());
  built->coupling.plan_path = [prefixes](const std::string& path) { return path_in_model(path, prefixes); };
  // Step 3: tied copies take their first holder's value; the norm counts the first only.
  built->ties = find_ties(specs, built->layout, built->shape, built->chunks);
  Communicator& pp = runtime.mesh().pp();
  torch::NoGradGuard no_grad;
  for (TiedWeight& tie : built->ties) {
    if (tie.local.empty()) continue;
    if (built->stage != tie.owner) {
      torch::Tensor value = tie.local.front().detach();
      pp.recv(value, tie.owner, kTieValueTag)->wait();
    } else {
      for (int peer : tie.stages) {
        if (peer != tie.owner) pp.send(tie.local.front().detach(), peer, kTieValueTag)->wait();
      }
    }
    for (std::size_t i = 1; i < tie.local.size(); ++i) tie.local[i].detach().copy_(tie.local[0]);
    // optimizer.no_decay: every copy steps in its first holder's group.
    const std::vector<std::string>& kinds = runtime.config().optimizer.no_decay;
    if (!kinds.empty()) {
      torch::Tensor exempt = torch::zeros({1}, torch::kInt64);
      if (built->stage != tie.owner) {
        pp.recv(exempt, tie.owner, kTieDecayTag)->wait();
      } else {
        exempt.fill_(exempt_from_decay(*built->module, tie.local.front(), kinds) ? 1 : 0);
        for (int peer : tie.stages) {
          if (peer != tie.owner) pp.send(exempt, peer, kTieDecayTag)->wait();
        }
      }
      for (const torch::Tensor& copy : tie.local) {
        built->coupling.tied_exempt[copy.unsafeGetTensorImpl()] = exempt.item<std::int64_t>() != 0;
      }
    }
    const std::size_t counted = built->stage == tie.owner ? 1 : 0;
    for (std::size_t i = counted; i < tie.local.size(); ++i) built->coupling.norm_excluded.push_back(tie.local[i]);
  }
  return built;
}

PipelineEngine::PipelineEngine(Runtime& runtime, std::shared_ptr<Built> built, const OptimizerSpec& spec)
    : built_(std::move(built)) {
  Built& b = *built_;
  b.applier = std::make_unique<StepApplier>(runtime, runtime.plan(), "", b.module, spec, &b.coupling);
  b.transport = std::make_unique<pipeline::Transport>(runtime.mesh().pp());
  for (TiedWeight& tie : b.ties) {
    for (const torch::Tensor& copy : tie.local) tie.indices.push_back(b.applier->parameter_index(copy));
  }
  b.executor = std::make_unique<pipeline::StageExecutor>(
      b.shape, b.stage, b.chunks, pipeline_options(runtime.plan()).recompute, *b.transport, runtime.tracer());
}

PipelineEngine::PipelineEngine(PipelineEngine&&) noexcept = default;
PipelineEngine::~PipelineEngine() = default;

double PipelineEngine::train_batch(const std::function<pipeline::MicroBatch()>& next) {
  const MemoryPhase phase("a pipeline step");
  Built& b = *built_;
  Runtime& runtime = *b.runtime;
  StepApplier& applier = *b.applier;
  applier.begin_window();
  std::vector<pipeline::MicroBatch> batch(static_cast<std::size_t>(b.shape.micro_batches));
  if (b.stage == 0 || b.stage == b.shape.stages - 1) {
    for (pipeline::MicroBatch& micro : batch) {
      micro = next();
      // With parallel.cp > 1, this rank's part of each sequence (inputs and targets).
      for (torch::Tensor& t : micro.inputs) t = applier.prepare_input(applier.local_part(t));
      for (torch::Tensor& t : micro.targets) t = applier.local_part(t);
    }
  }
  pipeline::ExecutorHooks hooks;
  hooks.around_backward = [&applier](pipeline::WeightGradients writes, const std::function<void()>& backward) {
    applier.reduction().run_backward(writes, [&] { applier.run_model(backward); });
  };
  hooks.reduce_gradients = [&applier] { applier.reduction().finish(); };
  hooks.reduce_tied_gradients = [this] { reduce_tied_gradients(); };
  hooks.optimizer_step = [&applier, &b, &runtime](const pipeline::BatchOutcome& outcome) {
    // The loss lives on the last stage: every stage of the pipeline gets it.
    torch::Tensor loss = torch::full({1}, outcome.loss_sum, torch::kFloat64);
    runtime.mesh().pp().broadcast(loss, b.shape.stages - 1)->wait();
    applier.telemetry().set_pipeline_activity(outcome.compute_ms, outcome.schedule_ms);
    applier.apply_step(loss.item<double>() / static_cast<double>(b.shape.micro_batches));
  };
  hooks.loss_scale = [&applier] { return applier.loss_scale(); };
  hooks.around_forward = [&applier](const std::function<void()>& forward) {
    ModelScope scope = applier.model_scope();
    applier.run_model(forward);
  };
  // A mixture-of-experts layer's auxiliary loss joins each micro-batch's backward with
  // the loss's weight (the executor's: the loss scale over the micro-batches).
  const expert_parallel::AuxLossGradientScale aux_scale(applier.loss_scale() /
                                                        static_cast<double>(b.shape.micro_batches));
  b.executor->run(batch, b.loss, hooks);
  applier.save_if_due();
  return applier.last_metrics().loss;
}

checkpoint::SaveResult PipelineEngine::save_checkpoint(const std::string& trainer_state) {
  return applier().save_checkpoint(trainer_state);
}
std::optional<checkpoint::SaveResult> PipelineEngine::wait_for_checkpoint() {
  return applier().wait_for_checkpoint();
}
bool PipelineEngine::preempted() const {
  return applier().preempted();
}
void PipelineEngine::finish() {
  applier().finish();
}
std::optional<std::string> PipelineEngine::resume() {
  return applier().resume();
}
std::string PipelineEngine::load_checkpoint(const std::string& directory) {
  return applier().load_checkpoint(directory, /*latest=*/false);
}

// The protocol in the header: the first holder gathers each key's gradient sums, adds
// them in stage order and sends the total back, so every copy gets identical bits.
void PipelineEngine::reduce_tied_gradients() {
  Built& b = *built_;
  Communicator& pp = b.runtime->mesh().pp();
  torch::NoGradGuard no_grad;
  for (TiedWeight& tie : b.ties) {
    if (tie.local.empty()) continue;
    b.applier->reduction().edit_gradients(tie.indices, [&](std::vector<torch::Tensor>& grads) {
      torch::Tensor sum = grads.front().clone();
      for (std::size_t i = 1; i < grads.size(); ++i) sum.add_(grads[i]);
      if (tie.stages.size() > 1) {
        if (b.stage == tie.owner) {
          torch::Tensor received = torch::empty_like(sum);
          for (int peer : tie.stages) {
            if (peer == tie.owner) continue;
            pp.recv(received, peer, kTieGradTag)->wait();
            sum.add_(received);
          }
          std::vector<WorkPtr> sends;
          for (int peer : tie.stages) {
            if (peer != tie.owner) sends.push_back(pp.send(sum, peer, kTieSumTag));
          }
          for (auto& work : sends) work->wait();
        } else {
          pp.send(sum, tie.owner, kTieGradTag)->wait();
          pp.recv(sum, tie.owner, kTieSumTag)->wait();
        }
      }
      for (torch::Tensor& grad : grads) grad.copy_(sum);
    });
  }
}

int PipelineEngine::stage() const {
  return built_->stage;
}
const PipelineLayout& PipelineEngine::layout() const {
  return built_->layout;
}
const std::vector<pipeline::LayerSequence>& PipelineEngine::chunks() const {
  return built_->chunks;
}
const std::vector<pipeline::Instruction>& PipelineEngine::instructions() const {
  return built_->executor->instructions();
}
std::string PipelineEngine::timeline() const {
  return pipeline::format_timeline(built_->shape);
}
StepApplier& PipelineEngine::applier() const {
  return *built_->applier;
}
std::int64_t PipelineEngine::global_step() const {
  return applier().global_step();
}
double PipelineEngine::last_loss() const {
  return applier().last_metrics().loss;
}
const StepMetrics& PipelineEngine::last_metrics() const {
  return applier().last_metrics();
}
torch::ScalarType PipelineEngine::compute_dtype() const {
  return applier().compute_dtype();
}
ModelStateBytes PipelineEngine::model_state_bytes() const {
  return applier().model_state_bytes();
}
std::int64_t PipelineEngine::gradient_bytes() const {
  return applier().reduction().gradient_bytes();
}
std::int64_t PipelineEngine::gradient_padding_bytes() const {
  return applier().reduction().gradient_padding_bytes();
}
std::int64_t PipelineEngine::expert_gradient_bytes() const {
  return applier().reduction().expert_gradient_bytes();
}
std::int64_t PipelineEngine::expert_gradient_padding_bytes() const {
  return applier().reduction().expert_gradient_padding_bytes();
}
void PipelineEngine::set_tokens_per_sample(std::int64_t tokens) {
  applier().telemetry().set_tokens_per_sample(tokens);
}
std::vector<torch::Tensor> PipelineEngine::master_parameters() const {
  return applier().master_parameters();
}
const zero::ShardedModel* PipelineEngine::sharded_model() const {
  return applier().sharded_model();
}
double PipelineEngine::loss_scale() const {
  return applier().loss_scale();
}
std::int64_t PipelineEngine::skipped_steps() const {
  return applier().skipped_steps();
}

}  // namespace parallax
