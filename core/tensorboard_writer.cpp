#include "parallax/core/tensorboard_writer.h"

#include <unistd.h>

#include <array>
#include <boost/crc.hpp>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "parallax/core/error.h"
#include "proto/tensorboard_event.pb.h"

namespace parallax {
namespace {

constexpr const char* kFileVersion = "brain.Event:2";
constexpr std::uint32_t kCrcMaskDelta = 0xa282ead8u;

double unix_seconds_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string host_name() {
  std::array<char, 256> name{};
  if (gethostname(name.data(), name.size() - 1) != 0 || name[0] == '\0') return "localhost";
  return name.data();
}

// TFRecord's integers are little endian whatever the host.
template <typename T>
void append_little_endian(std::string& out, T value) {
  for (std::size_t i = 0; i < sizeof(T); ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

}  // namespace

std::uint32_t crc32c(const void* data, std::size_t size) {
  boost::crc_optimal<32, 0x1EDC6F41, 0xFFFFFFFF, 0xFFFFFFFF, true, true> crc;
  crc.process_bytes(data, size);
  return crc.checksum();
}

std::uint32_t masked_crc32c(const void* data, std::size_t size) {
  const std::uint32_t crc = crc32c(data, size);
  return ((crc >> 15) | (crc << 17)) + kCrcMaskDelta;
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  PARALLAX_CHECK(!error, UsageError, "logging.tensorboard_dir '", dir, "' cannot be created: ", error.message());
  const auto seconds = static_cast<long long>(unix_seconds_now());
  path_ = (std::filesystem::path(dir) / ("events.out.tfevents." + std::to_string(seconds) + "." + host_name() + "." +
                                         std::to_string(static_cast<long long>(getpid()))))
              .string();
  out_.open(path_, std::ios::binary | std::ios::trunc);
  PARALLAX_CHECK(out_.good(), UsageError, "logging.tensorboard_dir '", dir, "': cannot create '", path_,
                 "': ", std::strerror(errno));
  proto::tensorboard::Event event;
  event.set_wall_time(unix_seconds_now());
  event.set_file_version(kFileVersion);
  write_record(event.SerializeAsString());
}

void TensorBoardWriter::add_scalars(std::int64_t step, const std::vector<TensorBoardScalar>& scalars) {
  proto::tensorboard::Event event;
  event.set_wall_time(unix_seconds_now());
  event.set_step(step);
  proto::tensorboard::Summary* summary = event.mutable_summary();
  for (const TensorBoardScalar& scalar : scalars) {
    proto::tensorboard::Summary::Value* value = summary->add_value();
    value->set_tag(scalar.tag);
    value->set_simple_value(static_cast<float>(scalar.value));
  }
  write_record(event.SerializeAsString());
}

void TensorBoardWriter::write_record(const std::string& data) {
  std::string record;
  record.reserve(data.size() + 16);
  append_little_endian<std::uint64_t>(record, data.size());
  append_little_endian<std::uint32_t>(record, masked_crc32c(record.data(), 8));
  record += data;
  append_little_endian<std::uint32_t>(record, masked_crc32c(data.data(), data.size()));
  out_.write(record.data(), static_cast<std::streamsize>(record.size()));
  out_.flush();
  PARALLAX_CHECK(out_.good(), UsageError, "failed writing the TensorBoard event file '", path_,
                 "' (logging.tensorboard_dir)");
}

}  // namespace parallax
