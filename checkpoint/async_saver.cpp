#include "parallax/checkpoint/async_saver.h"

#include <cstdio>
#include <utility>

#include "parallax/core/error.h"

namespace parallax::checkpoint {

SaveRequest snapshot(SaveRequest request) {
  for (Piece& piece : request.pieces) {
    piece.values = piece.values.detach().to(torch::kCPU, /*non_blocking=*/false, /*copy=*/true).contiguous();
  }
  return request;
}

AsyncSaver::AsyncSaver(std::unique_ptr<Communicator> comm) : comm_(std::move(comm)) {}

AsyncSaver::~AsyncSaver() {
  try {
    wait();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%scheckpoint: the last asynchronous save failed: %s\n", rank_prefix().c_str(), e.what());
  }
}

std::optional<SaveResult> AsyncSaver::start(SaveRequest request) {
  std::optional<SaveResult> previous = wait();
  thread_ = std::thread([this, request = std::move(request)] {
    try {
      result_ = save(*comm_, request);
    } catch (const Error& e) {
      error_ = e.detail();
    } catch (const std::exception& e) {
      error_ = e.what();
    }
  });
  return previous;
}

std::optional<SaveResult> AsyncSaver::wait() {
  if (thread_.joinable()) thread_.join();
  if (!error_.empty()) {
    const std::string error = std::move(error_);
    error_.clear();
    result_.reset();
    throw CheckpointError(error);
  }
  std::optional<SaveResult> result = std::move(result_);
  result_.reset();
  return result;
}

}  // namespace parallax::checkpoint
