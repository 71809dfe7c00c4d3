// What the FFI handlers (handlers.cc, and the tools' loopback-group
// handlers) read from XLA's operands: the element type as a kernel dtype and
// the equality of two operands' shapes and types.
#ifndef LLAR_FFI_OPERANDS_H_
#define LLAR_FFI_OPERANDS_H_

#include <cstddef>

#include "llar/args.h"
#include "xla/ffi/api/ffi.h"

namespace llar {

// The kernels' dtype of XLA's element type `t`; false for a type no kernel
// serves (float32, bfloat16, float16 and int32 are served).
inline bool ToDType(xla::ffi::DataType t, DType* out) {
  switch (t) {
    case xla::ffi::DataType::F32: *out = DType::kF32; return true;
    case xla::ffi::DataType::BF16: *out = DType::kBF16; return true;
    case xla::ffi::DataType::F16: *out = DType::kF16; return true;
    case xla::ffi::DataType::S32: *out = DType::kI32; return true;
    default: return false;
  }
}

// Same dimensions and element type.
inline bool SameShape(const xla::ffi::AnyBuffer& a, const xla::ffi::AnyBuffer& b) {
  const auto da = a.dimensions();
  const auto db = b.dimensions();
  if (da.size() != db.size() || a.element_type() != b.element_type()) return false;
  for (size_t i = 0; i < da.size(); ++i) {
    if (da[i] != db[i]) return false;
  }
  return true;
}

}  // namespace llar

#endif  // LLAR_FFI_OPERANDS_H_
