// TensorBoard event files read back record by record, with a reader written here from
// the format (core/tensorboard_writer.h), not the writer's own helpers: each record's
// length and data CRCs are checked, each Event parsed with the generated class, and the
// first record's bytes compared with the field numbers TensorBoard reads.
//
// Mutants these catch: an unmasked CRC, or one masked another way (EveryRecordsCrcs...
// fails); a big-endian length (same); a CRC other than CRC-32C, e.g. zlib's CRC-32
// (KnownCheckValue); a CRC computed over fewer bytes than the data (a flipped byte in
// the data then passes: FlippedBytesAreDetected); a wrong field number in
// proto/tensorboard_event.proto (FirstRecordHasTensorBoardsFieldNumbers); a step or
// value written to the wrong event, or simple_value without presence, which drops zeros
// (EveryRecords...).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "parallax/core/error.h"
#include "parallax/core/tensorboard_writer.h"
#include "proto/tensorboard_event.pb.h"

namespace parallax {
namespace {

namespace fs = std::filesystem;
using proto::tensorboard::Event;

// TFRecord's mask, written out here so a wrong mask in the writer fails the checks.
std::uint32_t mask(std::uint32_t crc) {
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::uint64_t little_endian(const std::string& bytes, std::size_t at, std::size_t size) {
  std::uint64_t value = 0;
  for (std::size_t i = 0; i < size; ++i) {
    value |= static_cast<std::uint64_t>(static_cast<unsigned char>(bytes[at + i])) << (8 * i);
  }
  return value;
}

struct Records {
  std::vector<std::string> data;  // each record's payload, in order
  std::string error;              // the first framing or CRC failure; "" if none
};

// Splits a file's bytes into records, checking every length and data CRC.
Records read_records(const std::string& bytes) {
  Records records;
  std::size_t at = 0;
  while (at < bytes.size()) {
    const std::string where = "record " + std::to_string(records.data.size());
    if (bytes.size() - at < 12) {
      records.error = where + ": truncated header";
      return records;
    }
    const std::uint64_t length = little_endian(bytes, at, 8);
    if (little_endian(bytes, at + 8, 4) != mask(crc32c(bytes.data() + at, 8))) {
      records.error = where + ": length CRC mismatch";
      return records;
    }
    if (bytes.size() - at - 12 < length + 4) {
      records.error = where + ": truncated data";
      return records;
    }
    const std::string data = bytes.substr(at + 12, length);
    if (little_endian(bytes, at + 12 + length, 4) != mask(crc32c(data.data(), data.size()))) {
      records.error = where + ": data CRC mismatch";
      return records;
    }
    records.data.push_back(data);
    at += 12 + length + 4;
  }
  return records;
}

std::string read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

// A fresh directory under the system's temporary one, removed at the end of the test.
class TempDir {
 public:
  TempDir() {
    const auto* test = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = fs::temp_directory_path() /
            ("parallax_tb_" + std::string(test->name()) + "_" + std::to_string(static_cast<long>(getpid())));
    fs::remove_all(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

TEST(Crc32c, KnownCheckValue) {
  const char* text = "123456789";
  EXPECT_EQ(crc32c(text, 9), 0xE3069283u);
  EXPECT_EQ(crc32c(text, 0), 0u);
  EXPECT_EQ(masked_crc32c(text, 9), mask(0xE3069283u));
}

TEST(TensorBoardWriter, EveryRecordsCrcsStepsTagsAndValuesReadBack) {
  TempDir dir;
  const fs::path nested = dir.path() / "runs" / "exp";  // parents are created too
  std::string written;
  {
    TensorBoardWriter writer(nested.string());
    written = writer.path();
    for (std::int64_t step = 1; step <= 3; ++step) {
      writer.add_scalars(step, {{"train/loss", 4.0 - 0.5 * step}, {"perf/step_ms", 10.0 * step}});
    }
    writer.add_scalars(4, {{"comm/send_bytes", 0.0}});
  }
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(nested)) files.push_back(entry.path());
  ASSERT_EQ(files.size(), 1u);
  EXPECT_EQ(files[0].string(), written);
  const std::string name = files[0].filename().string();
  EXPECT_EQ(name.rfind("events.out.tfevents.", 0), 0u) << name;
  EXPECT_NE(name.find("." + std::to_string(static_cast<long>(getpid()))), std::string::npos) << name;

  const Records records = read_records(read_bytes(files[0]));
  ASSERT_EQ(records.error, "");
  ASSERT_EQ(records.data.size(), 5u);
  Event event;
  ASSERT_TRUE(event.ParseFromString(records.data[0]));
  EXPECT_EQ(event.file_version(), "brain.Event:2");
  EXPECT_FALSE(event.has_summary());
  EXPECT_GT(event.wall_time(), 1.6e9);  // seconds since the epoch, not milliseconds or 0
  EXPECT_LT(event.wall_time(), 1e10);
  for (std::int64_t step = 1; step <= 3; ++step) {
    ASSERT_TRUE(event.ParseFromString(records.data[step]));
    EXPECT_EQ(event.step(), step);
    ASSERT_TRUE(event.has_summary());
    ASSERT_EQ(event.summary().value_size(), 2);
    EXPECT_EQ(event.summary().value(0).tag(), "train/loss");
    EXPECT_EQ(event.summary().value(0).simple_value(), static_cast<float>(4.0 - 0.5 * step));
    EXPECT_EQ(event.summary().value(1).tag(), "perf/step_ms");
    EXPECT_EQ(event.summary().value(1).simple_value(), static_cast<float>(10.0 * step));
  }
  // A zero is written, not left out as a proto3 default (TensorBoard drops a value
  // without one).
  ASSERT_TRUE(event.ParseFromString(records.data[4]));
  EXPECT_EQ(event.step(), 4);
  ASSERT_EQ(event.summary().value_size(), 1);
  EXPECT_TRUE(event.summary().value(0).has_simple_value());
  EXPECT_EQ(event.summary().value(0).simple_value(), 0.0f);
}

// The bytes TensorBoard reads, independent of our generated class: field 1 (wall_time,
// fixed64: key 0x09), then field 3 (file_version, length-delimited: key 0x1a); a step's
// event: 0x09, field 2 (step, varint: 0x10), field 5 (summary: 0x2a) holding field 1
// (value: 0x0a) holding field 1 (tag: 0x0a) and field 2 (simple_value, fixed32: 0x15).
TEST(TensorBoardWriter, FirstRecordHasTensorBoardsFieldNumbers) {
  TempDir dir;
  std::string path;
  {
    TensorBoardWriter writer(dir.path().string());
    writer.add_scalars(7, {{"a", 1.0}});
    path = writer.path();
  }
  const Records records = read_records(read_bytes(path));
  ASSERT_EQ(records.error, "");
  ASSERT_EQ(records.data.size(), 2u);
  EXPECT_EQ(records.data[0].substr(0, 1), "\x09");
  EXPECT_EQ(records.data[0].substr(9), std::string("\x1a\x0d") + "brain.Event:2");
  const std::string& step = records.data[1];
  ASSERT_EQ(step.size(), 9u + 2u + 2u + 2u + 3u + 5u);
  EXPECT_EQ(step.substr(9), std::string("\x10\x07\x2a\x0a\x0a\x08\x0a\x01"
                                        "a\x15\x00\x00\x80\x3f",
                                        14));
}

TEST(TensorBoardWriter, FlippedBytesAreDetected) {
  TempDir dir;
  std::string path;
  {
    TensorBoardWriter writer(dir.path().string());
    writer.add_scalars(1, {{"train/loss", 2.5}});
    writer.add_scalars(2, {{"train/loss", 2.25}});
    path = writer.path();
  }
  const std::string bytes = read_bytes(path);
  const Records intact = read_records(bytes);
  ASSERT_EQ(intact.error, "");
  ASSERT_EQ(intact.data.size(), 3u);
  // The second record starts after the first: 12 header bytes, data, 4 CRC bytes.
  const std::size_t second = 12 + intact.data[0].size() + 4;
  const std::size_t data_bytes = intact.data[1].size();
  for (std::size_t offset = 0; offset < 12 + data_bytes + 4; ++offset) {
    std::string flipped = bytes;
    flipped[second + offset] = static_cast<char>(flipped[second + offset] ^ 0x10);
    const Records read = read_records(flipped);
    EXPECT_NE(read.error, "") << "flipped byte " << offset << " of record 1 went unnoticed";
    EXPECT_EQ(read.data.size(), 1u) << offset;  // record 0 still reads
  }
}

TEST(TensorBoardWriter, DirectoryThatCannotBeCreatedIsNamedWithTheReason) {
  TempDir dir;
  fs::create_directories(dir.path());
  const fs::path file = dir.path() / "a_file";
  std::ofstream(file) << "x";
  const std::string bad = (file / "runs").string();
  try {
    TensorBoardWriter writer(bad);
    FAIL() << "expected an error";
  } catch (const UsageError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("logging.tensorboard_dir"), std::string::npos) << message;
    EXPECT_NE(message.find(bad), std::string::npos) << message;
    EXPECT_NE(message.find(std::strerror(ENOTDIR)), std::string::npos) << message;
  }
}

}  // namespace
}  // namespace parallax
