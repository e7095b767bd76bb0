// Layout and LayoutConstraints (plan_search.h): their text form and the Config a
// layout stands for.
#include <sstream>

#include "parallax/core/config_loader.h"
#include "parallax/core/error.h"
#include "parallax/planner/plan_search.h"

namespace parallax::planner {
namespace {

const char* offload_name(OffloadTarget optimizer, OffloadTarget param) {
  if (optimizer == OffloadTarget::kNone) return "none";
  return param == OffloadTarget::kNone ? "optimizer" : "optimizer+param";
}

template <typename Enum>
Enum enum_named(const std::string& item, const std::string& value, std::initializer_list<Enum> values) {
  std::string allowed;
  for (Enum candidate : values) {
    if (value == to_string(candidate)) return candidate;
    allowed += (allowed.empty() ? "" : ", ") + std::string(to_string(candidate));
  }
  throw UsageError("layout item '" + item + "': expected one of " + allowed);
}

std::int64_t positive_number(const std::string& item, const std::string& value) {
  return parse_whole_number(value, item.rfind("zero=", 0) == 0 ? 0 : 1, "layout item '" + item + "'");
}

}  // namespace

std::int64_t parse_whole_number(const std::string& text, std::int64_t low, const std::string& what) {
  std::size_t used = 0;
  long long number = 0;
  try {
    number = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  PARALLAX_CHECK(!text.empty() && used == text.size() && number >= low && number <= (1LL << 40), UsageError, what,
                 ": expected a whole number of at least ", low);
  return number;
}

std::string Layout::describe() const {
  std::ostringstream out;
  out << "tp=" << tp << ",pp=" << pp << ",dp=" << dp << ",zero=" << zero_stage
      << ",offload=" << offload_name(offload_optimizer, offload_param) << ",schedule=" << to_string(schedule)
      << ",vp=" << virtual_stages << ",recompute=" << to_string(recompute) << ",mbs=" << micro_batch_size
      << ",ga=" << grad_accum;
  return out.str();
}

Config Layout::apply_to(const Config& base, std::int64_t global_batch) const {
  Config c = base;
  c.parallel.mode = ParallelMode::kManual;
  c.parallel.tp = tp;
  c.parallel.pp = pp;
  c.parallel.dp = dp;
  c.zero.stage = zero_stage;
  c.offload.optimizer = offload_optimizer;
  c.offload.param = offload_param;
  c.pipeline.schedule = schedule;
  c.pipeline.virtual_stages = virtual_stages;
  c.pipeline.recompute = recompute;
  c.train.micro_batch_size = micro_batch_size;
  c.train.grad_accum = grad_accum;
  c.train.global_batch_size = global_batch;
  return c;
}

LayoutConstraints LayoutConstraints::parse(const std::string& text) {
  LayoutConstraints fixed;
  std::istringstream items(text);
  std::string item;
  while (std::getline(items, item, ',')) {
    if (item.empty()) continue;
    const std::size_t equals = item.find('=');
    PARALLAX_CHECK(equals != std::string::npos, UsageError, "layout item '", item,
                   "': expected key=value (keys: tp, pp, dp, zero, offload, schedule, vp, recompute, mbs, ga)");
    const std::string key = item.substr(0, equals);
    const std::string value = item.substr(equals + 1);
    if (key == "tp") {
      fixed.tp = static_cast<int>(positive_number(item, value));
    } else if (key == "pp") {
      fixed.pp = static_cast<int>(positive_number(item, value));
    } else if (key == "dp") {
      fixed.dp = static_cast<int>(positive_number(item, value));
    } else if (key == "zero") {
      const std::int64_t stage = positive_number(item, value);
      PARALLAX_CHECK(stage <= 3, UsageError, "layout item '", item, "': the ZeRO stage is 0, 1, 2 or 3");
      fixed.zero_stage = static_cast<int>(stage);
    } else if (key == "vp") {
      fixed.virtual_stages = static_cast<int>(positive_number(item, value));
    } else if (key == "mbs") {
      fixed.micro_batch_size = positive_number(item, value);
    } else if (key == "ga") {
      fixed.grad_accum = positive_number(item, value);
    } else if (key == "offload") {
      PARALLAX_CHECK(value == "none" || value == "optimizer" || value == "optimizer+param", UsageError,
                     "layout item '", item, "': expected none, optimizer or optimizer+param (on the host)");
      fixed.offload_optimizer = value == "none" ? OffloadTarget::kNone : OffloadTarget::kCpu;
      fixed.offload_param = value == "optimizer+param" ? OffloadTarget::kCpu : OffloadTarget::kNone;
    } else if (key == "schedule") {
      fixed.schedule = enum_named(item, value,
                                  {PipelineSchedule::kGPipe, PipelineSchedule::k1F1B, PipelineSchedule::kInterleaved,
                                   PipelineSchedule::kZbH1});
    } else if (key == "recompute") {
      fixed.recompute = enum_named(item, value, {Recompute::kNone, Recompute::kFull});
    } else {
      throw UsageError("layout item '" + item +
                       "': unknown key (keys: tp, pp, dp, zero, offload, schedule, vp, recompute, mbs, ga)");
    }
  }
  return fixed;
}

bool LayoutConstraints::admits(const Layout& l) const {
  return (!tp || *tp == l.tp) && (!pp || *pp == l.pp) && (!dp || *dp == l.dp) &&
         (!zero_stage || *zero_stage == l.zero_stage) && (!virtual_stages || *virtual_stages == l.virtual_stages) &&
         (!offload_optimizer || *offload_optimizer == l.offload_optimizer) &&
         (!offload_param || *offload_param == l.offload_param) && (!schedule || *schedule == l.schedule) &&
         (!recompute || *recompute == l.recompute) && (!micro_batch_size || *micro_batch_size == l.micro_batch_size) &&
         (!grad_accum || *grad_accum == l.grad_accum);
}

std::string LayoutConstraints::describe() const {
  std::ostringstream out;
  const auto add = [&out](const char* key, const std::string& value) {
    out << (out.tellp() > 0 ? "," : "") << key << "=" << value;
  };
  if (tp) add("tp", std::to_string(*tp));
  if (pp) add("pp", std::to_string(*pp));
  if (dp) add("dp", std::to_string(*dp));
  if (zero_stage) add("zero", std::to_string(*zero_stage));
  if (offload_optimizer) add("offload", offload_name(*offload_optimizer, offload_param.value_or(OffloadTarget::kNone)));
  if (schedule) add("schedule", to_string(*schedule));
  if (virtual_stages) add("vp", std::to_string(*virtual_stages));
  if (recompute) add("recompute", to_string(*recompute));
  if (micro_batch_size) add("mbs", std::to_string(*micro_batch_size));
  if (grad_accum) add("ga", std::to_string(*grad_accum));
  return out.str();
}

}  // namespace parallax::planner
