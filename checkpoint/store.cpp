#include "parallax/checkpoint/store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <map>
#include <sstream>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "parallax/checkpoint/files.h"
#include "parallax/checkpoint/manifest.h"
#include "parallax/checkpoint/weights_file.h"
#include "parallax/core/error.h"
#include "proto/checkpoint.pb.h"

namespace parallax::checkpoint {
namespace {

constexpr std::uint64_t kBlockBytes = 1u << 20;
constexpr int kDescriptorTag = 7301;
constexpr char kManifest[] = "manifest.pb";
constexpr char kCommit[] = "commit";

std::string join(const std::string& directory, const std::string& name) {
  return directory + "/" + name;
}

std::string dtype_name(torch::ScalarType type) {
  return c10::toString(type);
}

std::int64_t numel_of(const google::protobuf::RepeatedField<std::int64_t>& shape) {
  std::int64_t n = 1;
  for (std::int64_t d : shape) n *= d;
  return n;
}

// Writes this rank's pieces to its data file; returns their descriptors (tensor indices
// local to the returned manifest, file index 0).
proto::CheckpointManifest write_pieces(const std::string& directory,
                                       int rank,
                                       const std::vector<Piece>& pieces,
                                       SaveResult& result) {
  proto::CheckpointManifest local;
  if (pieces.empty()) return local;
  const std::string name = rank_file_name(rank);
  proto::CheckpointFile* file = local.add_files();
  file->set_name(name);
  file->set_rank(rank);
  const auto start = std::chrono::steady_clock::now();
  DurableFile out(join(directory, name));
  for (const Piece& piece : pieces) {
    const torch::Tensor host = piece.values.detach().reshape({-1}).to(torch::kCPU).contiguous();
    proto::CheckpointTensor* tensor = local.add_tensors();
    tensor->set_name(piece.tensor);
    tensor->set_dtype(dtype_name(host.scalar_type()));
    for (std::int64_t d : piece.shape) tensor->add_shape(d);
    if (piece.part.count > 0) {
      proto::TensorPart* part = tensor->mutable_part();
      part->set_whole(piece.part.whole);
      for (std::int64_t d : piece.part.whole_shape) part->add_whole_shape(d);
      part->set_dim(piece.part.cut.dim);
      part->set_blocks(piece.part.cut.blocks);
      part->set_index(piece.part.index);
      part->set_count(piece.part.count);
    }
    proto::CheckpointPiece* described = local.add_pieces();
    described->set_tensor(static_cast<std::uint32_t>(local.tensors_size() - 1));
    described->set_offset(piece.offset);
    described->set_numel(host.numel());
    described->set_file(0);
    described->set_byte_offset(out.written());
    const auto* bytes = static_cast<const char*>(host.data_ptr());
    const std::uint64_t total = static_cast<std::uint64_t>(host.numel()) * host.element_size();
    for (std::uint64_t at = 0; at < total; at += kBlockBytes) {
      const std::uint64_t block = std::min(kBlockBytes, total - at);
      described->add_block_crc32(crc32(bytes + at, block));
    }
    out.write(bytes, total);
  }
  out.close();
  file->set_bytes(out.written());
  result.bytes_written = out.written();
  result.write_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return local;
}

// Rank 0: every rank's descriptor (serialized), over point-to-point messages.
std::vector<std::string> gather_descriptors(Communicator& world,
                                            const std::string& mine,
                                            std::chrono::milliseconds timeout) {
  CollectiveOptions options;
  options.timeout = timeout;
  torch::Tensor length = torch::tensor({static_cast<std::int64_t>(mine.size())});
  torch::Tensor lengths = torch::zeros({world.size()}, torch::kInt64);
  world.all_gather(lengths, length, options)->wait();
  std::vector<std::string> all;
  if (world.rank() != 0) {
    if (!mine.empty()) {
      torch::Tensor bytes = torch::empty({static_cast<std::int64_t>(mine.size())}, torch::kUInt8);
      std::memcpy(bytes.data_ptr(), mine.data(), mine.size());
      world.send(bytes, 0, kDescriptorTag, options)->wait();
    }
    return all;
  }
  all.push_back(mine);
  for (int r = 1; r < world.size(); ++r) {
    const std::int64_t n = lengths[r].item<std::int64_t>();
    std::string text;
    if (n > 0) {
      torch::Tensor bytes = torch::empty({n}, torch::kUInt8);
      world.recv(bytes, r, kDescriptorTag, options)->wait();
      text.assign(static_cast<const char*>(bytes.data_ptr()), static_cast<std::size_t>(n));
    }
    all.push_back(std::move(text));
  }
  return all;
}

// Rank 0: one manifest from every rank's descriptor; checks that each tensor's pieces
// cover it exactly once and that every rank agrees on its dtype and shape.
proto::CheckpointManifest merge(const std::vector<std::string>& descriptors,
                                const SaveRequest& request,
                                int world_size) {
  proto::CheckpointManifest manifest;
  manifest.set_format_version(kManifestFormatVersion);
  manifest.set_step(request.step);
  manifest.set_world_size(world_size);
  manifest.set_layout(request.layout);
  manifest.set_engine_state(request.engine_state);
  manifest.set_trainer_state(request.trainer_state);
  manifest.set_block_bytes(kBlockBytes);
  std::map<std::string, std::uint32_t> index;
  std::vector<std::vector<std::pair<std::int64_t, std::int64_t>>> ranges;
  for (std::size_t r = 0; r < descriptors.size(); ++r) {
    if (descriptors[r].empty()) continue;
    proto::CheckpointManifest local;
    PARALLAX_CHECK(local.ParseFromString(descriptors[r]), InternalError, "rank ", r,
                   "'s checkpoint descriptor does not parse");
    const auto file = static_cast<std::uint32_t>(manifest.files_size());
    *manifest.add_files() = local.files(0);
    for (const proto::CheckpointPiece& piece : local.pieces()) {
      const proto::CheckpointTensor& tensor = local.tensors(static_cast<int>(piece.tensor()));
      auto [it, added] = index.emplace(tensor.name(), static_cast<std::uint32_t>(manifest.tensors_size()));
      if (added) {
        *manifest.add_tensors() = tensor;
        ranges.emplace_back();
      } else {
        const proto::CheckpointTensor& known = manifest.tensors(static_cast<int>(it->second));
        PARALLAX_CHECK(
            known.dtype() == tensor.dtype() &&
                std::equal(known.shape().begin(), known.shape().end(), tensor.shape().begin(), tensor.shape().end()) &&
                known.part().SerializeAsString() == tensor.part().SerializeAsString(),
            InternalError, "checkpoint tensor '", tensor.name(), "': rank ", r,
            " saved a piece of another dtype, shape or cut than an earlier rank");
      }
      proto::CheckpointPiece* kept = manifest.add_pieces();
      *kept = piece;
      kept->set_tensor(it->second);
      kept->set_file(file);
      ranges[it->second].emplace_back(piece.offset(), piece.numel());
    }
  }
  for (std::size_t t = 0; t < ranges.size(); ++t) {
    auto& pieces = ranges[t];
    std::sort(pieces.begin(), pieces.end());
    std::int64_t next = 0;
    for (const auto& [offset, numel] : pieces) {
      PARALLAX_CHECK(offset == next, InternalError, "checkpoint tensor '", manifest.tensors(static_cast<int>(t)).name(),
                     "': its saved pieces ", offset < next ? "overlap" : "leave a gap", " at element ",
                     std::min(offset, next), " (a wrong shard owner)");
      next = offset + numel;
    }
    const std::int64_t whole = numel_of(manifest.tensors(static_cast<int>(t)).shape());
    PARALLAX_CHECK(next == whole, InternalError, "checkpoint tensor '", manifest.tensors(static_cast<int>(t)).name(),
                   "': its saved pieces end at element ", next, " of ", whole);
  }
  check_manifest(manifest, "the manifest being saved");  // parts that do not join, among others
  return manifest;
}

// Rank 0: manifest and commit marker into the partial directory, then the rename, then
// the oldest complete checkpoints beyond `keep` go.
void publish(const proto::CheckpointManifest& manifest,
             const std::string& partial,
             const std::string& final_dir,
             const SaveRequest& request) {
  const std::string text = manifest.SerializeAsString();
  write_file(join(partial, kManifest), text);
  write_file(join(partial, kCommit), detail::concat(text.size(), " ", crc32(text.data(), text.size()), "\n"));
  sync_directory(partial);
  const std::string replaced = final_dir + ".replaced";
  const bool exists = std::filesystem::exists(final_dir);
  if (exists) rename_durably(final_dir, replaced, request.root);
  rename_durably(partial, final_dir, request.root);
  if (exists) remove_tree(replaced);
  if (request.keep > 0) {
    const std::vector<std::string> complete = checkpoint_directories(request.root);
    for (std::size_t i = static_cast<std::size_t>(request.keep); i < complete.size(); ++i) remove_tree(complete[i]);
  }
}

}  // namespace

void raise_if_any_failed(Communicator& world,
                         const std::string& action,
                         const std::string& error,
                         std::chrono::milliseconds timeout) {
  CollectiveOptions options;
  options.timeout = timeout;
  options.reduce_op = ReduceOp::kMax;
  torch::Tensor failed = torch::tensor({error.empty() ? std::int64_t{0} : std::int64_t{world.size() - world.rank()}});
  world.all_reduce(failed, options)->wait();
  if (failed.item<std::int64_t>() == 0) return;
  const int culprit = world.size() - static_cast<int>(failed.item<std::int64_t>());
  options.reduce_op = ReduceOp::kSum;
  torch::Tensor length = torch::tensor({static_cast<std::int64_t>(error.size())});
  world.broadcast(length, culprit, options)->wait();
  const auto bytes = static_cast<std::size_t>(length.item<std::int64_t>());
  torch::Tensor text = torch::zeros({static_cast<std::int64_t>(std::max<std::size_t>(1, bytes))}, torch::kUInt8);
  if (world.rank() == culprit) std::memcpy(text.data_ptr(), error.data(), bytes);
  world.broadcast(text, culprit, options)->wait();
  throw CheckpointError(detail::concat(action, " failed on rank ", culprit, ": ",
                                       std::string(static_cast<const char*>(text.data_ptr()), bytes)));
}

SaveResult save(Communicator& world, const SaveRequest& request) {
  const std::chrono::milliseconds timeout = request.timeout;
  const std::string final_dir = join(request.root, directory_name(request.step));
  const std::string partial = final_dir + ".partial";
  const auto started = std::chrono::steady_clock::now();
  SaveResult result;
  result.directory = final_dir;

  std::string error;
  if (world.rank() == 0) {
    error = error_of([&] {
      make_directories(request.root);
      remove_tree(partial);
      make_directories(partial);
    });
  }
  const std::string saving = "saving checkpoint " + final_dir;
  raise_if_any_failed(world, saving + " (creating " + partial + ")", error, timeout);

  proto::CheckpointManifest local;
  error = error_of([&] { local = write_pieces(partial, world.rank(), request.pieces, result); });
  const auto clean_up = [&] {
    if (world.rank() == 0) error_of([&] { remove_tree(partial); });
  };
  try {
    raise_if_any_failed(world, saving + " (writing the ranks' files)", error, timeout);
  } catch (const CheckpointError&) {
    clean_up();
    throw;
  }

  const std::vector<std::string> descriptors = gather_descriptors(world, local.SerializeAsString(), timeout);
  if (world.rank() == 0) {
    error = error_of([&] { publish(merge(descriptors, request, world.size()), partial, final_dir, request); });
  }
  try {
    raise_if_any_failed(world, saving + " (publishing it)", error, timeout);
  } catch (const CheckpointError&) {
    clean_up();
    throw;
  }
  result.save_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return result;
}

// ---- loading ----

struct Reader::Index {
  std::unordered_map<std::string, std::uint32_t> tensors;
  std::vector<std::vector<int>> pieces;  ///< by tensor: indices into the manifest's pieces
  /// A tensor saved as parts: its parts' tensor indices, in part order (check_manifest
  /// has made sure they are all there and agree).
  std::unordered_map<std::string, std::vector<std::uint32_t>> parts;
};

namespace {

std::uint64_t file_size(const std::string& path) {
  struct stat info {};
  PARALLAX_CHECK(::stat(path.c_str(), &info) == 0, CheckpointError, path, ": missing (", std::strerror(errno), ")");
  return static_cast<std::uint64_t>(info.st_size);
}

// The directory's manifest, if the commit marker, the manifest and the data files agree.
std::unique_ptr<proto::CheckpointManifest> validate(const std::string& directory) {
  const std::string commit_path = join(directory, kCommit);
  PARALLAX_CHECK(std::filesystem::exists(commit_path), CheckpointError, "checkpoint ", directory,
                 " has no commit marker '", kCommit, "': its save did not finish");
  std::istringstream commit(read_file(commit_path));
  std::uint64_t size = 0;
  std::uint32_t crc = 0;
  PARALLAX_CHECK(static_cast<bool>(commit >> size >> crc), CheckpointError, commit_path,
                 ": expected '<manifest bytes> <manifest CRC-32>'");
  const std::string manifest_path = join(directory, kManifest);
  const std::string text = read_file(manifest_path);
  PARALLAX_CHECK(text.size() == size, CheckpointError, manifest_path, ": expected ", size, " bytes (", kCommit,
                 "), found ", text.size(), " (truncated?)");
  PARALLAX_CHECK(crc32(text.data(), text.size()) == crc, CheckpointError, manifest_path, ": CRC-32 ",
                 crc32(text.data(), text.size()), " does not match ", crc, " recorded in ", kCommit, " (corrupted)");
  std::unique_ptr<proto::CheckpointManifest> manifest = parse_manifest(text, manifest_path);
  for (const proto::CheckpointFile& file : manifest->files()) {
    const std::string path = join(directory, file.name());
    const std::uint64_t found = file_size(path);
    PARALLAX_CHECK(found == file.bytes(), CheckpointError, path, ": expected ", file.bytes(), " bytes (", kManifest,
                   "), found ", found, " (truncated?)");
  }
  return manifest;
}

}  // namespace

Reader Reader::open(const std::string& where, Mode mode) {
  Reader reader;
  if (mode == kExactly) {
    reader.manifest_ = validate(where);
    reader.directory_ = where;
  } else {
    const std::vector<std::string> candidates = checkpoint_directories(where);
    for (const std::string& directory : candidates) {
      try {
        reader.manifest_ = validate(directory);
        reader.directory_ = directory;
        break;
      } catch (const CheckpointError& e) {
        reader.skipped_.push_back(e.detail());
      }
    }
    if (!reader.manifest_) {
      std::string why;
      for (const std::string& s : reader.skipped_) why += "\n  " + s;
      throw CheckpointError(detail::concat("no complete checkpoint under ", where,
                                           candidates.empty() ? " (no step-* directory there)" : ":", why));
    }
  }
  reader.build_index();
  return reader;
}

Reader Reader::open_weights(const std::string& path) {
  Reader reader;
  reader.directory_ = parent_directory(path);
  reader.weights_only_ = true;
  reader.manifest_ = std::make_unique<proto::CheckpointManifest>();
  proto::CheckpointManifest& manifest = *reader.manifest_;
  manifest.set_format_version(kManifestFormatVersion);
  manifest.set_layout("weights file " + path);
  manifest.set_block_bytes(kBlockBytes);  // the unit reads are rounded to; no CRCs
  proto::CheckpointFile* file = manifest.add_files();
  file->set_name(base_name(path));
  file->set_bytes(file_size(path));
  for (const SafetensorsTensor& saved : read_safetensors_header(path)) {
    proto::CheckpointTensor* tensor = manifest.add_tensors();
    tensor->set_name(std::string(kParamKind) + "/" + saved.entry.name);
    tensor->set_dtype(dtype_name(saved.entry.dtype));
    for (std::int64_t d : saved.entry.shape) tensor->add_shape(d);
    proto::CheckpointPiece* piece = manifest.add_pieces();
    piece->set_tensor(static_cast<std::uint32_t>(manifest.tensors_size() - 1));
    piece->set_numel(numel_of(tensor->shape()));
    piece->set_byte_offset(saved.begin);
  }
  check_manifest(manifest, path, /*with_crcs=*/false);
  reader.build_index();
  return reader;
}

void Reader::build_index() {
  index_ = std::make_unique<Index>();
  for (int t = 0; t < manifest_->tensors_size(); ++t) {
    index_->tensors.emplace(manifest_->tensors(t).name(), static_cast<std::uint32_t>(t));
  }
  index_->pieces.resize(static_cast<std::size_t>(manifest_->tensors_size()));
  for (int p = 0; p < manifest_->pieces_size(); ++p) index_->pieces.at(manifest_->pieces(p).tensor()).push_back(p);
  for (int t = 0; t < manifest_->tensors_size(); ++t) {
    const proto::TensorPart& part = manifest_->tensors(t).part();
    if (part.count() == 0) continue;
    std::vector<std::uint32_t>& parts = index_->parts[part.whole()];
    parts.resize(static_cast<std::size_t>(part.count()));
    parts[static_cast<std::size_t>(part.index())] = static_cast<std::uint32_t>(t);
  }
}

Reader::~Reader() = default;
Reader::Reader(Reader&&) noexcept = default;
Reader& Reader::operator=(Reader&&) noexcept = default;

std::int64_t Reader::step() const {
  return manifest_->step();
}
const std::string& Reader::layout() const {
  return manifest_->layout();
}
const std::string& Reader::engine_state() const {
  return manifest_->engine_state();
}
const std::string& Reader::trainer_state() const {
  return manifest_->trainer_state();
}

std::vector<std::string> Reader::tensors() const {
  std::vector<std::string> names;
  for (const proto::CheckpointTensor& tensor : manifest_->tensors()) names.push_back(tensor.name());
  return names;
}

std::vector<std::string> Reader::wholes() const {
  std::vector<std::string> names;
  std::unordered_set<std::string> joined;
  for (const proto::CheckpointTensor& tensor : manifest_->tensors()) {
    if (tensor.part().count() == 0) {
      names.push_back(tensor.name());
    } else if (!has(tensor.part().whole()) && joined.insert(tensor.part().whole()).second) {
      names.push_back(tensor.part().whole());
    }
  }
  return names;
}

bool Reader::has(const std::string& tensor) const {
  return index_->tensors.count(tensor) > 0;
}

bool Reader::has_whole(const std::string& tensor) const {
  return has(tensor) || index_->parts.count(tensor) > 0;
}

std::int64_t Reader::parts_of(const std::string& tensor) const {
  if (has(tensor)) return 0;
  const auto it = index_->parts.find(tensor);
  return it == index_->parts.end() ? 0 : static_cast<std::int64_t>(it->second.size());
}

// The saved tensor `tensor` is, or its first part when it is saved as parts.
const proto::CheckpointTensor& Reader::saved(const std::string& tensor) const {
  if (const auto it = index_->tensors.find(tensor); it != index_->tensors.end()) {
    return manifest_->tensors(static_cast<int>(it->second));
  }
  const auto parts = index_->parts.find(tensor);
  PARALLAX_CHECK(parts != index_->parts.end(), CheckpointError, "checkpoint ", directory_, " holds no tensor '", tensor,
                 "' (saved under: ", layout(), ")");
  return manifest_->tensors(static_cast<int>(parts->second.front()));
}

torch::ScalarType Reader::dtype(const std::string& tensor) const {
  return dtype_from_name(saved(tensor).dtype());
}

std::vector<std::int64_t> Reader::shape(const std::string& tensor) const {
  const proto::CheckpointTensor& found = saved(tensor);
  const auto& shape = found.name() == tensor ? found.shape() : found.part().whole_shape();
  return {shape.begin(), shape.end()};
}

torch::Tensor Reader::read_whole(const std::string& tensor) const {
  torch::Tensor whole = torch::empty(shape(tensor), torch::TensorOptions(dtype(tensor)));
  if (has(tensor)) {
    torch::Tensor flat = whole.view({-1});
    read(tensor, 0, flat);
    return whole;
  }
  for (const std::uint32_t t : index_->parts.at(tensor)) {
    const proto::CheckpointTensor& part = manifest_->tensors(static_cast<int>(t));
    torch::Tensor values =
        torch::empty(std::vector<std::int64_t>(part.shape().begin(), part.shape().end()), whole.options());
    torch::Tensor flat = values.view({-1});
    read(part.name(), 0, flat);
    place(whole, values, TensorCut{part.part().dim(), part.part().blocks()}, part.part().index(), part.part().count());
  }
  return whole;
}

void Reader::read(const std::string& tensor, std::int64_t offset, torch::Tensor& out) const {
  shape(tensor);  // names the tensor if it is missing
  PARALLAX_CHECK(has(tensor), InternalError, "Reader::read: '", tensor, "' is saved as ", parts_of(tensor),
                 " parts, which read_whole() joins");
  const std::uint32_t t = index_->tensors.at(tensor);
  const proto::CheckpointTensor& saved = manifest_->tensors(static_cast<int>(t));
  PARALLAX_CHECK(out.is_contiguous() && out.device().is_cpu(), InternalError,
                 "Reader::read: out must be contiguous on the host");
  PARALLAX_CHECK(dtype_name(out.scalar_type()) == saved.dtype(), CheckpointError, "checkpoint ", directory_,
                 ": tensor '", tensor, "' is saved as ", saved.dtype(), ", this run holds it as ",
                 dtype_name(out.scalar_type()));
  const std::int64_t end = offset + out.numel();
  const auto element = static_cast<std::uint64_t>(out.element_size());
  const std::uint64_t block_bytes = manifest_->block_bytes();
  std::int64_t covered = 0;
  std::vector<char> buffer;
  for (int p : index_->pieces[t]) {
    const proto::CheckpointPiece& piece = manifest_->pieces(p);
    const std::int64_t lo = std::max(offset, piece.offset());
    const std::int64_t hi = std::min(end, piece.offset() + piece.numel());
    if (lo >= hi) continue;
    const std::uint64_t piece_bytes = static_cast<std::uint64_t>(piece.numel()) * element;
    const std::uint64_t first = static_cast<std::uint64_t>(lo - piece.offset()) * element;
    const std::uint64_t last = static_cast<std::uint64_t>(hi - piece.offset()) * element;
    const std::uint64_t block_begin = first / block_bytes;
    const std::uint64_t block_end = (last + block_bytes - 1) / block_bytes;
    const std::uint64_t read_begin = block_begin * block_bytes;
    const std::uint64_t read_end = std::min(block_end * block_bytes, piece_bytes);
    const proto::CheckpointFile& file = manifest_->files(static_cast<int>(piece.file()));
    const std::string path = join(directory_, file.name());
    buffer.resize(read_end - read_begin);
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    PARALLAX_CHECK(fd >= 0, CheckpointError, "cannot open ", path, ": ", std::strerror(errno));
    std::uint64_t got = 0;
    while (got < buffer.size()) {
      const ssize_t n = ::pread(fd, buffer.data() + got, buffer.size() - got,
                                static_cast<off_t>(piece.byte_offset() + read_begin + got));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      got += static_cast<std::uint64_t>(n);
    }
    ::close(fd);
    PARALLAX_CHECK(got == buffer.size(), CheckpointError, path, ": expected ", buffer.size(), " bytes of tensor '",
                   tensor, "' at byte ", piece.byte_offset() + read_begin, ", read ", got, " (truncated?)");
    bytes_read_ += got;
    for (std::uint64_t b = block_begin; b < block_end && piece.block_crc32_size() > 0; ++b) {
      const std::uint64_t at = b * block_bytes - read_begin;
      const std::uint64_t n = std::min(block_bytes, piece_bytes - b * block_bytes);
      const std::uint32_t expected = piece.block_crc32(static_cast<int>(b));
      const std::uint32_t found = crc32(buffer.data() + at, n);
      PARALLAX_CHECK(found == expected, CheckpointError, path, ": block ", b, " of tensor '", tensor, "' (bytes ",
                     piece.byte_offset() + b * block_bytes, "..", piece.byte_offset() + b * block_bytes + n,
                     ") has CRC-32 ", found, ", ", kManifest, " records ", expected, " (corrupted)");
    }
    std::memcpy(static_cast<char*>(out.data_ptr()) + static_cast<std::uint64_t>(lo - offset) * element,
                buffer.data() + (first - read_begin), last - first);
    covered += hi - lo;
  }
  PARALLAX_CHECK(covered == out.numel(), CheckpointError, "checkpoint ", directory_, ": elements [", offset, ", ", end,
                 ") of tensor '", tensor, "' are not all saved (", covered, " found)");
}

}  // namespace parallax::checkpoint
