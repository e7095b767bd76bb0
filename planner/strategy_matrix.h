// The strategy matrix: which products of tensor, context, pipeline and data parallelism,
// ZeRO stage, offload and the communication backend this build runs, and why the others
// do not. The one place that decides: parallax::init's plan (plan.h) calls
// check_strategy() on every rank before anything is printed or any model is built,
// and the README's matrix table is printed by strategy_matrix_markdown(), which runs
// the real loader and this check on every cell.
//
//   const std::vector<parallax::Refusal> refusals = parallax::strategy_refusals(config);
//   for (const auto& r : refusals) std::cout << r.message() << "\n";
//   parallax::check_strategy(config);   // throws ConfigError listing every refusal
#pragma once

#include <string>
#include <vector>

#include "parallax/core/config.h"

namespace parallax {

/// Why one combination of keys does not run, and the nearest combination that does.
struct Refusal {
  /// The keys that together are refused, each with its value and where it was set,
  /// e.g. "zero.stage = 2 at train.toml:12:9".
  std::vector<std::string> keys;
  /// Why, e.g. "ZeRO inside pipeline stages is not available in this build".
  std::string reason;
  /// The nearest cell that runs, e.g. "zero.stage = 0 (data parallelism across pipelines)".
  std::string nearest;

  /// "keys: reason; instead: nearest", on one line.
  std::string message() const;
};

/// Every refusal for a resolved `config` (Config::resolve has run); empty when the
/// strategy runs. Pure: no communication, the same on every rank holding the config.
std::vector<Refusal> strategy_refusals(const Config& config);

/// Throws ConfigError listing every refusal of strategy_refusals(config), one per line.
void check_strategy(const Config& config);

/// The matrix as a Markdown table and its numbered reasons: one row per tp (1, 2) × cp
/// (1, 2) × pp (1, 2) × ZeRO stage (0–3), one column per offload (none, optimizer,
/// optimizer and parameters); each cell loaded from its keys by the real config loader,
/// resolved on tp × cp × pp × 2 ranks and checked by strategy_refusals(): "runs", or
/// "refused (n)" with reason n below the table. Deterministic.
std::string strategy_matrix_markdown();

}  // namespace parallax
