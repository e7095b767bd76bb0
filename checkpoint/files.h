// The file-system side of checkpoints: names, durable writes, CRC-32, and which
// checkpoint directories under a root are complete. No tensors, no communication.
//
// Layout under a root (checkpoint.dir):
//   step-000000000120/            a complete checkpoint (published by rename)
//     rank-00000.bin ...          each rank's pieces, back to back
//     manifest.pb                 proto/checkpoint.proto's CheckpointManifest
//     commit                      "<manifest bytes> <manifest CRC-32>\n", written last
//   step-000000000130.partial/    one being written (or torn by a crash): never loaded
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace parallax::checkpoint {

/// "step-000000000120" for step 120.
std::string directory_name(std::int64_t step);
/// "rank-00003.bin".
std::string rank_file_name(int rank);
/// The step a complete checkpoint directory's name encodes, or nothing for any other
/// name (a `.partial` directory, a stray file).
std::optional<std::int64_t> step_of(const std::string& name);

/// The directory part of `path` ("." for a bare name, "/" for a file at the root) and
/// the name after the last '/'.
std::string parent_directory(const std::string& path);
std::string base_name(const std::string& path);

/// CRC-32 (zlib's) of `bytes` bytes at `data`, continuing from `crc` (0 to start).
std::uint32_t crc32(const void* data, std::size_t bytes, std::uint32_t crc = 0);

/// A file opened for writing; every failure throws CheckpointError naming the path and
/// the system's reason (a full disk among them). close() fsyncs before closing.
class DurableFile {
 public:
  explicit DurableFile(std::string path);
  ~DurableFile();
  DurableFile(const DurableFile&) = delete;
  DurableFile& operator=(const DurableFile&) = delete;

  void write(const void* data, std::size_t bytes);
  std::uint64_t written() const { return written_; }
  /// fsync, then close.
  void close();

 private:
  std::string path_;
  int fd_ = -1;
  std::uint64_t written_ = 0;
};

/// Writes `text` to `path` durably (DurableFile).
void write_file(const std::string& path, const std::string& text);
/// The whole file; throws CheckpointError naming it if it cannot be read.
std::string read_file(const std::string& path);
/// fsync of a directory, so the entries created or renamed in it survive a crash.
void sync_directory(const std::string& path);
/// mkdir -p; throws CheckpointError naming the path.
void make_directories(const std::string& path);
/// rm -r (no error if absent); throws CheckpointError naming the path.
void remove_tree(const std::string& path);
/// rename(2), then fsync of the parent; throws CheckpointError naming both.
void rename_durably(const std::string& from, const std::string& to, const std::string& parent);

/// The complete-looking checkpoint directories under `root` (step-N, not .partial), by
/// step, newest first; empty when `root` does not exist.
std::vector<std::string> checkpoint_directories(const std::string& root);

}  // namespace parallax::checkpoint
