// Saving in the background (checkpoint.async = true): at the step boundary the pieces
// are copied into host memory (a snapshot training may overwrite the originals of at
// once), and one thread per saver writes and publishes them with save() over a
// communicator of its own, while training goes on. One save at a time: the next start()
// first waits for the previous save, and rethrows its error.
//
//   AsyncSaver saver(world.split(0, world.rank(), "checkpoint"));
//   saver.start(snapshot(std::move(request)));   // returns once the copy is taken
//   ...                                          // training
//   std::optional<SaveResult> done = saver.wait();  // e.g. before the process ends
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "parallax/checkpoint/store.h"

namespace parallax::checkpoint {

/// `request` with every piece's values copied to host memory.
SaveRequest snapshot(SaveRequest request);

class AsyncSaver {
 public:
  /// `comm`: a communicator over the same ranks as the training world that only this
  /// saver uses (its collectives run on the saver's thread, beside training's).
  explicit AsyncSaver(std::unique_ptr<Communicator> comm);
  /// Waits for a save in flight; an error it ended with is printed, not thrown.
  ~AsyncSaver();
  AsyncSaver(const AsyncSaver&) = delete;
  AsyncSaver& operator=(const AsyncSaver&) = delete;

  /// Waits for the previous save (rethrowing its CheckpointError), then starts writing
  /// `request`, whose values must be a snapshot nobody writes to; returns the previous
  /// save's result, if any. Collective: every rank starts the same saves in the same order.
  std::optional<SaveResult> start(SaveRequest request);
  /// Waits for the save in flight and returns its result (nothing when none was
  /// started since the last wait); rethrows its error.
  std::optional<SaveResult> wait();

 private:
  std::unique_ptr<Communicator> comm_;
  std::thread thread_;
  std::optional<SaveResult> result_;
  std::string error_;
};

}  // namespace parallax::checkpoint
