// Config::resolve: the arithmetic that needs the world size. The data-parallel degree
// and the batch identity are checked exactly; nothing is rounded (STYLE.md: never
// silently change what the user asked for).
#include "parallax/core/config.h"

#include <string>

#include "parallax/core/error.h"

namespace parallax {
namespace {

std::int64_t multiply(std::int64_t a, std::int64_t b, const char* what) {
  std::int64_t product = 0;
  PARALLAX_CHECK(!__builtin_mul_overflow(a, b, &product), ConfigError, what, " overflows: ", a, " × ", b);
  return product;
}

void resolve_degrees(ParallelOptions& parallel, int world_size) {
  PARALLAX_CHECK(parallel.tp >= 1 && parallel.pp >= 1 && parallel.cp >= 1, ConfigError, "parallel.tp = ", parallel.tp,
                 ", parallel.pp = ", parallel.pp, ", parallel.cp = ", parallel.cp, ": expected integers >= 1");
  PARALLAX_CHECK(parallel.dp == -1 || parallel.dp >= 1, ConfigError, "parallel.dp = ", parallel.dp,
                 ": expected -1 (the ranks left over) or an integer >= 1");
  // "parallel.tp (2) × parallel.pp (1)", with cp where it is not 1.
  const std::string cp = parallel.cp == 1 ? "" : " × parallel.cp (" + std::to_string(parallel.cp) + ")";
  const std::int64_t model_parallel =
      multiply(multiply(parallel.tp, parallel.pp, "parallel.tp × parallel.pp"), parallel.cp, "parallel.tp × pp × cp");
  if (parallel.dp == -1) {
    PARALLAX_CHECK(world_size % model_parallel == 0, ConfigError, "parallel.dp = -1 cannot be inferred: parallel.tp (",
                   parallel.tp, ") × parallel.pp (", parallel.pp, ")", cp, " = ", model_parallel,
                   " does not divide the world size (", world_size, " ranks)");
    parallel.dp = static_cast<int>(world_size / model_parallel);
  }
  const std::int64_t product = multiply(model_parallel, parallel.dp, "parallel.tp × pp × cp × dp");
  PARALLAX_CHECK(product == world_size, ConfigError, "parallel.tp (", parallel.tp, ") × parallel.pp (", parallel.pp,
                 ")", cp, " × parallel.dp (", parallel.dp, ") = ", product, ", but the world size is ", world_size,
                 " ranks; the product must equal the number of ranks");
  const std::int64_t replicas = static_cast<std::int64_t>(parallel.dp) * parallel.cp;
  PARALLAX_CHECK(parallel.ep >= 1 && replicas % parallel.ep == 0, ConfigError, "parallel.ep = ", parallel.ep,
                 " must divide parallel.dp (", parallel.dp, ")", cp, " = ", replicas,
                 ": expert parallelism folds inside the data-parallel replicas (Megatron's folding); e.g. "
                 "parallel.ep = ",
                 replicas, " or a divisor of it");
}

// "train.global_batch_size (32), train.micro_batch_size (omitted), ..., parallel.dp (2)"
std::string batch_values(const TrainOptions& train, int dp) {
  auto show = [](std::int64_t v) { return v == 0 ? std::string("omitted") : std::to_string(v); };
  return "train.global_batch_size (" + show(train.global_batch_size) + "), train.micro_batch_size (" +
         show(train.micro_batch_size) + "), train.grad_accum (" + show(train.grad_accum) + "), parallel.dp (" +
         std::to_string(dp) + ")";
}

void resolve_batch(TrainOptions& train, int dp) {
  std::int64_t& global = train.global_batch_size;
  std::int64_t& micro = train.micro_batch_size;
  std::int64_t& accum = train.grad_accum;
  PARALLAX_CHECK(global >= 0 && micro >= 0 && accum >= 0, ConfigError, "batch values must be >= 1, ",
                 "or 0 to be inferred: ", batch_values(train, dp));
  const char* const identity = "global_batch_size = micro_batch_size × grad_accum × dp";
  PARALLAX_CHECK(global != 0 || micro != 0, ConfigError,
                 "train: set global_batch_size or micro_batch_size (or both); got ", batch_values(train, dp), "; ",
                 identity);

  const int omitted = (global == 0) + (micro == 0) + (accum == 0);
  // With two unknowns the identity cannot decide; one accumulation step is the
  // natural default and the remaining unknown is then inferred.
  if (omitted >= 2 && accum == 0) accum = 1;

  if (global == 0) {
    global = multiply(multiply(micro, accum, "train.micro_batch_size × grad_accum"), dp,
                      "train.micro_batch_size × grad_accum × dp");
  } else if (micro == 0) {
    const std::int64_t per_micro = multiply(accum, dp, "train.grad_accum × parallel.dp");
    PARALLAX_CHECK(global % per_micro == 0, ConfigError,
                   "train.micro_batch_size cannot be inferred: train.global_batch_size (", global,
                   ") is not divisible by train.grad_accum (", accum, ") × parallel.dp (", dp, ") = ", per_micro, "; ",
                   identity);
    micro = global / per_micro;
  } else if (accum == 0) {
    const std::int64_t per_step = multiply(micro, dp, "train.micro_batch_size × parallel.dp");
    PARALLAX_CHECK(global % per_step == 0, ConfigError,
                   "train.grad_accum cannot be inferred: train.global_batch_size (", global,
                   ") is not divisible by train.micro_batch_size (", micro, ") × parallel.dp (", dp, ") = ", per_step,
                   "; ", identity);
    accum = global / per_step;
  }

  const std::int64_t product = multiply(multiply(micro, accum, "train.micro_batch_size × grad_accum"), dp,
                                        "train.micro_batch_size × grad_accum × dp");
  PARALLAX_CHECK(product == global, ConfigError, "train.global_batch_size (", global, ") != train.micro_batch_size (",
                 micro, ") × train.grad_accum (", accum, ") × parallel.dp (", dp, ") = ", product, "; ", identity,
                 " must hold exactly");
}

}  // namespace

const std::vector<std::string>& Config::plannable_keys() {
  static const std::vector<std::string> keys{"train.micro_batch_size",
                                             "train.grad_accum",
                                             "parallel.tp",
                                             "parallel.pp",
                                             "parallel.dp",
                                             "zero.stage",
                                             "offload.optimizer",
                                             "offload.param",
                                             "pipeline.schedule",
                                             "pipeline.virtual_stages",
                                             "pipeline.recompute"};
  return keys;
}

std::string Config::position_of(const std::string& key) const {
  const auto found = positions.find(key);
  return found == positions.end() ? "" : found->second;
}

void Config::resolve(int world_size) {
  PARALLAX_CHECK(world_size >= 1, UsageError, "Config::resolve: world_size = ", world_size, ", expected >= 1");
  // Work on copies so a failed resolve leaves the Config as it was.
  ParallelOptions resolved_parallel = parallel;
  TrainOptions resolved_train = train;
  resolve_degrees(resolved_parallel, world_size);
  resolve_batch(resolved_train, resolved_parallel.dp);
  parallel = resolved_parallel;
  train = resolved_train;
}

}  // namespace parallax
