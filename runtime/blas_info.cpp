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

namespace {

template <typename Fn>
Fn blas_symbol(const char* name) {
  return reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, name));
}

}  // namespace

BlasThreading loaded_blas_threading() {
  // openblas_get_parallel: 0 sequential, 1 pthreads, 2 OpenMP.
  if (auto parallel = blas_symbol<int (*)()>("openblas_get_parallel")) {
    switch (parallel()) {
      case 0:
        return BlasThreading::kSequential;
      case 1:
        return BlasThreading::kOwnThreads;
      default:
        return BlasThreading::kOpenMp;
    }
  }
  if (blas_symbol<int (*)()>("MKL_Get_Max_Threads")) return BlasThreading::kOpenMp;
  return BlasThreading::kUnknown;
}

const char* to_string(BlasThreading threading) {
  switch (threading) {
    case BlasThreading::kSequential:
      return "sequential";
    case BlasThreading::kOwnThreads:
      return "its own threads";
    case BlasThreading::kOpenMp:
      return "the OpenMP pool";
    case BlasThreading::kUnknown:
      break;
  }
  return "unknown threading";
}

bool set_blas_threads(int threads) {
  if (auto set = blas_symbol<void (*)(int)>("openblas_set_num_threads")) {
    set(threads);
    return true;
  }
  if (auto set = blas_symbol<void (*)(int)>("MKL_Set_Num_Threads")) {
    set(threads);
    return true;
  }
  return false;
}

int blas_threads() {
  if (auto get = blas_symbol<int (*)()>("openblas_get_num_threads")) return get();
  if (auto get = blas_symbol<int (*)()>("MKL_Get_Max_Threads")) return get();
  return 0;
}

}  // namespace parallax
