// One flat, padded buffer of parameters sharded over the data-parallel group: the
// unit of ZeRO's bookkeeping (a bucket at stages 1–2, a wrapped module at stage 3).
//
// Layout (see shard_layout.h): parameters back to back, padded to a multiple of the
// group size N; rank r owns shard r. Each parameter is re-pointed (set_data) at its
// place in the group's full buffer, so the model's own tensors read the buffer.
//
// What this rank holds, by residency:
//   replicated (stages 1–2, persistent stage-3 parameters): the full buffer always;
//     its shard is a view of it.
//   sharded (stage 3): the shard always; the full buffer only between gather() and
//     release(), which allocate and free its storage in place, so the parameters and
//     any view autograd saved of them see the data again after a new gather.
// The fp32 master shard is the shard itself when parameters are fp32, else a copy.
// Gradients: each backward's gradient of a parameter is added (in fp32) into a full
// gradient buffer on the parameters' device; reduce_scatter leaves this rank's reduced
// shard in the gradient shard (the master's .grad). With an offloaded optimizer
// (use_host_gradient) the master and the gradient shard are the optimizer's host
// buffers instead: from a device, the reduced shard goes there on the side stream while
// backward goes on (finish_host_gradient waits for it), and the updated shard comes back
// the same way (set_pending_update). With parameter offload (fetch_shard_from) a sharded
// group keeps no shard at all: each gather fills this rank's part of the full buffer
// from the host first.
// With `keep_full_gradients` (stage 1) the full buffer
// lives across micro-steps and the shard is its view; otherwise (stages 2–3) the full
// buffer exists only from a micro-step's first gradient to its reduce-scatter.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "parallax/core/communicator.h"
#include "parallax/offload/side_stream.h"
#include "parallax/zero/shard_layout.h"

namespace c10 {
struct StorageImpl;
}

namespace parallax::zero {

enum class Residency { kReplicated, kSharded };

class FlatGroup {
 public:
  /// `params`: distinct dense leaf tensors of one dtype, identical on every rank.
  /// Copies them into the group's buffer and re-points them at it; a sharded group
  /// keeps only this rank's shard afterwards. Does not communicate.
  FlatGroup(std::vector<torch::Tensor> params, int rank, int ranks, Residency residency, bool keep_full_gradients);
  FlatGroup(const FlatGroup&) = delete;
  FlatGroup& operator=(const FlatGroup&) = delete;
  ~FlatGroup();

  const ShardLayout& layout() const { return layout_; }
  const std::vector<torch::Tensor>& params() const { return params_; }
  Residency residency() const { return residency_; }
  /// The storage the parameters point into (for stage 3's use detection).
  const c10::StorageImpl* storage() const;

  // ---- parameters (stage 3) ----
  /// Allocates the full buffer and starts an all_gather of the shards into it.
  WorkPtr gather(Communicator& comm);
  /// Frees the full buffer's memory (shapes stay; data is gone until the next gather).
  void release();
  bool full_buffer_live() const { return full_live_; }

  // ---- gradients ----
  /// Starts a micro-step's gradient reports. With `keep_full_gradients`, a micro-step
  /// after this window's reduction (a late backward) is reduced again and added: the
  /// reduced shard is set aside and the full buffer starts from zero.
  void begin_micro_step();
  /// Whether a gradient was added (or absorbed) since the last reduction's report.
  bool has_gradients() const { return reported_ > 0 || absorbed_; }
  /// Adds parameter `i`'s gradient of this backward; returns true when every
  /// parameter of the group has reported in this micro-step.
  bool add_gradient(std::size_t i, const torch::Tensor& grad);
  /// Adds a gradient of parameter `i` that no report counts (one the trainer's .grad
  /// held from another backward); the next reduction carries it.
  void absorb_gradient(std::size_t i, const torch::Tensor& grad);
  /// Drops everything this rank holds of parameter `i`'s gradient: its elements of the
  /// full buffer and of the gradient shard (the trainer cleared it). Not while a
  /// reduction of the group is in flight.
  void discard_gradient(std::size_t i);
  /// Reduce-scatters the full gradient buffer (zeros where nothing was added) and
  /// returns the work; complete_reduction() folds the result into the gradient shard.
  WorkPtr reduce(Communicator& comm);
  void complete_reduction();
  /// Zeroes the gradient shard (and the full gradient buffer, when kept).
  void zero_gradients();

  // ---- offloading ----
  /// The optimizer is offloaded: the reduced gradient shard goes into `gradient`
  /// (host fp32, shard_numel elements; pinned for the copy from a device to overlap)
  /// through `copies`, which outlives the group, and the group keeps no master of its own.
  void use_host_gradient(torch::Tensor gradient, offload::SideStreamCopies& copies);
  /// Offloaded: blocks until the reduced shards copied from the device are in the host
  /// gradient shard (added to what earlier micro-steps left there). Before the host
  /// reads it; at once on a CPU device.
  void finish_host_gradient();
  /// Offloaded: the updated compute-dtype shard is being copied in by `update`; the next
  /// collective that reads the shard is ordered after it.
  void set_pending_update(offload::HostCopy update) { pending_update_ = std::move(update); }
  /// Parameter offload (sharded groups, released): frees the compute-dtype shard; every
  /// gather() first calls `fetch(slot)` to fill this rank's part of the full buffer.
  void fetch_shard_from(std::function<void(const torch::Tensor& slot)> fetch);
  /// The compute-dtype shard this rank keeps (a view of the full buffer when
  /// replicated; undefined after fetch_shard_from). Writing it updates the parameters.
  const torch::Tensor& shard() const { return shard_; }

  // ---- the optimizer's view ----
  /// The fp32 master shard; its .grad is the gradient shard. Undefined once the
  /// optimizer is offloaded.
  const torch::Tensor& master() const { return master_; }
  const torch::Tensor& gradient_shard() const { return grad_shard_; }
  /// Copies the updated master into the compute-dtype shard (and so, when replicated,
  /// into this rank's part of the full buffer). Not for an offloaded optimizer.
  void write_back_master();
  /// Replicated groups after an update: all-gathers every rank's shard in place.
  WorkPtr gather_updated(Communicator& comm);

  // ---- accounting (bytes this rank holds now) ----
  std::int64_t parameter_bytes() const;
  std::int64_t gradient_bytes() const;
  /// The master copy when it is not the shard itself.
  std::int64_t master_bytes() const;
  /// Bytes of the full buffer (what a gather moves into this rank).
  std::int64_t full_bytes() const;
  /// Bytes of the full gradient buffer, while it exists (what a reduction reads).
  std::int64_t full_gradient_bytes() const;

 private:
  void allocate_full();

  std::vector<torch::Tensor> params_;
  ShardLayout layout_;
  int rank_;
  Residency residency_;
  bool keep_full_gradients_;
  torch::Tensor full_;  ///< [padded], compute dtype; storage freed while released
  bool full_live_ = true;
  torch::Tensor shard_;                    ///< [S], compute dtype
  torch::Tensor master_;                   ///< [S], fp32 (aliases shard_ when compute is fp32)
  torch::Tensor grad_full_;                ///< [padded], fp32; see the class comment for its life
  torch::Tensor grad_shard_;               ///< [S], fp32
  torch::Tensor received_;                 ///< reduce-scatter output in flight
  torch::TensorOptions gradient_options_;  ///< fp32 on the parameters' device
  std::size_t reported_ = 0;
  bool absorbed_ = false;         ///< absorb_gradient() since the last reduction
  bool reduced_in_window_ = false;  ///< a reduction completed since zero_gradients()
  torch::Tensor settled_;         ///< keep_full_gradients: the window's earlier reduced shard, set aside
  bool host_gradient_ = false;                   ///< grad_shard_ is the offloaded optimizer's
  offload::SideStreamCopies* copies_ = nullptr;  ///< offloaded: device <-> host
  bool host_shard_written_ = false;              ///< offloaded: the host shard holds a gradient since it was zeroed
  offload::HostCopy to_host_;                    ///< offloaded: the last reduced shard on its way to the host
  torch::Tensor staged_;                         ///< ... into here, to be added, when the host shard already holds one
  offload::HostCopy pending_update_;             ///< offloaded: the updated shard on its way from the host
  std::function<void(const torch::Tensor&)> fetch_;
};

}  // namespace parallax::zero
