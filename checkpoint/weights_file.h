// Consolidated weights files that other programs read and write: safetensors, and
// PyTorch's torch.save format (a zip of a pickled dict and one record per tensor), which
// Python's torch.load (weights_only included) reads as a state dict and C++ reads with
// torch::pickle_load. Every tensor is whole and named by the model's own parameter name.
//
//   auto out = WeightsWriter::open("gpt.safetensors", {{"head.weight", torch::kFloat, {64, 64}}, ...});
//   for (...) out->write(tensor);          // in the order of the entries, one at a time
//   out->close();                          // published by rename: never a torn file
//
// Writers stream: the layout is known before any data, so a writer holds one tensor at
// a time. Reading a safetensors file goes through checkpoint::Reader::open_weights,
// which reads only the byte ranges asked for; a torch.save file is read whole.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace parallax::checkpoint {

class Reader;

enum class WeightsFormat {
  kSafetensors,  ///< ".safetensors"
  kTorch,        ///< ".pt", ".pth": torch.save's zip format
};
/// The format a path's extension names; nothing for any other path.
std::optional<WeightsFormat> weights_format(const std::string& path);

struct WeightsEntry {
  std::string name;  ///< the model's parameter name, e.g. "blocks.0.qkv.weight"
  torch::ScalarType dtype = torch::kFloat;
  std::vector<std::int64_t> shape;
};

/// A weights file being written, one tensor after another, into `<path>.partial`,
/// renamed to `path` by close(). Every failure (a full disk among them) throws
/// CheckpointError naming the file.
class WeightsWriter {
 public:
  /// Throws CheckpointError when `path` has neither format's extension.
  static std::unique_ptr<WeightsWriter> open(const std::string& path, std::vector<WeightsEntry> entries);
  virtual ~WeightsWriter() = default;
  /// The next entry's values: its dtype and shape, any device.
  virtual void write(const torch::Tensor& values) = 0;
  /// After the last entry: finishes the file and publishes it under its name.
  virtual void close() = 0;
};

/// One tensor of a safetensors file: its entry and the byte range of its data in the
/// file (absolute offsets).
struct SafetensorsTensor {
  WeightsEntry entry;
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
};
/// A safetensors file's header, checked as untrusted input: its length, the JSON,
/// every dtype, shape and byte range (inside the file, of the size the shape needs).
/// Throws CheckpointError naming the file and the entry.
std::vector<SafetensorsTensor> read_safetensors_header(const std::string& path);

/// Every tensor of a torch.save file that holds a dict of tensors, in its order. Reads
/// the file whole (torch::pickle_load). Throws CheckpointError naming the file when it
/// is not such a file, including a Module.state_dict() saved as is: LibTorch's
/// unpickler cannot read its collections.OrderedDict (save dict(state_dict) instead, or
/// safetensors).
std::vector<std::pair<std::string, torch::Tensor>> read_torch_weights(const std::string& path);

struct ExportResult {
  std::size_t tensors = 0;
  std::uint64_t bytes = 0;                 ///< of tensor data written
  std::uint64_t largest_tensor_bytes = 0;  ///< the most held at once
};
/// Writes `entries` to `path` (its extension picks the format), asking `values(i)` for
/// entry i's tensor only when it is written, so one tensor is held at a time (converted
/// to the entry's dtype).
ExportResult write_weights(const std::string& path,
                           std::vector<WeightsEntry> entries,
                           const std::function<torch::Tensor(std::size_t)>& values);
/// Writes the weights of `checkpoint` ("param/<name>": the fp32 masters, whole-model
/// names) to `path` (its extension picks the format), one whole tensor at a time
/// (tensor-parallel parts joined, Reader::read_whole), converted to `dtype` when given.
/// Needs no MPI. Throws CheckpointError for a part whose cut is not recorded ("@tp"
/// names of tensor_parallel/'s own layers), naming one.
ExportResult export_weights(const Reader& checkpoint,
                            const std::string& path,
                            std::optional<torch::ScalarType> dtype = std::nullopt);

/// LibTorch's dtype for a name Reader and the manifest use ("Float", "BFloat16", ...);
/// throws CheckpointError for another.
torch::ScalarType dtype_from_name(const std::string& name);

}  // namespace parallax::checkpoint
