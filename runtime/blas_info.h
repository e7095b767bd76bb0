// Which BLAS LibTorch is using in this process. Debian's LibTorch links libblas.so.3,
// which the alternatives system points at OpenBLAS or at the ~10× slower reference
// BLAS; the runtime logs the answer so a slow machine explains itself.
#pragma once

#include <string>

namespace parallax {

/// E.g. "OpenBLAS 0.3.21 (/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3)" or
/// "reference BLAS (/usr/lib/x86_64-linux-gnu/blas/libblas.so.3)"; "unknown" if no BLAS
/// library is loaded.
std::string describe_loaded_blas();

/// True when the loaded BLAS is the unoptimized reference implementation.
bool is_reference_blas(const std::string& description);

/// How the loaded BLAS runs in parallel: in threads of its own (OpenBLAS built with
/// pthreads, as Debian's libopenblas0-pthread), on the OpenMP pool LibTorch's intra-op
/// threads also use (OpenBLAS built with OpenMP, MKL), sequentially, or unknown.
enum class BlasThreading { kUnknown, kSequential, kOwnThreads, kOpenMp };
BlasThreading loaded_blas_threading();
const char* to_string(BlasThreading threading);

/// The BLAS's thread count through its own API (openblas_set_num_threads,
/// MKL_Set_Num_Threads); false when no BLAS with one is loaded.
bool set_blas_threads(int threads);
/// The BLAS's thread count (openblas_get_num_threads, MKL_Get_Max_Threads); 0 when unknown.
int blas_threads();

/// The kernels OpenBLAS chose at load (openblas_get_corename: "Haswell", "SkylakeX",
/// "Prescott", ...); "" when no OpenBLAS is loaded.
std::string openblas_core();
/// The best OpenBLAS core this CPU runs: "SkylakeX" with AVX-512 (F, VL, BW, DQ),
/// "Haswell" with AVX2 and FMA, "" otherwise.
std::string best_openblas_core_for_this_cpu();
/// When OpenBLAS chose weaker kernels than `best` (it does not recognize the CPU model,
/// as in many VMs, and falls back to "Prescott", SSE3): the advice that fixes it, naming
/// OPENBLAS_CORETYPE (read by OpenBLAS when it loads, so it must be set before the
/// program starts, e.g. mpirun -x OPENBLAS_CORETYPE=SkylakeX). "" when nothing is lost.
/// Pure.
std::string openblas_core_advice(const std::string& chosen, const std::string& best);

}  // namespace parallax
