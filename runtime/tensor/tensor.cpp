#include "runtime/tensor/tensor.h"

#include "runtime/tensor/half_bits.h"

#include <cstdlib>
#include <cstring>
#include <sstream>
#include <stdexcept>

#include "runtime/tensor/device_memory.h"

#ifdef __linux__
#include <sys/mman.h>
#endif

namespace flowrun {

size_t dtype_size(dtype t) {
  switch (t) {
    case dtype::f32: return 4;
    case dtype::bf16: return 2;
    case dtype::f16: return 2;
    case dtype::i32: return 4;
    case dtype::i64: return 8;
  }
  return 0;
}

const char* dtype_name(dtype t) {
  switch (t) {
    case dtype::f32: return "f32";
    case dtype::bf16: return "bf16";
    case dtype::f16: return "f16";
    case dtype::i32: return "i32";
    case dtype::i64: return "i64";
  }
  return "?";
}

std::string device::str() const {
  return kind == device_kind::cpu ? "cpu" : "cuda:" + std::to_string(index);
}

// ---------------------------------------------------------------- memory hooks

namespace {
device_memory_hooks g_hooks[2];  // indexed by device_kind
}

void register_device_memory(device_kind k, device_memory_hooks hooks) {
  g_hooks[static_cast<int>(k)] = hooks;
}

const device_memory_hooks* device_memory_for(device_kind k) {
  auto& h = g_hooks[static_cast<int>(k)];
  return h.alloc ? &h : nullptr;
}

#ifdef FLOWRUN_HAVE_CUDA
namespace detail {
bool cuda_register_memory();
}
#endif

static const device_memory_hooks& hooks_or_throw(device d) {
  auto* h = device_memory_for(d.kind);
#ifdef FLOWRUN_HAVE_CUDA
  if (!h && d.kind == device_kind::cuda) {
    if (!detail::cuda_register_memory())
      throw std::runtime_error("no CUDA device is present for " + d.str() + " (cudaGetDeviceCount found none)");
    h = device_memory_for(d.kind);
  }
#endif
  if (!h)
    throw std::runtime_error("no memory backend for device " + d.str() +
                             ": this build has no CUDA support (configure with -DFLOWRUN_CUDA=ON)");
  return *h;
}

bool cuda_device_present() {
#ifdef FLOWRUN_HAVE_CUDA
  return device_memory_for(device_kind::cuda) != nullptr || detail::cuda_register_memory();
#else
  return false;
#endif
}

// Host memory: 64-byte aligned (a cache line, an AVX-512 vector). A buffer of 2 MiB or more is
// aligned to 2 MiB and asked for transparent huge pages (madvise; the kernel's default "madvise"
// mode gives none otherwise): the flat parameter buffer and the large activations then stream
// without a TLB miss every 4 KiB. Measured on decode, which reads every weight once a token:
// docs/performance.md, change 43. Best effort: where the kernel gives no huge pages the buffer
// is the same memory in 4 KiB pages.
static void* cpu_alloc(size_t n) {
  constexpr size_t huge_page = size_t(2) << 20;
  void* p = nullptr;
  if (n >= huge_page) {
    if (posix_memalign(&p, huge_page, n) != 0) throw std::bad_alloc();
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    madvise(p, n / huge_page * huge_page, MADV_HUGEPAGE);
#endif
    return p;
  }
  p = std::aligned_alloc(64, n);
  if (!p) throw std::bad_alloc();
  return p;
}

storage::storage(size_t bytes, device dev) : bytes_(bytes), dev_(dev) {
  size_t n = bytes == 0 ? 64 : (bytes + 63) / 64 * 64;
  if (dev.kind == device_kind::cpu) {
    data_ = cpu_alloc(n);
  } else {
    data_ = hooks_or_throw(dev).alloc(n, dev.index);
  }
}

storage::~storage() {
  if (dev_.kind == device_kind::cpu)
    std::free(data_);
  else if (auto* h = device_memory_for(dev_.kind))
    h->free(data_, dev_.index);
}

// ---------------------------------------------------------------- shapes

std::string shape_str(const shape_t& s) {
  std::ostringstream os;
  os << "(";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  if (s.size() == 1) os << ",";
  os << ")";
  return os.str();
}

int64_t shape_numel(const shape_t& s) {
  int64_t n = 1;
  for (auto d : s) {
    if (d < 0) throw std::invalid_argument("negative dimension in shape " + shape_str(s));
    n *= d;
  }
  return n;
}

// ---------------------------------------------------------------- tensor

tensor tensor::empty(const shape_t& shape, dtype t, device dev) {
  tensor r;
  r.numel_ = shape_numel(shape);
  r.shape_ = shape;
  r.dtype_ = t;
  r.storage_ = std::make_shared<storage>(static_cast<size_t>(r.numel_) * dtype_size(t), dev);
  return r;
}

tensor tensor::zeros(const shape_t& shape, dtype t, device dev) {
  auto r = empty(shape, t, dev);
  r.zero_();
  return r;
}

tensor tensor::from_floats(const shape_t& shape, const std::vector<float>& values) {
  auto r = empty(shape, dtype::f32);
  if (static_cast<int64_t>(values.size()) != r.numel())
    throw std::invalid_argument("from_floats: " + std::to_string(values.size()) +
                                " values for shape " + shape_str(shape));
  std::memcpy(r.raw(), values.data(), r.nbytes());
  return r;
}

tensor tensor::from_ints(const shape_t& shape, const std::vector<int32_t>& values) {
  auto r = empty(shape, dtype::i32);
  if (static_cast<int64_t>(values.size()) != r.numel())
    throw std::invalid_argument("from_ints: " + std::to_string(values.size()) +
                                " values for shape " + shape_str(shape));
  std::memcpy(r.raw(), values.data(), r.nbytes());
  return r;
}

int64_t tensor::size(int i) const {
  int d = dim();
  if (i < 0) i += d;
  if (i < 0 || i >= d)
    throw std::out_of_range("tensor::size(" + std::to_string(i) + ") on " + str());
  return shape_[i];
}

template <class T> static bool dtype_matches(dtype t);
template <> bool dtype_matches<float>(dtype t) { return t == dtype::f32; }
template <> bool dtype_matches<int32_t>(dtype t) { return t == dtype::i32; }
template <> bool dtype_matches<int64_t>(dtype t) { return t == dtype::i64; }
template <> bool dtype_matches<uint16_t>(dtype t) { return t == dtype::bf16 || t == dtype::f16; }

template <class T> T* tensor::data() {
  if (!defined()) throw std::logic_error("data() on an undefined tensor");
  if (!dtype_matches<T>(dtype_)) throw std::logic_error(std::string("data<>() type does not match ") + str());
  return static_cast<T*>(raw());
}
template <class T> const T* tensor::data() const {
  if (!defined()) throw std::logic_error("data() on an undefined tensor");
  if (!dtype_matches<T>(dtype_)) throw std::logic_error(std::string("data<>() type does not match ") + str());
  return static_cast<const T*>(raw());
}
template float* tensor::data<float>();
template const float* tensor::data<float>() const;
template int32_t* tensor::data<int32_t>();
template const int32_t* tensor::data<int32_t>() const;
template int64_t* tensor::data<int64_t>();
template const int64_t* tensor::data<int64_t>() const;
template uint16_t* tensor::data<uint16_t>();
template const uint16_t* tensor::data<uint16_t>() const;

tensor tensor::view(const shape_t& new_shape) const {
  shape_t s = new_shape;
  int infer = -1;
  int64_t known = 1;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      if (infer >= 0) throw std::invalid_argument("view: more than one -1 in " + shape_str(new_shape));
      infer = static_cast<int>(i);
    } else {
      known *= s[i];
    }
  }
  if (infer >= 0) s[infer] = known ? numel_ / known : 0;
  if (shape_numel(s) != numel_)
    throw std::invalid_argument("view: cannot view " + str() + " as " + shape_str(new_shape));
  tensor r = *this;
  r.shape_ = s;
  return r;
}

tensor tensor::rows(int64_t begin, int64_t end) const {
  if (dim() == 0 || begin < 0 || end < begin || end > shape_[0])
    throw std::out_of_range("rows(" + std::to_string(begin) + ", " + std::to_string(end) + ") of " + str());
  int64_t row = shape_[0] ? numel_ / shape_[0] : 0;
  tensor r = *this;
  r.shape_[0] = end - begin;
  r.numel_ = row * (end - begin);
  r.offset_ += static_cast<size_t>(begin * row) * dtype_size(dtype_);
  return r;
}

tensor tensor::flat_view(int64_t offset, const shape_t& shape) const {
  int64_t n = shape_numel(shape);
  if (offset < 0 || offset + n > numel_)
    throw std::out_of_range("flat_view(" + std::to_string(offset) + ", " + shape_str(shape) + ") of " + str());
  tensor r = *this;
  r.shape_ = shape;
  r.numel_ = n;
  r.offset_ += static_cast<size_t>(offset) * dtype_size(dtype_);
  return r;
}

tensor tensor::clone() const {
  auto r = empty(shape_, dtype_, dev());
  r.copy_from(*this);
  return r;
}

void tensor::copy_from(const tensor& src) {
  if (src.numel() != numel_ || src.type() != dtype_)
    throw std::invalid_argument("copy_from: " + src.str() + " into " + str());
  if (nbytes() == 0) return;
  if (dev().kind == device_kind::cpu && src.dev().kind == device_kind::cpu) {
    std::memmove(raw(), src.raw(), nbytes());
    return;
  }
  device d = dev().kind != device_kind::cpu ? dev() : src.dev();
  hooks_or_throw(d).copy(raw(), dev(), src.raw(), src.dev(), nbytes());
}

tensor tensor::to(device d) const {
  if (d == dev()) return *this;
  auto r = empty(shape_, dtype_, d);
  r.copy_from(*this);
  return r;
}

tensor tensor::to(dtype t) const {
  if (t == dtype_) return *this;
  if (dev().kind != device_kind::cpu) throw std::logic_error("to(dtype) is CPU-only; move to cpu first");
  auto r = empty(shape_, t);
  const int64_t n = numel_;
  auto is_float = [](dtype x) { return x == dtype::f32 || x == dtype::bf16 || x == dtype::f16; };
  if (is_float(dtype_) && is_float(t)) {
    std::vector<float> f = to_floats();
    if (t == dtype::f32) {
      std::memcpy(r.raw(), f.data(), n * 4);
    } else {
      auto* o = static_cast<uint16_t*>(r.raw());
      for (int64_t i = 0; i < n; ++i) o[i] = t == dtype::bf16 ? float_to_bf16(f[i]) : float_to_f16(f[i]);
    }
    return r;
  }
  if (dtype_ == dtype::i32 && t == dtype::i64) {
    auto* s = data<int32_t>();
    auto* o = r.data<int64_t>();
    for (int64_t i = 0; i < n; ++i) o[i] = s[i];
    return r;
  }
  if (dtype_ == dtype::i64 && t == dtype::i32) {
    auto* s = data<int64_t>();
    auto* o = r.data<int32_t>();
    for (int64_t i = 0; i < n; ++i) o[i] = static_cast<int32_t>(s[i]);
    return r;
  }
  throw std::invalid_argument(std::string("to(): no conversion from ") + dtype_name(dtype_) + " to " + dtype_name(t));
}

void tensor::zero_() {
  if (!defined() || nbytes() == 0) return;
  if (dev().kind == device_kind::cpu)
    std::memset(raw(), 0, nbytes());
  else
    hooks_or_throw(dev()).memset0(raw(), nbytes(), dev().index);
}

void tensor::fill_(float v) {
  if (dev().kind != device_kind::cpu) throw std::logic_error("fill_ is CPU-only; use ops::fill");
  float* p = data<float>();
  for (int64_t i = 0; i < numel_; ++i) p[i] = v;
}

std::vector<float> tensor::to_floats() const {
  if (dev().kind != device_kind::cpu) return to(device::cpu()).to_floats();
  std::vector<float> out(numel_);
  switch (dtype_) {
    case dtype::f32: std::memcpy(out.data(), raw(), nbytes()); break;
    case dtype::bf16: {
      auto* s = static_cast<const uint16_t*>(raw());
      for (int64_t i = 0; i < numel_; ++i) out[i] = bf16_to_float(s[i]);
      break;
    }
    case dtype::f16: {
      auto* s = static_cast<const uint16_t*>(raw());
      for (int64_t i = 0; i < numel_; ++i) out[i] = f16_to_float(s[i]);
      break;
    }
    case dtype::i32: {
      auto* s = static_cast<const int32_t*>(raw());
      for (int64_t i = 0; i < numel_; ++i) out[i] = static_cast<float>(s[i]);
      break;
    }
    case dtype::i64: {
      auto* s = static_cast<const int64_t*>(raw());
      for (int64_t i = 0; i < numel_; ++i) out[i] = static_cast<float>(s[i]);
      break;
    }
  }
  return out;
}

float tensor::item(int64_t i) const {
  if (i < 0 || i >= numel_) throw std::out_of_range("item(" + std::to_string(i) + ") of " + str());
  if (dtype_ == dtype::f32 && dev().kind == device_kind::cpu) return data<float>()[i];
  return flat_view(i, {1}).to_floats()[0];
}

std::string tensor::str() const {
  return std::string(dtype_name(dtype_)) + shape_str(shape_) + "@" + dev().str();
}

// ---------------------------------------------------------------- half types

uint16_t float_to_bf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  return half_bits::bf16_from_f32(x);
}

float bf16_to_float(uint16_t h) {
  const uint32_t x = half_bits::f32_from_bf16(h);
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

uint16_t float_to_f16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  return half_bits::f16_from_f32(x);
}

float f16_to_float(uint16_t h) {
  const uint32_t x = half_bits::f32_from_f16(h);
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

}  // namespace flowrun
