#include "parallax/core/resident_memory.h"

#include <fstream>
#include <string>

namespace parallax {
namespace {

// A "Name:   1234 kB" line of /proc/self/status, in bytes; -1 when absent.
std::int64_t status_bytes(const std::string& name) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(name + ":", 0) != 0) continue;
    try {
      return std::stoll(line.substr(name.size() + 1)) * 1024;
    } catch (const std::exception&) {
      return -1;
    }
  }
  return -1;
}

}  // namespace

std::int64_t resident_bytes() {
  return status_bytes("VmRSS");
}

std::int64_t resident_peak_bytes() {
  return status_bytes("VmHWM");
}

bool reset_resident_peak() {
  std::ofstream clear("/proc/self/clear_refs");
  clear << "5";
  clear.flush();
  return static_cast<bool>(clear);
}

}  // namespace parallax
