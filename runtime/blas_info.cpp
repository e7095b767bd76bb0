#include "parallax/runtime/blas_info.h"

#include <dlfcn.h>
#include <link.h>

#include <climits>
#include <cstdlib>
#include <string>
#include <vector>

namespace parallax {
namespace {

// A function the loaded BLAS exports, or null.
template <typename Fn>
Fn blas_symbol(const char* name) {
  return reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, name));
}

int collect_blas_paths(struct dl_phdr_info* info, size_t, void* data) {
  auto* paths = static_cast<std::vector<std::string>*>(data);
  const std::string name = info->dlpi_name ? info->dlpi_name : "";
  const auto slash = name.find_last_of('/');
  const std::string base = slash == std::string::npos ? name : name.substr(slash + 1);
  const bool cpu_blas = base.find("blas") != std::string::npos && base.find("cublas") == std::string::npos;
  if (cpu_blas || base.find("mkl_core") != std::string::npos) {
    char resolved[PATH_MAX];
    paths->push_back(realpath(name.c_str(), resolved) ? std::string(resolved) : name);
  }
  return 0;
}

}  // namespace

std::string describe_loaded_blas() {
  std::vector<std::string> paths;
  dl_iterate_phdr(collect_blas_paths, &paths);
  // OpenBLAS reports its own version and build.
  if (auto fn = blas_symbol<const char* (*)()>("openblas_get_config")) {
    std::string config = fn();
    for (const auto& p : paths) {
      if (p.find("openblas") != std::string::npos) return config + " (" + p + ")";
    }
    return paths.empty() ? config : config + " (" + paths.front() + ")";
  }
  for (const auto& p : paths) {
    if (p.find("mkl") != std::string::npos) return "Intel MKL (" + p + ")";
  }
  // MKL linked statically into LibTorch (the PyPI wheels): no library of its own.
  if (auto fn = blas_symbol<int (*)()>("MKL_Get_Max_Threads")) {
    Dl_info where{};
    const bool found = dladdr(reinterpret_cast<void*>(fn), &where) != 0 && where.dli_fname != nullptr;
    return std::string("Intel MKL (inside ") + (found ? where.dli_fname : "LibTorch") + ")";
  }
  if (paths.empty()) return "unknown";
  return "reference BLAS (" + paths.front() + ")";
}

bool is_reference_blas(const std::string& description) {
  return description.rfind("reference", 0) == 0;
}

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

std::string openblas_core() {
  if (auto name = blas_symbol<const char* (*)()>("openblas_get_corename")) return name();
  return "";
}

std::string best_openblas_core_for_this_cpu() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq")) {
    return "SkylakeX";
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
  return "";
}

std::string openblas_core_advice(const std::string& chosen, const std::string& best) {
  if (chosen.empty() || best.empty()) return "";
  // OpenBLAS's x86-64 cores without AVX2 kernels (what it falls back to on a CPU it does
  // not recognize), and those that have them.
  static const char* const kWeak[] = {"Prescott",    "Core2",     "Penryn",     "Dunnington", "Nehalem",
                                      "Sandybridge", "Atom",      "Barcelona",  "Opteron",    "Opteron(SSE3)",
                                      "Bobcat",      "Bulldozer", "Piledriver", "Katmai",     "Coppermine",
                                      "Northwood",   "Banias",    "Athlon"};
  bool weak = false;
  for (const char* name : kWeak) weak |= chosen == name;
  // The AVX2 cores OpenBLAS may pick on a CPU that also has AVX-512.
  const bool avx2_only = chosen == "Haswell" || chosen == "Zen";
  if (!weak && !(best == "SkylakeX" && avx2_only)) return "";
  return "OpenBLAS chose its " + chosen + " kernels, but this CPU runs its " + best +
         " kernels (OpenBLAS did not recognize the CPU model); matrix products run up to 3x slower. Set "
         "OPENBLAS_CORETYPE=" +
         best + " before the program starts (mpirun -x OPENBLAS_CORETYPE=" + best +
         "); Parallax's demo and bench scripts do";
}

int blas_threads() {
  if (auto get = blas_symbol<int (*)()>("openblas_get_num_threads")) return get();
  if (auto get = blas_symbol<int (*)()>("MKL_Get_Max_Threads")) return get();
  return 0;
}

}  // namespace parallax
