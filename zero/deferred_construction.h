// Builds a model without ever holding all of its parameters: the stage-3 answer to
// "the model does not fit on one rank".
//
// While a DeferredConstruction scope is alive on a thread, every tensor of at least
// `min_elements` that a factory operator called by the constructor creates (an
// operator with no tensor arguments: empty, zeros, randn... what Linear, Embedding and
// LayerNorm allocate with) is *deferred*: the factory call and each operator the
// constructor calls that writes into the tensor (uniform_, normal_, fill_, copy_, also
// through a view) are recorded with the CPU generator's state just before them. When
// the next such tensor is created the previous one is *sealed* if it is a parameter
// (requires grad): its memory is freed in place, its shape and identity stay. So
// construction holds at most two parameters' data at a time, and the global generator
// advances exactly as in an eager construction: a model built this way and one built
// eagerly from the same seed materialize to identical values.
//
// A sealed tensor is materialized (its storage allocated in place and its record
// replayed with the generator states restored) by materialize(), or when an operator
// uses it while a ParameterUseScope or DeferredConstruction is open on the thread. ZeRO
// stage 3 materializes one parameter at a time into its unit's flat buffer, keeps the
// shard and frees the rest; stages 0–2 materialize everything.
//
//   std::shared_ptr<GPTImpl> model;
//   { parallax::zero::DeferredConstruction deferred;  model = GPT(options).ptr(); }
//   auto engine = rt.engine(model, spec);    // zero.stage = 3: sharded unit by unit
//
// Requirements: construct on the CPU (the CPU generator is what is recorded), with the
// same seed on every rank (parallax::init seeds all ranks alike; deferred parameters
// are not broadcast). Construction code may read deferred values (each read brings the
// tensor back); a write whose other operands are deferred too is rejected with
// UsageError. A parameter filled through data_ptr() instead of operators (a large
// torch::tensor({...}) literal) cannot be replayed: raise `min_elements` above it.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <mutex>

namespace parallax::zero {

/// Bytes held by the data of one construction's deferred tensors: now, and the most
/// at once, counted from the construction's start until every tensor it deferred is
/// materialized or destroyed. Thread-safe.
class DeferredBytes {
 public:
  std::int64_t live() const;
  std::int64_t peak() const;
  /// Adds (or, negative, removes) held bytes. Internal to deferred construction.
  void add(std::int64_t bytes);

 private:
  mutable std::mutex mutex_;
  std::int64_t live_ = 0;
  std::int64_t peak_ = 0;
};

class DeferredConstruction {
 public:
  /// Tensors smaller than `min_elements` are created normally (biases, small tables).
  /// Throws UsageError when another library holds the interception's dispatch key.
  explicit DeferredConstruction(std::int64_t min_elements = 4096);
  DeferredConstruction(const DeferredConstruction&) = delete;
  DeferredConstruction& operator=(const DeferredConstruction&) = delete;
  /// Seals the last deferred tensor.
  ~DeferredConstruction();

  /// This construction's byte count; it stays valid, and counting, after the scope ends.
  std::shared_ptr<const DeferredBytes> bytes() const;

 private:
  struct Open;
  std::unique_ptr<Open> open_;
};

/// True while `tensor`'s storage is deferred (sealed or materialized but not forgotten).
/// A deferred tensor's record lives in its storage: it goes when the storage goes.
bool is_deferred(const torch::Tensor& tensor);
/// Allocates `tensor`'s storage in place and replays its recorded writes, then forgets
/// the record: the tensor is an ordinary tensor afterwards. No-op for other tensors.
void materialize(const torch::Tensor& tensor);

}  // namespace parallax::zero
