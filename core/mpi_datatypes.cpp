#include "parallax/core/mpi_datatypes.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>

#include "parallax/core/error.h"

namespace parallax::detail {
namespace {

struct Sum {
  static float apply(float a, float b) { return a + b; }
};
struct Max {
  static float apply(float a, float b) { return std::max(a, b); }
};
struct Min {
  static float apply(float a, float b) { return std::min(a, b); }
};

// MPI_User_function: inout[i] = in[i] ∘ inout[i], computed in fp32 and rounded once.
template <typename Half, typename Combine>
void reduce_half(void* in, void* inout, int* length, MPI_Datatype* /*type*/) {
  const auto* a = static_cast<const Half*>(in);
  auto* b = static_cast<Half*>(inout);
  for (int i = 0; i < *length; ++i) {
    b[i] = Half(Combine::apply(static_cast<float>(a[i]), static_cast<float>(b[i])));
  }
}

int reduce_index(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return 0;
    case ReduceOp::kMax:
      return 1;
    case ReduceOp::kMin:
      return 2;
  }
  return 0;
}

}  // namespace

MPI_Datatype mpi_datatype(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat:
      return MPI_FLOAT;
    case at::kDouble:
      return MPI_DOUBLE;
    case at::kBFloat16:
    case at::kHalf:
      return MPI_UINT16_T;
    case at::kInt:
      return MPI_INT32_T;
    case at::kLong:
      return MPI_INT64_T;
    case at::kByte:
      return MPI_UINT8_T;
    default:
      break;
  }
  throw UsageError(concat("dtype ", c10::toString(dtype),
                          " is not supported by the MPI communicator; use float32, float64, "
                          "bfloat16, float16, int32, int64 or uint8"));
}

bool is_supported_dtype(at::ScalarType dtype) {
  return is_floating_dtype(dtype) || dtype == at::kInt || dtype == at::kLong || dtype == at::kByte;
}

std::string mpi_error_string(int code) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) {
    return "MPI error code " + std::to_string(code);
  }
  return std::string(text, static_cast<std::size_t>(length)) + " (code " + std::to_string(code) + ")";
}

MpiReduceOps::MpiReduceOps() {
  MPI_User_function* functions[2][3] = {
      {reduce_half<c10::BFloat16, Sum>, reduce_half<c10::BFloat16, Max>, reduce_half<c10::BFloat16, Min>},
      {reduce_half<c10::Half, Sum>, reduce_half<c10::Half, Max>, reduce_half<c10::Half, Min>}};
  for (int type = 0; type < 2; ++type) {
    for (int op = 0; op < 3; ++op) {
      half_ops_[type][op] = MPI_OP_NULL;
      const int code = MPI_Op_create(functions[type][op], /*commute=*/1, &half_ops_[type][op]);
      PARALLAX_CHECK(code == MPI_SUCCESS, CommError, "MPI_Op_create failed (code ", code, ")");
    }
  }
}

MPI_Op MpiReduceOps::get(at::ScalarType dtype, ReduceOp op) const {
  if (dtype == at::kBFloat16) {
    return half_ops_[0][reduce_index(op)];
  }
  if (dtype == at::kHalf) {
    return half_ops_[1][reduce_index(op)];
  }
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return MPI_SUM;
    case ReduceOp::kMax:
      return MPI_MAX;
    case ReduceOp::kMin:
      return MPI_MIN;
  }
  return MPI_SUM;
}

void MpiReduceOps::release() {
  if (released_) {
    return;
  }
  released_ = true;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) {
    return;
  }
  for (auto& row : half_ops_) {
    for (MPI_Op& op : row) {
      if (op != MPI_OP_NULL) {
        MPI_Op_free(&op);
      }
    }
  }
}

}  // namespace parallax::detail
