// The communicator base class (argument checks, world_size 1, byte counting)
// and the factory by name. The backends live in inproc.cpp, gloo_comm.cpp and
// nccl_comm.cpp.
#include "runtime/comm/communicator.h"

#include <stdexcept>

namespace flowrun::comm {

const char* reduce_op_name(reduce_op op) { return op == reduce_op::sum ? "sum" : "max"; }

int64_t ring_bytes_sent(const std::string& op, int64_t bytes, int world_size) {
  if (world_size < 1)
    throw std::invalid_argument("ring_bytes_sent: world_size must be >= 1, got " + std::to_string(world_size));
  if (bytes < 0) throw std::invalid_argument("ring_bytes_sent: negative byte count");
  const int64_t n = world_size;
  const int64_t per_rank = bytes / n;
  if (op == "all_gather" || op == "reduce_scatter" || op == "broadcast") return (n - 1) * per_rank;
  if (op == "all_reduce") return 2 * (n - 1) * per_rank;
  if (op == "barrier" || op == "recv") return 0;
  if (op == "send") return bytes;
  throw std::invalid_argument("ring_bytes_sent: unknown op '" + op +
                              "' (expected all_gather, reduce_scatter, all_reduce, broadcast, barrier, send or recv)");
}

communicator::~communicator() = default;

void communicator::do_send(const tensor&, int) {
  throw std::runtime_error(where("send") + ": point-to-point send is not supported by this backend");
}

void communicator::do_recv(tensor&, int) {
  throw std::runtime_error(where("recv") + ": point-to-point recv is not supported by this backend");
}

void communicator::do_send_tagged(const tensor&, int, uint64_t) {
  throw std::runtime_error(where("send_tagged") + ": tagged point-to-point is not supported by this backend (use gloo)");
}

void communicator::do_recv_tagged(tensor&, int, uint64_t) {
  throw std::runtime_error(where("recv_tagged") + ": tagged point-to-point is not supported by this backend (use gloo)");
}

namespace {

void check_peer(const communicator& c, const std::string& where, int peer) {
  if (peer < 0 || peer >= c.world_size() || peer == c.rank())
    throw std::invalid_argument(where + ": peer " + std::to_string(peer) + " must be another rank in [0, " +
                                std::to_string(c.world_size()) + ")");
}

}  // namespace

std::string communicator::where(const char* op) const {
  return std::string(op) + " (rank " + std::to_string(rank()) + " of " + std::to_string(world_size()) + ", " +
         backend() + ")";
}

void communicator::count(const char* op, int64_t full_bytes) {
  const int64_t b = ring_bytes_sent(op, full_bytes, world_size());
  stats_.bytes_sent += b;
  stats_.calls += 1;
  stats_.bytes_by_op[op] += b;
}

namespace {

std::string desc(const tensor& t) { return t.defined() ? t.str() : "an undefined tensor"; }

void check_tensor(const communicator& c, const std::string& where, const char* name, const tensor& t) {
  if (!t.defined()) throw std::invalid_argument(where + ": " + name + " is an undefined tensor");
  if (!c.takes(t.dev()))
    throw std::invalid_argument(where + ": " + name + " " + desc(t) + " is on " + t.dev().str() + ", but the " +
                                c.backend() + " communicator takes tensors on " + c.tensor_device().str() +
                                (c.backend() == "gloo" ? " only (gloo is CPU-only: use nccl for GPU tensors)" : ""));
}

bool overlap(const void* a, size_t na, const void* b, size_t nb) {
  auto pa = reinterpret_cast<uintptr_t>(a), pb = reinterpret_cast<uintptr_t>(b);
  return na > 0 && nb > 0 && pa < pb + nb && pb < pa + na;
}

}  // namespace

void communicator::all_gather(const tensor& send, tensor& recv) {
  const std::string w = where("all_gather");
  check_tensor(*this, w, "send", send);
  check_tensor(*this, w, "recv", recv);
  const int64_t world = world_size();
  if (send.type() != recv.type())
    throw std::invalid_argument(w + ": dtypes differ: send " + desc(send) + ", recv " + desc(recv));
  if (recv.numel() != world * send.numel())
    throw std::invalid_argument(w + ": recv " + desc(recv) + " must have world_size * send.numel() = " +
                                std::to_string(world) + " * " + std::to_string(send.numel()) + " = " +
                                std::to_string(world * send.numel()) + " elements; send is " + desc(send));
  const size_t nb = send.nbytes();
  const char* slot = static_cast<const char*>(recv.raw()) + static_cast<size_t>(rank()) * nb;
  const bool in_place = send.raw() == slot;
  if (!in_place && overlap(send.raw(), nb, recv.raw(), recv.nbytes()))
    throw std::invalid_argument(w + ": send " + desc(send) + " overlaps recv " + desc(recv) +
                                " (only in place is allowed: send exactly recv's elements [rank*n, (rank+1)*n))");
  if (world == 1) {
    if (!in_place) recv.copy_from(send);
  } else if (nb > 0) {
    do_all_gather(send, recv);
  }
  count("all_gather", static_cast<int64_t>(recv.nbytes()));
}

void communicator::reduce_scatter(const tensor& send, tensor& recv) {
  const std::string w = where("reduce_scatter");
  check_tensor(*this, w, "send", send);
  check_tensor(*this, w, "recv", recv);
  const int64_t world = world_size();
  if (send.type() != recv.type())
    throw std::invalid_argument(w + ": dtypes differ: send " + desc(send) + ", recv " + desc(recv));
  if (send.numel() != world * recv.numel())
    throw std::invalid_argument(w + ": send " + desc(send) + " must have world_size * recv.numel() = " +
                                std::to_string(world) + " * " + std::to_string(recv.numel()) + " = " +
                                std::to_string(world * recv.numel()) + " elements; recv is " + desc(recv));
  const size_t nb = recv.nbytes();
  const char* slot = static_cast<const char*>(send.raw()) + static_cast<size_t>(rank()) * nb;
  const bool in_place = recv.raw() == slot;
  if (!in_place && overlap(send.raw(), send.nbytes(), recv.raw(), nb))
    throw std::invalid_argument(w + ": recv " + desc(recv) + " overlaps send " + desc(send) +
                                " (only in place is allowed: recv exactly send's elements [rank*n, (rank+1)*n))");
  if (world == 1) {
    if (!in_place) recv.copy_from(send);
  } else if (nb > 0) {
    do_reduce_scatter(send, recv);
  }
  count("reduce_scatter", static_cast<int64_t>(send.nbytes()));
}

void communicator::all_reduce(tensor& x, reduce_op op) {
  const std::string w = where("all_reduce");
  check_tensor(*this, w, "x", x);
  if (op != reduce_op::sum && op != reduce_op::max) throw std::invalid_argument(w + ": unknown reduce_op");
  if (world_size() > 1 && x.numel() > 0) do_all_reduce(x, op);
  count("all_reduce", static_cast<int64_t>(x.nbytes()));
}

void communicator::broadcast(tensor& x, int root) {
  const std::string w = where("broadcast");
  check_tensor(*this, w, "x", x);
  if (root < 0 || root >= world_size())
    throw std::invalid_argument(w + ": root " + std::to_string(root) + " is not a rank in [0, " +
                                std::to_string(world_size()) + ")");
  if (world_size() > 1 && x.numel() > 0) do_broadcast(x, root);
  count("broadcast", static_cast<int64_t>(x.nbytes()));
}

void communicator::barrier() {
  if (world_size() > 1) do_barrier();
  count("barrier", 0);
}

// ------------------------------------------------------------------ factory

std::vector<std::string> available_backends() {
  std::vector<std::string> r{"inproc"};
#ifdef FLOWRUN_HAVE_GLOO
  r.push_back("gloo");
#endif
#ifdef FLOWRUN_HAVE_NCCL
  r.push_back("nccl");
#endif
  return r;
}

std::unique_ptr<communicator> make_communicator(const comm_options& o) {
  if (o.backend == "inproc") {
    auto group = o.group;
    if (!group) {
      if (o.world_size != 1)
        throw std::invalid_argument("make_communicator: the inproc backend with world_size " +
                                    std::to_string(o.world_size) +
                                    " needs comm_options.group (make_inproc_group) shared by the ranks' threads");
      group = make_inproc_group(1);
    }
    return inproc_communicator(group, o.rank, o.timeout);
  }
  if (o.backend == "gloo") {
    gloo_options g;
    g.rank = o.rank;
    g.world_size = o.world_size;
    g.store_dir = o.store_dir;
    g.kv = o.kv;
    g.prefix = o.prefix;
    g.hostname = o.hostname;
    g.iface = o.iface;
    g.timeout = o.timeout;
    return gloo_communicator(g);
  }
  if (o.backend == "nccl") {
    nccl_options n;
    n.rank = o.rank;
    n.world_size = o.world_size;
    n.device_index = o.device_index;
    n.timeout = o.timeout;
    n.kv = o.kv;
    n.key = o.prefix + "/nccl_unique_id";
    if (!n.kv && o.world_size > 1) {
      if (o.store_dir.empty())
        throw std::invalid_argument("make_communicator: the nccl backend needs comm_options.kv or store_dir");
      n.kv = std::make_shared<file_store>(o.store_dir);
    }
    return nccl_communicator(n);
  }
  std::string have;
  for (auto& b : available_backends()) have += (have.empty() ? "" : ", ") + b;
  throw std::invalid_argument("make_communicator: unknown backend '" + o.backend +
                              "' (choices: inproc, gloo, nccl; this build has: " + have + ")");
}

}  // namespace flowrun::comm

namespace flowrun::comm {

void communicator::send(const tensor& x, int peer) {
  const std::string w = where("send");
  if (!x.defined()) throw std::invalid_argument(w + ": x is an undefined tensor");
  check_tensor(*this, w, "x", x);
  check_peer(*this, w, peer);
  if (x.numel() > 0) do_send(x, peer);
  count("send", static_cast<int64_t>(x.nbytes()));
}

void communicator::recv(tensor& x, int peer) {
  const std::string w = where("recv");
  if (!x.defined()) throw std::invalid_argument(w + ": x is an undefined tensor");
  check_tensor(*this, w, "x", x);
  check_peer(*this, w, peer);
  if (x.numel() > 0) do_recv(x, peer);
  count("recv", static_cast<int64_t>(x.nbytes()));
}

namespace {

// send_tagged / recv_tagged: a defined tensor on the backend's device, another rank, a tag below 2^56.
void check_tagged(const communicator& c, const std::string& w, const tensor& x, int peer, uint64_t tag) {
  if (!x.defined()) throw std::invalid_argument(w + ": x is an undefined tensor");
  check_tensor(c, w, "x", x);
  check_peer(c, w, peer);
  if (tag >> 56) throw std::invalid_argument(w + ": tag " + std::to_string(tag) + " is not below 2^56");
}

}  // namespace

void communicator::send_tagged(const tensor& x, int peer, uint64_t tag) {
  check_tagged(*this, where("send_tagged"), x, peer, tag);
  if (x.numel() > 0) do_send_tagged(x, peer, tag);
}

void communicator::recv_tagged(tensor& x, int peer, uint64_t tag) {
  check_tagged(*this, where("recv_tagged"), x, peer, tag);
  if (x.numel() > 0) do_recv_tagged(x, peer, tag);
}

}  // namespace flowrun::comm
