// TensorBoard event files: named scalars per optimizer step, in the format TensorBoard
// (and tensorboardX, PyTorch's SummaryWriter) reads.
//
// One file per writer, `<dir>/events.out.tfevents.<unix seconds>.<hostname>.<pid>`, a
// sequence of records, each framed as
//   uint64 length of the data, little endian
//   uint32 masked CRC-32C of those 8 length bytes, little endian
//   the data: one serialized Event (proto/tensorboard_event.proto)
//   uint32 masked CRC-32C of the data, little endian
// where masked(crc) = ((crc >> 15) | (crc << 17)) + 0xa282ead8 (mod 2^32). The first
// Event carries file_version "brain.Event:2"; each add_scalars call appends one Event
// whose Summary holds its values. Every record is flushed when written, so TensorBoard
// shows a run while it trains.
//
//   TensorBoardWriter tensorboard("runs/gpt-dp4");
//   tensorboard.add_scalars(step, {{"train/loss", 2.71}, {"train/lr", 3e-4}});
//   // tensorboard --logdir runs
#pragma once

#include <cstddef>
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

namespace parallax {

/// One named value of a step, e.g. {"train/loss", 2.71}. Written as a 32-bit float
/// (TensorBoard's simple_value).
struct TensorBoardScalar {
  std::string tag;
  double value = 0.0;
};

class TensorBoardWriter {
 public:
  /// Creates `dir` (with its parents) if missing and a new event file in it, and writes
  /// the file_version record. Blocks on the file system. Throws UsageError naming
  /// logging.tensorboard_dir, the path and the system's reason when the directory cannot
  /// be created or the file cannot be created or written.
  explicit TensorBoardWriter(const std::string& dir);

  /// Appends one Event at `step` (wall time now) holding `scalars` in order, and flushes
  /// it. Blocks on the file write. Throws UsageError naming the file when the write
  /// fails; the file may then end in a partial record, which readers drop.
  void add_scalars(std::int64_t step, const std::vector<TensorBoardScalar>& scalars);

  /// The event file's path, e.g. "runs/gpt/events.out.tfevents.1718000000.node7.4242".
  const std::string& path() const { return path_; }

 private:
  void write_record(const std::string& data);

  std::string path_;
  std::ofstream out_;
};

/// CRC-32C (Castagnoli, reflected, as iSCSI and TFRecord use it) of `size` bytes, e.g.
/// crc32c("123456789", 9) == 0xE3069283. Computed by Boost.CRC.
std::uint32_t crc32c(const void* data, std::size_t size);

/// The masked CRC-32C a TFRecord stores: masked(crc32c(data, size)) as above.
std::uint32_t masked_crc32c(const void* data, std::size_t size);

}  // namespace parallax
