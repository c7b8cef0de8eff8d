// flowrun tensor: shape, dtype, device and ref-counted storage.
//
// Layer 1 of docs/architecture.md. Knows nothing about CAF, models or graphs.
//
// A tensor is always contiguous (row-major). Views share the storage and
// differ only in byte offset and shape: reshape (`view`), a range of rows
// along dim 0 (`rows`), and a window of a flat buffer (`flat_view`). That is
// enough for flat parameter buffers (ZeRO shards, AdamW over one buffer),
// per-layer activations, and KV caches, without a general stride machinery.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

namespace flowrun {

/// Element types. f32 is the compute type on CPU; bf16/f16 are storage types
/// (converted with `to(dtype)`); i32/i64 hold token ids, positions and masks.
enum class dtype : uint8_t { f32, bf16, f16, i32, i64 };

/// Bytes per element of `t`.
size_t dtype_size(dtype t);
/// "f32", "bf16", ...
const char* dtype_name(dtype t);

enum class device_kind : uint8_t { cpu, cuda };

/// Where a tensor's storage lives. `index` is the CUDA ordinal (0 for cpu).
struct device {
  device_kind kind = device_kind::cpu;
  int index = 0;
  static device cpu() { return {}; }
  static device cuda(int i = 0) { return {device_kind::cuda, i}; }
  bool operator==(const device& o) const { return kind == o.kind && index == o.index; }
  bool operator!=(const device& o) const { return !(*this == o); }
  std::string str() const;
};

/// A ref-counted block of bytes on one device. CPU storage is 64-byte aligned.
/// Device allocation goes through the backend registered for the device
/// (runtime/kernels/backend.h), so CUDA storage needs no change here.
class storage {
 public:
  storage(size_t bytes, device dev);
  ~storage();
  storage(const storage&) = delete;
  storage& operator=(const storage&) = delete;
  void* data() { return data_; }
  const void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  device dev() const { return dev_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
  device dev_;
};

using shape_t = std::vector<int64_t>;

/// "(2, 3, 4)"
std::string shape_str(const shape_t& s);
/// Product of the dimensions (1 for a scalar shape {}).
int64_t shape_numel(const shape_t& s);

/// A contiguous n-d array. Copying a tensor copies the handle, not the data
/// (ref-counted, like torch.Tensor); use `clone()` for a deep copy.
class tensor {
 public:
  tensor() = default;

  /// Uninitialised tensor. Throws std::bad_alloc when memory runs out.
  static tensor empty(const shape_t& shape, dtype t = dtype::f32, device dev = device::cpu());
  /// Zero-filled tensor.
  static tensor zeros(const shape_t& shape, dtype t = dtype::f32, device dev = device::cpu());
  /// CPU f32 tensor holding `values` (size must equal the shape's numel).
  static tensor from_floats(const shape_t& shape, const std::vector<float>& values);
  /// CPU i32 tensor holding `values`.
  static tensor from_ints(const shape_t& shape, const std::vector<int32_t>& values);

  bool defined() const { return static_cast<bool>(storage_); }
  const shape_t& shape() const { return shape_; }
  int dim() const { return static_cast<int>(shape_.size()); }
  /// Size of dimension i; negative i counts from the end. Throws std::out_of_range.
  int64_t size(int i) const;
  int64_t numel() const { return numel_; }
  size_t nbytes() const { return static_cast<size_t>(numel_) * dtype_size(dtype_); }
  dtype type() const { return dtype_; }
  device dev() const { return storage_ ? storage_->dev() : device::cpu(); }
  /// Shares storage with `o` (either may be a view).
  bool shares_storage(const tensor& o) const { return storage_ && storage_ == o.storage_; }

  void* raw() { return static_cast<char*>(storage_->data()) + offset_; }
  const void* raw() const { return static_cast<const char*>(storage_->data()) + offset_; }
  /// Typed pointer to the first element. Throws std::logic_error if T does not
  /// match the dtype (float↔f32, int32_t↔i32, int64_t↔i64, uint16_t↔bf16/f16).
  template <class T> T* data();
  template <class T> const T* data() const;

  /// Same data, new shape (numel must match; one dim may be -1).
  tensor view(const shape_t& new_shape) const;
  /// Rows [begin, end) along dim 0, as a view.
  tensor rows(int64_t begin, int64_t end) const;
  /// Elements [offset, offset + numel(shape)) of the flattened tensor, as a view.
  tensor flat_view(int64_t offset, const shape_t& shape) const;

  /// Deep copy on the same device.
  tensor clone() const;
  /// Copy to another device (a handle to the same tensor if already there).
  tensor to(device d) const;
  /// Convert between f32, bf16 and f16 (round to nearest even); i32↔i64. CPU only.
  tensor to(dtype t) const;
  /// Copy `src` (same numel and dtype) into this tensor.
  void copy_from(const tensor& src);
  /// Set all bytes to zero.
  void zero_();
  /// Fill an f32 tensor with `v`.
  void fill_(float v);

  /// CPU f32 contents as a vector (converting bf16/f16).
  std::vector<float> to_floats() const;
  /// f32 element at flat index i (CPU).
  float item(int64_t i = 0) const;

  std::string str() const;  // "f32(2, 3)@cpu"

 private:
  std::shared_ptr<storage> storage_;
  size_t offset_ = 0;  // bytes
  shape_t shape_;
  int64_t numel_ = 0;
  dtype dtype_ = dtype::f32;
};

/// bf16 and f16 conversions (round to nearest even; NaN stays NaN).
uint16_t float_to_bf16(float f);
float bf16_to_float(uint16_t h);
uint16_t float_to_f16(float f);
float f16_to_float(uint16_t h);

}  // namespace flowrun
