// MpiCommunicator: validates arguments, describes each operation (for errors and
// counters) and hands it to its MpiProgressEngine (mpi_progress.h), which starts and
// polls the nonblocking MPI calls on its own thread.
//
// kAvg is the sum followed by a division by size() on the progress thread. For
// bfloat16/float16 every pairwise combine rounds (size() − 1 roundings), and the
// division once more. kAvg of an integer tensor is a UsageError (an
// integer mean is not an integer; reduce with kSum and divide as you see fit).
#include "parallax/core/mpi_communicator.h"

#include <unistd.h>

#include <climits>

#include "parallax/core/error.h"
#include "parallax/core/failure_watch.h"
#include "parallax/core/logging.h"
#include "parallax/core/mpi_datatypes.h"
#include "parallax/core/mpi_progress.h"

namespace parallax {
namespace {

std::string host_name() {
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) {
    return "unknown host";
  }
  return host;
}

// The world rank of each rank of `comm`.
std::vector<int> world_ranks(MPI_Comm comm) {
  MPI_Group group = MPI_GROUP_NULL;
  MPI_Group world = MPI_GROUP_NULL;
  MPI_Comm_group(comm, &group);
  MPI_Comm_group(MPI_COMM_WORLD, &world);
  int size = 0;
  MPI_Group_size(group, &size);
  std::vector<int> ranks(static_cast<std::size_t>(size));
  std::vector<int> translated(ranks.size());
  for (int r = 0; r < size; ++r) ranks[static_cast<std::size_t>(r)] = r;
  MPI_Group_translate_ranks(group, size, ranks.data(), world, translated.data());
  MPI_Group_free(&group);
  MPI_Group_free(&world);
  return translated;
}

bool overlaps(const at::Tensor& a, const at::Tensor& b) {
  const auto* a_begin = static_cast<const char*>(a.data_ptr());
  const auto* b_begin = static_cast<const char*>(b.data_ptr());
  return a_begin < b_begin + payload_bytes(b) && b_begin < a_begin + payload_bytes(a);
}

class MpiCommunicator final : public Communicator {
 public:
  /// Takes ownership of `comm` (already duplicated or split for Parallax's use).
  MpiCommunicator(MPI_Comm comm, std::string name, std::chrono::milliseconds default_timeout)
      : comm_(comm), name_(std::move(name)), host_(host_name()) {
    check_mpi(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    check_mpi(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
    check_mpi(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
    set_default_timeout(default_timeout);
    engine_ = std::make_unique<detail::MpiProgressEngine>(
        detail::concat("on rank ", rank_, " (world rank ", process_rank(), ", host ", host_, ")"), name_,
        world_ranks(comm_), [this](CommOp op, std::int64_t bytes, std::int64_t ns, int peer) { record(op, bytes, ns, peer); });
  }

  ~MpiCommunicator() override {
    // After the job failed, what is still in flight will not complete: do not wait for it.
    engine_->shutdown(failure_watch::job_failed() ? std::chrono::milliseconds(100)
                                                  : detail::MpiProgressEngine::kDefaultGrace);
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) {
      return;
    }
    if (engine_->leaked() > 0) {
      return;  // requests may still use the communicator and ops
    }
    ops_.release();
    MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }
  const char* backend() const override { return "mpi"; }

  WorkPtr all_reduce(at::Tensor& tensor, const CollectiveOptions& options) override {
    const CommOp op = CommOp::kAllReduce;
    check_tensor(op, tensor, "tensor");
    check_reduce_op(op, tensor, options.reduce_op);
    void* data = tensor.data_ptr();
    const int count = static_cast<int>(tensor.numel());
    const MPI_Datatype type = detail::mpi_datatype(tensor.scalar_type());
    const MPI_Op reduce = ops_.get(tensor.scalar_type(), options.reduce_op);
    MPI_Comm comm = comm_;
    detail::MpiOpSpec spec = make_spec(op, tensor, payload_bytes(tensor), options);
    spec.start = [=](MPI_Request* request) {
      return MPI_Iallreduce(MPI_IN_PLACE, data, count, type, reduce, comm, request);
    };
    spec.finish = average_finisher(tensor, options.reduce_op);
    return engine_->submit(std::move(spec));
  }

  WorkPtr reduce_scatter(at::Tensor& output, const at::Tensor& input, const CollectiveOptions& options) override {
    const CommOp op = CommOp::kReduceScatter;
    check_tensor(op, output, "output");
    check_tensor(op, input, "input");
    check_same_dtype(op, output, input);
    check_reduce_op(op, output, options.reduce_op);
    check_shards(op, input, "input", output, "output");
    PARALLAX_CHECK(!overlaps(output, input), UsageError, error_prefix(op),
                   "output overlaps input; MPI needs separate buffers");
    const void* in = input.data_ptr();
    void* out = output.data_ptr();
    const int count = static_cast<int>(output.numel());
    const MPI_Datatype type = detail::mpi_datatype(output.scalar_type());
    const MPI_Op reduce = ops_.get(output.scalar_type(), options.reduce_op);
    MPI_Comm comm = comm_;
    detail::MpiOpSpec spec = make_spec(op, input, payload_bytes(input), options);
    spec.tensors.push_back(output);
    spec.start = [=](MPI_Request* request) {
      return MPI_Ireduce_scatter_block(in, out, count, type, reduce, comm, request);
    };
    spec.finish = average_finisher(output, options.reduce_op);
    return engine_->submit(std::move(spec));
  }

  WorkPtr all_gather(at::Tensor& output, const at::Tensor& input, const CollectiveOptions& options) override {
    const CommOp op = CommOp::kAllGather;
    check_tensor(op, output, "output");
    check_tensor(op, input, "input");
    check_same_dtype(op, output, input);
    check_shards(op, output, "output", input, "input");
    const int count = static_cast<int>(input.numel());
    const auto* own_chunk =
        static_cast<const char*>(output.data_ptr()) + static_cast<std::int64_t>(rank_) * payload_bytes(input);
    // Input already sitting in this rank's chunk of output is MPI_IN_PLACE.
    const bool in_place = input.numel() > 0 && input.data_ptr() == static_cast<const void*>(own_chunk);
    PARALLAX_CHECK(in_place || !overlaps(output, input), UsageError, error_prefix(op),
                   "input overlaps output other than as this rank's chunk (rank ", rank_, ")");
    const void* in = in_place ? MPI_IN_PLACE : input.data_ptr();
    void* out = output.data_ptr();
    const MPI_Datatype type = detail::mpi_datatype(output.scalar_type());
    MPI_Comm comm = comm_;
    detail::MpiOpSpec spec = make_spec(op, output, payload_bytes(output), options);
    spec.tensors.push_back(input);
    spec.start = [=](MPI_Request* request) { return MPI_Iallgather(in, count, type, out, count, type, comm, request); };
    return engine_->submit(std::move(spec));
  }

  WorkPtr broadcast(at::Tensor& tensor, int root, const CollectiveOptions& options) override {
    const CommOp op = CommOp::kBroadcast;
    check_tensor(op, tensor, "tensor");
    check_peer(op, root, "root");
    void* data = tensor.data_ptr();
    const int count = static_cast<int>(tensor.numel());
    const MPI_Datatype type = detail::mpi_datatype(tensor.scalar_type());
    MPI_Comm comm = comm_;
    detail::MpiOpSpec spec = make_spec(op, tensor, payload_bytes(tensor), options);
    spec.what += detail::concat(" from root ", root);
    spec.start = [=](MPI_Request* request) { return MPI_Ibcast(data, count, type, root, comm, request); };
    return engine_->submit(std::move(spec));
  }

  WorkPtr send(const at::Tensor& tensor, int dst, int tag, const CollectiveOptions& options) override {
    const CommOp op = CommOp::kSend;
    check_tensor(op, tensor, "tensor");
    check_peer(op, dst, "dst");
    check_tag(op, tag);
    const void* data = tensor.data_ptr();
    const int count = static_cast<int>(tensor.numel());
    const MPI_Datatype type = detail::mpi_datatype(tensor.scalar_type());
    MPI_Comm comm = comm_;
    detail::MpiOpSpec spec = make_spec(op, tensor, payload_bytes(tensor), options);
    spec.what += detail::concat(" to rank ", dst, " (tag ", tag, ")");
    spec.peer = dst;
    spec.start = [=](MPI_Request* request) { return MPI_Isend(data, count, type, dst, tag, comm, request); };
    return engine_->submit(std::move(spec));
  }

  WorkPtr recv(at::Tensor& tensor, int src, int tag, const CollectiveOptions& options) override {
    const CommOp op = CommOp::kRecv;
    check_tensor(op, tensor, "tensor");
    check_peer(op, src, "src");
    check_tag(op, tag);
    void* data = tensor.data_ptr();
    const int count = static_cast<int>(tensor.numel());
    const MPI_Datatype type = detail::mpi_datatype(tensor.scalar_type());
    MPI_Comm comm = comm_;
    detail::MpiOpSpec spec = make_spec(op, tensor, payload_bytes(tensor), options);
    spec.what += detail::concat(" from rank ", src, " (tag ", tag, ")");
    spec.peer = src;
    spec.start = [=](MPI_Request* request) { return MPI_Irecv(data, count, type, src, tag, comm, request); };
    const std::string what = spec.what;
    spec.finish = [=](const MPI_Status& status) {
      int received = 0;
      MPI_Status copy = status;
      check_mpi(MPI_Get_count(&copy, type, &received), "MPI_Get_count");
      PARALLAX_CHECK(received == count, CommError, what, ": expected ", count, " elements but the message held ",
                     received);
    };
    return engine_->submit(std::move(spec));
  }

  WorkPtr barrier(const CollectiveOptions& options) override {
    MPI_Comm comm = comm_;
    detail::MpiOpSpec spec;
    spec.op = CommOp::kBarrier;
    spec.what = detail::concat("barrier on group '", name_, "' (", size_, " ranks)", step_suffix());
    spec.timeout = timeout_for(options);
    spec.start = [=](MPI_Request* request) { return MPI_Ibarrier(comm, request); };
    return engine_->submit(std::move(spec));
  }

  WorkPtr all_to_all(at::Tensor& output,
                     const std::vector<std::int64_t>& output_rows,
                     const at::Tensor& input,
                     const std::vector<std::int64_t>& input_rows,
                     const CollectiveOptions& options) override {
    const CommOp op = CommOp::kAllToAll;
    check_tensor(op, output, "output");
    check_tensor(op, input, "input");
    const std::int64_t row = check_all_to_all(output, output_rows, input, input_rows);
    PARALLAX_CHECK(output.numel() == 0 || input.numel() == 0 || !overlaps(output, input), UsageError,
                   error_prefix(op), "output overlaps input; MPI needs separate buffers");
    // Counts and displacements in elements; MPI_Alltoallv takes them as int (check_tensor
    // bounds both tensors by INT_MAX elements).
    auto counts = std::make_shared<std::vector<int>>(4 * size_);
    std::int64_t sent_elsewhere = 0;
    for (int q = 0, in_at = 0, out_at = 0; q < size_; ++q) {
      (*counts)[q] = static_cast<int>(input_rows[q] * row);
      (*counts)[size_ + q] = in_at;
      (*counts)[2 * size_ + q] = static_cast<int>(output_rows[q] * row);
      (*counts)[3 * size_ + q] = out_at;
      in_at += (*counts)[q];
      out_at += (*counts)[2 * size_ + q];
      if (q != rank_) sent_elsewhere += (*counts)[q];
    }
    const void* in = input.data_ptr();
    void* out = output.data_ptr();
    const MPI_Datatype type = detail::mpi_datatype(input.scalar_type());
    const int n = size_;
    MPI_Comm comm = comm_;
    detail::MpiOpSpec spec = make_spec(op, input, sent_elsewhere * input.element_size(), options);
    spec.tensors.push_back(output);
    spec.start = [=](MPI_Request* request) {
      const int* c = counts->data();
      return MPI_Ialltoallv(in, c, c + n, type, out, c + 2 * n, c + 3 * n, type, comm, request);
    };
    return engine_->submit(std::move(spec));
  }

  // Protocol: (a) an MPI_Ibarrier queued like any operation, with the default timeout,
  // so a rank that never calls split becomes a CommError; (b) once every rank passed
  // it, MPI_Comm_split runs on the progress thread, which starts nothing else
  // meanwhile (a fence), so all collectives on comm_ keep one order on every rank;
  // (c) the caller wraps the new MPI communicator.
  std::unique_ptr<Communicator> split(int color, int key, const std::string& name) override {
    PARALLAX_CHECK(color >= 0, UsageError, "split of group '", name_, "' into '", name, "': color must be >= 0, got ",
                   color);
    auto result = std::make_shared<MPI_Comm>(MPI_COMM_NULL);
    MPI_Comm comm = comm_;
    detail::MpiOpSpec spec;
    spec.op = CommOp::kBarrier;
    spec.what = detail::concat("split of group '", name_, "' (", size_, " ranks) into '", name, "' (color ", color,
                               ", key ", key, ")");
    spec.counted = false;
    spec.fence = true;
    spec.finish_if_abandoned = true;
    spec.timeout = default_timeout();
    spec.start = [=](MPI_Request* request) { return MPI_Ibarrier(comm, request); };
    spec.finish = [=](const MPI_Status&) {
      check_mpi(MPI_Comm_split(comm, color, key, result.get()), "MPI_Comm_split");
    };
    engine_->submit(std::move(spec))->wait();
    return std::make_unique<MpiCommunicator>(*result, name, default_timeout());
  }

 private:
  detail::MpiOpSpec make_spec(CommOp op,
                              const at::Tensor& tensor,
                              std::int64_t bytes,
                              const CollectiveOptions& options) const {
    detail::MpiOpSpec spec;
    spec.op = op;
    spec.what = describe_op(op, tensor, bytes);
    spec.bytes = bytes;
    spec.timeout = timeout_for(options);
    spec.tensors.push_back(tensor);
    return spec;
  }

  std::function<void(const MPI_Status&)> average_finisher(const at::Tensor& tensor, ReduceOp op) const {
    if (op != ReduceOp::kAvg || size_ == 1) {
      return nullptr;
    }
    const int size = size_;
    return [tensor, size](const MPI_Status&) { tensor.div_(size); };
  }

  void check_tensor(CommOp op, const at::Tensor& tensor, const char* role) const {
    PARALLAX_CHECK(tensor.defined(), UsageError, error_prefix(op), role, " is an undefined tensor");
    PARALLAX_CHECK(tensor.device().is_cpu() && tensor.layout() == at::kStrided, UsageError, error_prefix(op), role,
                   " is on ", tensor.device(), " with layout ", tensor.layout(),
                   "; the MPI communicator moves dense CPU tensors only");
    PARALLAX_CHECK(tensor.is_contiguous(), UsageError, error_prefix(op), role, " is not contiguous (sizes ",
                   tensor.sizes(), ", strides ", tensor.strides(),
                   "); pass tensor.contiguous() and copy the result back");
    PARALLAX_CHECK(detail::is_supported_dtype(tensor.scalar_type()), UsageError, error_prefix(op), role, " has dtype ",
                   tensor.scalar_type(), "; supported: float32, float64, bfloat16, float16, int32, int64, uint8");
    PARALLAX_CHECK(tensor.numel() <= INT_MAX, UsageError, error_prefix(op), role, " has ", tensor.numel(),
                   " elements; one MPI operation moves at most ", INT_MAX, " (split it into buckets)");
  }

  void check_tag(CommOp op, int tag) const {
    int* upper = nullptr;
    int found = 0;
    MPI_Comm_get_attr(comm_, MPI_TAG_UB, &upper, &found);
    const int tag_ub = found && upper ? *upper : 32767;
    PARALLAX_CHECK(tag >= 0 && tag <= tag_ub, UsageError, error_prefix(op), "tag ", tag, " is out of range 0..",
                   tag_ub);
  }

  MPI_Comm comm_;
  std::string name_;
  std::string host_;
  int rank_ = 0;
  int size_ = 1;
  detail::MpiReduceOps ops_;
  std::unique_ptr<detail::MpiProgressEngine> engine_;
};

}  // namespace

std::unique_ptr<Communicator> create_mpi_world_communicator() {
  MPI_Comm comm = MPI_COMM_NULL;
  check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &comm), "MPI_Comm_dup(MPI_COMM_WORLD)");
  return std::make_unique<MpiCommunicator>(comm, "world", std::chrono::milliseconds(300'000));
}

void check_mpi(int code, const char* call) {
  if (code == MPI_SUCCESS) {
    return;
  }
  int rank = -1;
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  }
  throw CommError(
      detail::concat(call, " failed: ", detail::mpi_error_string(code), " (host ", host_name(), ", rank ", rank, ")"));
}

}  // namespace parallax
