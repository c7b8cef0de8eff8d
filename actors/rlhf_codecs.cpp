// Byte codecs for the small control-like message types of DS-Chat's step 3
// (docs/scaling.md): they let the prompt loader and the PPO controller run on
// other cluster nodes than the models. Doubles travel as their IEEE-754 bits
// inside the byte buffer (never as CAF float fields: CAF 0.17 hangs on +inf
// and turns NaN into 1). Tensors in a prompt batch are token ids and masks:
// only integer tensors are encoded; a float tensor is refused (tensors of
// floats are for the communicator). "model", "rollouts", "scores" and
// "experience" hold models and float tensors: no codec, they cannot cross.
#include <cstring>
#include <stdexcept>
#include <type_traits>

#include "actors/register.h"
#include "actors/rlhf_types.h"
#include "runtime/actor/payload_codec.h"

namespace flowrun::actors {

namespace {

struct writer {
  std::vector<char> out;
  template <class T>
  void put(T x) {
    static_assert(std::is_trivially_copyable_v<T>);
    const auto at = out.size();
    out.resize(at + sizeof(T));
    std::memcpy(out.data() + at, &x, sizeof(T));
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

struct reader {
  const std::vector<char>& in;
  std::size_t at = 0;
  template <class T>
  T get() {
    if (at + sizeof(T) > in.size()) throw std::invalid_argument("truncated message");
    T x;
    std::memcpy(&x, in.data() + at, sizeof(T));
    at += sizeof(T);
    return x;
  }
  tensor get_int_tensor() {
    const auto t = get<std::uint8_t>();
    if (t == 255) return tensor{};
    if (t != static_cast<std::uint8_t>(dtype::i32) && t != static_cast<std::uint8_t>(dtype::i64))
      throw std::invalid_argument("not an integer tensor");
    const auto dims = get<std::uint32_t>();
    if (dims > 8) throw std::invalid_argument("too many dimensions");
    shape_t shape;
    for (std::uint32_t i = 0; i < dims; ++i) shape.push_back(get<std::int64_t>());
    tensor out = tensor::empty(shape, static_cast<dtype>(t));
    if (at + out.nbytes() > in.size()) throw std::invalid_argument("truncated tensor");
    if (out.nbytes()) std::memcpy(out.raw(), in.data() + at, out.nbytes());
    at += out.nbytes();
    return out;
  }
  void done() const {
    if (at != in.size()) throw std::invalid_argument("trailing bytes");
  }
};

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

}  // namespace

void register_rlhf_codecs() {
  actor::register_payload_codec("tick", codec<std::int64_t>([](writer& w, const std::int64_t& x) { w.put(x); },
                                                            [](reader& r) { return r.get<std::int64_t>(); }));
  actor::register_payload_codec(
      "prompt_batch", codec<prompt_msg>(
                          [](writer& w, const prompt_msg& m) {
                            w.put_int_tensor(m.ids);
                            w.put_int_tensor(m.mask);
                            w.put(m.iteration);
                            w.put<std::uint8_t>(m.eval ? 1 : 0);
                          },
                          [](reader& r) {
                            prompt_msg m;
                            m.ids = r.get_int_tensor();
                            m.mask = r.get_int_tensor();
                            m.iteration = r.get<std::int64_t>();
                            m.eval = r.get<std::uint8_t>() != 0;
                            return m;
                          }));
  actor::register_payload_codec("stats", codec<stats_msg>(
                                             [](writer& w, const stats_msg& s) {
                                               w.put(s.iteration);
                                               w.put(s.loss);  // the double's bytes
                                               w.put(s.grad_norm);
                                               w.put(s.seconds);
                                               w.put(s.unsup_loss);
                                               w.put(s.tokens);
                                             },
                                             [](reader& r) {
                                               stats_msg s;
                                               s.iteration = r.get<std::int64_t>();
                                               s.loss = r.get<double>();
                                               s.grad_norm = r.get<double>();
                                               s.seconds = r.get<double>();
                                               s.unsup_loss = r.get<double>();
                                               s.tokens = r.get<std::int64_t>();
                                               return s;
                                             }));
  actor::register_payload_codec("summary", codec<summary_msg>(
                                               [](writer& w, const summary_msg& s) {
                                                 w.put(s.iteration);
                                                 w.put<std::uint8_t>((s.eval ? 1 : 0) | (s.dropped ? 2 : 0) |
                                                                     (s.trains ? 4 : 0));
                                                 w.put(s.reward_mean);
                                                 w.put(s.kl_mean);
                                                 w.put(s.answer_len_mean);
                                                 w.put(s.generate_seconds);
                                                 w.put(s.generated_tokens);
                                                 w.put(s.rows);
                                               },
                                               [](reader& r) {
                                                 summary_msg s;
                                                 s.iteration = r.get<std::int64_t>();
                                                 const auto f = r.get<std::uint8_t>();
                                                 s.eval = f & 1;
                                                 s.dropped = f & 2;
                                                 s.trains = f & 4;
                                                 s.reward_mean = r.get<double>();
                                                 s.kl_mean = r.get<double>();
                                                 s.answer_len_mean = r.get<double>();
                                                 s.generate_seconds = r.get<double>();
                                                 s.generated_tokens = r.get<std::int64_t>();
                                                 s.rows = r.get<std::int64_t>();
                                                 return s;
                                               }));
}

}  // namespace flowrun::actors
