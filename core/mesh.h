// The device mesh: every world rank gets a coordinate (tp, pp, dp), and every rank gets
// one communicator per axis for the ranks that differ from it only along that axis.
//
// TP is innermost, then DP, then PP outermost (Megatron's and DeepSpeed's order): in the
// plain layout world rank r = tp + T·(dp + D·pp). Tensor-parallel groups talk the most,
// so each lies within one node; pipeline stages talk the least, so PP spans nodes first.
// AxisOrder::kTpPpDp ([parallel] order = "tp-pp-dp") swaps the outer two,
// r = tp + T·(pp + P·dp): each replica's whole pipeline on as few nodes as possible, and
// data parallelism across nodes (for gradients small enough, or point-to-point links
// slow enough, that activations should not leave a node).
//
// Placement uses the Cluster, not rank arithmetic alone. A launcher that deals ranks
// round-robin over nodes (mpirun --map-by node) would put a TP group of consecutive ranks
// on several nodes; then the TP groups are cut from each node's own ranks instead, and
// where that is impossible the placement refuses and says why:
//
//   Cluster (round robin, 2 nodes × 4):  node0 {0,2,4,6}   node1 {1,3,5,7}
//   tp=2, pp=2, dp=2:                    tp groups {0,2} {4,6} {1,3} {5,7}
//                                        dp groups {0,4} {2,6} {1,5} {3,7}   (within nodes)
//                                        pp groups {0,1} {4,5} {2,3} {6,7}   (across nodes)
//
// Usage:
//   auto cluster = parallax::Cluster::gather(world.communicator(), parallax::NodeTopology::discover());
//   parallax::Mesh mesh(world.communicator(), cluster, {/*tp=*/2, /*pp=*/1, /*dp=*/4});
//   mesh.tp().all_reduce(partial)->wait();       // within the tensor-parallel group
//   if (mesh.coord().pp == 0) ...                 // first pipeline stage
//
// MeshLayout is the pure part (no communication): tests and the planner use it to see a
// layout without MPI.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "parallax/core/communicator.h"
#include "parallax/core/config.h"
#include "parallax/core/topology.h"

namespace parallax {

/// The parallel degrees; tp × pp × dp must equal the world size.
struct MeshDegrees {
  int tp = 1;  ///< tensor-parallel ranks per group, e.g. 8 (≤ ranks per node)
  int pp = 1;  ///< pipeline stages, e.g. 4
  int dp = 1;  ///< data-parallel replicas, e.g. 2

  int product() const { return tp * pp * dp; }
};

/// A rank's place in the mesh; each member is in [0, degree).
struct MeshCoord {
  int tp = 0;
  int pp = 0;
  int dp = 0;
};
bool operator==(const MeshCoord& a, const MeshCoord& b);
bool operator!=(const MeshCoord& a, const MeshCoord& b);

/// The three axes. A group "along" an axis is the ranks whose other two coordinates match.
enum class MeshAxis { kTp, kPp, kDp };
/// "tp", "pp", "dp".
const char* to_string(MeshAxis axis);

/// Throws ConfigError unless every degree is ≥ 1 and tp × pp × dp == world_size; the
/// message names tp, pp, dp and the world size.
void check_degrees(const MeshDegrees& degrees, int world_size);

/// Which world rank holds which coordinate. Pure: computed from a Cluster alone, so it
/// is the same on every rank that holds the same Cluster.
class MeshLayout {
 public:
  /// Places every rank of `cluster`:
  ///   1. check_degrees(degrees, cluster.world_size()) — ConfigError otherwise.
  ///   2. Rank arithmetic (r = tp + T·(dp + D·pp), or tp + T·(pp + P·dp) for
  ///      kTpPpDp) when each node's ranks are consecutive and every TP group of
  ///      consecutive ranks then lies within one node.
  ///   3. Otherwise per node: each node's ranks, in local order, are cut into TP groups
  ///      of tp; TP group g (counting node by node) gets the inner of (dp, pp) = g mod its
  ///      degree, the outer = g / that degree.
  /// Throws TopologyError when step 3 is impossible: a node hosts fewer than tp ranks,
  /// or a number that tp does not divide; the message names the node and its ranks.
  static MeshLayout place(const Cluster& cluster, const MeshDegrees& degrees, AxisOrder order = AxisOrder::kTpDpPp);

  const MeshDegrees& degrees() const { return degrees_; }
  AxisOrder order() const { return order_; }
  int world_size() const { return static_cast<int>(coords_.size()); }
  /// True when step 2 (rank arithmetic) was used, false when TP groups were cut per node.
  bool rank_arithmetic() const { return rank_arithmetic_; }

  /// Coordinate of world rank `rank`; throws UsageError when out of range.
  const MeshCoord& coord(int rank) const;
  /// Every rank's coordinate, indexed by world rank.
  const std::vector<MeshCoord>& coords() const { return coords_; }
  /// The world rank at `coord`; throws UsageError when a member is out of range.
  int rank_at(const MeshCoord& coord) const;

  /// Identifies the group along `axis` that `rank` belongs to, in [0, world/degree):
  /// tp: pp·D + dp; dp: tp·P + pp; pp: tp·D + dp. Used as the split color.
  int color(MeshAxis axis, int rank) const;
  /// The world ranks of that group, ordered by their coordinate along `axis` (so a
  /// rank's index in it equals its coordinate, and its rank in the group communicator).
  std::vector<int> group(MeshAxis axis, int rank) const;
  /// All groups along `axis`, ordered by color.
  std::vector<std::vector<int>> groups(MeshAxis axis) const;
  /// Name of the group of `rank` along `axis`, e.g. "tp[pp=0,dp=1]", "dp[tp=0,pp=0]",
  /// "pp[tp=0,dp=0]".
  std::string group_name(MeshAxis axis, int rank) const;

  /// A table, one row per rank (rank, host, local index, tp, pp, dp), then the groups of
  /// each axis. `cluster` must be the one the layout was placed on.
  std::string describe(const Cluster& cluster) const;

 private:
  MeshLayout(MeshDegrees degrees, AxisOrder order, std::vector<MeshCoord> coords, bool rank_arithmetic);

  MeshDegrees degrees_;
  AxisOrder order_;
  std::vector<MeshCoord> coords_;  // by world rank
  std::vector<int> rank_at_;       // by linear index (the plain layout's rank)
  bool rank_arithmetic_ = true;
};

/// The mesh of this rank: its coordinate and one communicator per axis.
class Mesh {
 public:
  /// Collective over `world`: every rank must call it with the same cluster and degrees,
  /// and it blocks until all have. Places the ranks (MeshLayout::place) and splits
  /// `world` three times, in this order: TP groups, DP groups, PP groups. Labels `world`
  /// and the three groups with their ranks' nodes (Communicator::set_member_nodes), so
  /// their counters split intra- from inter-node bytes. `world` must outlive the Mesh. Throws UsageError when cluster.world_size() differs
  /// from world.size(), ConfigError / TopologyError as MeshLayout::place (on every rank
  /// alike, before any communication), CommError if a split fails.
  Mesh(Communicator& world, Cluster cluster, const MeshDegrees& degrees, AxisOrder order = AxisOrder::kTpDpPp);
  Mesh(const Mesh&) = delete;
  Mesh& operator=(const Mesh&) = delete;

  /// This rank's coordinate. coord().tp == tp().rank(), and likewise for pp and dp.
  const MeshCoord& coord() const { return layout_.coord(world_->rank()); }
  const MeshDegrees& degrees() const { return layout_.degrees(); }

  /// The ranks sharing this rank's (pp, dp): size tp, named "tp[pp=P,dp=D]".
  Communicator& tp() { return *tp_; }
  /// The ranks sharing this rank's (tp, pp): size dp, named "dp[tp=T,pp=P]".
  Communicator& dp() { return *dp_; }
  /// The ranks sharing this rank's (tp, dp): size pp, named "pp[tp=T,dp=D]".
  Communicator& pp() { return *pp_; }
  /// The world communicator the mesh was built from.
  Communicator& world() { return *world_; }
  /// The group along `axis`.
  Communicator& group(MeshAxis axis);

  const MeshLayout& layout() const { return layout_; }
  const Cluster& cluster() const { return cluster_; }

  /// The layout table (MeshLayout::describe) headed by this rank's coordinate.
  std::string describe() const;

 private:
  Communicator* world_;
  Cluster cluster_;
  MeshLayout layout_;
  std::unique_ptr<Communicator> tp_;
  std::unique_ptr<Communicator> dp_;
  std::unique_ptr<Communicator> pp_;
};

}  // namespace parallax
