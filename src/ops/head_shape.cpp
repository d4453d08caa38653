#include "ops/head_shape.h"

#include "quiver/error.h"

namespace quiver::ops {

HeadShape head_shape(const Shape& s, const char* name) {
  QV_CHECK(s.size() == 3 || s.size() == 4, "{}: expected shape [T, H, Dh] or [B, T, H, Dh], got {}",
           name, shape_str(s));
  HeadShape d;
  d.ndim = static_cast<int>(s.size());
  const size_t off = s.size() - 3;
  if (off) d.B = s[0];
  d.T = s[off];
  d.H = s[off + 1];
  d.Dh = s[off + 2];
  QV_CHECK(d.B >= 1 && d.T >= 1 && d.H >= 1 && d.Dh >= 1, "{}: every size must be positive, got {}",
           name, shape_str(s));
  return d;
}

void check_float_input(const Tensor& t, const char* name) {
  QV_CHECK(t.defined(), "{}: tensor is undefined", name);
  check_cpu_contiguous(t, name);
  QV_CHECK(t.dtype() == DType::F32 || t.dtype() == DType::F64,
           "{}: expected dtype F32 or F64, got {}", name, dtype_name(t.dtype()));
}

}  // namespace quiver::ops
