// Tensor: a strided view (shape, strides in elements, dtype, device) over memory
// that it may or may not own. Owning tensors share their storage when copied;
// views made by view(), reshape() or slice() keep the storage alive.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "quiver/dtype.h"
#include "quiver/error.h"

namespace quiver {

using Shape = std::vector<int64_t>;

std::string shape_str(const Shape& shape);  // "[2, 3, 4]"
int64_t shape_numel(const Shape& shape);
Shape contiguous_strides(const Shape& shape);

class Tensor {
 public:
  Tensor() = default;

  // Owning, contiguous, uninitialized (CPU memory is 64-byte aligned).
  static Tensor empty(const Shape& shape, DType dtype, Device device = Device::CPU);
  static Tensor zeros(const Shape& shape, DType dtype, Device device = Device::CPU);
  // Non-owning view of caller memory; the caller keeps it alive.
  static Tensor wrap(void* data, const Shape& shape, DType dtype, Device device = Device::CPU,
                     Shape strides = {});

  bool defined() const { return data_ != nullptr; }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  int ndim() const { return static_cast<int>(shape_.size()); }
  int64_t dim(int i) const;  // negative i counts from the end
  int64_t numel() const { return shape_numel(shape_); }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  bool is_contiguous() const;

  void* raw() const { return data_; }
  template <typename T>
  T* data() const {
    QV_CHECK(dtype_of<T>() == dtype_, "tensor holds {}, accessed as {}", dtype_name(dtype_),
             dtype_name(dtype_of<T>()));
    return static_cast<T*>(data_);
  }

  // Views sharing storage.
  Tensor reshape(const Shape& shape) const;            // contiguous tensors only; one -1 allowed
  Tensor slice(int axis, int64_t begin, int64_t end) const;  // [begin, end) along axis
  Tensor transpose(int a, int b) const;

  // Copies (CPU).
  Tensor clone() const;              // contiguous copy, same dtype
  Tensor to(DType dtype) const;      // contiguous copy converted (bf16 rounds to nearest even)
  void copy_from(const Tensor& src);  // same shape; converts dtype
  void fill(double value);

  // Element access by multi-index, converted to double (tests, references, small tools).
  double at(std::initializer_list<int64_t> index) const;

 private:
  std::shared_ptr<void> storage_;
  void* data_ = nullptr;
  Shape shape_;
  Shape strides_;
  DType dtype_ = DType::F32;
  Device device_ = Device::CPU;
};

// Checks that name the tensor: "x: expected shape [4, 8], got [4, 9]".
void check_shape(const Tensor& t, const Shape& expected, const char* name);
void check_ndim(const Tensor& t, int ndim, const char* name);
void check_dtype(const Tensor& t, DType expected, const char* name);
void check_cpu_contiguous(const Tensor& t, const char* name);

// ‖a − b‖ / ‖b‖ computed in double (b all zeros: returns ‖a‖).
double rel_error(const Tensor& a, const Tensor& b);
double norm2(const Tensor& t);

// Arena: one allocation carved into 64-byte aligned pieces; reset() frees them all at once.
// Used for activations and scratch that live for one step.
class Arena {
 public:
  explicit Arena(size_t capacity_bytes);
  Tensor tensor(const Shape& shape, DType dtype);  // throws Error when the arena is full
  void* allocate(size_t bytes);
  void reset() { used_ = 0; }
  size_t used() const { return used_; }
  size_t capacity() const { return capacity_; }

 private:
  std::shared_ptr<void> block_;
  size_t capacity_;
  size_t used_ = 0;
};

}  // namespace quiver
