#include "runtime/actor/bulk_plane.h"


#include <chrono>
#include <cstring>
#include <stdexcept>
#include <thread>

#include <spdlog/spdlog.h>

#include "runtime/actor/byte_io.h"

namespace flowrun::actor {

namespace {

using byte_io::put;

template <class T>
T get(const std::vector<char>& in, std::size_t& at) {
  T x;
  if (!byte_io::get(in, at, x)) throw std::invalid_argument("truncated bulk header");
  return x;
}

std::uint64_t nbytes_of(dtype t, const shape_t& s) {
  std::uint64_t n = dtype_size(t);
  for (auto d : s) n *= static_cast<std::uint64_t>(d);
  return n;
}

}  // namespace

void encode_bulk_header(const bulk_header& h, std::vector<char>& out) {
  put<std::uint64_t>(out, h.first_tag);
  put<std::uint32_t>(out, static_cast<std::uint32_t>(h.types.size()));
  for (std::size_t i = 0; i < h.types.size(); ++i) {
    put<std::uint8_t>(out, static_cast<std::uint8_t>(h.types[i]));
    put<std::uint32_t>(out, static_cast<std::uint32_t>(h.shapes[i].size()));
    for (auto d : h.shapes[i]) put<std::int64_t>(out, d);
  }
}

bulk_header decode_bulk_header(const std::vector<char>& bytes, std::size_t& at) {
  bulk_header h;
  h.first_tag = get<std::uint64_t>(bytes, at);
  const auto n = get<std::uint32_t>(bytes, at);
  if (n > 4096) throw std::invalid_argument("bulk header announces " + std::to_string(n) + " tensors (at most 4096)");
  std::uint64_t total = 0;  // bytes announced so far
  for (std::uint32_t i = 0; i < n; ++i) {
    const auto t = get<std::uint8_t>(bytes, at);
    if (t > static_cast<std::uint8_t>(dtype::i64)) throw std::invalid_argument("bulk header: unknown dtype " + std::to_string(t));
    const auto dims = get<std::uint32_t>(bytes, at);
    if (dims > 8) throw std::invalid_argument("bulk header: " + std::to_string(dims) + " dimensions (at most 8)");
    shape_t s;
    std::uint64_t elems = 1;
    for (std::uint32_t d = 0; d < dims; ++d) {
      const auto x = get<std::int64_t>(bytes, at);
      if (x < 0) throw std::invalid_argument("bulk header: negative size");
      s.push_back(x);
      const auto ux = static_cast<std::uint64_t>(x);
      if (ux != 0 && elems > max_bulk_payload_bytes / ux) elems = max_bulk_payload_bytes + 1;  // saturate
      else elems *= ux;
    }
    total += elems * dtype_size(static_cast<dtype>(t));  // elems <= 2^36 + 1: no overflow
    if (total > max_bulk_payload_bytes)
      throw std::invalid_argument("bulk header announces more than " + std::to_string(max_bulk_payload_bytes) +
                                  " bytes of tensors (a corrupt or hostile header)");
    h.types.push_back(static_cast<dtype>(t));
    h.shapes.push_back(std::move(s));
  }
  return h;
}

bulk_plane::bulk_plane(std::shared_ptr<comm::communicator> comm) : comm_(std::move(comm)) {
  if (!comm_) throw std::invalid_argument("bulk_plane: no communicator");
}

bulk_plane::~bulk_plane() {
  std::lock_guard<std::mutex> lock(st_->mutex);
  if (st_->in_flight > 0)
    spdlog::info("bulk plane: {} send(s) still in flight at the end of the job (a stopped run leaves payloads "
                 "nobody takes): they end when their peer's plane closes, or at the timeout",
                 st_->in_flight);
}

bulk_header bulk_plane::send(int peer, const std::vector<tensor>& tensors) {
  bulk_header h;
  const auto n = static_cast<std::uint64_t>(tensors.size());
  h.first_tag = next_tag_.fetch_add(n == 0 ? 1 : n);
  std::vector<tensor> host;
  host.reserve(tensors.size());
  std::uint64_t bytes = 0;
  for (const auto& t : tensors) {
    if (!t.defined()) throw std::invalid_argument("bulk_plane::send: an undefined tensor");
    host.push_back(t.dev() == device::cpu() ? t : t.to(device::cpu()));
    h.types.push_back(t.type());
    h.shapes.push_back(t.shape());
    bytes += t.nbytes();
  }
  {
    std::lock_guard<std::mutex> lock(st_->mutex);
    ++st_->in_flight;
    ++st_->stats.sends;
    st_->stats.tensors_sent += n;
    st_->stats.bytes_sent += bytes;
  }
  // A thread per payload: sends to different receivers never wait for each other.
  std::thread([comm = comm_, st = st_, peer, first = h.first_tag, host = std::move(host)] {
    bool failed = false;
    try {
      for (std::size_t i = 0; i < host.size(); ++i) comm->send_tagged(host[i], peer, first + i);
    } catch (const std::exception& e) {
      failed = true;
      spdlog::error("bulk plane: sending {} tensor(s) to rank {} failed: {}", host.size(), peer, e.what());
    }
    std::lock_guard<std::mutex> lock(st->mutex);
    if (failed) ++st->failed;
    --st->in_flight;
  }).detach();
  return h;
}

std::vector<tensor> bulk_plane::recv(int peer, const bulk_header& h) {
  std::vector<tensor> out;
  out.reserve(h.types.size());
  std::uint64_t bytes = 0;
  for (std::size_t i = 0; i < h.types.size(); ++i) {
    tensor t = tensor::empty(h.shapes[i], h.types[i]);
    comm_->recv_tagged(t, peer, h.first_tag + i);
    bytes += nbytes_of(h.types[i], h.shapes[i]);
    out.push_back(std::move(t));
  }
  std::lock_guard<std::mutex> lock(st_->mutex);
  ++st_->stats.recvs;
  st_->stats.tensors_received += out.size();
  st_->stats.bytes_received += bytes;
  return out;
}

bulk_stats bulk_plane::stats() const {
  std::lock_guard<std::mutex> lock(st_->mutex);
  return st_->stats;
}

std::uint64_t bulk_plane::failed_sends() const {
  std::lock_guard<std::mutex> lock(st_->mutex);
  return st_->failed;
}

}  // namespace flowrun::actor
