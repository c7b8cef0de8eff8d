// Tests of runtime/tensor/tensor.h: construction, views (view, rows,
// flat_view), clone / copy_from, dtype conversion (bf16 / f16 round to nearest
// even, NaN / inf, subnormals) and the errors.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/tensor/device_memory.h"
#include "runtime/tensor/tensor.h"

using namespace flowrun;

namespace {
float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
std::vector<float> iota_floats(int n) {
  std::vector<float> v(n);
  for (int i = 0; i < n; ++i) v[i] = static_cast<float>(i);
  return v;
}
}  // namespace

TEST_CASE("dtype sizes, names, shape helpers") {
  CHECK(dtype_size(dtype::f32) == 4);
  CHECK(dtype_size(dtype::bf16) == 2);
  CHECK(dtype_size(dtype::f16) == 2);
  CHECK(dtype_size(dtype::i32) == 4);
  CHECK(dtype_size(dtype::i64) == 8);
  CHECK(std::string(dtype_name(dtype::bf16)) == "bf16");
  CHECK(shape_str({2, 3, 4}) == "(2, 3, 4)");
  CHECK(shape_str({5}) == "(5,)");
  CHECK(shape_str({}) == "()");
  CHECK(shape_numel({}) == 1);
  CHECK(shape_numel({2, 0, 3}) == 0);
  CHECK(shape_numel({2, 3, 4}) == 24);
  CHECK_THROWS_AS(shape_numel({2, -1}), std::invalid_argument);
  CHECK(device::cpu().str() == "cpu");
  CHECK(device::cuda(1).str() == "cuda:1");
  CHECK(device::cuda(1) != device::cpu());
}

TEST_CASE("construction: empty, zeros, from_floats, from_ints") {
  tensor undef;
  CHECK_FALSE(undef.defined());

  auto z = tensor::zeros({2, 3});
  CHECK(z.defined());
  CHECK(z.dim() == 2);
  CHECK(z.numel() == 6);
  CHECK(z.nbytes() == 24);
  CHECK(z.type() == dtype::f32);
  CHECK(z.dev() == device::cpu());
  CHECK(z.str() == "f32(2, 3)@cpu");
  CHECK(z.size(0) == 2);
  CHECK(z.size(-1) == 3);
  CHECK(z.size(-2) == 2);
  CHECK_THROWS_AS(z.size(2), std::out_of_range);
  CHECK_THROWS_AS(z.size(-3), std::out_of_range);
  for (float v : z.to_floats()) CHECK(v == 0.0f);
  CHECK(reinterpret_cast<uintptr_t>(z.raw()) % 64 == 0);  // 64-byte aligned CPU storage
  {
    // a buffer of 2 MiB or more starts on a 2 MiB boundary (its huge pages: tensor.cpp cpu_alloc),
    // and holds what is written to its last element as any other
    auto big = tensor::zeros({int64_t(1) << 19});  // 2 MiB of f32
    CHECK(reinterpret_cast<uintptr_t>(big.raw()) % (size_t(2) << 20) == 0);
    big.data<float>()[(int64_t(1) << 19) - 1] = 3.0f;
    CHECK(big.item((int64_t(1) << 19) - 1) == 3.0f);
    CHECK(big.item(0) == 0.0f);
    auto small = tensor::zeros({(int64_t(1) << 19) - 16});  // just under: 64-byte alignment only
    CHECK(reinterpret_cast<uintptr_t>(small.raw()) % 64 == 0);
  }

  auto f = tensor::from_floats({2, 2}, {1, 2, 3, 4});
  CHECK(f.item(3) == 4.0f);
  CHECK_THROWS_AS(f.item(4), std::out_of_range);
  CHECK_THROWS_AS(tensor::from_floats({2, 2}, {1, 2, 3}), std::invalid_argument);

  auto i = tensor::from_ints({3}, {7, -8, 9});
  CHECK(i.type() == dtype::i32);
  CHECK(i.data<int32_t>()[1] == -8);
  CHECK(i.item(1) == -8.0f);
  CHECK_THROWS_AS(tensor::from_ints({2}, {1, 2, 3}), std::invalid_argument);

  auto e = tensor::empty({0, 4});
  CHECK(e.numel() == 0);
  CHECK(e.to_floats().empty());

  auto s = tensor::zeros({});  // scalar
  CHECK(s.numel() == 1);
  CHECK(s.dim() == 0);

  auto filled = tensor::empty({5});
  filled.fill_(2.5f);
  for (float v : filled.to_floats()) CHECK(v == 2.5f);
  filled.zero_();
  for (float v : filled.to_floats()) CHECK(v == 0.0f);
}

TEST_CASE("typed data access checks the dtype") {
  auto f = tensor::zeros({4});
  CHECK_NOTHROW(f.data<float>());
  CHECK_THROWS_AS(f.data<int32_t>(), std::logic_error);
  CHECK_THROWS_AS(f.data<uint16_t>(), std::logic_error);
  auto h = tensor::zeros({4}, dtype::bf16);
  CHECK_NOTHROW(h.data<uint16_t>());
  CHECK_THROWS_AS(h.data<float>(), std::logic_error);
  auto l = tensor::zeros({4}, dtype::i64);
  CHECK_NOTHROW(l.data<int64_t>());
  tensor undef;
  CHECK_THROWS_AS(undef.data<float>(), std::logic_error);
}

TEST_CASE("view shares storage and infers -1") {
  auto t = tensor::from_floats({2, 3, 4}, iota_floats(24));
  auto v = t.view({6, 4});
  CHECK(v.shape() == shape_t{6, 4});
  CHECK(v.shares_storage(t));
  CHECK(v.raw() == t.raw());
  auto w = t.view({-1, 12});
  CHECK(w.shape() == shape_t{2, 12});
  auto x = t.view({4, -1});
  CHECK(x.shape() == shape_t{4, 6});
  v.data<float>()[5] = 100.0f;  // writes through
  CHECK(t.item(5) == 100.0f);
  CHECK_THROWS_AS(t.view({5, 5}), std::invalid_argument);
  CHECK_THROWS_AS(t.view({-1, -1}), std::invalid_argument);
  CHECK_THROWS_AS(t.view({-1, 5}), std::invalid_argument);
  auto e = tensor::empty({0, 3});
  CHECK(e.view({-1, 3}).shape() == shape_t{0, 3});
}

TEST_CASE("rows: a range along dim 0 as a view") {
  auto t = tensor::from_floats({4, 3}, iota_floats(12));
  auto r = t.rows(1, 3);
  CHECK(r.shape() == shape_t{2, 3});
  CHECK(r.numel() == 6);
  CHECK(r.shares_storage(t));
  CHECK(r.item(0) == 3.0f);
  CHECK(r.item(5) == 8.0f);
  r.fill_(-1.0f);
  auto all = t.to_floats();
  CHECK(all[2] == 2.0f);
  CHECK(all[3] == -1.0f);
  CHECK(all[8] == -1.0f);
  CHECK(all[9] == 9.0f);
  // rows of rows, and of a 3-d tensor
  auto rr = r.rows(1, 2);
  CHECK(rr.shape() == shape_t{1, 3});
  CHECK(rr.data<float>() == t.data<float>() + 6);
  auto t3 = tensor::from_floats({3, 2, 2}, iota_floats(12));
  auto r3 = t3.rows(2, 3);
  CHECK(r3.shape() == shape_t{1, 2, 2});
  CHECK(r3.item(0) == 8.0f);
  // empty range is fine
  CHECK(t.rows(4, 4).numel() == 0);
  CHECK_THROWS_AS(t.rows(3, 5), std::out_of_range);
  CHECK_THROWS_AS(t.rows(2, 1), std::out_of_range);
  CHECK_THROWS_AS(t.rows(-1, 1), std::out_of_range);
  CHECK_THROWS_AS(tensor::zeros({}).rows(0, 0), std::out_of_range);
}

TEST_CASE("flat_view: a window of the flattened buffer") {
  auto t = tensor::from_floats({2, 5}, iota_floats(10));
  auto f = t.flat_view(3, {2, 2});
  CHECK(f.shape() == shape_t{2, 2});
  CHECK(f.shares_storage(t));
  CHECK(f.to_floats() == std::vector<float>{3, 4, 5, 6});
  // a view of a view composes offsets
  auto g = t.rows(1, 2).flat_view(1, {3});
  CHECK(g.to_floats() == std::vector<float>{6, 7, 8});
  CHECK_THROWS_AS(t.flat_view(8, {3}), std::out_of_range);
  CHECK_THROWS_AS(t.flat_view(-1, {3}), std::out_of_range);
  CHECK(t.flat_view(10, {0}).numel() == 0);
}

TEST_CASE("clone is deep, copy_from copies data and checks numel/dtype") {
  auto t = tensor::from_floats({2, 3}, iota_floats(6));
  auto c = t.clone();
  CHECK_FALSE(c.shares_storage(t));
  CHECK(c.shape() == t.shape());
  c.data<float>()[0] = 42.0f;
  CHECK(t.item(0) == 0.0f);
  auto handle = t;  // copying the handle shares data
  handle.data<float>()[1] = 7.0f;
  CHECK(t.item(1) == 7.0f);

  auto dst = tensor::zeros({3, 2});  // same numel, different shape is allowed
  dst.copy_from(t);
  CHECK(dst.to_floats() == t.to_floats());
  // into a view
  auto big = tensor::zeros({4, 3});
  big.rows(2, 4).copy_from(t);
  auto bv = big.to_floats();
  CHECK(bv[5] == 0.0f);
  CHECK(bv[6] == 0.0f);
  CHECK(bv[7] == 7.0f);
  CHECK(bv[11] == 5.0f);
  CHECK_THROWS_AS(dst.copy_from(tensor::zeros({5})), std::invalid_argument);
  CHECK_THROWS_AS(dst.copy_from(tensor::zeros({6}, dtype::i32)), std::invalid_argument);
  // cloning a view copies only the view
  auto cv = big.rows(2, 3).clone();
  CHECK(cv.numel() == 3);
  CHECK(cv.to_floats() == std::vector<float>{0, 7, 2});
  // to(device) on the same device returns the same tensor
  CHECK(t.to(device::cpu()).shares_storage(t));
}

TEST_CASE("bf16 conversion: round to nearest even, NaN, inf") {
  CHECK(float_to_bf16(1.0f) == 0x3f80);
  CHECK(float_to_bf16(-2.0f) == 0xc000);
  CHECK(float_to_bf16(0.0f) == 0x0000);
  CHECK(float_to_bf16(-0.0f) == 0x8000);
  // 1 + 2^-8 is halfway between 1 (even) and 1 + 2^-7: rounds down to even
  CHECK(float_to_bf16(1.0f + std::ldexp(1.0f, -8)) == 0x3f80);
  // 1 + 3*2^-8 is halfway between 0x3f81 (odd) and 0x3f82 (even): rounds up
  CHECK(float_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)) == 0x3f82);
  // just above halfway rounds up
  CHECK(float_to_bf16(from_bits(0x3f808001u)) == 0x3f81);
  CHECK(float_to_bf16(from_bits(0x3f807fffu)) == 0x3f80);
  // inf and overflow
  CHECK(float_to_bf16(std::numeric_limits<float>::infinity()) == 0x7f80);
  CHECK(float_to_bf16(-std::numeric_limits<float>::infinity()) == 0xff80);
  CHECK(float_to_bf16(std::numeric_limits<float>::max()) == 0x7f80);
  // NaN stays NaN (including a NaN whose payload sits in the low bits only)
  CHECK(std::isnan(bf16_to_float(float_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  CHECK(std::isnan(bf16_to_float(float_to_bf16(from_bits(0x7f800001u)))));
  CHECK(std::isnan(bf16_to_float(float_to_bf16(from_bits(0xff800001u)))));
  // decoding is exact
  CHECK(bf16_to_float(0x3f80) == 1.0f);
  CHECK(bf16_to_float(0x4049) == 3.140625f);
  CHECK(std::isinf(bf16_to_float(0x7f80)));
  // every bf16 value round-trips
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    const float f = bf16_to_float(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    if (float_to_bf16(f) != h) {
      FAIL_CHECK("bf16 round trip failed for 0x" << std::hex << h);
      break;
    }
  }
}

TEST_CASE("f16 conversion: round to nearest even, subnormals, NaN, inf, overflow") {
  CHECK(float_to_f16(1.0f) == 0x3c00);
  CHECK(float_to_f16(-2.0f) == 0xc000);
  CHECK(float_to_f16(0.5f) == 0x3800);
  CHECK(float_to_f16(65504.0f) == 0x7bff);  // max finite
  CHECK(float_to_f16(-0.0f) == 0x8000);
  // halfway cases go to even
  CHECK(float_to_f16(1.0f + std::ldexp(1.0f, -11)) == 0x3c00);
  CHECK(float_to_f16(1.0f + 3 * std::ldexp(1.0f, -11)) == 0x3c02);
  CHECK(float_to_f16(65520.0f) == 0x7c00);  // halfway to 2^16 rounds (to even) to inf
  CHECK(float_to_f16(65519.0f) == 0x7bff);
  CHECK(float_to_f16(1e6f) == 0x7c00);
  CHECK(float_to_f16(-1e6f) == 0xfc00);
  CHECK(float_to_f16(std::numeric_limits<float>::infinity()) == 0x7c00);
  CHECK(float_to_f16(-std::numeric_limits<float>::infinity()) == 0xfc00);
  // subnormals
  CHECK(float_to_f16(std::ldexp(1.0f, -14)) == 0x0400);  // min normal
  CHECK(float_to_f16(std::ldexp(1.0f, -24)) == 0x0001);  // min subnormal
  CHECK(float_to_f16(std::ldexp(1.0f, -25)) == 0x0000);  // halfway to 0 (even)
  CHECK(float_to_f16(std::ldexp(3.0f, -25)) == 0x0002);  // 1.5 ulp: halfway, rounds to even (2)
  CHECK(float_to_f16(std::ldexp(1.5f, -25)) == 0x0001);  // above halfway
  CHECK(float_to_f16(std::ldexp(1.0f, -30)) == 0x0000);  // underflow to zero
  CHECK(float_to_f16(-std::ldexp(1.0f, -30)) == 0x8000);
  CHECK(f16_to_float(0x0001) == std::ldexp(1.0f, -24));
  CHECK(f16_to_float(0x03ff) == std::ldexp(1023.0f, -24));
  CHECK(f16_to_float(0x3c00) == 1.0f);
  CHECK(f16_to_float(0xc000) == -2.0f);
  CHECK(std::isinf(f16_to_float(0x7c00)));
  // NaN stays NaN
  CHECK(std::isnan(f16_to_float(float_to_f16(std::numeric_limits<float>::quiet_NaN()))));
  CHECK(std::isnan(f16_to_float(float_to_f16(from_bits(0x7f800001u)))));
  CHECK(std::isnan(f16_to_float(0x7e00)));
  // every f16 value round-trips
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    const float f = f16_to_float(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    if (float_to_f16(f) != h) {
      FAIL_CHECK("f16 round trip failed for 0x" << std::hex << h);
      break;
    }
  }
}

TEST_CASE("to(dtype): f32 <-> bf16 / f16, i32 <-> i64, errors") {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  auto t = tensor::from_floats({2, 3}, {1.0f, -2.5f, 1.0f + std::ldexp(1.0f, -8), nan, inf, -inf});
  CHECK(t.to(dtype::f32).shares_storage(t));  // same dtype: same tensor

  auto b = t.to(dtype::bf16);
  CHECK(b.type() == dtype::bf16);
  CHECK(b.shape() == t.shape());
  CHECK(b.nbytes() == 12);
  CHECK(b.data<uint16_t>()[2] == 0x3f80);  // rounded to even
  auto back = b.to(dtype::f32).to_floats();
  CHECK(back[0] == 1.0f);
  CHECK(back[1] == -2.5f);
  CHECK(back[2] == 1.0f);
  CHECK(std::isnan(back[3]));
  CHECK(back[4] == inf);
  CHECK(back[5] == -inf);
  CHECK(b.item(1) == -2.5f);  // item converts

  auto h = t.to(dtype::f16);
  CHECK(h.type() == dtype::f16);
  auto hb = h.to_floats();
  CHECK(hb[0] == 1.0f);
  CHECK(hb[1] == -2.5f);
  CHECK(std::isnan(hb[3]));
  CHECK(hb[4] == inf);
  CHECK(hb[5] == -inf);

  // bf16 -> f16 directly
  auto bh = b.to(dtype::f16);
  CHECK(bh.to_floats()[1] == -2.5f);

  // round trip of representable values is exact
  auto r = tensor::from_floats({4}, {0.15625f, -1024.0f, 3.0f, 0.0f});
  CHECK(r.to(dtype::bf16).to(dtype::f32).to_floats() == r.to_floats());
  CHECK(r.to(dtype::f16).to(dtype::f32).to_floats() == r.to_floats());

  auto i = tensor::from_ints({3}, {1, -2, 2147483647});
  auto l = i.to(dtype::i64);
  CHECK(l.type() == dtype::i64);
  CHECK(l.data<int64_t>()[1] == -2);
  CHECK(l.data<int64_t>()[2] == 2147483647);
  auto i2 = l.to(dtype::i32);
  CHECK(std::vector<int32_t>(i2.data<int32_t>(), i2.data<int32_t>() + 3) == std::vector<int32_t>{1, -2, 2147483647});

  CHECK_THROWS_AS(i.to(dtype::f32), std::invalid_argument);
  CHECK_THROWS_AS(t.to(dtype::i32), std::invalid_argument);
}

TEST_CASE("CUDA tensors need a registered device memory backend") {
  if (device_memory_for(device_kind::cuda)) return;  // a CUDA build registered one
  CHECK_THROWS_AS(tensor::empty({4}, dtype::f32, device::cuda()), std::runtime_error);
  auto t = tensor::zeros({4});
  CHECK_THROWS_AS(t.to(device::cuda()), std::runtime_error);
}
