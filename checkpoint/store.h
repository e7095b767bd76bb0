// Sharded checkpoints: every rank writes the pieces of state it owns, rank 0 writes the
// manifest (the global view: every tensor's name, dtype and shape, which element range
// each file holds, CRC-32 per block) and publishes the directory atomically. Loading
// reads, per rank, only the blocks that overlap the ranges that rank asks for, so a
// checkpoint saved under one sharding loads under any other that names the same tensors.
// The strategies' state (which tensors exist, who owns what) is runtime/'s; this module
// only moves named element ranges to and from files (files.h has the directory layout).
//
//   std::vector<Piece> mine = ...;                       // views of the state this rank owns
//   SaveResult r = save(world, {"/ckpt", step, keep, layout, mine, engine_blob, trainer_blob});
//   Reader checkpoint = Reader::open("/ckpt", Reader::kLatest);
//   checkpoint.read("param/fc.weight", offset, out);     // out: this rank's range, filled
//
// Save protocol (collective over `world`; every rank returns the same outcome):
//  1. rank 0 creates <root>/step-N.partial (removing a torn one of the same step);
//  2. every rank with pieces writes rank-R.bin and fsyncs it;
//  3. every rank's piece list reaches rank 0, which checks that the pieces of each tensor
//     cover it exactly once, writes manifest.pb and the commit marker, fsyncs, renames
//     the directory to step-N, fsyncs the root, and removes the oldest complete
//     checkpoints beyond `keep`.
// A failure on any rank at any point (a full disk, an unwritable root) is a
// CheckpointError on every rank naming the rank, the file and the reason; the .partial
// directory is removed and the previous checkpoints are untouched. A crash mid-save
// leaves at most a .partial directory, which no loader takes.
#pragma once

#include <torch/types.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "parallax/core/communicator.h"
#include "parallax/core/error.h"
#include "parallax/core/tensor_cut.h"

namespace parallax::proto {
class CheckpointManifest;
class CheckpointTensor;
}  // namespace parallax::proto

namespace parallax::checkpoint {

/// The kind the engines save weights under ("param/<parameter name>"; optimizer state
/// has other kinds): what a weights file holds and export writes.
inline constexpr char kParamKind[] = "param";

/// `tensor` is part `index` of `count` of the larger tensor `whole` (a tensor-parallel
/// rank's), cut from a tensor of `whole_shape` as core/tensor_cut.h cuts: what lets a
/// reader join the parts under any other part count. `count` 0: not a part.
struct PartOf {
  std::string whole;
  std::vector<std::int64_t> whole_shape;
  TensorCut cut;
  std::int64_t index = 0;
  std::int64_t count = 0;
};

/// Elements [offset, offset + values.numel()) of the flattened tensor `tensor`, whose
/// whole shape is `shape`: a view of state this rank owns (any device; read at save).
struct Piece {
  std::string tensor;
  std::vector<std::int64_t> shape;
  std::int64_t offset = 0;
  torch::Tensor values;
  PartOf part;
};

struct SaveRequest {
  std::string root;
  std::int64_t step = 0;
  int keep = 0;        ///< complete checkpoints to keep (0: all)
  std::string layout;  ///< the saving run's plan, one line, for messages
  std::vector<Piece> pieces;
  std::string engine_state;   ///< rank 0's is kept
  std::string trainer_state;  ///< rank 0's is kept
  /// How long a rank waits for the others between phases (writing may be slow); 0: the
  /// communicator's own timeout.
  std::chrono::milliseconds timeout{0};
};

struct SaveResult {
  std::string directory;            ///< the published checkpoint
  std::uint64_t bytes_written = 0;  ///< by this rank (its data file)
  double write_seconds = 0.0;       ///< this rank's data file, write + fsync
  double save_seconds = 0.0;        ///< the whole protocol, on this rank
  /// How long the caller's training loop waited for it (the engine's figure: the whole
  /// save when synchronous; the snapshot and the wait for the previous save when
  /// asynchronous); 0 from save() itself.
  double blocked_seconds = 0.0;
};

/// The save protocol above. Collective over `world`; blocks.
SaveResult save(Communicator& world, const SaveRequest& request);

/// Collective over `world`, after a phase every rank ran: returns when every rank's
/// `error` is empty; otherwise every rank throws the same CheckpointError, "<action>
/// failed on rank R: <R's error>" (the lowest failing rank), so none goes on alone.
void raise_if_any_failed(Communicator& world,
                         const std::string& action,
                         const std::string& error,
                         std::chrono::milliseconds timeout);

/// Runs `body`; returns the message of the Parallax error it threw, "" when it did not
/// (for raise_if_any_failed).
template <typename Body>
std::string error_of(Body&& body) {
  try {
    body();
    return "";
  } catch (const Error& e) {
    return e.detail();
  }
}

/// A published checkpoint, validated on open: its commit marker matches manifest.pb,
/// the manifest parses, and every data file has the size the manifest records.
class Reader {
 public:
  enum Mode {
    kExactly,  ///< `where` is a checkpoint directory; a torn one is an error
    kLatest,   ///< `where` is a root: the newest checkpoint under it that validates
  };
  /// Throws CheckpointError naming the directory, the file and what was expected (with
  /// kLatest: when no checkpoint under the root validates, listing why each did not).
  static Reader open(const std::string& where, Mode mode);
  /// A safetensors file (weights_file.h) read as a checkpoint of weights only: its
  /// tensors under "param/<name>", step 0, no engine or trainer state, no CRCs (the
  /// format has none; its header is checked as untrusted input). Loading it starts a
  /// run from pretrained weights under any layout.
  static Reader open_weights(const std::string& path);
  ~Reader();
  Reader(Reader&&) noexcept;
  Reader& operator=(Reader&&) noexcept;

  const std::string& directory() const { return directory_; }
  std::int64_t step() const;
  const std::string& layout() const;
  const std::string& engine_state() const;
  const std::string& trainer_state() const;
  /// Checkpoints under the root that kLatest passed over (newer but torn), with why.
  const std::vector<std::string>& skipped() const { return skipped_; }

  /// Whether it holds only weights (open_weights): no engine state to restore.
  bool weights_only() const { return weights_only_; }
  /// Every saved tensor's name (parts included), in the manifest's order.
  std::vector<std::string> tensors() const;
  /// Every whole tensor: each saved tensor that is not a part, and each tensor saved as
  /// parts (PartOf), once, where its first part is; in the manifest's order.
  std::vector<std::string> wholes() const;
  /// Whether `tensor` is saved (whole, or as a part).
  bool has(const std::string& tensor) const;
  /// Whether `tensor` is saved whole or as parts: what read_whole() reads.
  bool has_whole(const std::string& tensor) const;
  /// How many parts `tensor` is saved as (0: saved whole, or not at all).
  std::int64_t parts_of(const std::string& tensor) const;
  /// The tensor's saved dtype and whole shape (a tensor saved as parts: the joined
  /// one's); throw CheckpointError when it is not in the checkpoint.
  torch::ScalarType dtype(const std::string& tensor) const;
  std::vector<std::int64_t> shape(const std::string& tensor) const;
  /// Fills `out` (contiguous, on the host, the tensor's dtype) with elements [offset,
  /// offset + out.numel()) of `tensor`, reading only the blocks that hold them and
  /// checking each block's CRC-32 (a safetensors file has none to check). Throws
  /// CheckpointError naming the file, the tensor and the block when a CRC does not
  /// match or a read comes short, and when the range is not saved or the dtype differs.
  void read(const std::string& tensor, std::int64_t offset, torch::Tensor& out) const;
  /// The whole of `tensor`, in its saved dtype: read, or its parts read one after
  /// another and joined (core/tensor_cut.h), holding the whole and one part at most.
  /// Throws as read() does.
  torch::Tensor read_whole(const std::string& tensor) const;
  /// Bytes this reader has read from data files.
  std::uint64_t bytes_read() const { return bytes_read_; }

 private:
  struct Index;
  Reader() = default;
  void build_index();
  const proto::CheckpointTensor& saved(const std::string& tensor) const;
  std::string directory_;
  std::unique_ptr<proto::CheckpointManifest> manifest_;
  std::unique_ptr<Index> index_;
  std::vector<std::string> skipped_;
  bool weights_only_ = false;
  mutable std::uint64_t bytes_read_ = 0;
};

}  // namespace parallax::checkpoint
