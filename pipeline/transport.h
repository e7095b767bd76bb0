// Activations and gradients between pipeline stages, over the pipeline communicator.
//
// Protocol for one transfer on a stream (activations or gradients from one stage to
// another), all messages on the stream's tag, so MPI's non-overtaking order keeps them
// in sequence:
//  1. a header: one int64, the byte length of a new TransferMeta (proto/pipeline.proto),
//     or 0 when the shapes, dtypes and flags are those of the stream's previous transfer;
//  2. only when the header is not 0: the serialized TransferMeta (uint8);
//  3. one message per defined tensor, contiguous, in order.
// So the shapes travel once per change, and a receiver allocates exactly what arrives.
// Sends are non-blocking (the tensors are kept until wait_sends()); receives block, each
// bounded by the communicator's timeout.
//
//   Transport transport(mesh.pp());
//   transport.send(output, /*peer=*/stage + 1, Stream::kActivation);
//   auto input = transport.recv(/*peer=*/stage - 1, Stream::kActivation);
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "parallax/core/communicator.h"
#include "parallax/pipeline/layers.h"
#include "parallax/pipeline/transfer_meta.h"

namespace parallax::pipeline {

enum class Stream { kActivation = 1, kGradient = 2 };

class Transport {
 public:
  /// `comm` is the pipeline group (ranks are stages); it must outlive this object.
  explicit Transport(Communicator& comm);
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;
  ~Transport();

  /// Starts sending `value` (undefined tensors allowed: they send nothing) to `peer`.
  /// Does not block. Throws CommError if a send cannot start.
  void send(const Activation& value, int peer, Stream stream);
  /// The next transfer from `peer` on `stream`. Activations: floating-point tensors sent
  /// as requiring grad arrive as leaves that require grad. Blocks; throws CommError on
  /// timeout or failure.
  Activation recv(int peer, Stream stream);
  /// Waits for every send started so far. Throws CommError on failure.
  void wait_sends();

  /// TransferMeta messages sent so far (each is one change of shapes on a stream).
  std::int64_t meta_messages_sent() const { return meta_sent_; }

 private:
  Communicator& comm_;
  std::map<std::pair<int, Stream>, std::string> sent_meta_;              // last meta sent, serialized
  std::map<std::pair<int, Stream>, std::vector<detail::WireTensor>> received_meta_;  // last shapes received
  std::vector<std::pair<WorkPtr, std::vector<torch::Tensor>>> pending_;  // sends and what they read
  std::int64_t meta_sent_ = 0;
};

}  // namespace parallax::pipeline
