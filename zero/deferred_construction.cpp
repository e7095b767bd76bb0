#include "parallax/zero/deferred_construction.h"

#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/StorageImpl.h>
#include <torch/utils.h>

#include <algorithm>
#include <vector>

#include "parallax/core/error.h"
#include "parallax/core/operator_interception.h"
#include "parallax/zero/deferred_internal.h"
#include "parallax/zero/parameter_interception.h"

namespace parallax::zero {
namespace {

constexpr interception::Layer kLayer = interception::Layer::kParameters;

// One recorded write: the operator, its arguments, where in the storage its target
// view sat, and the generator state just before it ran.
struct Write {
  c10::OperatorHandle op;
  std::vector<c10::IValue> arguments;  // argument 0 is replaced at replay
  std::vector<std::int64_t> sizes, strides;
  std::int64_t storage_offset = 0;
  at::Tensor generator_state;
};

// A deferred tensor's record. It is owned by the tensor's storage: the storage's DataPtr
// has the record as its context and delete_record as its deleter, so the storage says
// by itself whether it is deferred, and the record goes when the storage goes. Its data
// pointer is the record's own allocation while live and null while sealed.
struct Record {
  Record(const at::Tensor& result, Write factory, std::shared_ptr<DeferredBytes> bytes)
      : tensor(result.getIntrusivePtr()),
        storage(result.storage().unsafeGetStorageImpl()),
        factory(std::move(factory)),
        nbytes(static_cast<std::int64_t>(storage->nbytes())),
        bytes(std::move(bytes)) {}

  // The factory's result, held weakly: a strong reference would make torch::empty's
  // make_variable copy the TensorImpl, and the parameter would not be this tensor.
  c10::weak_intrusive_ptr<c10::TensorImpl> tensor;
  c10::StorageImpl* storage = nullptr;  ///< the owner
  at::DataPtr data;                     ///< the allocation; empty while sealed
  Write factory;                        ///< re-run, its result copied into the storage
  std::vector<Write> writes;
  std::int64_t nbytes = 0;  ///< the storage's
  std::shared_ptr<DeferredBytes> bytes;
  std::mutex mutex;  ///< guards data and writes

  bool live() const { return data.get() != nullptr; }
};

// One open DeferredConstruction on this thread: what it defers, and the tensor being
// written (the only live one; the previous is sealed when another one starts).
struct Construction {
  std::int64_t min_elements = 0;
  Record* current = nullptr;
  std::shared_ptr<DeferredBytes> bytes = std::make_shared<DeferredBytes>();
  Construction* enclosing = nullptr;
};

thread_local Construction* tls_construction = nullptr;
// A top-level operator without tensor arguments, seen before it runs: if it returns a
// large enough tensor, that tensor is deferred with this as its factory.
thread_local std::unique_ptr<Write> tls_pending_factory;

void delete_record(void* context) {
  auto* record = static_cast<Record*>(context);
  for (Construction* c = tls_construction; c != nullptr; c = c->enclosing) {
    if (c->current == record) c->current = nullptr;
  }
  if (record->live()) record->bytes->add(-record->nbytes);
  delete record;
}

Record* record_of(const at::Tensor& tensor) {
  if (!tensor.defined() || !tensor.has_storage()) return nullptr;
  const at::DataPtr& pointer =
      static_cast<const c10::StorageImpl*>(tensor.storage().unsafeGetStorageImpl())->data_ptr();
  return pointer.get_deleter() == &delete_record ? static_cast<Record*>(pointer.get_context()) : nullptr;
}

// Points the record's storage at `data` (null: sealed), the record staying its context.
void retag(Record& record, void* data) {
  at::DataPtr previous =
      record.storage->set_data_ptr(at::DataPtr(data, &record, &delete_record, record.storage->device()));
  (void)previous.release_context();  // the same record: it must not be deleted
}

// Gives the storage back its allocation, untagged; deletes the record.
void forget(Record& record) {
  at::DataPtr allocation = std::move(record.data);
  record.data = at::DataPtr();  // a moved-from DataPtr may still report its pointer
  at::DataPtr tag = record.storage->set_data_ptr(std::move(allocation));
  // `tag` goes out of scope here: its deleter deletes the record.
}

bool holds_deferred(const c10::IValue& value) {
  bool found = false;
  detail::for_each_tensor(value, [&found](const at::Tensor& tensor) { found = found || record_of(tensor) != nullptr; });
  return found;
}

// Frees the data of the construction's current tensor. Only parameters are sealed: a
// tensor that does not require grad may have been filled through data_ptr()
// (torch::tensor does), which no record can replay, so it stays an ordinary tensor.
void seal_current(Construction& c) {
  Record* record = c.current;
  if (record == nullptr) return;
  c.current = nullptr;
  bool replayable = false;
  {
    std::lock_guard<std::mutex> lock(record->mutex);
    if (!record->live()) return;
    const auto tensor = record->tensor.lock();
    replayable = tensor && at::Tensor(tensor).requires_grad();
    record->bytes->add(-record->nbytes);
    if (replayable) {
      retag(*record, nullptr);
      record->data = at::DataPtr();
    }
  }
  if (!replayable) forget(*record);  // the record goes with its tag: not under its lock
}

// Allocates a sealed record's storage in place and replays its writes with the
// generator states they saw; the generator is left as it was.
void ensure_live(Record& record) {
  {
    std::lock_guard<std::mutex> lock(record.mutex);
    if (record.live()) return;
    interception::Paused paused(kLayer);
    torch::NoGradGuard no_grad;
    const auto strong = record.tensor.lock();
    PARALLAX_CHECK(strong, UsageError, "deferred construction: a view outlived the parameter it was taken from");
    const at::Tensor base(strong);
    record.data = record.storage->allocator()->allocate(record.storage->nbytes());
    retag(record, record.data.get());
    record.bytes->add(record.nbytes);
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
  }
  // A construction that keeps reading a sealed tensor keeps it live: it is the current one.
  if (Construction* c = tls_construction; c != nullptr && c->current != &record) {
    seal_current(*c);
    c->current = &record;
  }
}

// A write by `op` into a deferred tensor (argument 0 marked (a!)) while constructing is
// recorded before it happens.
void record_write(Construction& c, const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  const auto& schema = op.schema();
  const std::size_t count = schema.arguments().size();
  const auto* alias = schema.arguments().empty() ? nullptr : schema.arguments()[0].alias_info();
  const c10::IValue& target = stack[stack.size() - count];
  if (alias == nullptr || !alias->isWrite() || !target.isTensor()) return;
  const at::Tensor& tensor = target.toTensor();
  Record* record = record_of(tensor);
  if (record == nullptr) return;
  Write write{op,
              {},
              tensor.sizes().vec(),
              tensor.strides().vec(),
              tensor.storage_offset(),
              at::detail::getDefaultCPUGenerator().get_state()};
  for (std::size_t i = stack.size() - count + 1; i < stack.size(); ++i) {
    PARALLAX_CHECK(!holds_deferred(stack[i]), UsageError, "deferred construction: ", schema.name(),
                   " writes into a deferred tensor from another deferred tensor; construct this model without "
                   "DeferredConstruction, or raise its min_elements above the tensors involved");
    write.arguments.push_back(stack[i]);
  }
  {
    std::lock_guard<std::mutex> lock(record->mutex);
    record->writes.push_back(std::move(write));
  }
  if (c.current != record) {
    seal_current(c);
    c.current = record;
  }
}

void defer(Construction& c, Write factory, const at::Tensor& result) {
  if (!result.defined() || result.numel() < c.min_elements || !result.has_storage() || !result.is_contiguous() ||
      result.storage_offset() != 0 || record_of(result) != nullptr) {
    return;
  }
  seal_current(c);
  auto* record = new Record(result, std::move(factory), c.bytes);
  void* data = record->storage->data_ptr().get();
  record->data = record->storage->set_data_ptr(at::DataPtr(data, record, &delete_record, record->storage->device()));
  record->bytes->add(record->nbytes);
  c.current = record;
}

}  // namespace

std::int64_t DeferredBytes::live() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return live_;
}
std::int64_t DeferredBytes::peak() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return peak_;
}
void DeferredBytes::add(std::int64_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  live_ += bytes;
  peak_ = std::max(peak_, live_);
}

struct DeferredConstruction::Open {
  Construction construction;
  std::unique_ptr<interception::Scope> scope;  ///< includes the key; lends no state
};

DeferredConstruction::DeferredConstruction(std::int64_t min_elements) : open_(std::make_unique<Open>()) {
  PARALLAX_CHECK(min_elements >= 1, UsageError, "DeferredConstruction: min_elements must be >= 1, got ", min_elements);
  claim_parameter_interception();
  open_->construction.min_elements = min_elements;
  open_->construction.enclosing = tls_construction;
  open_->scope = std::make_unique<interception::Scope>(kLayer, nullptr);
  tls_construction = &open_->construction;
}

DeferredConstruction::~DeferredConstruction() {
  seal_current(open_->construction);
  tls_construction = open_->construction.enclosing;
}

std::shared_ptr<const DeferredBytes> DeferredConstruction::bytes() const {
  return open_->construction.bytes;
}

bool is_deferred(const torch::Tensor& tensor) {
  return record_of(tensor) != nullptr;
}

void materialize(const torch::Tensor& tensor) {
  Record* record = record_of(tensor);
  if (record == nullptr) return;
  ensure_live(*record);
  for (Construction* c = tls_construction; c != nullptr; c = c->enclosing) {
    if (c->current == record) c->current = nullptr;
  }
  record->bytes->add(-record->nbytes);
  forget(*record);  // the storage keeps the data; the record is gone
}

namespace detail {

void before_operator(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  const std::size_t count = op.schema().arguments().size();
  bool any_tensor = false;
  for (std::size_t i = stack.size() - count; i < stack.size(); ++i) {
    detail::for_each_tensor(stack[i], [&any_tensor](const at::Tensor& tensor) {
      any_tensor = true;
      if (Record* record = record_of(tensor)) ensure_live(*record);
    });
  }
  tls_pending_factory.reset();
  Construction* c = tls_construction;
  if (c == nullptr) return;
  if (any_tensor) {
    record_write(*c, op, stack);
    return;
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
  if (tls_construction == nullptr || stack.empty() || !stack.back().isTensor()) return;
  defer(*tls_construction, std::move(*factory), stack.back().toTensor());
}

bool constructing() {
  return tls_construction != nullptr;
}

}  // namespace detail
}  // namespace parallax::zero
