// One rank's file of the NVMe tier: a fixed-size scratch file read and written at byte
// offsets, synchronously or on the file's own I/O thread.
//
// Life: created with mkstemp under the directory and unlinked at once, so the name is
// gone before any data is written. The kernel frees the space when the descriptor
// closes — on destruction, on an exception, and on a crash or a kill — so no exit
// leaves a file behind. The whole size is reserved up front (posix_fallocate), so a
// drive without room fails at start, naming it, rather than in the middle of a step.
//
// Asynchronous I/O: one background thread runs submitted reads and writes strictly in
// submission order (FIFO). A read submitted after a write to the same bytes or into
// the same host buffer therefore sees the write done; the optimizer's double
// buffering relies on it. The host buffer of a pending operation must stay alive and
// untouched until its future is ready.
//
//   SwapFile file("/local/nvme", bytes, "rank 3");
//   auto pending = file.write_async(0, buffer, n);   ...   pending.get();  // rethrows I/O errors
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <string>
#include <thread>

namespace parallax::offload {

class SwapFile {
 public:
  /// Creates and reserves a `bytes`-byte file under `directory`. Throws ConfigError
  /// naming offload.nvme_path, `owner` (e.g. "rank 3 on node7") and the system's
  /// reason when the directory cannot take it (missing, not writable, full).
  SwapFile(const std::string& directory, std::int64_t bytes, const std::string& owner);
  SwapFile(const SwapFile&) = delete;
  SwapFile& operator=(const SwapFile&) = delete;
  /// Waits for pending operations (never throws), then closes: the space is freed.
  ~SwapFile();

  std::int64_t size() const { return bytes_; }
  /// The name the file had (it no longer has one), for messages.
  const std::string& path() const { return path_; }

  /// Blocking. Throws OffloadError naming the file, offset and reason.
  void read(std::int64_t offset, void* destination, std::int64_t bytes) const;
  void write(std::int64_t offset, const void* source, std::int64_t bytes);

  /// Queued on the I/O thread; the future rethrows the operation's OffloadError.
  std::future<void> read_async(std::int64_t offset, void* destination, std::int64_t bytes);
  std::future<void> write_async(std::int64_t offset, const void* source, std::int64_t bytes);

  /// Bytes moved so far (completed operations).
  std::int64_t bytes_read() const { return bytes_read_; }
  std::int64_t bytes_written() const { return bytes_written_; }

 private:
  std::future<void> submit(std::function<void()> operation);
  void run_io_thread();

  std::string path_;
  std::int64_t bytes_ = 0;
  int fd_ = -1;
  mutable std::atomic<std::int64_t> bytes_read_{0};
  std::atomic<std::int64_t> bytes_written_{0};

  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::packaged_task<void()>> queue_;
  bool stopping_ = false;
  std::thread io_thread_;
};

}  // namespace parallax::offload
