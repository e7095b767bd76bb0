#include "parallax/checkpoint/files.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>

#include "parallax/core/error.h"

namespace parallax::checkpoint {
namespace {

namespace fs = std::filesystem;

constexpr char kStepPrefix[] = "step-";

std::string reason() {
  return std::strerror(errno);
}

}  // namespace

std::string directory_name(std::int64_t step) {
  char name[32];
  std::snprintf(name, sizeof(name), "%s%012lld", kStepPrefix, static_cast<long long>(step));
  return name;
}

std::string parent_directory(const std::string& path) {
  const std::size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, std::max<std::size_t>(slash, 1));
}

std::string base_name(const std::string& path) {
  const std::size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::string rank_file_name(int rank) {
  char name[32];
  std::snprintf(name, sizeof(name), "rank-%05d.bin", rank);
  return name;
}

std::optional<std::int64_t> step_of(const std::string& name) {
  const std::size_t prefix = sizeof(kStepPrefix) - 1;
  if (name.size() <= prefix || name.compare(0, prefix, kStepPrefix) != 0) return std::nullopt;
  const std::string digits = name.substr(prefix);
  if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) return std::nullopt;
  return std::stoll(digits);
}

std::uint32_t crc32(const void* data, std::size_t bytes, std::uint32_t crc) {
  const auto* p = static_cast<const Bytef*>(data);
  uLong value = crc;
  while (bytes > 0) {  // zlib takes a uInt length
    const auto chunk = static_cast<uInt>(std::min<std::size_t>(bytes, 1u << 30));
    value = ::crc32(value, p, chunk);
    p += chunk;
    bytes -= chunk;
  }
  return static_cast<std::uint32_t>(value);
}

DurableFile::DurableFile(std::string path) : path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  PARALLAX_CHECK(fd_ >= 0, CheckpointError, "cannot create ", path_, ": ", reason());
}

DurableFile::~DurableFile() {
  if (fd_ >= 0) ::close(fd_);
}

void DurableFile::write(const void* data, std::size_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(fd_, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    PARALLAX_CHECK(n > 0, CheckpointError, "cannot write ", path_, " after ", written_, " bytes: ", reason());
    p += n;
    bytes -= static_cast<std::size_t>(n);
    written_ += static_cast<std::uint64_t>(n);
  }
}

void DurableFile::close() {
  PARALLAX_CHECK(::fsync(fd_) == 0, CheckpointError, "cannot fsync ", path_, ": ", reason());
  const int fd = fd_;
  fd_ = -1;
  PARALLAX_CHECK(::close(fd) == 0, CheckpointError, "cannot close ", path_, ": ", reason());
}

void write_file(const std::string& path, const std::string& text) {
  DurableFile file(path);
  file.write(text.data(), text.size());
  file.close();
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  PARALLAX_CHECK(in.good(), CheckpointError, "cannot read ", path, ": ", reason());
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

void sync_directory(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  PARALLAX_CHECK(fd >= 0, CheckpointError, "cannot open directory ", path, ": ", reason());
  const int status = ::fsync(fd);
  const std::string why = status == 0 ? "" : reason();
  ::close(fd);
  PARALLAX_CHECK(status == 0, CheckpointError, "cannot fsync directory ", path, ": ", why);
}

void make_directories(const std::string& path) {
  std::error_code error;
  fs::create_directories(path, error);
  PARALLAX_CHECK(!error, CheckpointError, "cannot create directory ", path, ": ", error.message());
}

void remove_tree(const std::string& path) {
  std::error_code error;
  fs::remove_all(path, error);
  PARALLAX_CHECK(!error, CheckpointError, "cannot remove ", path, ": ", error.message());
}

void rename_durably(const std::string& from, const std::string& to, const std::string& parent) {
  PARALLAX_CHECK(::rename(from.c_str(), to.c_str()) == 0, CheckpointError, "cannot rename ", from, " to ", to, ": ",
                 reason());
  sync_directory(parent);
}

std::vector<std::string> checkpoint_directories(const std::string& root) {
  std::vector<std::pair<std::int64_t, std::string>> found;
  std::error_code error;
  for (fs::directory_iterator it(root, error), end; !error && it != end; it.increment(error)) {
    if (!it->is_directory()) continue;
    const std::string name = it->path().filename().string();
    if (const auto step = step_of(name)) found.emplace_back(*step, (fs::path(root) / name).string());
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<std::string> out;
  for (auto& [step, path] : found) out.push_back(std::move(path));
  return out;
}

}  // namespace parallax::checkpoint
