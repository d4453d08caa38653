#include "quiver/tensor.h"

#include <cmath>
#include <cstdlib>
#include <cstring>

#include "core/device_alloc.h"

namespace quiver {

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::F32: return 4;
    case DType::F64: return 8;
    case DType::BF16: return 2;
  }
  return 0;
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::F32: return "F32";
    case DType::F64: return "F64";
    case DType::BF16: return "BF16";
  }
  return "?";
}

DType dtype_from_name(const std::string& name) {
  if (name == "F32") return DType::F32;
  if (name == "F64") return DType::F64;
  if (name == "BF16") return DType::BF16;
  fail("unsupported dtype '{}' (quiver reads F32, F64 and BF16)", name);
}

const char* device_name(Device device) { return device == Device::CPU ? "cpu" : "cuda"; }

std::string shape_str(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

Shape contiguous_strides(const Shape& shape) {
  Shape strides(shape.size());
  int64_t s = 1;
  for (int i = static_cast<int>(shape.size()) - 1; i >= 0; --i) {
    strides[i] = s;
    s *= shape[i];
  }
  return strides;
}

namespace {

std::shared_ptr<void> allocate_storage(size_t bytes, Device device) {
  if (device == Device::CUDA) return detail::device_allocate(bytes);
  size_t rounded = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded ? rounded : 64);
  QV_CHECK(p != nullptr, "out of host memory allocating {} bytes", bytes);
  return std::shared_ptr<void>(p, [](void* q) { std::free(q); });
}

// Reads element i (flat index into a strided tensor's own memory offset) as double.
double load(const void* base, DType dtype, int64_t offset) {
  switch (dtype) {
    case DType::F32: return static_cast<const float*>(base)[offset];
    case DType::F64: return static_cast<const double*>(base)[offset];
    case DType::BF16: return bf16_to_float(static_cast<const bf16*>(base)[offset]);
  }
  return 0;
}

void store(void* base, DType dtype, int64_t offset, double v) {
  switch (dtype) {
    case DType::F32: static_cast<float*>(base)[offset] = static_cast<float>(v); break;
    case DType::F64: static_cast<double*>(base)[offset] = v; break;
    case DType::BF16:
      static_cast<bf16*>(base)[offset] = float_to_bf16(static_cast<float>(v));
      break;
  }
}

// Visits every element in row-major order, giving its storage offset.
template <typename Fn>
void for_each_offset(const Shape& shape, const Shape& strides, Fn&& fn) {
  int64_t n = shape_numel(shape);
  if (n == 0) return;
  std::vector<int64_t> idx(shape.size(), 0);
  int64_t offset = 0;
  for (int64_t i = 0; i < n; ++i) {
    fn(i, offset);
    for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
      if (++idx[d] < shape[d]) {
        offset += strides[d];
        break;
      }
      offset -= strides[d] * (shape[d] - 1);
      idx[d] = 0;
    }
  }
}

}  // namespace

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  for (int64_t d : shape) QV_CHECK(d >= 0, "negative dimension in shape {}", shape_str(shape));
  Tensor t;
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  t.dtype_ = dtype;
  t.device_ = device;
  t.storage_ = allocate_storage(t.nbytes(), device);
  t.data_ = t.storage_.get();
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  if (device == Device::CUDA)
    detail::device_memset_zero(t.data_, t.nbytes());
  else
    std::memset(t.data_, 0, t.nbytes());
  return t;
}

Tensor Tensor::wrap(void* data, const Shape& shape, DType dtype, Device device, Shape strides) {
  Tensor t;
  t.shape_ = shape;
  t.strides_ = strides.empty() ? contiguous_strides(shape) : std::move(strides);
  QV_CHECK(t.strides_.size() == shape.size(), "strides {} do not match shape {}",
           shape_str(t.strides_), shape_str(shape));
  t.dtype_ = dtype;
  t.device_ = device;
  t.data_ = data;
  return t;
}

int64_t Tensor::dim(int i) const {
  int n = ndim();
  int j = i < 0 ? i + n : i;
  QV_CHECK(j >= 0 && j < n, "dimension {} out of range for a tensor of shape {}", i,
           shape_str(shape_));
  return shape_[j];
}

bool Tensor::is_contiguous() const {
  int64_t s = 1;
  for (int i = ndim() - 1; i >= 0; --i) {
    if (shape_[i] != 1 && strides_[i] != s) return false;
    s *= shape_[i];
  }
  return true;
}

Tensor Tensor::reshape(const Shape& shape) const {
  QV_CHECK(is_contiguous(), "reshape needs a contiguous tensor, got shape {} strides {}",
           shape_str(shape_), shape_str(strides_));
  Shape s = shape;
  int infer = -1;
  int64_t known = 1;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      QV_CHECK(infer < 0, "reshape to {}: only one -1 allowed", shape_str(shape));
      infer = static_cast<int>(i);
    } else {
      known *= s[i];
    }
  }
  if (infer >= 0) {
    QV_CHECK(known > 0 && numel() % known == 0, "cannot reshape {} to {}", shape_str(shape_),
             shape_str(shape));
    s[infer] = numel() / known;
  }
  QV_CHECK(shape_numel(s) == numel(), "cannot reshape {} ({} elements) to {}", shape_str(shape_),
           numel(), shape_str(shape));
  Tensor t = *this;
  t.shape_ = s;
  t.strides_ = contiguous_strides(s);
  return t;
}

Tensor Tensor::slice(int axis, int64_t begin, int64_t end) const {
  int a = axis < 0 ? axis + ndim() : axis;
  QV_CHECK(a >= 0 && a < ndim(), "slice axis {} out of range for shape {}", axis, shape_str(shape_));
  QV_CHECK(0 <= begin && begin <= end && end <= shape_[a], "slice [{}, {}) out of range for axis {} of {}",
           begin, end, a, shape_str(shape_));
  Tensor t = *this;
  t.shape_[a] = end - begin;
  t.data_ = static_cast<char*>(data_) + begin * strides_[a] * static_cast<int64_t>(dtype_size(dtype_));
  return t;
}

Tensor Tensor::transpose(int a, int b) const {
  int n = ndim();
  a = a < 0 ? a + n : a;
  b = b < 0 ? b + n : b;
  QV_CHECK(a >= 0 && a < n && b >= 0 && b < n, "transpose({}, {}) out of range for shape {}", a, b,
           shape_str(shape_));
  Tensor t = *this;
  std::swap(t.shape_[a], t.shape_[b]);
  std::swap(t.strides_[a], t.strides_[b]);
  return t;
}

Tensor Tensor::clone() const { return to(dtype_); }

Tensor Tensor::to(DType dtype) const {
  QV_CHECK(device_ == Device::CPU, "Tensor::to works on CPU tensors");
  Tensor out = empty(shape_, dtype);
  out.copy_from(*this);
  return out;
}

void Tensor::copy_from(const Tensor& src) {
  QV_CHECK(src.shape_ == shape_, "copy: source shape {} differs from destination {}",
           shape_str(src.shape_), shape_str(shape_));
  if (device_ == Device::CUDA || src.device_ == Device::CUDA) {
    QV_CHECK(src.dtype_ == dtype_ && src.is_contiguous() && is_contiguous(),
             "copies to or from the GPU need contiguous tensors of one dtype");
    detail::device_copy(data_, device_, src.data_, src.device_, nbytes());
    return;
  }
  if (src.dtype_ == dtype_ && src.is_contiguous() && is_contiguous()) {
    std::memmove(data_, src.data_, nbytes());
    return;
  }
  std::vector<int64_t> dst_offsets;
  dst_offsets.reserve(static_cast<size_t>(numel()));
  for_each_offset(shape_, strides_, [&](int64_t, int64_t off) { dst_offsets.push_back(off); });
  for_each_offset(src.shape_, src.strides_, [&](int64_t i, int64_t off) {
    store(data_, dtype_, dst_offsets[i], load(src.data_, src.dtype_, off));
  });
}

void Tensor::fill(double value) {
  QV_CHECK(device_ == Device::CPU, "fill works on CPU tensors");
  for_each_offset(shape_, strides_, [&](int64_t, int64_t off) { store(data_, dtype_, off, value); });
}

double Tensor::at(std::initializer_list<int64_t> index) const {
  QV_CHECK(static_cast<int>(index.size()) == ndim(), "at(): {} indices for a {}-d tensor",
           index.size(), ndim());
  QV_CHECK(device_ == Device::CPU, "at() works on CPU tensors");
  int64_t off = 0;
  int d = 0;
  for (int64_t i : index) {
    QV_CHECK(i >= 0 && i < shape_[d], "index {} out of range for axis {} of {}", i, d,
             shape_str(shape_));
    off += i * strides_[d++];
  }
  return load(data_, dtype_, off);
}

void check_shape(const Tensor& t, const Shape& expected, const char* name) {
  QV_CHECK(t.shape() == expected, "{}: expected shape {}, got {}", name, shape_str(expected),
           shape_str(t.shape()));
}

void check_ndim(const Tensor& t, int ndim, const char* name) {
  QV_CHECK(t.ndim() == ndim, "{}: expected a {}-d tensor, got shape {}", name, ndim,
           shape_str(t.shape()));
}

void check_dtype(const Tensor& t, DType expected, const char* name) {
  QV_CHECK(t.dtype() == expected, "{}: expected dtype {}, got {}", name, dtype_name(expected),
           dtype_name(t.dtype()));
}

void check_cpu_contiguous(const Tensor& t, const char* name) {
  QV_CHECK(t.device() == Device::CPU, "{}: expected a CPU tensor", name);
  QV_CHECK(t.is_contiguous(), "{}: expected a contiguous tensor (shape {}, strides {})", name,
           shape_str(t.shape()), shape_str(t.strides()));
}

double norm2(const Tensor& t) {
  double s = 0;
  for_each_offset(t.shape(), t.strides(), [&](int64_t, int64_t off) {
    double v = load(t.raw(), t.dtype(), off);
    s += v * v;
  });
  return std::sqrt(s);
}

double rel_error(const Tensor& a, const Tensor& b) {
  QV_CHECK(a.shape() == b.shape(), "rel_error: shapes {} and {} differ", shape_str(a.shape()),
           shape_str(b.shape()));
  std::vector<double> bv;
  bv.reserve(static_cast<size_t>(b.numel()));
  for_each_offset(b.shape(), b.strides(),
                  [&](int64_t, int64_t off) { bv.push_back(load(b.raw(), b.dtype(), off)); });
  double diff = 0, ref = 0;
  for_each_offset(a.shape(), a.strides(), [&](int64_t i, int64_t off) {
    double d = load(a.raw(), a.dtype(), off) - bv[i];
    diff += d * d;
    ref += bv[i] * bv[i];
  });
  return ref > 0 ? std::sqrt(diff / ref) : std::sqrt(diff);
}

Arena::Arena(size_t capacity_bytes) : capacity_(capacity_bytes) {
  block_ = allocate_storage(capacity_bytes, Device::CPU);
}

void* Arena::allocate(size_t bytes) {
  size_t start = (used_ + 63) / 64 * 64;
  QV_CHECK(start + bytes <= capacity_, "arena full: {} bytes requested, {} of {} used", bytes,
           used_, capacity_);
  used_ = start + bytes;
  return static_cast<char*>(block_.get()) + start;
}

Tensor Arena::tensor(const Shape& shape, DType dtype) {
  size_t bytes = static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype);
  return Tensor::wrap(allocate(bytes), shape, dtype);
}

}  // namespace quiver
