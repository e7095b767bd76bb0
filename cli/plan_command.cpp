#include "plan_command.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>

#include "parallax/core/config_loader.h"
#include "parallax/core/error.h"
#include "parallax/planner/layer_profile_file.h"
#include "parallax/planner/plan_search.h"

namespace parallax::cli {
namespace {

constexpr const char* kUsage =
    "Usage: parallax plan [model] [cluster] [batch] [what to answer] [output]\n"
    "Chooses tensor, pipeline and data parallelism, the ZeRO stage, offload, the pipeline schedule,\n"
    "virtual stages, recomputation and the micro-batch size for a transformer on a cluster, offline.\n"
    "\n"
    "Model (one of):\n"
    "  --model NAME            a published model: %s\n"
    "  --config FILE           a Parallax config with a [model] table (the GPT example's keys); its\n"
    "                          other sections (precision, optimizer, device, ...) are kept, and its\n"
    "                          train.global_batch_size is the batch unless --global-batch is given\n"
    "  --set KEY=VALUE         change a key of --config (as train programs take it)\n"
    "  --profile FILE          layer times an auto run measured (a file of its auto.profile_cache):\n"
    "                          plan from them, not from the peak rate; the model's sizes and dtype\n"
    "                          come from the file unless --model or --config gives them (they must\n"
    "                          match); the cluster is the measured machine's ranks unless --cluster\n"
    "                          is given\n"
    "Cluster:\n"
    "  --cluster NAME          %s (default dgx-h100; cpu with --profile)\n"
    "  --nodes N               nodes of the preset (default 1)\n"
    "  --devices-per-node N, --device-memory-gb X, --peak-tflops X   override the preset's figures\n"
    "Batch and constraints:\n"
    "  --global-batch N        samples per optimizer step\n"
    "  --fix LAYOUT            keys the plan must keep, e.g. \"tp=8,zero=1\" (keys: tp, pp, dp, zero,\n"
    "                          offload, schedule, vp, recompute, mbs, ga)\n"
    "  --max-memory-gb X       memory per device a plan may use (default: the device's, less 10%%)\n"
    "  --prefer throughput|memory\n"
    "What to answer (default: the ranked plans):\n"
    "  --evaluate LAYOUT       score one layout, e.g. \"tp=8,pp=16,dp=12,zero=1,mbs=1,vp=4,\n"
    "                          schedule=interleaved,recompute=full\": runs or why not, memory, time, rank;\n"
    "                          \"config\": the layout --config (with --set) gives\n"
    "  --min-nodes             the fewest nodes (1, 2, 4, ...) on which some plan fits\n"
    "  --largest-model         the most layers (the model's width kept) that fit the cluster\n"
    "  --compare-zero          the best plan of each ZeRO stage and offload\n"
    "Output:\n"
    "  --top K                 plans shown (default 10)\n"
    "  --json                  JSON instead of the table\n"
    "  --emit-config FILE      write the best (or the evaluated) plan as a TOML for --config\n";

struct Options {
  std::string model, config_file, profile, cluster, fix, evaluate, emit_config, prefer = "throughput";
  std::vector<std::string> overrides;  // --set key=value, over --config
  int nodes = 1, devices_per_node = 0, top = 10;
  double device_memory_gb = 0, peak_tflops = 0, max_memory_gb = 0;
  std::int64_t global_batch = 0;
  bool json = false, min_nodes = false, largest_model = false, compare_zero = false;
};

std::int64_t whole(const std::string& flag, const std::string& value, std::int64_t low) {
  return planner::parse_whole_number(value, low, flag + " " + value);
}

double positive_real(const std::string& flag, const std::string& value) {
  std::size_t used = 0;
  double number = 0;
  try {
    number = std::stod(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  PARALLAX_CHECK(!value.empty() && used == value.size() && std::isfinite(number) && number > 0, UsageError, flag, " ",
                 value, ": expected a positive number");
  return number;
}

Options parse(const std::vector<std::string>& args) {
  Options o;
  const std::map<std::string, std::string*> texts{{"--model", &o.model},         {"--config", &o.config_file},
                                                  {"--profile", &o.profile},     {"--cluster", &o.cluster},
                                                  {"--fix", &o.fix},             {"--evaluate", &o.evaluate},
                                                  {"--emit-config", &o.emit_config}, {"--prefer", &o.prefer}};
  const std::map<std::string, bool*> switches{{"--json", &o.json},
                                              {"--min-nodes", &o.min_nodes},
                                              {"--largest-model", &o.largest_model},
                                              {"--compare-zero", &o.compare_zero}};
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& flag = args[i];
    if (switches.count(flag)) {
      *switches.at(flag) = true;
      continue;
    }
    PARALLAX_CHECK(flag.rfind("--", 0) == 0, UsageError, "unexpected argument '", flag, "' (parallax plan --help)");
    static const std::vector<std::string> kValued{"--set",   "--nodes",           "--devices-per-node",
                                                  "--top",   "--global-batch",    "--device-memory-gb",
                                                  "--peak-tflops", "--max-memory-gb"};
    PARALLAX_CHECK(texts.count(flag) || std::find(kValued.begin(), kValued.end(), flag) != kValued.end(), UsageError,
                   "unknown option '", flag, "' (parallax plan --help)");
    PARALLAX_CHECK(i + 1 < args.size(), UsageError, flag, " needs a value (parallax plan --help)");
    const std::string& value = args[++i];
    if (texts.count(flag)) {
      *texts.at(flag) = value;
    } else if (flag == "--set") {
      o.overrides.push_back(value);
    } else if (flag == "--nodes") {
      o.nodes = static_cast<int>(whole(flag, value, 1));
    } else if (flag == "--devices-per-node") {
      o.devices_per_node = static_cast<int>(whole(flag, value, 1));
    } else if (flag == "--top") {
      o.top = static_cast<int>(whole(flag, value, 1));
    } else if (flag == "--global-batch") {
      o.global_batch = whole(flag, value, 1);
    } else if (flag == "--device-memory-gb") {
      o.device_memory_gb = positive_real(flag, value);
    } else if (flag == "--peak-tflops") {
      o.peak_tflops = positive_real(flag, value);
    } else if (flag == "--max-memory-gb") {
      o.max_memory_gb = positive_real(flag, value);
    } else {
      throw UsageError("unknown option '" + flag + "' (parallax plan --help)");
    }
  }
  PARALLAX_CHECK(o.overrides.empty() || !o.config_file.empty(), UsageError, "--set changes a --config file's keys");
  PARALLAX_CHECK(o.model.empty() || o.config_file.empty(), UsageError,
                 "give the model by --model NAME or by --config FILE, not both");
  PARALLAX_CHECK(!o.model.empty() || !o.config_file.empty() || !o.profile.empty(), UsageError,
                 "give the model by --model NAME, --config FILE or --profile FILE");
  PARALLAX_CHECK(o.prefer == "throughput" || o.prefer == "memory", UsageError, "--prefer ", o.prefer,
                 ": expected throughput or memory");
  PARALLAX_CHECK((o.min_nodes ? 1 : 0) + (o.largest_model ? 1 : 0) + (o.compare_zero ? 1 : 0) +
                         (o.evaluate.empty() ? 0 : 1) <=
                     1,
                 UsageError, "--evaluate, --min-nodes, --largest-model and --compare-zero answer one question each");
  return o;
}

planner::ClusterSpec cluster_of(const Options& o, int nodes) {
  planner::ClusterSpec cluster =
      planner::ClusterSpec::preset(o.cluster.empty() ? (o.profile.empty() ? "dgx-h100" : "cpu") : o.cluster, nodes);
  if (o.devices_per_node > 0) cluster.devices_per_node = o.devices_per_node;
  if (o.device_memory_gb > 0) cluster.device_memory_bytes = o.device_memory_gb * 1e9;
  if (o.peak_tflops > 0) cluster.peak_flops = o.peak_tflops * 1e12;
  return cluster;
}

// --profile: the file's times for the shapes it has; its model, dtype and machine
// where the command line leaves them open, and a clear error where it contradicts them.
void use_profile(const Options& o, planner::PlanQuery& query) {
  const planner::MeasuredProfile profile = planner::read_profile(o.profile);
  if (o.model.empty() && o.config_file.empty()) {
    query.model = profile.model;
    for (Dtype dtype : {Dtype::kFp32, Dtype::kBf16, Dtype::kFp16}) {
      if (profile.dtype == to_string(dtype)) query.base.precision.dtype = dtype;
    }
    query.tp_needs_plan = true;
  } else {
    PARALLAX_CHECK(query.model.same_sizes(profile.model), UsageError, "--profile ", o.profile, " was measured for ", profile.model.describe(), ", not for ",
                   query.model.describe());
    PARALLAX_CHECK(profile.dtype == to_string(query.base.precision.dtype), UsageError, "--profile ", o.profile,
                   " was measured in ", profile.dtype, ", the plan is for ", to_string(query.base.precision.dtype));
  }
  if (o.cluster.empty()) {
    query.cluster.name = "the machine of " + o.profile;
    query.cluster.devices_per_node = o.devices_per_node > 0 ? o.devices_per_node : profile.local_size;
    query.cluster.nodes = o.nodes > 1 ? o.nodes : std::max(1, profile.world_size / std::max(1, profile.local_size));
  }
  query.block_times = profile.block;
  query.head_times = profile.head;
}

planner::PlanQuery query_of(const Options& o) {
  planner::PlanQuery query;
  if (!o.config_file.empty()) {
    ConfigSources sources;
    sources.files = {o.config_file};
    sources.overrides = o.overrides;
    query.base = load_config(sources, LoadOptions{{"model", "data"}, {}});
    query.model = planner::TransformerShape::from_table(query.base.app_table("model"));
    query.global_batch = query.base.train.global_batch_size;
    query.tp_needs_plan = true;
  } else if (!o.model.empty()) {
    query.model = planner::TransformerShape::preset(o.model);
    query.base.precision.dtype = Dtype::kBf16;
  }
  query.cluster = cluster_of(o, o.nodes);
  if (query.cluster.name != "cpu") query.base.train.device = TrainDevice::kCuda;
  if (!o.profile.empty()) use_profile(o, query);
  if (o.global_batch > 0) query.global_batch = o.global_batch;
  PARALLAX_CHECK(query.global_batch >= 1, UsageError,
                 "the global batch is not known: give --global-batch N (or train.global_batch_size in --config)");
  query.max_memory_bytes = o.max_memory_gb * 1e9;
  query.preference = o.prefer == "memory" ? planner::Preference::kMemory : planner::Preference::kThroughput;
  return query;
}

// The plan as a config for --config: the base's sections with the layout's keys, and
// the [model] table the GPT example reads.
void emit_config(const std::string& path, const planner::PlanQuery& query, const planner::Layout& layout) {
  Config config = layout.apply_to(query.base, query.global_batch);
  std::ostringstream text;
  text << "# Written by parallax plan: " << layout.describe() << "\n# for " << query.model.describe() << " on "
       << query.cluster.describe() << "\n";
  text << to_toml(config);
  if (query.base.app.count("model") == 0) {
    const planner::TransformerShape& m = query.model;
    text << "\n[model]\nn_layer = " << m.layers << "\nd_model = " << m.hidden << "\nn_head = " << m.heads
         << "\nd_ff = " << m.ffn_width() << "\nvocab_size = " << m.vocab << "\nblock_size = " << m.seq << "\n";
  }
  std::ofstream out(path);
  out << text.str();
  out.close();
  PARALLAX_CHECK(out.good(), UsageError, "--emit-config ", path, ": could not write the file");
}

int report_evaluation(const Options& o, const planner::PlanQuery& query, const planner::Layout& layout);

// The layout a config gives (resolved on the cluster's devices).
planner::Layout layout_of_config(const planner::PlanQuery& query) {
  Config c = query.base;
  c.resolve(query.cluster.devices());
  planner::Layout l;
  l.tp = c.parallel.tp;
  l.pp = c.parallel.pp;
  l.dp = c.parallel.dp;
  l.zero_stage = c.zero.stage;
  l.offload_optimizer = c.offload.optimizer;
  l.offload_param = c.offload.param;
  l.schedule = c.pipeline.schedule;
  l.virtual_stages = c.pipeline.virtual_stages;
  l.recompute = c.pipeline.recompute;
  l.micro_batch_size = c.train.micro_batch_size;
  l.grad_accum = c.train.grad_accum;
  return l;
}

int evaluate_one(const Options& o, const planner::PlanQuery& query) {
  if (o.evaluate == "config") {
    PARALLAX_CHECK(!o.config_file.empty(), UsageError, "--evaluate config scores the layout of --config FILE");
    return report_evaluation(o, query, layout_of_config(query));
  }
  const planner::LayoutConstraints given = planner::LayoutConstraints::parse(o.evaluate);
  PARALLAX_CHECK(given.tp && given.pp && given.dp, UsageError, "--evaluate ", o.evaluate,
                 ": give at least tp, pp and dp (the others take the planner's defaults)");
  planner::Layout layout;
  layout.tp = *given.tp;
  layout.pp = *given.pp;
  layout.dp = *given.dp;
  layout.zero_stage = given.zero_stage.value_or(0);
  layout.offload_optimizer = given.offload_optimizer.value_or(OffloadTarget::kNone);
  layout.offload_param = given.offload_param.value_or(OffloadTarget::kNone);
  layout.virtual_stages = given.virtual_stages.value_or(1);
  layout.schedule = given.schedule.value_or(layout.virtual_stages > 1 ? PipelineSchedule::kInterleaved
                                                                      : PipelineSchedule::k1F1B);
  layout.recompute = given.recompute.value_or(Recompute::kNone);
  layout.micro_batch_size = given.micro_batch_size.value_or(1);
  const std::int64_t per_replica = query.global_batch / layout.dp;
  layout.grad_accum = given.grad_accum.value_or(per_replica / layout.micro_batch_size);
  return report_evaluation(o, query, layout);
}

int report_evaluation(const Options& o, const planner::PlanQuery& query, const planner::Layout& layout) {
  const planner::Candidate candidate = planner::evaluate(query, layout);
  std::size_t rank = 0;
  std::int64_t scored = 0;
  if (candidate.runs()) {
    const planner::PlanResult all = planner::search(query, planner::LayoutConstraints{});
    rank = planner::rank_among(all, candidate, query.preference);
    scored = all.scored;
  }
  if (o.json) {
    std::printf("%s\n", planner::format_candidate_json(candidate, rank).c_str());
  } else {
    std::printf("%s on %s\n%s", query.model.describe().c_str(), query.cluster.describe().c_str(),
                planner::format_candidate(candidate).c_str());
    if (rank > 0) std::printf("  rank %zu of the %lld layouts scored\n", rank, static_cast<long long>(scored));
  }
  if (!o.emit_config.empty()) emit_config(o.emit_config, query, layout);
  return candidate.runs() ? 0 : 1;
}

int min_nodes(const Options& o, planner::PlanQuery query, const planner::LayoutConstraints& fixed) {
  for (int nodes = 1; nodes <= 4096; nodes *= 2) {
    query.cluster = cluster_of(o, nodes);
    try {
      const planner::PlanResult result = planner::search(query, fixed);
      std::printf("%s with a global batch of %lld fits on %d node(s), %d devices; the best plan there:\n%s",
                  query.model.describe().c_str(), static_cast<long long>(query.global_batch), nodes,
                  query.cluster.devices(), planner::format_candidate(result.ranked.front()).c_str());
      return 0;
    } catch (const ConfigError& e) {
      std::printf("%d node(s): %s\n", nodes, e.detail().c_str());
    }
  }
  return 1;
}

int largest_model(planner::PlanQuery query, const planner::LayoutConstraints& fixed) {
  query.memory_only = true;  // a question of fit: no step times needed until the answer
  const auto fits = [&](std::int64_t layers) {
    query.model.layers = layers;
    try {
      planner::search(query, fixed);
      return true;
    } catch (const ConfigError&) {
      return false;
    }
  };
  std::int64_t low = 0;
  std::int64_t high = 1;
  while (high <= (1 << 16) && fits(high)) {
    low = high;
    high *= 2;
  }
  while (high - low > 1) {
    const std::int64_t middle = (low + high) / 2;
    (fits(middle) ? low : high) = middle;
  }
  if (low == 0) {
    std::printf("not even one layer of this width fits %s\n", query.cluster.describe().c_str());
    return 1;
  }
  query.model.layers = low;
  query.memory_only = false;
  const planner::PlanResult result = planner::search(query, fixed);
  std::printf("the largest that fits %s with a global batch of %lld: %s\nits best plan:\n%s",
              query.cluster.describe().c_str(), static_cast<long long>(query.global_batch),
              query.model.describe().c_str(), planner::format_candidate(result.ranked.front()).c_str());
  return 0;
}

int compare_zero(const planner::PlanQuery& query, const planner::LayoutConstraints& fixed) {
  std::printf("%s on %s, global batch %lld: the best plan of each ZeRO stage and offload\n",
              query.model.describe().c_str(), query.cluster.describe().c_str(),
              static_cast<long long>(query.global_batch));
  for (const char* family : {"zero=0", "zero=1", "zero=2", "zero=3", "zero=1,offload=optimizer",
                             "zero=2,offload=optimizer", "zero=3,offload=optimizer", "zero=3,offload=optimizer+param"}) {
    planner::LayoutConstraints constraints = planner::LayoutConstraints::parse(family);
    const planner::LayoutConstraints given = fixed;
    if (given.tp) constraints.tp = given.tp;
    if (given.pp) constraints.pp = given.pp;
    if (given.dp) constraints.dp = given.dp;
    if (given.micro_batch_size) constraints.micro_batch_size = given.micro_batch_size;
    try {
      const planner::PlanResult result = planner::search(query, constraints);
      const planner::Candidate& best = result.ranked.front();
      std::printf("  %-32s %8.2f GiB per device, %8.3f s per step  (%s)\n", family,
                  static_cast<double>(best.memory.device_total()) / (1024.0 * 1024 * 1024), best.time.total,
                  best.layout.describe().c_str());
    } catch (const ConfigError& e) {
      std::printf("  %-32s none fits: %s\n", family, e.detail().c_str());
    }
  }
  return 0;
}

}  // namespace

int plan_command(const std::vector<std::string>& args) {
  for (const std::string& arg : args) {
    if (arg == "--help" || arg == "-h") {
      std::printf(kUsage, planner::TransformerShape::preset_names().c_str(),
                  planner::ClusterSpec::preset_names().c_str());
      return 0;
    }
  }
  const Options o = parse(args);
  const planner::PlanQuery query = query_of(o);
  if (!o.evaluate.empty()) return evaluate_one(o, query);
  const planner::LayoutConstraints fixed = planner::LayoutConstraints::parse(o.fix);
  if (o.min_nodes) return min_nodes(o, query, fixed);
  if (o.largest_model) return largest_model(query, fixed);
  if (o.compare_zero) return compare_zero(query, fixed);
  const planner::PlanResult result = planner::search(query, fixed);
  if (o.json) {
    std::printf("%s\n", planner::format_json(result, static_cast<std::size_t>(o.top)).c_str());
  } else {
    std::printf("%s on %s, global batch %lld\n%s", query.model.describe().c_str(), query.cluster.describe().c_str(),
                static_cast<long long>(query.global_batch),
                planner::format_table(result, static_cast<std::size_t>(o.top)).c_str());
  }
  if (!o.emit_config.empty()) emit_config(o.emit_config, query, result.ranked.front().layout);
  return 0;
}

}  // namespace parallax::cli
