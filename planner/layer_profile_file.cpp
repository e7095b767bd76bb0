#include "parallax/planner/layer_profile_file.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <system_error>

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>

#include "parallax/core/error.h"
#include "parallax/core/fnv1a.h"
#include "proto/layer_profile.pb.h"

namespace parallax::planner {
namespace {

namespace fs = std::filesystem;

proto::TransformerSizes sizes_of(const TransformerShape& m) {
  proto::TransformerSizes sizes;
  sizes.set_layers(m.layers);
  sizes.set_hidden(m.hidden);
  sizes.set_heads(m.heads);
  sizes.set_kv_heads(m.kv_heads);
  sizes.set_ffn_hidden(m.ffn_hidden);
  sizes.set_vocab(m.vocab);
  sizes.set_seq(m.seq);
  sizes.set_tied_embeddings(m.tied_embeddings);
  sizes.set_dropout(m.dropout);
  return sizes;
}

TransformerShape shape_of(const proto::TransformerSizes& sizes) {
  TransformerShape m;
  m.layers = sizes.layers();
  m.hidden = sizes.hidden();
  m.heads = sizes.heads();
  m.kv_heads = sizes.kv_heads();
  m.ffn_hidden = sizes.ffn_hidden();
  m.vocab = sizes.vocab();
  m.seq = sizes.seq();
  m.tied_embeddings = sizes.tied_embeddings();
  m.dropout = sizes.dropout();
  return m;
}

// The conditions without the tables, as one message: what same_conditions compares
// and file_name hashes.
proto::LayerProfile conditions_of(const MeasuredProfile& p) {
  proto::LayerProfile message;
  *message.mutable_model() = sizes_of(p.model);
  message.set_dtype(p.dtype);
  message.set_machine(p.machine);
  message.set_world_size(p.world_size);
  message.set_local_size(p.local_size);
  message.set_build(p.build);
  return message;
}

std::string conditions_bytes(const MeasuredProfile& p) {
  std::string bytes;
  google::protobuf::io::StringOutputStream stream(&bytes);
  google::protobuf::io::CodedOutputStream coded(&stream);
  coded.SetSerializationDeterministic(true);
  conditions_of(p).SerializeToCodedStream(&coded);
  coded.Trim();
  return bytes;
}

}  // namespace

double MeasuredProfile::step_time_correction() const {
  if (step_time_ratios.empty()) return 1.0;
  std::vector<double> sorted = step_time_ratios;
  std::sort(sorted.begin(), sorted.end());
  const std::size_t n = sorted.size();
  return n % 2 == 1 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
}

void MeasuredProfile::add_step_time_ratio(double ratio) {
  step_time_ratios.push_back(ratio);
  if (step_time_ratios.size() > kRatiosKept) {
    step_time_ratios.erase(step_time_ratios.begin(), step_time_ratios.end() - kRatiosKept);
  }
}

bool MeasuredProfile::same_conditions(const MeasuredProfile& other) const {
  return conditions_bytes(*this) == conditions_bytes(other);
}

std::string MeasuredProfile::file_name() const {
  char name[64];
  std::snprintf(name, sizeof(name), "layer-profile-%016" PRIx64 ".pb", fnv1a_64(conditions_bytes(*this)));
  return name;
}

MeasuredProfile read_profile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  PARALLAX_CHECK(in.good(), ConfigError, path, ": cannot read the layer profile (", std::strerror(errno), ")");
  proto::LayerProfile message;
  PARALLAX_CHECK(message.ParseFromIstream(&in) && message.has_model() && message.model().layers() > 0 &&
                     message.world_size() > 0,
                 ConfigError, path, ": not a layer profile (one is written by an auto run, see docs/planner.md)");
  MeasuredProfile profile;
  profile.model = shape_of(message.model());
  profile.dtype = message.dtype();
  profile.machine = message.machine();
  profile.world_size = message.world_size();
  profile.local_size = message.local_size();
  profile.build = message.build();
  profile.memory_bandwidth = message.memory_bandwidth();
  profile.link_bandwidth = message.link_bandwidth();
  profile.link_latency = message.link_latency();
  profile.inter_node_link_bandwidth = message.inter_node_link_bandwidth();
  profile.inter_node_link_latency = message.inter_node_link_latency();
  PARALLAX_CHECK(profile.memory_bandwidth >= 0 && profile.link_bandwidth >= 0 && profile.link_latency >= 0 &&
                     profile.inter_node_link_bandwidth >= 0 && profile.inter_node_link_latency >= 0,
                 ConfigError, path, ": a machine figure is negative");
  for (double ratio : message.step_time_ratios()) {
    PARALLAX_CHECK(ratio > 0 && ratio < 1e6, ConfigError, path, ": a step-time ratio (", ratio, ") is out of range");
    profile.add_step_time_ratio(ratio);
  }
  for (const proto::ProfiledShape& shape : message.shapes()) {
    PARALLAX_CHECK(shape.micro_batch() > 0 && shape.tp() > 0 && shape.block_forward_s() > 0 &&
                       shape.block_backward_s() > 0 && shape.head_forward_s() > 0 && shape.head_backward_s() > 0,
                   ConfigError, path, ": a shape (micro-batch ", shape.micro_batch(), ", tp ", shape.tp(),
                   ") has a size or time that is not positive");
    const std::pair<std::int64_t, int> key{shape.micro_batch(), shape.tp()};
    profile.block[key] = {shape.block_forward_s(), shape.block_backward_s()};
    profile.head[key] = {shape.head_forward_s(), shape.head_backward_s()};
  }
  return profile;
}

void write_profile(const std::string& path, const MeasuredProfile& profile) {
  proto::LayerProfile message = conditions_of(profile);
  message.set_memory_bandwidth(profile.memory_bandwidth);
  message.set_link_bandwidth(profile.link_bandwidth);
  message.set_link_latency(profile.link_latency);
  message.set_inter_node_link_bandwidth(profile.inter_node_link_bandwidth);
  message.set_inter_node_link_latency(profile.inter_node_link_latency);
  for (double ratio : profile.step_time_ratios) message.add_step_time_ratios(ratio);
  for (const auto& [key, block] : profile.block) {
    const auto head = profile.head.find(key);
    if (head == profile.head.end()) continue;
    proto::ProfiledShape* shape = message.add_shapes();
    shape->set_micro_batch(key.first);
    shape->set_tp(key.second);
    shape->set_block_forward_s(block.forward);
    shape->set_block_backward_s(block.backward);
    shape->set_head_forward_s(head->second.forward);
    shape->set_head_backward_s(head->second.backward);
  }
  std::error_code error;
  const fs::path target(path);
  if (target.has_parent_path()) fs::create_directories(target.parent_path(), error);
  PARALLAX_CHECK(!error, ConfigError, path, ": cannot create its directory (", error.message(), ")");
  // Written whole or not at all: another run may read it at any moment.
  const std::string partial = path + ".partial." + std::to_string(::getpid());
  {
    std::ofstream out(partial, std::ios::binary | std::ios::trunc);
    PARALLAX_CHECK(out.good() && message.SerializeToOstream(&out) && (out.flush(), out.good()), ConfigError, path,
                   ": cannot write the layer profile (", std::strerror(errno), ")");
  }
  fs::rename(partial, target, error);
  if (error) fs::remove(partial);
  PARALLAX_CHECK(!error, ConfigError, path, ": cannot write the layer profile (", error.message(), ")");
}

}  // namespace parallax::planner
