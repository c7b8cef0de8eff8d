// Byte codecs for the small control-like message types of DS-Chat's step 3
// (docs/scaling.md): they let the prompt loader and the PPO controller run on
// other cluster nodes than the models. Doubles travel as their IEEE-754 bits
// inside the byte buffer (never as CAF float fields: CAF 0.17 hangs on +inf
// and turns NaN into 1). Tensors in a prompt batch are token ids and masks:
// only integer tensors are encoded; a float tensor is refused (tensors of
// floats are for the communicator).
//
// "model", "rollouts", "scores" and "experience" hold models and float
// tensors: their codecs are bulk codecs (payload_codec.h). The bytes carry
// the integers, the doubles' bits, a model's config as JSON text, and for
// each tensor its index in the bulk list; the tensors themselves go through
// the cluster's bulk plane (bulk_plane.h, gloo), so models and scorers can
// run on other nodes than the generator and the trainers.
#include <cmath>
#include <cstring>
#include <string>
#include <stdexcept>
#include <type_traits>

#include <nlohmann/json.hpp>

#include "actors/codec_io.h"
#include "actors/register.h"
#include "actors/rlhf_types.h"
#include "models/config.h"
#include "runtime/actor/payload_codec.h"

namespace flowrun::actors {

namespace {

using codec_io::writer;
using codec_io::reader;
using codec_io::codec;
using codec_io::bulk_codec;

void put_experience(writer& w, const ppo::experience& e) {
  for (const tensor* t : {&e.prompts, &e.seq, &e.attention_mask, &e.logprobs, &e.ref_logprobs, &e.values,
                          &e.reward_score, &e.behav_logprobs})
    w.put_tensor(*t);
  w.put<std::uint64_t>(e.answer_len.size());
  for (auto n : e.answer_len) w.put<std::int64_t>(n);
  w.put<std::uint64_t>(e.source_rows.size());
  for (auto n : e.source_rows) w.put<std::int64_t>(n);
  w.put<std::uint64_t>(e.stop_ids.size());
  for (auto id : e.stop_ids) w.put<std::int32_t>(id);
  w.put(e.temperature);  // the float's bytes
}

void put_strings(writer& w, const std::vector<std::string>& v) {
  w.put<std::uint64_t>(v.size());
  for (const auto& x : v) w.put_string(x);
}

std::vector<std::string> get_strings(reader& r) {
  const auto n = r.get<std::uint64_t>();
  if (n > (1u << 24)) throw std::invalid_argument("implausible string count");
  std::vector<std::string> v;
  for (std::uint64_t i = 0; i < n; ++i) v.push_back(r.get_string());
  return v;
}

ppo::experience get_experience(reader& r) {
  ppo::experience e;
  for (tensor* t : {&e.prompts, &e.seq, &e.attention_mask, &e.logprobs, &e.ref_logprobs, &e.values, &e.reward_score,
                    &e.behav_logprobs})
    *t = r.get_tensor();
  const auto n = r.get<std::uint64_t>();
  if (n > (1u << 24)) throw std::invalid_argument("implausible answer_len count");
  for (std::uint64_t i = 0; i < n; ++i) e.answer_len.push_back(r.get<std::int64_t>());
  const auto k = r.get<std::uint64_t>();
  if (k > (1u << 24)) throw std::invalid_argument("implausible source_rows count");
  for (std::uint64_t i = 0; i < k; ++i) e.source_rows.push_back(r.get<std::int64_t>());
  const auto s = r.get<std::uint64_t>();
  if (s > (1u << 20)) throw std::invalid_argument("implausible stop_ids count");
  for (std::uint64_t i = 0; i < s; ++i) e.stop_ids.push_back(r.get<std::int32_t>());
  e.temperature = r.get<float>();
  if (!(e.temperature > 0.0f) || !std::isfinite(e.temperature))
    throw std::invalid_argument("experience: temperature " + std::to_string(e.temperature) + " is not > 0");
  return e;
}

void put_rollouts(writer& w, const rollout_msg& m) {
  w.put<std::uint8_t>(m.exp ? 1 : 0);
  if (m.exp) put_experience(w, *m.exp);
  w.put(m.iteration);
  w.put<std::uint8_t>(m.eval ? 1 : 0);
  w.put(m.generate_seconds);  // the double's bytes
  w.put(m.generated_tokens);
  w.put(m.batch);
  w.put<std::uint8_t>(m.checkpoint ? 1 : 0);
  w.put(m.group_size);
  w.put(m.iterations);
  w.put(m.generated_rows);
  put_strings(w, m.references);
  w.put(m.policy_version);
  w.put(m.weights_wait_seconds);
  w.put(m.max_staleness);
  w.put<std::uint8_t>(m.drop_stale ? 1 : 0);
  w.put<std::uint8_t>(m.save_only ? 1 : 0);
}

rollout_msg get_rollouts(reader& r) {
  rollout_msg m;
  if (r.get<std::uint8_t>()) m.exp = std::make_shared<const ppo::experience>(get_experience(r));
  m.iteration = r.get<std::int64_t>();
  m.eval = r.get<std::uint8_t>() != 0;
  m.generate_seconds = r.get<double>();
  m.generated_tokens = r.get<std::int64_t>();
  m.batch = r.get<std::int64_t>();
  m.checkpoint = r.get<std::uint8_t>() != 0;
  m.group_size = r.get<std::int64_t>();
  m.iterations = r.get<std::int64_t>();
  m.generated_rows = r.get<std::int64_t>();
  m.references = get_strings(r);
  m.policy_version = r.get<std::int64_t>();
  m.weights_wait_seconds = r.get<double>();
  m.max_staleness = r.get<std::int64_t>();
  m.drop_stale = r.get<std::uint8_t>() != 0;
  m.save_only = r.get<std::uint8_t>() != 0;
  return m;
}

}  // namespace

void register_rlhf_codecs() {
  // A model: its config as JSON text, then its weights. The owner keeps
  // training its live model after it sent it (the hybrid engine's weights), so
  // the tensors are cloned here, at send time.
  actor::register_payload_codec(
      "model", bulk_codec<model_msg>(
                   [](writer& w, const model_msg& m) {
                     if (!m.model) throw std::invalid_argument("an empty model handle");
                     if (m.model->has_lora())
                       throw std::invalid_argument(
                           "a model with LoRA enabled cannot cross cluster nodes yet: place the receiving node on "
                           "the same node as the model's owner (on = ...), or train without LoRA "
                           "(actor_lora_dim / critic_lora_dim = 0)");
                     nlohmann::json j = m.model->config();
                     w.put(m.version);
                     w.put<std::uint8_t>(static_cast<std::uint8_t>(m.format));
                     w.put_string(m.tokenizer);
                     w.put_string(j.dump());
                     w.put<std::uint8_t>(m.model->has_value_head() ? 1 : 0);
                     w.put_tensor(m.model->w().flat.clone());
                     if (m.model->has_value_head()) w.put_tensor(m.model->w().v_head.clone());
                     w.put_string(m.source);
                   },
                   [](reader& r) {
                     model_msg m;
                     m.version = r.get<std::int64_t>();
                     const auto format = r.get<std::uint8_t>();
                     if (format > static_cast<std::uint8_t>(model_format::hf))
                       throw std::invalid_argument("unknown model format " + std::to_string(format));
                     m.format = static_cast<model_format>(format);
                     m.tokenizer = r.get_string();
                     const model_config cfg = nlohmann::json::parse(r.get_string()).get<model_config>();
                     const bool value_head = r.get<std::uint8_t>() != 0;
                     // The config and the weights' size are checked before the model is allocated: a malformed
                     // message must not divide by zero heads or ask for gigabytes.
                     cfg.validate();
                     const tensor flat = r.get_tensor();
                     if (!flat.defined() || flat.numel() != cfg.num_parameters() || flat.type() != dtype::f32)
                       throw std::invalid_argument("the weights do not fit the config (" +
                                                   (flat.defined() ? flat.str() : std::string("none")) + " for " +
                                                   cfg.summary() + ")");
                     auto d = std::make_shared<decoder>(cfg);
                     if (flat.numel() != d->w().flat.numel() || flat.type() != d->w().flat.type())
                       throw std::invalid_argument("the weights do not fit the config (" + flat.str() + " for " +
                                                   d->w().flat.str() + ")");
                     d->w().flat.copy_from(flat);
                     if (value_head) {
                       d->add_value_head();
                       const tensor v = r.get_tensor();
                       if (!v.defined() || v.numel() != d->w().v_head.numel())
                         throw std::invalid_argument("the value head does not fit the config");
                       d->w().v_head.copy_from(v.view(d->w().v_head.shape()));
                     }
                     m.model = std::move(d);
                     m.snapshot = true;  // this process's own copy: its owner trains elsewhere
                     m.source = r.get_string();
                     return m;
                   }));
  actor::register_payload_codec("rollouts", bulk_codec<rollout_msg>(put_rollouts, get_rollouts));
  actor::register_payload_codec("scores", bulk_codec<score_msg>(
                                              [](writer& w, const score_msg& m) {
                                                if (!m.rollouts) throw std::invalid_argument("scores without rollouts");
                                                put_rollouts(w, *m.rollouts);
                                                w.put_tensor(m.value);
                                              },
                                              [](reader& r) {
                                                score_msg m;
                                                m.rollouts = std::make_shared<const rollout_msg>(get_rollouts(r));
                                                m.value = r.get_tensor();
                                                return m;
                                              }));
  actor::register_payload_codec(
      "experience", bulk_codec<experience_batch>(
                        [](writer& w, const experience_batch& b) {
                          w.put(b.iteration);
                          w.put<std::uint8_t>(b.checkpoint ? 1 : 0);
                          w.put(b.max_staleness);
                          w.put<std::uint8_t>(b.drop_stale ? 1 : 0);
                          w.put<std::uint64_t>(b.items.size());
                          for (const auto& x : b.items) {
                            w.put<std::uint8_t>(x.exp ? 1 : 0);
                            if (x.exp) put_experience(w, *x.exp);
                            w.put_tensor(x.advantages);
                            w.put_tensor(x.returns);
                            w.put(x.iteration);
                            w.put(x.policy_version);
                          }
                        },
                        [](reader& r) {
                          experience_batch b;
                          b.iteration = r.get<std::int64_t>();
                          b.checkpoint = r.get<std::uint8_t>() != 0;
                          b.max_staleness = r.get<std::int64_t>();
                          b.drop_stale = r.get<std::uint8_t>() != 0;
                          const auto n = r.get<std::uint64_t>();
                          if (n > 4096) throw std::invalid_argument("implausible experience count");
                          for (std::uint64_t i = 0; i < n; ++i) {
                            experience_msg x;
                            if (r.get<std::uint8_t>()) x.exp = std::make_shared<const ppo::experience>(get_experience(r));
                            x.advantages = r.get_tensor();
                            x.returns = r.get_tensor();
                            x.iteration = r.get<std::int64_t>();
                            x.policy_version = r.get<std::int64_t>();
                            b.items.push_back(std::move(x));
                          }
                          return b;
                        }));
  actor::register_payload_codec("tick", codec<std::int64_t>([](writer& w, const std::int64_t& x) { w.put(x); },
                                                            [](reader& r) { return r.get<std::int64_t>(); }));
  actor::register_payload_codec(
      "prompt_batch", codec<prompt_msg>(
                          [](writer& w, const prompt_msg& m) {
                            w.put_int_tensor(m.ids);
                            w.put_int_tensor(m.mask);
                            w.put(m.iteration);
                            w.put<std::uint8_t>(m.eval ? 1 : 0);
                            w.put(m.policy_version);
                            w.put<std::uint8_t>(m.checkpoint ? 1 : 0);
                            put_strings(w, m.references);
                            w.put(m.max_staleness);
                            w.put<std::uint8_t>(m.drop_stale ? 1 : 0);
                            w.put<std::uint8_t>(m.last ? 1 : 0);
                            w.put(m.longest_prompt);
                            w.put(m.iterations);
                            w.put<std::uint8_t>(m.save_only ? 1 : 0);
                          },
                          [](reader& r) {
                            prompt_msg m;
                            m.ids = r.get_int_tensor();
                            m.mask = r.get_int_tensor();
                            m.iteration = r.get<std::int64_t>();
                            m.eval = r.get<std::uint8_t>() != 0;
                            m.policy_version = r.get<std::int64_t>();
                            m.checkpoint = r.get<std::uint8_t>() != 0;
                            m.references = get_strings(r);
                            m.max_staleness = r.get<std::int64_t>();
                            m.drop_stale = r.get<std::uint8_t>() != 0;
                            m.last = r.get<std::uint8_t>() != 0;
                            m.longest_prompt = r.get<std::int64_t>();
                            m.iterations = r.get<std::int64_t>();
                            m.save_only = r.get<std::uint8_t>() != 0;
                            return m;
                          }));
  actor::register_payload_codec("stats", codec<stats_msg>(
                                             [](writer& w, const stats_msg& s) {
                                               w.put(s.iteration);
                                               w.put(s.loss);  // the double's bytes
                                               w.put(s.grad_norm);
                                               w.put(s.seconds);
                                               w.put(s.unsup_loss);
                                               w.put(s.lr);
                                               w.put<std::uint8_t>(s.scheduled ? 1 : 0);
                                               w.put(s.tokens);
                                               w.put(s.gather_bytes);
                                               w.put(s.gather_theory_bytes);
                                               w.put<std::uint8_t>(s.updated ? 1 : 0);
                                               w.put(s.stale_dropped);
                                               w.put(s.staleness);
                                               w.put(s.policy_version);
                                               w.put(s.snapshot_bytes);
                                             },
                                             [](reader& r) {
                                               stats_msg s;
                                               s.iteration = r.get<std::int64_t>();
                                               s.loss = r.get<double>();
                                               s.grad_norm = r.get<double>();
                                               s.seconds = r.get<double>();
                                               s.unsup_loss = r.get<double>();
                                               s.lr = r.get<double>();
                                               s.scheduled = r.get<std::uint8_t>() != 0;
                                               s.tokens = r.get<std::int64_t>();
                                               s.gather_bytes = r.get<std::int64_t>();
                                               s.gather_theory_bytes = r.get<std::int64_t>();
                                               s.updated = r.get<std::uint8_t>() != 0;
                                               s.stale_dropped = r.get<std::int64_t>();
                                               s.staleness = r.get<std::int64_t>();
                                               s.policy_version = r.get<std::int64_t>();
                                               s.snapshot_bytes = r.get<std::int64_t>();
                                               return s;
                                             }));
  actor::register_payload_codec("summary", codec<summary_msg>(
                                               [](writer& w, const summary_msg& s) {
                                                 w.put(s.iteration);
                                                 w.put<std::uint8_t>((s.eval ? 1 : 0) | (s.dropped ? 2 : 0) |
                                                                     (s.trains ? 4 : 0) | (s.with_critic ? 8 : 0) |
                                                                     (s.saves ? 16 : 0));
                                                 w.put(s.reward_mean);
                                                 w.put(s.kl_mean);
                                                 w.put(s.answer_len_mean);
                                                 w.put(s.generate_seconds);
                                                 w.put(s.generated_tokens);
                                                 w.put(s.rows);
                                                 w.put(s.reward_stderr);
                                                 w.put(s.groups);
                                                 w.put(s.groups_kept);
                                                 w.put(s.policy_version);
                                                 w.put(s.weights_wait_seconds);
                                               },
                                               [](reader& r) {
                                                 summary_msg s;
                                                 s.iteration = r.get<std::int64_t>();
                                                 const auto f = r.get<std::uint8_t>();
                                                 s.eval = f & 1;
                                                 s.dropped = f & 2;
                                                 s.trains = f & 4;
                                                 s.with_critic = f & 8;
                                                 s.saves = f & 16;
                                                 s.reward_mean = r.get<double>();
                                                 s.kl_mean = r.get<double>();
                                                 s.answer_len_mean = r.get<double>();
                                                 s.generate_seconds = r.get<double>();
                                                 s.generated_tokens = r.get<std::int64_t>();
                                                 s.rows = r.get<std::int64_t>();
                                                 s.reward_stderr = r.get<double>();
                                                 s.groups = r.get<std::int64_t>();
                                                 s.groups_kept = r.get<std::int64_t>();
                                                 s.policy_version = r.get<std::int64_t>();
                                                 s.weights_wait_seconds = r.get<double>();
                                                 return s;
                                               }));
}

}  // namespace flowrun::actors
