#include "parallax/checkpoint/weights_file.h"

#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/pickler.h>
#include <torch/serialize.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "parallax/checkpoint/files.h"
#include "parallax/checkpoint/store.h"
#include "parallax/core/error.h"

namespace parallax::checkpoint {
namespace {

struct SafetensorsDtype {
  const char* code;
  torch::ScalarType type;
};
constexpr std::array<SafetensorsDtype, 10> kSafetensorsDtypes{{
    {"F64", torch::kDouble},
    {"F32", torch::kFloat},
    {"F16", torch::kHalf},
    {"BF16", torch::kBFloat16},
    {"I64", torch::kLong},
    {"I32", torch::kInt},
    {"I16", torch::kShort},
    {"I8", torch::kChar},
    {"U8", torch::kByte},
    {"BOOL", torch::kBool},
}};

const char* safetensors_code(torch::ScalarType type, const std::string& tensor) {
  for (const SafetensorsDtype& d : kSafetensorsDtypes) {
    if (d.type == type) return d.code;
  }
  throw CheckpointError(
      detail::concat("tensor '", tensor, "' has dtype ", c10::toString(type), ", which safetensors does not store"));
}

bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() && text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The entry's values on the host, contiguous, checked against the entry.
torch::Tensor host_values(const WeightsEntry& entry, const torch::Tensor& values, const std::string& path) {
  PARALLAX_CHECK(values.scalar_type() == entry.dtype && values.sizes().vec() == entry.shape, CheckpointError, path,
                 ": tensor '", entry.name, "' was announced as ", c10::toString(entry.dtype), " ", entry.shape.size(),
                 "-d of ", c10::multiply_integers(entry.shape), " elements, written as ",
                 c10::toString(values.scalar_type()), " ", values.sizes());
  return values.detach().to(torch::kCPU).contiguous();
}

// A writer's bookkeeping: the entries are written in order, each checked against its
// announcement; close() publishes `<path>.partial` under `path` once all are written.
class OrderedWriter : public WeightsWriter {
 public:
  OrderedWriter(std::string path, std::vector<WeightsEntry> entries)
      : path_(std::move(path)), entries_(std::move(entries)) {}

  void write(const torch::Tensor& values) final {
    PARALLAX_CHECK(next_ < entries_.size(), CheckpointError, path_, ": more tensors written than announced");
    write_next(next_, host_values(entries_[next_], values, path_));
    ++next_;
  }

  void close() final {
    PARALLAX_CHECK(next_ == entries_.size(), CheckpointError, path_, ": ", next_, " of ", entries_.size(),
                   " tensors written");
    finish();
    rename_durably(partial(), path_, parent_directory(path_));
  }

 protected:
  /// Entry `index`'s values, on the host and contiguous, into `<path>.partial`.
  virtual void write_next(std::size_t index, const torch::Tensor& host) = 0;
  /// Completes `<path>.partial` (flushed and closed).
  virtual void finish() = 0;
  std::string partial() const { return path_ + ".partial"; }

  std::string path_;
  std::vector<WeightsEntry> entries_;

 private:
  std::size_t next_ = 0;
};

// safetensors: an 8-byte little-endian header length, the JSON header (padded with
// spaces to a multiple of 8), then every tensor's bytes in the header's order.
class SafetensorsWriter final : public OrderedWriter {
 public:
  SafetensorsWriter(std::string path, std::vector<WeightsEntry> entries)
      : OrderedWriter(std::move(path), std::move(entries)), file_(partial()) {
    nlohmann::ordered_json header;
    header["__metadata__"] = {{"format", "pt"}, {"writer", "parallax"}};
    std::uint64_t offset = 0;
    for (const WeightsEntry& entry : entries_) {
      const std::uint64_t bytes =
          static_cast<std::uint64_t>(c10::multiply_integers(entry.shape)) * c10::elementSize(entry.dtype);
      header[entry.name] = {{"dtype", safetensors_code(entry.dtype, entry.name)},
                            {"shape", entry.shape},
                            {"data_offsets", {offset, offset + bytes}}};
      offset += bytes;
    }
    std::string text = header.dump();
    text.append((8 - text.size() % 8) % 8, ' ');
    std::array<unsigned char, 8> length{};
    for (int i = 0; i < 8; ++i)
      length[static_cast<std::size_t>(i)] = static_cast<unsigned char>(text.size() >> (8 * i));
    file_.write(length.data(), length.size());
    file_.write(text.data(), text.size());
  }

 private:
  void write_next(std::size_t, const torch::Tensor& host) override {
    file_.write(host.data_ptr(), static_cast<std::size_t>(host.numel()) * host.element_size());
  }
  void finish() override { file_.close(); }

  DurableFile file_;
};

// Runs `body`, LibTorch's zip writer at work on `path`: its failures (a full disk) come
// as c10::Error.
template <typename Body>
auto guarded(const std::string& path, Body&& body) -> decltype(body()) {
  try {
    return body();
  } catch (const c10::Error& e) {
    throw CheckpointError(detail::concat("writing ", path, ": ", e.what_without_backtrace()));
  }
}

// torch.save's format: LibTorch's own zip writer takes each tensor's bytes as record
// data/<i> as it comes; at the end LibTorch's pickler writes data.pkl, the dict of
// tensors referring to those records. The pickler reads only the tensors' metadata, so
// it is handed stand-ins: tensors of the entries' dtypes and shapes over a dummy
// pointer, never dereferenced.
class TorchWriter final : public OrderedWriter {
 public:
  TorchWriter(std::string path, std::vector<WeightsEntry> entries)
      : OrderedWriter(std::move(path), std::move(entries)) {
    std::remove(partial().c_str());  // a torn earlier export's
    writer_ = guarded(partial(), [&] { return std::make_unique<caffe2::serialize::PyTorchStreamWriter>(partial()); });
  }

 private:
  void write_next(std::size_t index, const torch::Tensor& host) override {
    guarded(partial(), [&] {
      writer_->writeRecord("data/" + std::to_string(index), host.data_ptr(),
                           static_cast<std::size_t>(host.numel()) * host.element_size());
      return 0;
    });
  }

  void finish() override {
    static char stand_in_data = 0;
    c10::Dict<std::string, at::Tensor> dict;
    std::unordered_map<const c10::StorageImpl*, std::string> keys;
    for (std::size_t i = 0; i < entries_.size(); ++i) {
      const WeightsEntry& entry = entries_[i];
      torch::Tensor stand_in = torch::from_blob(&stand_in_data, entry.shape, torch::TensorOptions(entry.dtype));
      keys.emplace(stand_in.storage().unsafeGetStorageImpl(), std::to_string(i));
      dict.insert(entry.name, stand_in);
    }
    std::vector<char> pickle;
    torch::jit::Pickler pickler(
        [&](const char* bytes, std::size_t n) { pickle.insert(pickle.end(), bytes, bytes + n); },
        /*tensor_table=*/nullptr, /*type_renamer=*/nullptr, /*memoized_class_types=*/nullptr,
        [&](const at::Tensor& t) { return keys.at(t.storage().unsafeGetStorageImpl()); },
        /*tag_aggregates=*/false);
    pickler.protocol();
    pickler.pushIValue(dict);
    pickler.stop();
    guarded(partial(), [&] {
      writer_->writeRecord("data.pkl", pickle.data(), pickle.size());
      writer_->writeRecord("byteorder", "little", 6);
      writer_->writeEndOfFile();
      return 0;
    });
    writer_.reset();
  }

  std::unique_ptr<caffe2::serialize::PyTorchStreamWriter> writer_;
};

}  // namespace

std::optional<WeightsFormat> weights_format(const std::string& path) {
  if (ends_with(path, ".safetensors")) return WeightsFormat::kSafetensors;
  if (ends_with(path, ".pt") || ends_with(path, ".pth")) return WeightsFormat::kTorch;
  return std::nullopt;
}

std::unique_ptr<WeightsWriter> WeightsWriter::open(const std::string& path, std::vector<WeightsEntry> entries) {
  const std::optional<WeightsFormat> format = weights_format(path);
  PARALLAX_CHECK(format.has_value(), CheckpointError, path,
                 ": the extension names no weights format (expected .safetensors, .pt or .pth)");
  if (*format == WeightsFormat::kSafetensors) return std::make_unique<SafetensorsWriter>(path, std::move(entries));
  return std::make_unique<TorchWriter>(path, std::move(entries));
}

std::vector<SafetensorsTensor> read_safetensors_header(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  PARALLAX_CHECK(in.good(), CheckpointError, "cannot open ", path, ": ", std::strerror(errno));
  in.seekg(0, std::ios::end);
  const auto file_bytes = static_cast<std::uint64_t>(in.tellg());
  in.seekg(0);
  std::array<unsigned char, 8> length{};
  in.read(reinterpret_cast<char*>(length.data()), length.size());
  PARALLAX_CHECK(in.good(), CheckpointError, path, ": shorter than a safetensors header's 8-byte length");
  std::uint64_t header_bytes = 0;
  for (int i = 7; i >= 0; --i) header_bytes = (header_bytes << 8) | length[static_cast<std::size_t>(i)];
  constexpr std::uint64_t kMaxHeaderBytes = 100u << 20;  // the safetensors library's own limit
  PARALLAX_CHECK(header_bytes <= kMaxHeaderBytes && header_bytes <= file_bytes - 8, CheckpointError, path,
                 ": header length ", header_bytes, " exceeds the file (", file_bytes, " bytes) or 100 MiB");
  std::string text(header_bytes, '\0');
  in.read(text.data(), static_cast<std::streamsize>(header_bytes));
  PARALLAX_CHECK(in.good(), CheckpointError, path, ": header cut short");
  const std::uint64_t data_begin = 8 + header_bytes;
  const std::uint64_t data_bytes = file_bytes - data_begin;

  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError(detail::concat(path, ": the header is not JSON (", e.what(), ")"));
  }
  PARALLAX_CHECK(header.is_object(), CheckpointError, path, ": the header is not a JSON object");
  std::vector<SafetensorsTensor> tensors;
  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") continue;
    const std::string& tensor_name = name;  // a lambda cannot capture a structured binding in C++17
    const auto bad = [&](const std::string& what) {
      return CheckpointError(detail::concat(path, ": tensor '", tensor_name, "': ", what));
    };
    if (!value.is_object() || !value.contains("dtype") || !value.contains("shape") || !value.contains("data_offsets")) {
      throw bad("expected an object with dtype, shape and data_offsets");
    }
    SafetensorsTensor tensor;
    tensor.entry.name = name;
    const nlohmann::json& dtype = value["dtype"];
    bool known = false;
    for (const SafetensorsDtype& d : kSafetensorsDtypes) {
      if (dtype.is_string() && dtype.get<std::string>() == d.code) {
        tensor.entry.dtype = d.type;
        known = true;
      }
    }
    if (!known)
      throw bad("dtype " + dtype.dump() + " is not one this build reads (F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL)");
    const nlohmann::json& shape = value["shape"];
    if (!shape.is_array()) throw bad("shape is not an array");
    constexpr std::uint64_t kMaxElements = std::uint64_t{1} << 48;
    std::uint64_t numel = 1;
    for (const nlohmann::json& d : shape) {
      if (!d.is_number_unsigned()) throw bad("shape " + shape.dump() + " is not a list of sizes");
      const auto size = d.get<std::uint64_t>();
      if (size != 0 && numel > kMaxElements / size) throw bad("shape " + shape.dump() + " is too large");
      numel *= size;
      tensor.entry.shape.push_back(static_cast<std::int64_t>(size));
    }
    const nlohmann::json& offsets = value["data_offsets"];
    if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
        !offsets[1].is_number_unsigned()) {
      throw bad("data_offsets is not [begin, end]");
    }
    const auto begin = offsets[0].get<std::uint64_t>();
    const auto end = offsets[1].get<std::uint64_t>();
    const std::uint64_t bytes = numel * c10::elementSize(tensor.entry.dtype);
    if (begin > end || end > data_bytes || end - begin != bytes) {
      throw bad(detail::concat("data_offsets [", begin, ", ", end, ") do not hold its ", bytes, " bytes inside the ",
                               data_bytes, " bytes of data"));
    }
    tensor.begin = data_begin + begin;
    tensor.end = data_begin + end;
    tensors.push_back(std::move(tensor));
  }
  std::sort(tensors.begin(), tensors.end(),
            [](const SafetensorsTensor& a, const SafetensorsTensor& b) { return a.begin < b.begin; });
  return tensors;
}

std::vector<std::pair<std::string, torch::Tensor>> read_torch_weights(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  PARALLAX_CHECK(in.good(), CheckpointError, "cannot open ", path, ": ", std::strerror(errno));
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // LibTorch's unpickler reads collections.OrderedDict as None (it expects one only for
  // a tensor's backward hooks), so a Module.state_dict() saved by torch.save arrives as
  // None, or trips its assertion; say what to do instead.
  constexpr char kStateDictAdvice[] =
      " (LibTorch reads a dict of tensors, not the OrderedDict that Module.state_dict() returns: save "
      "dict(model.state_dict()), or write safetensors with safetensors.torch.save_file, which checkpoint.load "
      "takes directly)";
  c10::IValue value;
  try {
    value = torch::pickle_load(bytes);
  } catch (const c10::Error& e) {
    throw CheckpointError(
        detail::concat(path, ": not a torch.save file LibTorch reads: ", e.what_without_backtrace(), kStateDictAdvice));
  }
  PARALLAX_CHECK(value.isGenericDict(), CheckpointError, path, ": holds a ", value.tagKind(),
                 ", expected a dict of tensors", kStateDictAdvice);
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  for (const auto& item : value.toGenericDict()) {
    PARALLAX_CHECK(item.key().isString() && item.value().isTensor(), CheckpointError, path,
                   ": an entry is not a name and a tensor (", item.key().tagKind(), " → ", item.value().tagKind(), ")");
    tensors.emplace_back(item.key().toStringRef(), item.value().toTensor());
  }
  return tensors;
}

ExportResult write_weights(const std::string& path,
                           std::vector<WeightsEntry> entries,
                           const std::function<torch::Tensor(std::size_t)>& values) {
  ExportResult result;
  std::unique_ptr<WeightsWriter> out = WeightsWriter::open(path, entries);
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const torch::Tensor tensor = values(i).to(entries[i].dtype);
    const auto bytes = static_cast<std::uint64_t>(tensor.numel()) * tensor.element_size();
    out->write(tensor);
    ++result.tensors;
    result.bytes += bytes;
    result.largest_tensor_bytes = std::max(result.largest_tensor_bytes, bytes);
  }
  out->close();
  return result;
}

ExportResult export_weights(const Reader& checkpoint, const std::string& path, std::optional<torch::ScalarType> dtype) {
  const std::string prefix = std::string(kParamKind) + "/";
  std::vector<std::string> names;
  std::vector<WeightsEntry> entries;
  for (const std::string& name : checkpoint.wholes()) {
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    PARALLAX_CHECK(name.find("@tp") == std::string::npos, CheckpointError, checkpoint.directory(), " (saved under ",
                   checkpoint.layout(), ") holds '", name,
                   "', one tensor-parallel rank's part of a model built with tensor_parallel/'s own layers, whose cut "
                   "is not recorded (a [tensor_parallel.plan]'s is): it loads only under the same tp");
    names.push_back(name);
    entries.push_back({name.substr(prefix.size()), dtype.value_or(checkpoint.dtype(name)), checkpoint.shape(name)});
  }
  PARALLAX_CHECK(!entries.empty(), CheckpointError, checkpoint.directory(), " holds no weights ('", prefix, "*')");
  return write_weights(path, entries, [&](std::size_t i) { return checkpoint.read_whole(names[i]); });
}

torch::ScalarType dtype_from_name(const std::string& name) {
  for (const SafetensorsDtype& d : kSafetensorsDtypes) {
    if (name == c10::toString(d.type)) return d.type;
  }
  throw CheckpointError(detail::concat("dtype '", name, "' is not one this build stores"));
}

}  // namespace parallax::checkpoint
