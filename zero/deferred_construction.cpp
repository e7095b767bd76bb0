#include "parallax/zero/deferred_construction.h"

#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/StorageImpl.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/utils.h>

#include <atomic>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "parallax/core/error.h"
#include "parallax/zero/deferred_internal.h"

namespace parallax::zero {
namespace {

constexpr c10::DispatchKey kInterceptKey = c10::DispatchKey::TESTING_ONLY_GenericMode;

// One recorded write: the operator, its arguments, where in the storage its target
// view sat, and the generator state just before it ran.
struct Write {
  c10::OperatorHandle op;
  std::vector<c10::IValue> arguments;  // argument 0 is replaced at replay
  std::vector<std::int64_t> sizes, strides;
  std::int64_t storage_offset = 0;
  at::Tensor generator_state;
};

struct Record {
  // The factory's result, held weakly: a strong reference would make torch::empty's
  // make_variable copy the TensorImpl, and the parameter would not be this tensor.
  c10::weak_intrusive_ptr<c10::TensorImpl> tensor;
  c10::Storage storage;  // keeps the key of records_ from being reused
  Write factory;         // re-run, its result copied into the storage
  std::vector<Write> writes;
  bool live = true;
};

thread_local std::int64_t tls_min_elements = -1;  // >= 0 while constructing on this thread
// A top-level operator without tensor arguments, seen before it runs: if it returns a
// large enough tensor, that tensor is deferred with this as its factory.
thread_local std::unique_ptr<Write> tls_pending_factory;

bool has_tensor(const c10::IValue& value) {
  bool found = false;
  detail::for_each_tensor(value, [&found](const at::Tensor&) { found = true; });
  return found;
}

class DeferredTensors {
 public:
  static DeferredTensors& instance() {
    static DeferredTensors tensors;
    return tensors;
  }

  void after_factory(Write factory, const at::Tensor& result) {
    if (!result.defined() || result.numel() < tls_min_elements || !result.has_storage() || !result.is_contiguous() ||
        result.storage_offset() != 0) {
      return;
    }
    std::lock_guard<std::mutex> lock(mutex_);
    seal_current_locked();
    const c10::StorageImpl* storage = result.storage().unsafeGetStorageImpl();
    records_.erase(storage);
    records_.emplace(storage, Record{c10::weak_intrusive_ptr<c10::TensorImpl>(result.getIntrusivePtr()),
                                     result.storage(),
                                     std::move(factory),
                                     {},
                                     true});
    record_count_.store(records_.size(), std::memory_order_release);
    current_ = storage;
    add_live_locked(result.storage().nbytes());
  }

  // Before an operator: sealed arguments come back; a write into a deferred tensor is
  // recorded (while constructing) before it happens.
  void before(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
    const auto& schema = op.schema();
    const std::size_t count = schema.arguments().size();
    // Every operator of a stage-3 forward passes here: skip the lock when nothing is deferred.
    if (record_count_.load(std::memory_order_acquire) == 0) return;
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<const c10::StorageImpl*> touched;
    for (std::size_t i = stack.size() - count; i < stack.size(); ++i) collect(stack[i], touched);
    for (const c10::StorageImpl* storage : touched) ensure_live_locked(storage);
    if (tls_min_elements < 0 || touched.empty()) return;
    // A write: argument 0 marked (a!) whose storage is deferred.
    const auto* alias = schema.arguments().empty() ? nullptr : schema.arguments()[0].alias_info();
    const c10::IValue& target = stack[stack.size() - count];
    if (alias == nullptr || !alias->isWrite() || !target.isTensor()) return;
    const at::Tensor& tensor = target.toTensor();
    const auto found = records_.find(tensor.storage().unsafeGetStorageImpl());
    if (found == records_.end()) return;
    Write write{op,
                {},
                tensor.sizes().vec(),
                tensor.strides().vec(),
                tensor.storage_offset(),
                at::detail::getDefaultCPUGenerator().get_state()};
    for (std::size_t i = stack.size() - count + 1; i < stack.size(); ++i) {
      std::vector<const c10::StorageImpl*> other;
      collect(stack[i], other);
      PARALLAX_CHECK(other.empty(), UsageError, "deferred construction: ", schema.name(),
                     " writes into a deferred tensor from another deferred tensor; construct this model without "
                     "DeferredConstruction, or raise its min_elements above the tensors involved");
      write.arguments.push_back(stack[i]);
    }
    found->second.writes.push_back(std::move(write));
    if (current_ != found->first) {
      seal_current_locked();
      current_ = found->first;
    }
  }

  void seal_current() {
    std::lock_guard<std::mutex> lock(mutex_);
    seal_current_locked();
  }

  bool contains(const at::Tensor& tensor) {
    if (!tensor.defined() || !tensor.has_storage()) return false;
    std::lock_guard<std::mutex> lock(mutex_);
    return records_.count(tensor.storage().unsafeGetStorageImpl()) > 0;
  }

  void materialize(const at::Tensor& tensor) {
    if (!tensor.defined() || !tensor.has_storage()) return;
    std::lock_guard<std::mutex> lock(mutex_);
    const auto found = records_.find(tensor.storage().unsafeGetStorageImpl());
    if (found == records_.end()) return;
    ensure_live_locked(found->first);
    if (current_ == found->first) current_ = nullptr;
    live_bytes_ -= static_cast<std::int64_t>(tensor.storage().nbytes());
    records_.erase(found);
    record_count_.store(records_.size(), std::memory_order_release);
  }

  std::int64_t live_bytes() {
    std::lock_guard<std::mutex> lock(mutex_);
    return live_bytes_;
  }
  std::int64_t peak_live_bytes() {
    std::lock_guard<std::mutex> lock(mutex_);
    return peak_live_bytes_;
  }
  void reset_peak() {
    std::lock_guard<std::mutex> lock(mutex_);
    peak_live_bytes_ = live_bytes_;
  }

 private:
  void collect(const c10::IValue& value, std::vector<const c10::StorageImpl*>& out) const {
    detail::for_each_tensor(value, [&](const at::Tensor& tensor) {
      if (!tensor.has_storage()) return;
      const c10::StorageImpl* storage = tensor.storage().unsafeGetStorageImpl();
      if (records_.count(storage)) out.push_back(storage);
    });
  }

  void add_live_locked(std::size_t bytes) {
    live_bytes_ += static_cast<std::int64_t>(bytes);
    peak_live_bytes_ = std::max(peak_live_bytes_, live_bytes_);
  }

  // Frees the current tensor's data. Only parameters are sealed: a tensor that does not
  // require grad may have been filled through data_ptr() (torch::tensor does), which no
  // record can replay, so it stays an ordinary tensor and its record is dropped.
  void seal_current_locked() {
    if (current_ == nullptr) return;
    const auto found = records_.find(current_);
    current_ = nullptr;
    Record& record = found->second;
    if (!record.live) return;
    c10::StorageImpl* storage = record.storage.unsafeGetStorageImpl();
    live_bytes_ -= static_cast<std::int64_t>(storage->nbytes());
    const auto tensor = record.tensor.lock();
    if (!tensor || !at::Tensor(tensor).requires_grad()) {
      records_.erase(found);
      record_count_.store(records_.size(), std::memory_order_release);
      return;
    }
    storage->set_data_ptr_noswap(at::DataPtr(nullptr, record.storage.device()));
    record.live = false;
  }

  // Allocates a sealed record's storage in place and replays its writes with the
  // generator states they saw; the generator is left as it was.
  void ensure_live_locked(const c10::StorageImpl* key) {
    Record& record = records_.at(key);
    if (record.live) return;
    c10::impl::ExcludeDispatchKeyGuard no_intercept(kInterceptKey);
    torch::NoGradGuard no_grad;
    const auto strong = record.tensor.lock();
    PARALLAX_CHECK(strong, UsageError, "deferred construction: a view outlived the parameter it was taken from");
    const at::Tensor base(strong);
    c10::StorageImpl* storage = record.storage.unsafeGetStorageImpl();
    storage->set_data_ptr_noswap(storage->allocator()->allocate(storage->nbytes()));
    add_live_locked(storage->nbytes());
    record.live = true;
    at::Generator generator = at::detail::getDefaultCPUGenerator();
    const at::Tensor saved = generator.get_state();
    {
      generator.set_state(record.factory.generator_state);
      torch::jit::Stack stack(record.factory.arguments);
      record.factory.op.callBoxed(&stack);
      base.copy_(stack.back().toTensor());
    }
    for (const Write& write : record.writes) {
      generator.set_state(write.generator_state);
      torch::jit::Stack stack;
      stack.emplace_back(base.as_strided(write.sizes, write.strides, write.storage_offset));
      for (const c10::IValue& argument : write.arguments) stack.push_back(argument);
      write.op.callBoxed(&stack);
    }
    generator.set_state(saved);
    // A model that keeps reading a sealed tensor keeps it live: it is the current one.
    if (current_ != key) {
      seal_current_locked();
      if (tls_min_elements >= 0) current_ = key;
    }
  }

  std::mutex mutex_;
  std::unordered_map<const c10::StorageImpl*, Record> records_;
  std::atomic<std::size_t> record_count_{0};  ///< records_.size(), readable without the lock
  const c10::StorageImpl* current_ = nullptr;
  std::int64_t live_bytes_ = 0;
  std::int64_t peak_live_bytes_ = 0;
};

}  // namespace

struct DeferredConstruction::Guard {
  c10::impl::IncludeDispatchKeyGuard include{kInterceptKey};
  std::int64_t previous_min = tls_min_elements;
};

DeferredConstruction::DeferredConstruction(std::int64_t min_elements) : guard_(std::make_unique<Guard>()) {
  PARALLAX_CHECK(min_elements >= 1, UsageError, "DeferredConstruction: min_elements must be >= 1, got ", min_elements);
  tls_min_elements = min_elements;
}

DeferredConstruction::~DeferredConstruction() {
  DeferredTensors::instance().seal_current();
  tls_min_elements = guard_->previous_min;
}

bool is_deferred(const torch::Tensor& tensor) {
  return DeferredTensors::instance().contains(tensor);
}
void materialize(const torch::Tensor& tensor) {
  DeferredTensors::instance().materialize(tensor);
}
std::int64_t deferred_live_bytes() {
  return DeferredTensors::instance().live_bytes();
}
std::int64_t deferred_peak_live_bytes() {
  return DeferredTensors::instance().peak_live_bytes();
}
void reset_deferred_peak_live_bytes() {
  DeferredTensors::instance().reset_peak();
}

namespace detail {

void before_operator(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  DeferredTensors::instance().before(op, stack);
  tls_pending_factory.reset();
  if (tls_min_elements < 0) return;
  const std::size_t count = op.schema().arguments().size();
  for (std::size_t i = stack.size() - count; i < stack.size(); ++i) {
    if (has_tensor(stack[i])) return;
  }
  tls_pending_factory = std::make_unique<Write>(Write{op,
                                                      std::vector<c10::IValue>(stack.end() - count, stack.end()),
                                                      {},
                                                      {},
                                                      0,
                                                      at::detail::getDefaultCPUGenerator().get_state()});
}

void after_operator(const c10::OperatorHandle& /*op*/, const torch::jit::Stack& stack) {
  if (!tls_pending_factory) return;
  std::unique_ptr<Write> factory = std::move(tls_pending_factory);
  if (stack.empty() || !stack.back().isTensor()) return;
  DeferredTensors::instance().after_factory(std::move(*factory), stack.back().toTensor());
}

bool constructing() {
  return tls_min_elements >= 0;
}

}  // namespace detail
}  // namespace parallax::zero
