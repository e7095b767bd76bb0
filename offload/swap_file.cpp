#include "parallax/offload/swap_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "parallax/core/error.h"

namespace parallax::offload {
namespace {

std::string system_reason(int error) {
  return std::strerror(error);
}

// Repeats `call(done)` (a pread or pwrite of the rest, from `done` bytes on) until
// `bytes` have moved; an interrupted call is retried.
template <typename Call>
void move_all(const char* verb, std::int64_t offset, std::int64_t bytes, const std::string& path, Call call) {
  std::int64_t done = 0;
  while (done < bytes) {
    const ssize_t moved = call(done);
    if (moved < 0 && errno == EINTR) continue;
    PARALLAX_CHECK(moved > 0, OffloadError, verb, " ", bytes, " bytes at offset ", offset, " of the NVMe tier's file ",
                   path, " (deleted) failed: ", moved == 0 ? std::string("no progress") : system_reason(errno));
    done += moved;
  }
}

}  // namespace

SwapFile::SwapFile(const std::string& directory, std::int64_t bytes, const std::string& owner) : bytes_(bytes) {
  PARALLAX_CHECK(bytes > 0, UsageError, "a swap file needs a positive size, got ", bytes);
  std::string name = directory + (directory.empty() || directory.back() == '/' ? "" : "/") + "parallax-swap-XXXXXX";
  std::vector<char> buffer(name.begin(), name.end());
  buffer.push_back('\0');
  fd_ = ::mkstemp(buffer.data());
  PARALLAX_CHECK(fd_ >= 0, ConfigError, "offload.nvme_path = \"", directory, "\": ", owner,
                 " cannot create the NVMe tier's file there: ", system_reason(errno),
                 "; name an existing, writable directory on a local drive of every node");
  path_ = buffer.data();
  ::unlink(path_.c_str());  // nameless from now on: closing the descriptor frees it
  const int reserved = ::posix_fallocate(fd_, 0, bytes_);
  if (reserved != 0) {
    ::close(fd_);
    throw ConfigError(detail::concat("offload.nvme_path = \"", directory, "\": ", owner, " cannot reserve ", bytes_,
                                     " bytes for the NVMe tier's file: ", system_reason(reserved)));
  }
  io_thread_ = std::thread([this] { run_io_thread(); });
}

SwapFile::~SwapFile() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  io_thread_.join();  // drains the queue first: no buffer is written after its owner left
  ::close(fd_);
}

void SwapFile::read(std::int64_t offset, void* destination, std::int64_t bytes) const {
  PARALLAX_ASSERT(offset >= 0 && bytes >= 0 && offset + bytes <= bytes_, "swap file read out of range");
  char* out = static_cast<char*>(destination);
  move_all("reading", offset, bytes, path_, [&](std::int64_t done) {
    return ::pread(fd_, out + done, static_cast<std::size_t>(bytes - done), offset + done);
  });
  bytes_read_ += bytes;
}

void SwapFile::write(std::int64_t offset, const void* source, std::int64_t bytes) {
  PARALLAX_ASSERT(offset >= 0 && bytes >= 0 && offset + bytes <= bytes_, "swap file write out of range");
  const char* in = static_cast<const char*>(source);
  move_all("writing", offset, bytes, path_, [&](std::int64_t done) {
    return ::pwrite(fd_, in + done, static_cast<std::size_t>(bytes - done), offset + done);
  });
  bytes_written_ += bytes;
}

std::future<void> SwapFile::read_async(std::int64_t offset, void* destination, std::int64_t bytes) {
  return submit([this, offset, destination, bytes] { read(offset, destination, bytes); });
}

std::future<void> SwapFile::write_async(std::int64_t offset, const void* source, std::int64_t bytes) {
  return submit([this, offset, source, bytes] { write(offset, source, bytes); });
}

std::future<void> SwapFile::submit(std::function<void()> operation) {
  std::packaged_task<void()> task(std::move(operation));
  std::future<void> done = task.get_future();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(std::move(task));
  }
  wake_.notify_one();
  return done;
}

void SwapFile::run_io_thread() {
  for (;;) {
    std::packaged_task<void()> task;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and everything submitted has run
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();  // an exception is stored in the task's future
  }
}

}  // namespace parallax::offload
