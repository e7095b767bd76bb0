#include "parallax/runtime/blas_info.h"

#include <dlfcn.h>
#include <link.h>

#include <climits>
#include <cstdlib>
#include <string>
#include <vector>

namespace parallax {
namespace {

int collect_blas_paths(struct dl_phdr_info* info, size_t, void* data) {
  auto* paths = static_cast<std::vector<std::string>*>(data);
  const std::string name = info->dlpi_name ? info->dlpi_name : "";
  const auto slash = name.find_last_of('/');
  const std::string base = slash == std::string::npos ? name : name.substr(slash + 1);
  if (base.find("blas") != std::string::npos || base.find("mkl_core") != std::string::npos) {
    char resolved[PATH_MAX];
    paths->push_back(realpath(name.c_str(), resolved) ? std::string(resolved) : name);
  }
  return 0;
}

}  // namespace

std::string describe_loaded_blas() {
  std::vector<std::string> paths;
  dl_iterate_phdr(collect_blas_paths, &paths);
  if (paths.empty()) return "unknown";
  // OpenBLAS reports its own version and build.
  using ConfigFn = const char* (*)();
  if (auto fn = reinterpret_cast<ConfigFn>(dlsym(RTLD_DEFAULT, "openblas_get_config"))) {
    std::string config = fn();
    for (const auto& p : paths) {
      if (p.find("openblas") != std::string::npos) return config + " (" + p + ")";
    }
    return config + " (" + paths.front() + ")";
  }
  for (const auto& p : paths) {
    if (p.find("mkl") != std::string::npos) return "Intel MKL (" + p + ")";
  }
  return "reference BLAS (" + paths.front() + ")";
}

bool is_reference_blas(const std::string& description) {
  return description.rfind("reference", 0) == 0;
}

}  // namespace parallax
