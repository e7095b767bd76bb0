// Times of a transformer's layers on this machine, and its memory bandwidth and link
// (α–β of the world's all-reduce), for the planner (auto_layout.h): a
// block and the LM head with its loss, built from ATen operations of the model's own
// shapes (TransformerShape) at each micro-batch size and tensor-parallel split a plan
// may use, forward and backward timed while every rank does the same (so a rank's time
// is what it gets when its neighbours compute too). The ranks' mean is shared from rank
// 0, so every rank plans from the same figures. Rank 0 keeps them in a file
// (planner/layer_profile_file.h) keyed by the conditions, so a second run under the
// same ones times only the shapes the file lacks.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "parallax/core/config.h"
#include "parallax/planner/layer_profile_file.h"

namespace parallax {

class World;

/// The profile and where it came from.
struct LayerProfile {
  planner::MeasuredProfile measured;  ///< every requested shape (and any more the file had)
  std::size_t timed = 0;              ///< shapes timed by this run
  std::size_t from_file = 0;          ///< shapes read from `file`
  bool machine_from_file = false;     ///< memory and link figures read from `file`
  /// The file's correction of predicted step times (MeasuredProfile::step_time_correction)
  /// and the runs it comes from; 1 and 0 without a file.
  double step_time_correction = 1.0;
  std::size_t correction_runs = 0;
  std::string file;                   ///< the cache file ("" when keeping none)
  std::string cache_problem;          ///< why the file could not be read or written ("" if it could)
};

/// Profiles `model` in `dtype` at every micro-batch of `micro_batches` and every split
/// of `tps` (those that divide its heads), on every rank at once (the median
/// of three runs after a warm-up), and the machine's figures; returns the ranks' mean,
/// identical on every rank. Shapes (and figures) found in `cache_directory`'s file for
/// these conditions are not measured again;
/// `cache_directory` "none" keeps no file. A file that cannot be read or written costs
/// only the timing (cache_problem says why). Collective over the world.
LayerProfile profile_layers(const planner::TransformerShape& model,
                            Dtype dtype,
                            const std::vector<std::int64_t>& micro_batches,
                            const std::vector<int>& tps,
                            const std::string& cache_directory,
                            World& world);

/// At an auto run's end, on rank 0: appends `ratio` (measured / predicted step time,
/// the prediction uncorrected) to `file`'s ratios, so the next run's correction counts
/// it. Returns "" when written, else why not (never throws).
std::string record_step_time_ratio(const std::string& file, double ratio);

}  // namespace parallax
