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

}  // namespace parallax
