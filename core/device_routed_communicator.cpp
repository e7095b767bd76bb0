#include "parallax/core/device_routed_communicator.h"

#include <string>

#include "parallax/core/error.h"

namespace parallax {
namespace {

class DeviceRoutedCommunicator final : public Communicator {
 public:
  DeviceRoutedCommunicator(std::unique_ptr<Communicator> host, std::unique_ptr<Communicator> cuda)
      : host_(std::move(host)), cuda_(std::move(cuda)) {
    PARALLAX_CHECK(host_ && cuda_, UsageError, "route_by_device needs both communicators");
    PARALLAX_CHECK(host_->size() == cuda_->size() && host_->rank() == cuda_->rank(), UsageError,
                   "route_by_device: group '", host_->name(), "' has rank ", host_->rank(), " of ", host_->size(),
                   " but '", cuda_->name(), "' rank ", cuda_->rank(), " of ", cuda_->size());
    backend_ = std::string(host_->backend()) + "+" + cuda_->backend();
    set_default_timeout(host_->default_timeout());
  }

  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  const std::string& name() const override { return host_->name(); }
  const char* backend() const override { return backend_.c_str(); }

  WorkPtr all_reduce(at::Tensor& tensor, const CollectiveOptions& options) override {
    return of(tensor).all_reduce(tensor, with_timeout(options));
  }
  WorkPtr reduce_scatter(at::Tensor& output, const at::Tensor& input, const CollectiveOptions& options) override {
    return of(input).reduce_scatter(output, input, with_timeout(options));
  }
  WorkPtr all_gather(at::Tensor& output, const at::Tensor& input, const CollectiveOptions& options) override {
    return of(input).all_gather(output, input, with_timeout(options));
  }
  WorkPtr broadcast(at::Tensor& tensor, int root, const CollectiveOptions& options) override {
    return of(tensor).broadcast(tensor, root, with_timeout(options));
  }
  WorkPtr send(const at::Tensor& tensor, int dst, int tag, const CollectiveOptions& options) override {
    return of(tensor).send(tensor, dst, tag, with_timeout(options));
  }
  WorkPtr recv(at::Tensor& tensor, int src, int tag, const CollectiveOptions& options) override {
    return of(tensor).recv(tensor, src, tag, with_timeout(options));
  }
  WorkPtr all_to_all(at::Tensor& output,
                     const std::vector<std::int64_t>& output_rows,
                     const at::Tensor& input,
                     const std::vector<std::int64_t>& input_rows,
                     const CollectiveOptions& options) override {
    return of(input).all_to_all(output, output_rows, input, input_rows, with_timeout(options));
  }
  WorkPtr barrier(const CollectiveOptions& options) override {
    host_->set_step(step());
    return host_->barrier(with_timeout(options));
  }

  std::unique_ptr<Communicator> split(int color, int key, const std::string& name) override {
    auto host = host_->split(color, key, name);
    auto cuda = cuda_->split(color, key, name);
    auto routed = std::make_unique<DeviceRoutedCommunicator>(std::move(host), std::move(cuda));
    routed->set_default_timeout(default_timeout());
    return routed;
  }

  void set_member_nodes(std::vector<int> nodes) override {
    host_->set_member_nodes(nodes);
    cuda_->set_member_nodes(nodes);
    Communicator::set_member_nodes(std::move(nodes));
  }

  CommCounters counters() const override {
    CommCounters total = host_->counters();
    total += cuda_->counters();
    return total;
  }

 private:
  // The backend for `tensor`, told the step that its error messages name.
  Communicator& of(const at::Tensor& tensor) {
    Communicator& chosen = tensor.is_cuda() ? *cuda_ : *host_;
    chosen.set_step(step());
    return chosen;
  }
  // The routed group's default timeout applies to both backends.
  CollectiveOptions with_timeout(const CollectiveOptions& options) const {
    CollectiveOptions own = options;
    own.timeout = timeout_for(options);
    return own;
  }

  std::unique_ptr<Communicator> host_;
  std::unique_ptr<Communicator> cuda_;
  std::string backend_;
};

}  // namespace

std::unique_ptr<Communicator> route_by_device(std::unique_ptr<Communicator> host, std::unique_ptr<Communicator> cuda) {
  return std::make_unique<DeviceRoutedCommunicator>(std::move(host), std::move(cuda));
}

}  // namespace parallax
