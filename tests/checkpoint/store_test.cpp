// checkpoint/store.h on real ranks and real files: pieces written by every rank read
// back under another split, the atomic publish, `keep`, the loader's refusals of torn,
// truncated and corrupted checkpoints (each naming the file), `latest` passing over a
// torn one, and a rank that cannot write (a full disk, an unwritable root) failing the
// save on every rank while the previous checkpoint stays loadable; the same for a save
// in the background, whose snapshot is what it writes. A rank's file missing; a
// manifest that names files outside its directory or ranges past its files; weights
// files (safetensors, torch.save's format) written and read back in parts; tensor-
// parallel parts joined into their whole tensors.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "parallax/checkpoint/async_saver.h"
#include "parallax/checkpoint/files.h"
#include "parallax/checkpoint/manifest.h"
#include "parallax/checkpoint/store.h"
#include "parallax/checkpoint/weights_file.h"
#include "parallax/core/error.h"
#include "parallax/core/mpi_communicator.h"
#include "parallax/core/tensor_cut.h"
#include "proto/checkpoint.pb.h"

namespace {

using parallax::CheckpointError;
using parallax::Communicator;
namespace checkpoint = parallax::checkpoint;
namespace fs = std::filesystem;

// While it lives, this process's file system is "full" when `full`: files stop at 64 KiB
// (writes fail with EFBIG; SIGXFSZ is ignored), far below a data file of about 4 MB / size.
class FullDisk {
 public:
  explicit FullDisk(bool full) : old_handler_(std::signal(SIGXFSZ, SIG_IGN)) {
    ::getrlimit(RLIMIT_FSIZE, &saved_);
    if (!full) return;
    struct rlimit small = saved_;
    small.rlim_cur = 64 * 1024;
    EXPECT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  }
  ~FullDisk() {
    ::setrlimit(RLIMIT_FSIZE, &saved_);
    std::signal(SIGXFSZ, old_handler_);
  }
  FullDisk(const FullDisk&) = delete;
  FullDisk& operator=(const FullDisk&) = delete;

 private:
  struct rlimit saved_ {};
  void (*old_handler_)(int);
};

class StoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    world_ = parallax::create_mpi_world_communicator();
    world_->set_default_timeout(std::chrono::milliseconds(30'000));
    // One fresh directory every rank shares: rank 0 makes it, the name is broadcast.
    std::string name(256, '\0');
    if (rank() == 0) {
      char pattern[] = "/tmp/parallax_store_test.XXXXXX";
      ASSERT_NE(::mkdtemp(pattern), nullptr);
      name.replace(0, sizeof(pattern), pattern, sizeof(pattern));
    }
    torch::Tensor bytes = torch::zeros({256}, torch::kUInt8);
    std::copy(name.begin(), name.end(), static_cast<char*>(bytes.data_ptr()));
    world_->broadcast(bytes, 0)->wait();
    root_ = std::string(static_cast<const char*>(bytes.data_ptr()));
  }
  void TearDown() override {
    world_->barrier()->wait();
    if (rank() == 0) fs::remove_all(root_);
  }
  int rank() const { return world_->rank(); }
  int size() const { return world_->size(); }

  // The tensor "w" of kNumel floats (value = index + step), each rank owning an uneven
  // contiguous part (rank r: [r·n/size … (r+1)·n/size) with n/size not whole), and
  // "b" of bytes held by the last rank only.
  static constexpr std::int64_t kNumel = 1000003;  // about 4 MB: several CRC blocks per piece
  checkpoint::SaveRequest request(std::int64_t step, int keep = 0) const {
    checkpoint::SaveRequest r;
    r.root = root_;
    r.step = step;
    r.keep = keep;
    r.layout = "test";
    const std::int64_t begin = kNumel * rank() / size(), end = kNumel * (rank() + 1) / size();
    r.pieces.push_back(
        {"param/w", {kNumel}, begin, torch::arange(begin, end, torch::kFloat32).add_(static_cast<double>(step)), {}});
    if (rank() == size() - 1) r.pieces.push_back({"rank/b", {3}, 0, torch::tensor({7, 8, 9}, torch::kUInt8), {}});
    r.engine_state = "engine@" + std::to_string(step);
    r.trainer_state = "loader@" + std::to_string(step);
    return r;
  }
  std::string dir(std::int64_t step) const { return root_ + "/" + checkpoint::directory_name(step); }

  std::unique_ptr<Communicator> world_;
  std::string root_;
};

TEST_F(StoreTest, EveryRangeReadsBackUnderAnotherSplitAndOnlyItsBlocksAreRead) {
  const checkpoint::SaveResult saved = checkpoint::save(*world_, request(5));
  EXPECT_EQ(saved.directory, dir(5));
  EXPECT_TRUE(fs::exists(dir(5) + "/commit"));
  EXPECT_FALSE(fs::exists(dir(5) + ".partial"));
  const checkpoint::Reader reader = checkpoint::Reader::open(dir(5), checkpoint::Reader::kExactly);
  EXPECT_EQ(reader.step(), 5);
  EXPECT_EQ(reader.engine_state(), "engine@5");
  EXPECT_EQ(reader.trainer_state(), "loader@5");
  EXPECT_EQ(reader.shape("param/w"), std::vector<std::int64_t>{kNumel});
  // Another split than the saving one: 7 parts, each straddling the savers' pieces.
  for (int part = 0; part < 7; ++part) {
    const std::int64_t begin = kNumel * part / 7, end = kNumel * (part + 1) / 7;
    torch::Tensor out = torch::empty({end - begin}, torch::kFloat32);
    reader.read("param/w", begin, out);
    ASSERT_TRUE(torch::equal(out, torch::arange(begin, end, torch::kFloat32).add_(5.0))) << "part " << part;
  }
  torch::Tensor b = torch::empty({3}, torch::kUInt8);
  reader.read("rank/b", 0, b);
  EXPECT_TRUE(torch::equal(b, torch::tensor({7, 8, 9}, torch::kUInt8)));

  // A small range reads only the CRC blocks that hold it: at most 2 MiB for 10 elements.
  const checkpoint::Reader fresh = checkpoint::Reader::open(dir(5), checkpoint::Reader::kExactly);
  torch::Tensor few = torch::empty({10}, torch::kFloat32);
  fresh.read("param/w", kNumel / 2, few);
  EXPECT_LE(fresh.bytes_read(), 2u << 20);
  EXPECT_GT(fresh.bytes_read(), 0u);

  // A dtype or range the checkpoint does not hold is named.
  torch::Tensor doubles = torch::empty({4}, torch::kFloat64);
  EXPECT_THROW(reader.read("param/w", 0, doubles), CheckpointError);
  torch::Tensor beyond = torch::empty({4}, torch::kFloat32);
  EXPECT_THROW(reader.read("param/w", kNumel - 2, beyond), CheckpointError);
  EXPECT_THROW(reader.shape("param/nothing"), CheckpointError);
}

TEST_F(StoreTest, KeepRemovesTheOldestAndLatestPassesOverATornOne) {
  for (std::int64_t step : {1, 2, 3, 4}) checkpoint::save(*world_, request(step, /*keep=*/2));
  world_->barrier()->wait();
  EXPECT_FALSE(fs::exists(dir(1)));
  EXPECT_FALSE(fs::exists(dir(2)));
  EXPECT_TRUE(fs::exists(dir(3)));
  EXPECT_TRUE(fs::exists(dir(4)));
  world_->barrier()->wait();
  if (rank() == 0) fs::remove(dir(4) + "/commit");  // as a crash between rename and marker would (it cannot)
  world_->barrier()->wait();
  EXPECT_THROW(checkpoint::Reader::open(dir(4), checkpoint::Reader::kExactly), CheckpointError);
  const checkpoint::Reader latest = checkpoint::Reader::open(root_, checkpoint::Reader::kLatest);
  EXPECT_EQ(latest.step(), 3);
  ASSERT_EQ(latest.skipped().size(), 1u);
  EXPECT_NE(latest.skipped()[0].find("no commit marker"), std::string::npos) << latest.skipped()[0];
  // A .partial directory (a save that died) is never a candidate.
  EXPECT_EQ(checkpoint::step_of(checkpoint::directory_name(9) + ".partial"), std::nullopt);
}

TEST_F(StoreTest, TruncatedAndCorruptedFilesAreNamed) {
  checkpoint::save(*world_, request(1));
  checkpoint::save(*world_, request(2));
  world_->barrier()->wait();
  const std::string last_file = dir(2) + "/" + checkpoint::rank_file_name(size() - 1);
  if (rank() == 0) {
    // Flip one byte in the middle of rank 0's data file of step 2.
    std::fstream file(dir(2) + "/" + checkpoint::rank_file_name(0), std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(1000);
    file.put('\x5a');
  }
  world_->barrier()->wait();
  const checkpoint::Reader reader = checkpoint::Reader::open(dir(2), checkpoint::Reader::kExactly);
  torch::Tensor out = torch::empty({kNumel}, torch::kFloat32);
  try {
    reader.read("param/w", 0, out);
    ADD_FAILURE() << "a corrupted block was read without error";
  } catch (const CheckpointError& e) {
    const std::string what = e.detail();
    EXPECT_NE(what.find(checkpoint::rank_file_name(0)), std::string::npos) << what;
    EXPECT_NE(what.find("CRC-32"), std::string::npos) << what;
    EXPECT_NE(what.find("block 0"), std::string::npos) << what;
  }
  world_->barrier()->wait();
  if (rank() == 0) fs::resize_file(last_file, fs::file_size(last_file) - 1);
  world_->barrier()->wait();
  try {
    checkpoint::Reader::open(dir(2), checkpoint::Reader::kExactly);
    ADD_FAILURE() << "a truncated file was accepted";
  } catch (const CheckpointError& e) {
    EXPECT_NE(e.detail().find(checkpoint::rank_file_name(size() - 1)), std::string::npos) << e.detail();
    EXPECT_NE(e.detail().find("truncated"), std::string::npos) << e.detail();
  }
  // latest: the newest that validates (step 1), step 2 named as passed over.
  EXPECT_EQ(checkpoint::Reader::open(root_, checkpoint::Reader::kLatest).step(), 1);
}

TEST_F(StoreTest, ARankThatCannotWriteFailsTheSaveOnEveryRankAndTheLastCheckpointStays) {
  checkpoint::save(*world_, request(1));
  {
    const FullDisk full(rank() == size() - 1);
    try {
      checkpoint::save(*world_, request(2));
      ADD_FAILURE() << "the save succeeded with a full disk";
    } catch (const CheckpointError& e) {
      EXPECT_NE(e.detail().find("rank " + std::to_string(size() - 1)), std::string::npos) << e.detail();
      EXPECT_NE(e.detail().find("cannot write"), std::string::npos) << e.detail();
    }
  }
  world_->barrier()->wait();
  EXPECT_FALSE(fs::exists(dir(2)));
  EXPECT_FALSE(fs::exists(dir(2) + ".partial"));
  const checkpoint::Reader latest = checkpoint::Reader::open(root_, checkpoint::Reader::kLatest);
  EXPECT_EQ(latest.step(), 1);
  torch::Tensor out = torch::empty({kNumel}, torch::kFloat32);
  latest.read("param/w", 0, out);
  EXPECT_TRUE(torch::equal(out, torch::arange(0, kNumel, torch::kFloat32).add_(1.0)));

  // A root that cannot be created (below a regular file) fails on every rank too.
  if (rank() == 0) std::ofstream(root_ + "/a_file") << "x";
  world_->barrier()->wait();
  checkpoint::SaveRequest blocked = request(3);
  blocked.root = root_ + "/a_file/checkpoints";
  try {
    checkpoint::save(*world_, blocked);
    ADD_FAILURE() << "the save succeeded under a regular file";
  } catch (const CheckpointError& e) {
    EXPECT_NE(e.detail().find("failed on rank 0"), std::string::npos) << e.detail();
    EXPECT_NE(e.detail().find("a_file"), std::string::npos) << e.detail();
  }
}

TEST_F(StoreTest, AnAsynchronousSaveWritesItsSnapshotAndItsFailureReachesTheNextWait) {
  checkpoint::AsyncSaver saver(world_->split(0, rank(), "checkpoint"));
  checkpoint::SaveRequest first = request(1);
  torch::Tensor original = first.pieces[0].values;
  EXPECT_FALSE(saver.start(checkpoint::snapshot(std::move(first))).has_value());
  original.fill_(-1.0f);  // training goes on and changes the state: the snapshot was taken
  const std::optional<checkpoint::SaveResult> done = saver.wait();
  ASSERT_TRUE(done.has_value());
  EXPECT_EQ(done->directory, dir(1));
  torch::Tensor out = torch::empty({kNumel}, torch::kFloat32);
  checkpoint::Reader::open(dir(1), checkpoint::Reader::kExactly).read("param/w", 0, out);
  EXPECT_TRUE(torch::equal(out, torch::arange(0, kNumel, torch::kFloat32).add_(1.0)));

  // The last rank's disk is full while the save runs in the background: start() returns,
  // and the next wait() throws on every rank; step 1 stays the latest.
  {
    const FullDisk full(rank() == size() - 1);
    saver.start(checkpoint::snapshot(request(2)));
    EXPECT_THROW(saver.wait(), CheckpointError);
  }
  EXPECT_EQ(checkpoint::Reader::open(root_, checkpoint::Reader::kLatest).step(), 1);
  EXPECT_FALSE(saver.wait().has_value());  // the error was reported once
}

TEST_F(StoreTest, AMissingRankFileIsNamedAndLatestFallsBack) {
  checkpoint::save(*world_, request(1));
  checkpoint::save(*world_, request(2));
  world_->barrier()->wait();
  const std::string lost = checkpoint::rank_file_name(size() - 1);
  if (rank() == 0) fs::remove(dir(2) + "/" + lost);
  world_->barrier()->wait();
  try {
    checkpoint::Reader::open(dir(2), checkpoint::Reader::kExactly);
    ADD_FAILURE() << "a checkpoint missing a rank's file was accepted";
  } catch (const CheckpointError& e) {
    EXPECT_NE(e.detail().find(lost + ": missing"), std::string::npos) << e.detail();
  }
  const checkpoint::Reader latest = checkpoint::Reader::open(root_, checkpoint::Reader::kLatest);
  EXPECT_EQ(latest.step(), 1);
  ASSERT_EQ(latest.skipped().size(), 1u);
  EXPECT_NE(latest.skipped()[0].find(lost), std::string::npos) << latest.skipped()[0];
}

// A manifest is untrusted: names that leave the directory and indices or ranges past
// what they describe are refused before a byte is read (tests/fuzz/ fuzzes the same).
TEST(ManifestTest, EscapingNamesAndOutOfRangeEntriesAreRefused) {
  using Manifest = parallax::proto::CheckpointManifest;
  Manifest good;
  good.set_format_version(checkpoint::kManifestFormatVersion);
  good.set_block_bytes(1 << 20);
  auto* file = good.add_files();
  file->set_name("rank-00000.bin");
  file->set_bytes(16);
  auto* tensor = good.add_tensors();
  tensor->set_name("param/w");
  tensor->set_dtype("Float");
  tensor->add_shape(4);
  auto* piece = good.add_pieces();
  piece->set_numel(4);
  piece->add_block_crc32(0);
  EXPECT_NO_THROW(checkpoint::parse_manifest(good.SerializeAsString(), "manifest.pb"));

  // Each case: one change to the good manifest, and what the refusal must say.
  struct Case {
    std::function<void(Manifest&)> change;
    std::string why;
  };
  std::vector<Case> cases;
  for (const char* name : {"../rank-00000.bin", "/etc/passwd", "..", "a/b"}) {
    cases.push_back({[name](Manifest& m) { m.mutable_files(0)->set_name(name); }, "is not a plain name"});
  }
  cases.push_back({[](Manifest& m) { m.mutable_pieces(0)->set_file(1); }, "names file 1 of 1"});
  cases.push_back({[](Manifest& m) { m.mutable_pieces(0)->set_tensor(7); }, "names tensor 7 of 1"});
  cases.push_back({[](Manifest& m) { m.mutable_pieces(0)->set_offset(1); }, "which has 4"});
  cases.push_back({[](Manifest& m) { m.mutable_pieces(0)->set_byte_offset(4); }, "ends past file"});
  cases.push_back({[](Manifest& m) { m.mutable_pieces(0)->clear_block_crc32(); }, "block CRCs"});
  cases.push_back({[](Manifest& m) { m.mutable_tensors(0)->set_dtype("QInt8"); }, "does not read"});
  cases.push_back({[](Manifest& m) { m.mutable_tensors(0)->add_shape(-1); }, "has a negative dimension"});
  // Parts (of a tensor-parallel cut): the part's shape must be the cut of its whole, and
  // every part of the whole must be there.
  const auto as_part = [](Manifest& m, std::int64_t whole_rows, std::int64_t blocks, std::int64_t count) {
    parallax::proto::TensorPart* part = m.mutable_tensors(0)->mutable_part();
    part->set_whole("param/whole");
    part->add_whole_shape(whole_rows);
    part->set_blocks(blocks);
    part->set_count(count);
  };
  cases.push_back({[&](Manifest& m) { as_part(m, 8, 1, 3); }, "is not the cut of its whole"});
  cases.push_back({[&](Manifest& m) { as_part(m, 8, 3, 2); }, "does not form 3 equal blocks"});
  cases.push_back({[&](Manifest& m) { as_part(m, 8, 1, 2); }, "is saved as 2 parts, of which 1 are there"});
  cases.push_back({[&](Manifest& m) {
                     as_part(m, 8, 1, 2);
                     m.mutable_tensors(0)->mutable_part()->set_dim(1);
                   },
                   "does not fit a tensor of 1 dimension"});
  cases.push_back({[](Manifest& m) { m.set_format_version(2); }, "format version 2"});
  for (const Case& c : cases) {
    Manifest bad = good;
    c.change(bad);
    try {
      checkpoint::parse_manifest(bad.SerializeAsString(), "manifest.pb");
      ADD_FAILURE() << "accepted; expected: " << c.why;
    } catch (const CheckpointError& e) {
      EXPECT_NE(e.detail().find(c.why), std::string::npos) << e.detail();
    }
  }
}

// Tensor-parallel parts (PartOf): each rank saves its part of three tensors, cut as
// plans cut them: a fused [q | k | v] projection (dim 0, 3 blocks), a row layer's weight
// (dim 1) and a vocabulary that does not divide by the ranks (dim 0, zero padding). The
// reader joins each whole from the parts, export writes it whole, and it cuts again for
// another part count. Mutants: a join that ignores the blocks (qkv's rows interleave
// wrongly) or keeps the padding (vocab's shape) fail; a part left out fails the save.
TEST_F(StoreTest, PartsSavedUnderOnePartCountJoinIntoTheWholeAndExportWhole) {
  struct Whole {
    std::string name;
    torch::Tensor values;
    parallax::TensorCut cut;
  };
  const std::vector<Whole> wholes = {{"param/qkv", torch::arange(0, 24 * 5, torch::kFloat32).reshape({24, 5}), {0, 3}},
                                     {"param/proj", torch::arange(0, 6 * 8, torch::kFloat32).reshape({6, 8}), {1, 1}},
                                     {"param/vocab", torch::arange(0, 7 * 3, torch::kFloat32).reshape({7, 3}), {0, 1}}};
  const auto parts_request = [&](std::int64_t step, bool leave_last_out) {
    checkpoint::SaveRequest r;
    r.root = root_;
    r.step = step;
    r.layout = "parts";
    for (const Whole& w : wholes) {
      if (leave_last_out && rank() == size() - 1) continue;
      const torch::Tensor part = parallax::cut(w.values, w.cut, rank(), size());
      checkpoint::PartOf of{w.name, w.values.sizes().vec(), w.cut, rank(), size()};
      r.pieces.push_back({w.name + "@" + std::to_string(rank()), part.sizes().vec(), 0, part, std::move(of)});
    }
    return r;
  };
  checkpoint::save(*world_, parts_request(1, false));
  const checkpoint::Reader reader = checkpoint::Reader::open(dir(1), checkpoint::Reader::kExactly);
  EXPECT_EQ(reader.wholes(), (std::vector<std::string>{"param/qkv", "param/proj", "param/vocab"}));
  for (const Whole& w : wholes) {
    EXPECT_TRUE(reader.has_whole(w.name));
    EXPECT_FALSE(reader.has(w.name));
    EXPECT_EQ(reader.parts_of(w.name), size());
    EXPECT_EQ(reader.shape(w.name), w.values.sizes().vec());
    EXPECT_TRUE(torch::equal(reader.read_whole(w.name), w.values)) << w.name;
    // Cut again for another part count (a run under another tp), the parts join back.
    std::vector<torch::Tensor> three;
    for (int i = 0; i < 3; ++i) three.push_back(parallax::cut(reader.read_whole(w.name), w.cut, i, 3));
    EXPECT_TRUE(torch::equal(parallax::join(three, w.cut, w.values.sizes().vec()), w.values)) << w.name;
  }
  const std::string exported = root_ + "/joined.safetensors";
  if (rank() == 0) checkpoint::export_weights(reader, exported);
  world_->barrier()->wait();
  const checkpoint::Reader weights = checkpoint::Reader::open_weights(exported);
  for (const Whole& w : wholes) EXPECT_TRUE(torch::equal(weights.read_whole(w.name), w.values)) << w.name;

  try {
    checkpoint::save(*world_, parts_request(2, true));
    ADD_FAILURE() << "a save with a part missing was published";
  } catch (const CheckpointError& e) {
    EXPECT_NE(e.detail().find("parts, of which " + std::to_string(size() - 1) + " are there"), std::string::npos)
        << e.detail();
  }
  EXPECT_FALSE(fs::exists(dir(2)));
}

// Weights files: what the writers stream, Reader::open_weights and read_torch_weights
// read back, each rank a part of a tensor; a safetensors header that lies is named.
TEST_F(StoreTest, WeightsFilesRoundTripAndABadHeaderIsNamed) {
  const torch::Tensor w = torch::arange(0, 1000, torch::kFloat32).reshape({10, 100});
  const torch::Tensor b = torch::arange(0, 6, torch::kFloat32).to(torch::kBFloat16);
  const std::string st = root_ + "/w.safetensors", pt = root_ + "/w.pt";
  if (rank() == 0) {
    for (const std::string& path : {st, pt}) {
      auto out = checkpoint::WeightsWriter::open(
          path, {{"fc.weight", torch::kFloat, {10, 100}}, {"fc.bias", torch::kBFloat16, {6}}});
      out->write(w);
      out->write(b);
      out->close();
    }
  }
  world_->barrier()->wait();
  const checkpoint::Reader weights = checkpoint::Reader::open_weights(st);
  EXPECT_TRUE(weights.weights_only());
  EXPECT_EQ(weights.shape("param/fc.weight"), (std::vector<std::int64_t>{10, 100}));
  EXPECT_EQ(weights.dtype("param/fc.bias"), torch::kBFloat16);
  const std::int64_t begin = 1000 * rank() / size(), end = 1000 * (rank() + 1) / size();
  torch::Tensor part = torch::empty({end - begin}, torch::kFloat32);
  weights.read("param/fc.weight", begin, part);
  EXPECT_TRUE(torch::equal(part, w.view({-1}).narrow(0, begin, end - begin)));
  const auto loaded = checkpoint::read_torch_weights(pt);
  ASSERT_EQ(loaded.size(), 2u);
  EXPECT_EQ(loaded[0].first, "fc.weight");
  EXPECT_TRUE(torch::equal(loaded[0].second, w));
  EXPECT_TRUE(torch::equal(loaded[1].second, b));
  world_->barrier()->wait();

  if (rank() == 0) {
    std::fstream file(st, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(4);
    file.put('\x01');  // the header's length (8 bytes, little-endian) grows by 2^32
  }
  world_->barrier()->wait();
  try {
    checkpoint::Reader::open_weights(st);
    ADD_FAILURE() << "a header longer than the file was accepted";
  } catch (const CheckpointError& e) {
    EXPECT_NE(e.detail().find("w.safetensors: header length"), std::string::npos) << e.detail();
  }
}

}  // namespace
