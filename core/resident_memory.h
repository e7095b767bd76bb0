// The process's resident memory (RSS) as Linux reports it: now, and its peak since the
// peak was last reset. The figure GNU time's %M and the kernel's OOM killer see; it
// includes what LibTorch's allocator holds, the allocator's caching, MPI's buffers and
// the program itself.
//
//   reset_resident_peak();                       // at a step's start
//   ... the step ...
//   std::int64_t peak = resident_peak_bytes();   // its peak RSS
#pragma once

#include <cstdint>

namespace parallax {

/// Bytes resident now (VmRSS of /proc/self/status); -1 where it cannot be read.
std::int64_t resident_bytes();
/// The most bytes resident since the process started or reset_resident_peak() (VmHWM);
/// -1 where it cannot be read.
std::int64_t resident_peak_bytes();
/// Makes the peak the bytes resident now (writes 5 to /proc/self/clear_refs, Linux 4.0
/// and later). Returns false where the kernel refuses it: the peak then stays the
/// process's since it started.
bool reset_resident_peak();

}  // namespace parallax
