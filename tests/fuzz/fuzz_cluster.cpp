// Fuzz target: what a cluster process reads from another (docs/scaling.md):
//   selector % 4 == 0: a payload of one of the registered message types
//     (actors/register.cpp, rlhf_codecs.cpp, zero_nodes.cpp; codec_io.h), as
//     job.cpp decodes it: for a bulk codec, the bulk header (bulk_plane.h)
//     first, then the tensors it announces (made here, as the bulk plane would
//     receive them, when they hold at most 2^16 elements), then the codec's
//     bytes. A payload that decodes must encode again, and re-decoding that
//     must give the same bytes (the codec is stable).
//   1: a node's replica counters (metrics.h apply_replica_counters);
//   2: a liveness datagram (liveness.h parse_liveness_datagram; secret
//     "fuzz-secret", context "fuzz", kind "ping");
//   3: the job request's graph, as a node daemon checks it (cluster.cpp:
//     parse_graph_string, then validate against every built-in node kind),
//     and the daemon's handshake (cluster_auth.h handshake_gate: hello, auth,
//     replays) with the input split at newlines into client nonce, daemon
//     nonce and proof.
// Input: the selector byte, then the bytes (for 0, the type is
// types[(selector / 4) % the number of types]).
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "actors/register.h"
#include "runtime/actor/bulk_plane.h"
#include "runtime/actor/cluster_auth.h"
#include "runtime/actor/liveness.h"
#include "runtime/actor/metrics.h"
#include "runtime/actor/node.h"
#include "runtime/actor/payload_codec.h"
#include "runtime/graph/parse.h"
#include "runtime/graph/validate.h"

using namespace flowrun;

namespace {

const char* const types[] = {"text",  "tokens",       "model", "rollouts", "scores", "experience",
                             "tick",  "prompt_batch", "stats", "summary",  "lm_batch"};
constexpr std::size_t n_types = sizeof types / sizeof types[0];

struct registries {
  graph::node_kind_registry kinds;
  actor::node_factory_registry factories;
  registries() { actors::register_builtin_nodes(kinds, factories); }
};

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "%s\n", what.c_str());
  __builtin_trap();
}

// The tensors a bulk header announces, filled with small values; false when too large to make here.
bool make_tensors(const actor::bulk_header& h, std::vector<tensor>& out) {
  std::uint64_t total = 0;
  for (const auto& s : h.shapes) {
    std::uint64_t n = 1;
    for (auto d : s) {
      if (d > (1 << 16)) return false;
      n *= static_cast<std::uint64_t>(d);
      if (n > (1 << 16)) return false;
    }
    total += n;
    if (total > (1 << 16)) return false;
  }
  for (std::size_t i = 0; i < h.types.size(); ++i) {
    tensor t = tensor::zeros(h.shapes[i], h.types[i]);
    out.push_back(std::move(t));
  }
  return true;
}

void payload_case(std::string_view type, const std::vector<char>& bytes) {
  std::vector<tensor> bulk;
  std::vector<char> meta = bytes;
  const bool is_bulk = actor::has_bulk_codec(type);
  if (is_bulk) {
    std::size_t at = 0;
    try {
      const actor::bulk_header h = actor::decode_bulk_header(bytes, at);
      if (!make_tensors(h, bulk)) return;
    } catch (const std::invalid_argument&) {
      return;
    }
    meta.assign(bytes.begin() + static_cast<std::ptrdiff_t>(at), bytes.end());
  }
  auto p = actor::decode_payload(type, meta, is_bulk ? &bulk : nullptr);
  if (!p) return;
  std::vector<tensor> bulk1, bulk2;
  auto e1 = actor::encode_payload(*p, &bulk1);
  if (!e1) fail(std::string("a '") + std::string(type) + "' payload decoded but does not encode: " + e1.error());
  auto p2 = actor::decode_payload(type, *e1, is_bulk ? &bulk1 : nullptr);
  if (!p2) fail(std::string("a '") + std::string(type) + "' payload does not decode what it encoded: " + p2.error());
  auto e2 = actor::encode_payload(*p2, &bulk2);
  if (!e2 || *e2 != *e1) fail(std::string("the '") + std::string(type) + "' codec is not stable over a round trip");
}

// The daemon's handshake (cluster_auth.h handshake_gate) fed a hello and an auth made of the input's three
// newline-separated parts: a forged auth is refused, a nonce is accepted at most once, and a client that knows the
// secret is still accepted afterwards (the gate's state was not corrupted).
void handshake_case(const std::string& text) {
  static actor::handshake_gate gate("fuzz-secret", 64);
  const auto a = text.find('\n'), b = a == std::string::npos ? a : text.find('\n', a + 1);
  const std::string client_nonce = text.substr(0, a);
  const std::string daemon_nonce = a == std::string::npos ? std::string() : text.substr(a + 1, b - a - 1);
  const std::string proof = b == std::string::npos ? std::string() : text.substr(b + 1);
  if (auto answer = gate.hello(client_nonce)) {
    if (!actor::is_nonce(client_nonce)) fail("hello answered a client nonce that is not a nonce");
    // a fuzzed proof for the nonce just issued: accepted only if it is the right one
    const bool right = proof == actor::cluster_proof("fuzz-secret", "client", client_nonce, answer->first);
    if (gate.auth(client_nonce, answer->first, proof).empty() != right) fail("auth judged a proof wrongly");
    if (gate.auth(client_nonce, answer->first, actor::cluster_proof("fuzz-secret", "client", client_nonce,
                                                                     answer->first)).empty())
      fail("a daemon nonce was accepted twice (replay)");
  }
  if (gate.auth(client_nonce, daemon_nonce, proof).empty() &&
      proof != actor::cluster_proof("fuzz-secret", "client", client_nonce, daemon_nonce))
    fail("auth accepted a wrong proof");
  const std::string honest = actor::random_nonce();
  auto ok = gate.hello(honest);
  if (!ok || !gate.auth(honest, ok->first, actor::cluster_proof("fuzz-secret", "client", honest, ok->first)).empty())
    fail("an honest client was refused after fuzzed handshakes");
  if (gate.pending() > 64) fail("the gate remembers more handshakes than its bound");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static registries reg;
  if (size == 0) return 0;
  const std::uint8_t sel = data[0];
  const std::vector<char> bytes(reinterpret_cast<const char*>(data + 1), reinterpret_cast<const char*>(data + size));
  switch (sel % 4) {
    case 0:
      payload_case(types[(sel / 4) % n_types], bytes);
      break;
    case 1: {
      actor::job_metrics m;
      const auto a = m.add_node("src", 2, true);
      m.add_node("sink", 1, false, true);
      m.add_edge("src.out -> sink.in", 1, 4);
      (void)a;
      if (actor::apply_replica_counters(m, bytes)) (void)m.snapshot();
      break;
    }
    case 2: {
      std::uint32_t index = 0;
      std::uint64_t seq = 0;
      (void)actor::parse_liveness_datagram("fuzz-secret", "fuzz", "ping", bytes.data(), bytes.size(), index, seq);
      break;
    }
    default: {
      const std::string text(bytes.begin(), bytes.end());
      auto parsed = graph::parse_graph_string(text, "<graph from the coordinator>");
      if (parsed.ok()) {
        graph::validate_options vo;
        vo.check_files = false;
        (void)graph::validate(parsed.spec, reg.kinds, vo);
      }
      const std::string proof = actor::cluster_proof("fuzz-secret", "client", "a", "b");
      (void)actor::constant_time_equal(text, proof);
      handshake_case(text);
      break;
    }
  }
  return 0;
}
