// The device mesh: every world rank gets a coordinate on four named axes (tp, cp, pp,
// dp), and a communicator for every group the strategies talk over: the ranks that
// differ from it only along one axis, or along a set of axes (dp+cp, over which
// parameters replicated across context parallelism reduce and shard).
//
// TP is innermost, then CP, then DP, then PP outermost (Megatron's and DeepSpeed's
// order): in the plain layout world rank r = tp + T·(cp + C·(dp + D·pp)). Tensor-parallel
// groups talk the most, so each lies within one node; context parallelism (a ring of
// key/value blocks every attention layer) next; pipeline stages talk the least, so PP
// spans nodes first. AxisOrder::kTpPpDp ([parallel] order = "tp-pp-dp") swaps the outer
// two, r = tp + T·(cp + C·(pp + P·dp)): each replica's whole pipeline on as few nodes as
// possible, and data parallelism across nodes (for gradients small enough, or
// point-to-point links slow enough, that activations should not leave a node).
//
// An axis of degree 1 costs nothing but a communicator of one rank; cp is left out of
// group names and tables while its degree is 1, so a mesh without context parallelism
// reads as it always has.
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
//   parallax::Mesh mesh(world.communicator(), cluster, {/*tp=*/2, /*pp=*/1, /*dp=*/2, /*cp=*/2});
//   mesh.tp().all_reduce(partial)->wait();                       // within the tensor-parallel group
//   mesh.group({MeshAxis::kDp, MeshAxis::kCp}).all_reduce(grad); // over data and context parallelism
//   if (mesh.coord().pp == 0) ...                                 // first pipeline stage
//
// MeshLayout is the pure part (no communication): tests and the planner use it to see a
// layout without MPI.
#pragma once

#include <array>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "parallax/core/communicator.h"
#include "parallax/core/config.h"
#include "parallax/core/topology.h"

namespace parallax {

/// The named axes. A group "along" an axis is the ranks whose other coordinates match.
enum class MeshAxis {
  kTp,  ///< tensor parallelism: a layer's weights split (innermost, inside a node)
  kCp,  ///< context parallelism: each sequence split over ranks
  kPp,  ///< pipeline parallelism: the layers split into stages
  kDp,  ///< data parallelism: the batch split, the model replicated
};
/// Every axis, in the order colors and names list them (most significant first).
inline constexpr std::array<MeshAxis, 4> kMeshAxes = {MeshAxis::kTp, MeshAxis::kPp, MeshAxis::kDp, MeshAxis::kCp};
/// "tp", "cp", "pp", "dp".
const char* to_string(MeshAxis axis);

/// A set of axes: the group "over" a set is the ranks whose coordinates agree on every
/// axis outside it. A single axis converts to the set holding it.
class MeshAxes {
 public:
  MeshAxes(MeshAxis axis) : bits_(bit(axis)) {}  // NOLINT: an axis is the set of itself
  MeshAxes(std::initializer_list<MeshAxis> axes) {
    for (MeshAxis axis : axes) bits_ |= bit(axis);
  }
  bool contains(MeshAxis axis) const { return (bits_ & bit(axis)) != 0; }
  bool operator==(const MeshAxes& other) const { return bits_ == other.bits_; }
  bool operator!=(const MeshAxes& other) const { return bits_ != other.bits_; }

 private:
  static unsigned bit(MeshAxis axis) { return 1u << static_cast<unsigned>(axis); }
  unsigned bits_ = 0;
};
/// The set's axes joined by '+', in kMeshAxes order: "tp", "dp+cp".
std::string to_string(const MeshAxes& axes);

/// The parallel degrees; tp × pp × dp × cp must equal the world size.
struct MeshDegrees {
  int tp = 1;  ///< tensor-parallel ranks per group, e.g. 8 (≤ ranks per node)
  int pp = 1;  ///< pipeline stages, e.g. 4
  int dp = 1;  ///< data-parallel replicas, e.g. 2
  int cp = 1;  ///< context-parallel ranks per sequence, e.g. 4
  /// Expert-parallel ranks sharing one mixture-of-experts layer's experts, e.g. 4. Not an
  /// axis of its own: it folds inside the dp × cp replicas (Megatron's folding), so it must
  /// divide dp × cp and leaves product() alone.
  int ep = 1;

  /// The degree of `axis`.
  int of(MeshAxis axis) const;
  /// The number of ranks in a group over `axes`: the product of their degrees.
  int of(const MeshAxes& axes) const;
  int product() const { return tp * pp * dp * cp; }
};

/// A rank's place in the mesh; each member is in [0, degree).
struct MeshCoord {
  int tp = 0;
  int pp = 0;
  int dp = 0;
  int cp = 0;

  /// The coordinate along `axis`.
  int of(MeshAxis axis) const;
  /// Sets the coordinate along `axis` to `value`.
  void set(MeshAxis axis, int value);
};
bool operator==(const MeshCoord& a, const MeshCoord& b);
bool operator!=(const MeshCoord& a, const MeshCoord& b);

/// The axes innermost (fastest-varying over world ranks) first: tp, cp, then dp and pp,
/// or pp and dp for AxisOrder::kTpPpDp.
std::array<MeshAxis, 4> inner_to_outer(AxisOrder order);

/// Throws ConfigError unless every degree is ≥ 1, tp × pp × dp × cp == world_size and ep
/// divides dp × cp; the message names tp, pp, dp (cp and ep where they are not 1) and the
/// world size.
void check_degrees(const MeshDegrees& degrees, int world_size);

/// Which world rank holds which coordinate. Pure: computed from a Cluster alone, so it
/// is the same on every rank that holds the same Cluster.
class MeshLayout {
 public:
  /// Places every rank of `cluster`:
  ///   1. check_degrees(degrees, cluster.world_size()) — ConfigError otherwise.
  ///   2. Rank arithmetic (the linear index over inner_to_outer(order): r = tp +
  ///      T·(cp + C·(dp + D·pp)), or tp + T·(cp + C·(pp + P·dp)) for kTpPpDp) when each
  ///      node's ranks are consecutive and every TP group of consecutive ranks then lies
  ///      within one node.
  ///   3. Otherwise per node: each node's ranks, in local order, are cut into TP groups
  ///      of tp; TP group g (counting node by node) takes the other coordinates from g by
  ///      the same arithmetic (cp = g mod C, then the inner of dp and pp, then the outer).
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

  /// Identifies the group over `axes` that `rank` belongs to, in [0, world / size):
  /// the coordinates outside `axes` read as one number, most significant first in
  /// kMeshAxes order (tp, pp, dp, cp). E.g. tp: (pp·D + dp)·C + cp; dp: (tp·P + pp)·C
  /// + cp; pp: (tp·D + dp)·C + cp. Used as the split color.
  int color(const MeshAxes& axes, int rank) const;
  /// `rank`'s index in its group over `axes`: the coordinates inside `axes` read as one
  /// number, innermost least significant (along one axis, the coordinate itself; over
  /// dp+cp, cp + C·dp). Used as the split key.
  int index_in_group(const MeshAxes& axes, int rank) const;
  /// The world ranks of that group, ordered by index_in_group (so a rank's position in
  /// it is its rank in the group communicator).
  std::vector<int> group(const MeshAxes& axes, int rank) const;
  /// All groups over `axes`, ordered by color.
  std::vector<std::vector<int>> groups(const MeshAxes& axes) const;
  /// Name of the group of `rank` over `axes`: the axes, then the coordinates outside
  /// them, e.g. "tp[pp=0,dp=1]", "dp[tp=0,pp=0]", "dp+cp[tp=0,pp=1]",
  /// "cp[tp=0,pp=0,dp=1]". cp is named only where its degree is above 1.
  std::string group_name(const MeshAxes& axes, int rank) const;

  /// A table, one row per rank (rank, host, local index, tp, pp, dp, and cp where its
  /// degree is above 1), then the groups of each axis (and of dp+cp). `cluster` must be the one the layout was placed
  /// on.
  std::string describe(const Cluster& cluster) const;

 private:
  MeshLayout(MeshDegrees degrees, AxisOrder order, std::vector<MeshCoord> coords, bool rank_arithmetic);

  MeshDegrees degrees_;
  AxisOrder order_;
  std::vector<MeshCoord> coords_;  // by world rank
  std::vector<int> rank_at_;       // by linear index (the plain layout's rank)
  bool rank_arithmetic_ = true;
};

/// The mesh of this rank: its coordinate and a communicator for each axis and for dp+cp.
class Mesh {
 public:
  /// Collective over `world`: every rank must call it with the same cluster and degrees,
  /// and it blocks until all have. Places the ranks (MeshLayout::place) and splits
  /// `world`, in this order: TP groups, DP groups, PP groups, CP groups, the dp+cp
  /// groups when cp > 1 (with cp = 1 they are the DP groups), then, when ep > 1, splits
  /// the replicas into the ep and edp groups. Labels `world` and every
  /// group with their ranks' nodes (Communicator::set_member_nodes), so their counters
  /// split intra- from inter-node bytes. `world` must outlive the Mesh. Throws
  /// UsageError when cluster.world_size() differs from world.size(), ConfigError /
  /// TopologyError as MeshLayout::place (on every rank alike, before any
  /// communication), CommError if a split fails.
  Mesh(Communicator& world, Cluster cluster, const MeshDegrees& degrees, AxisOrder order = AxisOrder::kTpDpPp);
  Mesh(const Mesh&) = delete;
  Mesh& operator=(const Mesh&) = delete;

  /// This rank's coordinate. coord().tp == tp().rank(), and likewise for cp, pp and dp.
  const MeshCoord& coord() const { return layout_.coord(world_->rank()); }
  const MeshDegrees& degrees() const { return layout_.degrees(); }

  /// The ranks sharing this rank's (cp, pp, dp): size tp, named "tp[pp=P,dp=D]".
  Communicator& tp() { return *tp_; }
  /// The ranks sharing this rank's (tp, cp, pp): size dp, named "dp[tp=T,pp=P]".
  Communicator& dp() { return *dp_; }
  /// The ranks sharing this rank's (tp, cp, dp): size pp, named "pp[tp=T,dp=D]".
  Communicator& pp() { return *pp_; }
  /// The ranks sharing this rank's (tp, pp, dp): size cp, named "cp[tp=T,pp=P,dp=D]".
  Communicator& cp() { return *cp_; }
  /// The world communicator the mesh was built from.
  Communicator& world() { return *world_; }
  /// The group over `axes`: one of tp, cp, pp, dp or dp+cp (the ranks sharing this
  /// rank's tp and pp; dp() itself while cp = 1). Throws UsageError for another set,
  /// naming the sets the mesh holds.
  Communicator& group(const MeshAxes& axes);
  /// The ranks that hold the same parameters, each on its own data: dp+cp (dp() itself
  /// while cp = 1). Gradients reduce, and ZeRO shards model state, over it.
  Communicator& replicas() { return group({MeshAxis::kDp, MeshAxis::kCp}); }
  /// Expert parallelism (degrees().ep > 1): the replicas cut into blocks of ep consecutive
  /// ranks (replica index i in block i / ep, at i mod ep), each block sharing out the
  /// experts of every mixture-of-experts layer; named "ep[tp=T,pp=P,block=B]". Throws
  /// UsageError while ep = 1.
  Communicator& expert();
  /// The ranks holding the same experts: the replicas at the same place i mod ep of every
  /// block (dp × cp / ep of them), over which expert gradients reduce and ZeRO shards
  /// expert state; named "edp[tp=T,pp=P,ep=I]". replicas() itself while ep = 1.
  Communicator& expert_replicas() { return edp_ ? *edp_ : replicas(); }

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
  std::unique_ptr<Communicator> cp_;
  std::unique_ptr<Communicator> dp_cp_;  ///< null while cp = 1 (dp_ is that group)
  std::unique_ptr<Communicator> ep_;     ///< null while ep = 1
  std::unique_ptr<Communicator> edp_;    ///< null while ep = 1 (the replicas are that group)
};

}  // namespace parallax
