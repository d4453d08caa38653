// Element types and devices. bf16 conversion rounds to nearest even and keeps NaN a NaN.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>

namespace quiver {

enum class DType : uint8_t { F32, F64, BF16 };
enum class Device : uint8_t { CPU, CUDA };

size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);        // "F32", "F64", "BF16" (safetensors spelling)
DType dtype_from_name(const std::string& name);  // throws Error for unknown names
const char* device_name(Device device);

// bfloat16 storage: the top 16 bits of an IEEE float32.
struct bf16 {
  uint16_t bits = 0;
};

inline bf16 float_to_bf16(float value) {
  uint32_t u;
  std::memcpy(&u, &value, 4);
  bf16 out;
  if ((u & 0x7fffffffu) > 0x7f800000u) {  // NaN: keep it quiet and a NaN
    out.bits = static_cast<uint16_t>((u >> 16) | 0x0040u);
    return out;
  }
  uint32_t rounding_bias = 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
  out.bits = static_cast<uint16_t>((u + rounding_bias) >> 16);
  return out;
}

inline float bf16_to_float(bf16 value) {
  uint32_t u = static_cast<uint32_t>(value.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

template <typename T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() { return DType::F32; }
template <>
constexpr DType dtype_of<double>() { return DType::F64; }
template <>
constexpr DType dtype_of<bf16>() { return DType::BF16; }

}  // namespace quiver
