// Layer 6: building blocks for the payload codecs of node kinds
// (runtime/actor/payload_codec.h, docs/scaling.md): a writer and a reader of
// little-endian bytes (integers, doubles as their IEEE bits, strings, integer
// tensors inline, any tensor by index into the bulk list), and the two codec
// shapes built from an encode/decode pair. Used by actors/rlhf_codecs.cpp and
// actors/zero_nodes.cpp. No CAF.
#pragma once

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "runtime/actor/byte_io.h"
#include "runtime/actor/payload_codec.h"
#include "runtime/tensor/tensor.h"

namespace flowrun::actors::codec_io {

/// Appends values to `out` in this machine's byte order (the cluster's
/// machines must share it; x86-64 and AArch64 are little-endian). Integer
/// tensors may go inline (put_int_tensor, CPU only; float tensors are refused);
/// any tensor may go through the bulk list (put_tensor, bulk codecs only).
struct writer {
  std::vector<char> out;
  std::vector<tensor>* bulk = nullptr;  // bulk codecs: where tensors go (by index)
  // A tensor of any dtype, through the bulk list: its index (-1: undefined).
  void put_tensor(const tensor& t) {
    if (!t.defined()) {
      put<std::int32_t>(-1);
      return;
    }
    put<std::int32_t>(static_cast<std::int32_t>(bulk->size()));
    bulk->push_back(t);
  }
  void put_string(const std::string& s) {
    put<std::uint64_t>(s.size());
    out.insert(out.end(), s.begin(), s.end());
  }
  template <class T>
  void put(T x) {
    actor::byte_io::put(out, x);
  }
  void put_int_tensor(const tensor& t) {
    if (!t.defined()) {
      put<std::uint8_t>(255);
      return;
    }
    if (t.type() != dtype::i32 && t.type() != dtype::i64)
      throw std::invalid_argument(std::string("a ") + dtype_name(t.type()) +
                                  " tensor cannot cross processes inside a message (only token ids and masks do)");
    if (t.dev() != device::cpu()) throw std::invalid_argument("only CPU tensors cross processes inside a message");
    put<std::uint8_t>(static_cast<std::uint8_t>(t.type()));
    put<std::uint32_t>(static_cast<std::uint32_t>(t.dim()));
    for (auto d : t.shape()) put<std::int64_t>(d);
    const auto at = out.size();
    out.resize(at + t.nbytes());
    if (t.nbytes()) std::memcpy(out.data() + at, t.raw(), t.nbytes());
  }
};

/// Reads what a writer wrote, in the same order. Every get throws
/// std::invalid_argument on truncated or implausible bytes; done() checks
/// that nothing is left.
struct reader {
  const std::vector<char>& in;
  std::size_t at = 0;
  std::vector<tensor>* bulk = nullptr;
  tensor get_tensor() {
    const auto i = get<std::int32_t>();
    if (i == -1) return tensor{};
    if (i < 0 || !bulk || static_cast<std::size_t>(i) >= bulk->size())
      throw std::invalid_argument("tensor index " + std::to_string(i) + " out of range");
    return (*bulk)[static_cast<std::size_t>(i)];
  }
  std::string get_string() {
    const auto n = get<std::uint64_t>();
    if (n > in.size() - at) throw std::invalid_argument("truncated string");
    std::string s(in.data() + at, n);
    at += n;
    return s;
  }
  template <class T>
  T get() {
    T x;
    if (!actor::byte_io::get(in, at, x)) throw std::invalid_argument("truncated message");
    return x;
  }
  tensor get_int_tensor() {
    const auto t = get<std::uint8_t>();
    if (t == 255) return tensor{};
    if (t != static_cast<std::uint8_t>(dtype::i32) && t != static_cast<std::uint8_t>(dtype::i64))
      throw std::invalid_argument("not an integer tensor");
    const auto dims = get<std::uint32_t>();
    if (dims > 8) throw std::invalid_argument("too many dimensions");
    // The sizes against the bytes left before anything is allocated (a malformed message must not ask for
    // gigabytes, nor overflow the element count).
    shape_t shape;
    std::size_t bytes = t == static_cast<std::uint8_t>(dtype::i32) ? 4 : 8;
    bool empty = false;
    for (std::uint32_t i = 0; i < dims; ++i) {
      const auto d = get<std::int64_t>();
      if (d < 0) throw std::invalid_argument("negative tensor size " + std::to_string(d));
      shape.push_back(d);
      empty |= d == 0;
      if (!empty && static_cast<std::uint64_t>(d) > (in.size() - at) / bytes) throw std::invalid_argument("truncated tensor");
      if (!empty) bytes *= static_cast<std::size_t>(d);
    }
    tensor out = tensor::empty(shape, static_cast<dtype>(t));
    if (out.nbytes() > in.size() - at) throw std::invalid_argument("truncated tensor");
    if (out.nbytes()) std::memcpy(out.raw(), in.data() + at, out.nbytes());
    at += out.nbytes();
    return out;
  }
  void done() const {
    if (at != in.size()) throw std::invalid_argument("trailing bytes");
  }
};

/// A byte codec: enc(writer&, const T&) and dec(reader&) -> T; trailing bytes are an error.
template <class T, class Enc, class Dec>
actor::payload_codec codec(Enc enc, Dec dec) {
  actor::payload_codec c;
  c.encode = [enc](const actor::payload& p) {
    writer w;
    enc(w, p.as<T>());
    return std::move(w.out);
  };
  c.decode = [dec](std::string_view type, const std::vector<char>& bytes) {
    reader r{bytes};
    T x = dec(r);
    r.done();
    return actor::payload::make(type, std::move(x));
  };
  return c;
}

/// A bulk codec (tensors by index, moved by the bulk plane): the same shape as codec().
template <class T, class Enc, class Dec>
actor::payload_codec bulk_codec(Enc enc, Dec dec) {
  actor::payload_codec c;
  c.encode_bulk = [enc](const actor::payload& p, std::vector<tensor>& bulk) {
    writer w;
    w.bulk = &bulk;
    enc(w, p.as<T>());
    return std::move(w.out);
  };
  c.decode_bulk = [dec](std::string_view type, const std::vector<char>& bytes, std::vector<tensor>& bulk) {
    reader r{bytes};
    r.bulk = &bulk;
    T x = dec(r);
    r.done();
    return actor::payload::make(type, std::move(x));
  };
  return c;
}

}  // namespace flowrun::actors::codec_io
