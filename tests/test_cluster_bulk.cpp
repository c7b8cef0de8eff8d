// The bulk plane of cluster runs (runtime/actor/bulk_plane.h, docs/scaling.md):
// tagged point to point over gloo, the header that announces a payload's
// tensors, the plane itself between two ranks, and the bulk codecs of DS-Chat's
// step-3 message types (actors/rlhf_codecs.cpp). The end-to-end check over
// real processes is tests/cluster_rlhf_small.sh.
#include <doctest/doctest.h>

#include <bit>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <thread>

#include <nlohmann/json.hpp>

#include "actors/codec_io.h"
#include "actors/register.h"
#include "actors/rlhf_types.h"
#include "models/config.h"
#include "runtime/actor/bulk_plane.h"
#include "runtime/actor/payload_codec.h"
#include "runtime/comm/communicator.h"
#include "runtime/comm/store.h"

using namespace flowrun;
using namespace std::chrono_literals;

namespace {

bool same_bits(const tensor& a, const tensor& b) {
  if (a.defined() != b.defined()) return false;
  if (!a.defined()) return true;
  return a.type() == b.type() && a.shape() == b.shape() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

tensor floats(const shape_t& s, float start) {
  int64_t n = 1;
  for (auto d : s) n *= d;
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = start + 0.25f * static_cast<float>(i);
  return tensor::from_floats(s, v);
}

tensor ints(const shape_t& s, int32_t start) {
  int64_t n = 1;
  for (auto d : s) n *= d;
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = start + static_cast<int32_t>(i);
  return tensor::from_ints(s, v);
}

/// Two gloo ranks that are threads of this process, rendezvousing in memory.
std::pair<std::shared_ptr<comm::communicator>, std::shared_ptr<comm::communicator>> gloo_pair() {
  auto kv = std::make_shared<comm::memory_store>();
  std::shared_ptr<comm::communicator> c0, c1;
  std::thread t([&] {
    comm::gloo_options o;
    o.rank = 1;
    o.world_size = 2;
    o.kv = kv;
    o.timeout = 20s;
    c1 = comm::gloo_communicator(o);
  });
  comm::gloo_options o;
  o.world_size = 2;
  o.kv = kv;
  o.timeout = 20s;
  c0 = comm::gloo_communicator(o);
  t.join();
  return {c0, c1};
}

/// encode -> bytes + tensors -> decode, as the runtime does across processes
/// (the tensors are copied, as the plane's receiver gets fresh ones).
actor::payload round_trip(const actor::payload& p) {
  std::vector<tensor> bulk;
  auto bytes = actor::encode_payload(p, &bulk);
  REQUIRE_MESSAGE(bytes, (bytes ? "" : bytes.error()));
  std::vector<tensor> received;
  for (const auto& t : bulk) received.push_back(t.clone());
  auto back = actor::decode_payload(p.type(), *bytes, &received);
  REQUIRE_MESSAGE(back, (back ? "" : back.error()));
  return *back;
}

ppo::experience sample_experience() {
  ppo::experience e;
  e.prompts = ints({2, 3}, 5);
  e.seq = ints({2, 7}, 5);
  e.attention_mask = ints({2, 7}, 0);
  e.logprobs = floats({2, 6}, -3.0f);
  e.values = floats({2, 6}, 0.5f);
  e.answer_len = {4, 3};
  e.stop_ids = {2, 151645};  // the answers' stop ids: the scorers' text leaves a final one out
  e.temperature = 0.7f;  // the sampling temperature: the receiving scorers take log-probs at it
  return e;  // ref_logprobs and reward_score stay undefined
}

}  // namespace

TEST_CASE("cluster bulk: the header round trips, and malformed headers are refused") {
  actor::bulk_header h;
  h.first_tag = 77;
  h.types = {dtype::f32, dtype::i32, dtype::bf16};
  h.shapes = {{2, 3}, {5}, {}};
  std::vector<char> bytes{'x'};
  actor::encode_bulk_header(h, bytes);
  bytes.push_back('m');
  std::size_t at = 1;
  auto back = actor::decode_bulk_header(bytes, at);
  CHECK(back.first_tag == 77);
  CHECK(back.types == h.types);
  CHECK(back.shapes == h.shapes);
  CHECK(at == bytes.size() - 1);  // the codec's bytes follow
  at = 1;
  std::vector<char> cut(bytes.begin(), bytes.begin() + 12);
  CHECK_THROWS_WITH_AS(actor::decode_bulk_header(cut, at), doctest::Contains("truncated"), std::invalid_argument);
  std::vector<char> bad;
  actor::bulk_header one;
  one.types = {static_cast<dtype>(9)};
  one.shapes = {{1}};
  actor::encode_bulk_header(one, bad);
  at = 0;
  CHECK_THROWS_WITH_AS(actor::decode_bulk_header(bad, at), doctest::Contains("unknown dtype 9"), std::invalid_argument);

  // Sizes the receiver would allocate before the bytes arrive: bounded in all (max_bulk_payload_bytes = 64 GiB),
  // including products that overflow 64 bits (2^40 x 2^40) and many tensors that are each under the bound.
  auto refused = [](actor::bulk_header x) {
    std::vector<char> b;
    actor::encode_bulk_header(x, b);
    std::size_t a = 0;
    CHECK_THROWS_WITH_AS(actor::decode_bulk_header(b, a), doctest::Contains("bytes of tensors"), std::invalid_argument);
  };
  const std::int64_t big = std::int64_t{1} << 40;
  refused({0, {dtype::f32}, {{big, big}}});                               // 2^80 elements: overflows
  refused({0, {dtype::f32}, {{std::int64_t{1} << 34, 2}}});               // 2^35 x 4 bytes = 128 GiB
  refused({0, std::vector<dtype>(9, dtype::i64), std::vector<shape_t>(9, shape_t{1 << 30})});  // 9 x 8 GiB = 72 GiB
  actor::bulk_header edge{0, {dtype::f32}, {{std::int64_t{1} << 34}}};   // exactly 64 GiB: announced, allowed
  std::vector<char> eb;
  actor::encode_bulk_header(edge, eb);
  at = 0;
  CHECK(actor::decode_bulk_header(eb, at).shapes == edge.shapes);
  actor::bulk_header zero{0, {dtype::f32}, {{0, big}}};                  // an empty tensor of a large width
  std::vector<char> zb;
  actor::encode_bulk_header(zero, zb);
  at = 0;
  CHECK(actor::decode_bulk_header(zb, at).shapes == zero.shapes);
}

#ifdef FLOWRUN_HAVE_GLOO
TEST_CASE("cluster bulk: tagged gloo sends match by tag, from several threads, in any order") {
  auto [c0, c1] = gloo_pair();
  // rank 0 sends three tensors on three threads; rank 1 receives them in reverse order
  std::vector<std::thread> senders;
  for (int k = 0; k < 3; ++k)
    senders.emplace_back([&, k] { c0->send_tagged(floats({4}, 10.0f * static_cast<float>(k)), 1, 500 + k); });
  for (int k = 2; k >= 0; --k) {
    auto got = tensor::zeros({4});
    c1->recv_tagged(got, 0, 500 + k);
    CHECK(same_bits(got, floats({4}, 10.0f * static_cast<float>(k))));
  }
  for (auto& t : senders) t.join();
  CHECK(c0->stats().calls == 0);  // the caller counts tagged transfers
  CHECK_THROWS_WITH_AS(c0->send_tagged(floats({1}, 0), 1, std::uint64_t{1} << 56), doctest::Contains("2^56"),
                       std::invalid_argument);
  CHECK_THROWS_AS(c0->send_tagged(floats({1}, 0), 0, 1), std::invalid_argument);  // to itself
  // inproc has no tagged point to point
  auto in0 = comm::inproc_communicator(comm::make_inproc_group(2), 0);
  CHECK_THROWS_WITH_AS(in0->send_tagged(floats({1}, 0), 1, 1), doctest::Contains("not supported by this backend"),
                       std::runtime_error);
}

TEST_CASE("cluster bulk: the plane moves a payload's tensors between two ranks, receivers may take them out of order") {
  auto [c0, c1] = gloo_pair();
  actor::bulk_plane p0(c0), p1(c1);
  CHECK(p0.rank() == 0);
  CHECK(p1.world_size() == 2);
  const std::vector<tensor> first{floats({3, 2}, 1.0f), ints({5}, -2)};
  const std::vector<tensor> second{floats({1}, std::numeric_limits<float>::infinity())};
  const auto h1 = p0.send(1, first);
  const auto h2 = p0.send(1, second);
  CHECK(h1.first_tag != h2.first_tag);
  CHECK(h1.types == std::vector<dtype>{dtype::f32, dtype::i32});
  // the second payload is taken first: the first one's sends wait in their own thread
  auto got2 = p1.recv(0, h2);
  auto got1 = p1.recv(0, h1);
  REQUIRE(got1.size() == 2);
  CHECK(same_bits(got1[0], first[0]));
  CHECK(same_bits(got1[1], first[1]));
  REQUIRE(got2.size() == 1);
  CHECK(std::isinf(got2[0].item(0)));  // floats travel as bytes: +inf stays +inf
  const auto s0 = p0.stats(), s1 = p1.stats();
  CHECK(s0.sends == 2);
  CHECK(s0.tensors_sent == 3);
  CHECK(s0.bytes_sent == 6 * 4 + 5 * 4 + 4);
  CHECK(s1.recvs == 2);
  CHECK(s1.bytes_received == s0.bytes_sent);
  CHECK(p0.failed_sends() == 0);
}
#endif

TEST_CASE("cluster bulk: step 3's models, rollouts, scores and experience cross as bytes + tensors, bit for bit") {
  actors::register_rlhf_codecs();
  for (const char* t : {"model", "rollouts", "scores", "experience"}) {
    CAPTURE(t);
    CHECK(actor::has_bulk_codec(t));
  }
  CHECK_FALSE(actor::has_bulk_codec("prompt_batch"));  // integers only: inside the message

  SUBCASE("model, with a value head; the weights are a copy taken at send time") {
    auto m = std::make_shared<decoder>(stories260k_config());
    m->init_random(3);
    m->add_value_head(4);
    actors::model_msg msg{m, 5, model_format::hf, "/models/opt-tiny", /*snapshot=*/false, ""};
    msg.source = "/models/opt-tiny-src";  // its stop ids go with a trainer's output on the other process
    auto p = actor::payload::make("model", std::move(msg));
    std::vector<tensor> bulk;
    auto bytes = actor::encode_payload(p, &bulk);
    REQUIRE(bytes);
    REQUIRE(bulk.size() == 2);
    const tensor sent = bulk[0].clone();
    m->w().flat.data<float>()[0] += 1.0f;  // the owner trains on after sending
    CHECK(same_bits(bulk[0], sent));     // the payload's tensor did not change
    auto back = actor::decode_payload("model", *bytes, &bulk);
    REQUIRE(back);
    const auto& mm = back->as<actors::model_msg>();
    CHECK(mm.version == 5);
    CHECK(mm.format == model_format::hf);  // where it came from: the policy saves in this format
    CHECK(mm.tokenizer == "/models/opt-tiny");
    CHECK(mm.source == "/models/opt-tiny-src");
    CHECK(mm.model != m);
    CHECK(mm.model->config().dim == m->config().dim);
    CHECK(mm.model->config().norm_eps == m->config().norm_eps);
    CHECK(mm.model->has_value_head());
    CHECK(same_bits(mm.model->w().flat, sent));
    CHECK(same_bits(mm.model->w().v_head, m->w().v_head));
    // weights that do not fit the config are refused
    std::vector<tensor> wrong{floats({3}, 0), bulk[1]};
    auto bad = actor::decode_payload("model", *bytes, &wrong);
    REQUIRE_FALSE(bad);
    CHECK(bad.error().find("do not fit the config") != std::string::npos);
    // a LoRA model cannot cross yet
    lora_config lc;
    lc.lora_r = 2;
    m->enable_lora(lc);
    std::vector<tensor> none;
    auto lora = actor::encode_payload(actor::payload::make("model", actors::model_msg{m, 0, model_format::llama2c, "", false, ""}), &none);
    REQUIRE_FALSE(lora);
    CHECK(lora.error().find("LoRA") != std::string::npos);
  }

  SUBCASE("rollouts and scores, with every field; a batch with no rows") {
    actors::rollout_msg r;
    r.exp = std::make_shared<const ppo::experience>(sample_experience());
    r.iteration = 3;
    r.eval = true;
    r.generate_seconds = std::numeric_limits<double>::infinity();
    r.generated_tokens = 7;
    r.batch = 41;
    r.iterations = 20;       // the trainers' schedule length
    r.generated_rows = 6;
    auto back = round_trip(actor::payload::make("rollouts", r));
    const auto& rb = back.as<actors::rollout_msg>();
    CHECK(rb.iteration == 3);
    CHECK(rb.eval);
    CHECK(std::bit_cast<std::uint64_t>(rb.generate_seconds) == std::bit_cast<std::uint64_t>(r.generate_seconds));
    CHECK(rb.generated_tokens == 7);
    CHECK(rb.batch == 41);
    CHECK(rb.iterations == 20);
    CHECK(rb.generated_rows == 6);
    REQUIRE(rb.exp);
    CHECK(same_bits(rb.exp->prompts, r.exp->prompts));
    CHECK(same_bits(rb.exp->seq, r.exp->seq));
    CHECK(same_bits(rb.exp->attention_mask, r.exp->attention_mask));
    CHECK(same_bits(rb.exp->logprobs, r.exp->logprobs));
    CHECK(same_bits(rb.exp->values, r.exp->values));
    CHECK_FALSE(rb.exp->ref_logprobs.defined());
    CHECK(rb.exp->answer_len == r.exp->answer_len);
    CHECK(rb.exp->stop_ids == r.exp->stop_ids);
    CHECK(rb.exp->temperature == 0.7f);

    actors::rollout_msg dropped;  // every answer too short: no experience
    dropped.batch = 9;
    auto db = round_trip(actor::payload::make("rollouts", dropped));
    CHECK_FALSE(db.as<actors::rollout_msg>().exp);
    CHECK(db.as<actors::rollout_msg>().batch == 9);
    CHECK_FALSE(db.as<actors::rollout_msg>().save_only);
    actors::rollout_msg save;  // a drain's save (prompt_msg::save_only): no rows, the trainers save
    save.save_only = save.checkpoint = true;
    save.iteration = 4;
    const auto& svb = round_trip(actor::payload::make("rollouts", save)).as<actors::rollout_msg>();
    CHECK(svb.save_only);
    CHECK(svb.checkpoint);
    CHECK(svb.iteration == 4);

    actors::score_msg s;
    s.rollouts = std::make_shared<const actors::rollout_msg>(r);
    s.value = floats({2}, std::numeric_limits<float>::quiet_NaN());
    auto sb = round_trip(actor::payload::make("scores", s));
    const auto& sm = sb.as<actors::score_msg>();
    CHECK(sm.rollouts->batch == 41);
    CHECK(same_bits(sm.value, s.value));  // NaN stays NaN (CAF 0.17 would make it 1)
    CHECK(std::isnan(sm.value.item(0)));
  }

  SUBCASE("experience batches") {
    actors::experience_batch b;
    b.iteration = 2;
    for (int i = 0; i < 2; ++i) {
      actors::experience_msg x;
      x.exp = std::make_shared<const ppo::experience>(sample_experience());
      x.advantages = floats({2, 4}, static_cast<float>(i));
      x.returns = floats({2, 4}, -static_cast<float>(i));
      x.iteration = i;
      b.items.push_back(x);
    }
    auto back = round_trip(actor::payload::make("experience", b));
    const auto& bb = back.as<actors::experience_batch>();
    CHECK(bb.iteration == 2);
    REQUIRE(bb.items.size() == 2);
    for (int i = 0; i < 2; ++i) {
      CHECK(bb.items[i].iteration == i);
      CHECK(same_bits(bb.items[i].advantages, b.items[i].advantages));
      CHECK(same_bits(bb.items[i].returns, b.items[i].returns));
      CHECK(same_bits(bb.items[i].exp->seq, b.items[i].exp->seq));
    }
  }

  SUBCASE("without the plane, or with a tensor index out of range, a bulk payload is an error") {
    actors::score_msg s;
    s.rollouts = std::make_shared<const actors::rollout_msg>();
    s.value = floats({1}, 0);
    auto no_plane = actor::encode_payload(actor::payload::make("scores", s));
    REQUIRE_FALSE(no_plane);
    CHECK(no_plane.error().find("needs the cluster's bulk plane") != std::string::npos);
    std::vector<tensor> bulk;
    auto bytes = actor::encode_payload(actor::payload::make("scores", s), &bulk);
    REQUIRE(bytes);
    std::vector<tensor> short_list;
    auto bad = actor::decode_payload("scores", *bytes, &short_list);
    REQUIRE_FALSE(bad);
    CHECK(bad.error().find("out of range") != std::string::npos);
  }

  SUBCASE("prompt batches carry the policy version the generator must wait for") {
    actors::prompt_msg p;
    p.ids = ints({1, 4}, 3);
    p.mask = ints({1, 4}, 1);
    p.iteration = 6;
    p.policy_version = 4;
    p.iterations = 30;
    auto bytes = actor::encode_payload(actor::payload::make("prompt_batch", p));
    REQUIRE(bytes);
    auto back = actor::decode_payload("prompt_batch", *bytes);
    REQUIRE(back);
    CHECK(back->as<actors::prompt_msg>().policy_version == 4);
    CHECK(back->as<actors::prompt_msg>().iterations == 30);
    CHECK(same_bits(back->as<actors::prompt_msg>().ids, p.ids));
    CHECK_FALSE(back->as<actors::prompt_msg>().save_only);
    p.save_only = true;  // a drain's save, to a generator on another node
    auto saved = actor::decode_payload("prompt_batch", *actor::encode_payload(actor::payload::make("prompt_batch", p)));
    REQUIRE(saved);
    CHECK(saved->as<actors::prompt_msg>().save_only);
  }

  SUBCASE("a trainer's stats carry its learning rate as the double's bytes") {
    actors::stats_msg st;
    st.iteration = 5;
    st.lr = 3.25e-6;
    st.scheduled = true;
    st.unsup_loss = 0.5;
    auto bytes = actor::encode_payload(actor::payload::make("stats", st));
    REQUIRE(bytes);
    auto back = actor::decode_payload("stats", *bytes);
    REQUIRE(back);
    const auto& b = back->as<actors::stats_msg>();
    CHECK(b.iteration == 5);
    CHECK(std::bit_cast<std::uint64_t>(b.lr) == std::bit_cast<std::uint64_t>(st.lr));
    CHECK(b.scheduled);
    CHECK(b.unsup_loss == 0.5);
  }
}

TEST_CASE("cluster bulk: malformed step 3 messages are refused before anything is allocated") {
  // tests/fuzz/fuzz_cluster found both: a prompt_batch tensor of 2^41 x 2^42 ids overflowed the element count
  // (undefined) and was allocated before its bytes were checked; a model message built the decoder its config
  // named (zero heads: a division by zero; or gigabytes) before comparing the weights' size.
  actors::register_rlhf_codecs();
  auto prompt_batch = [](std::vector<std::int64_t> shape) {
    actors::codec_io::writer w;
    w.put<std::uint8_t>(static_cast<std::uint8_t>(dtype::i32));
    w.put<std::uint32_t>(static_cast<std::uint32_t>(shape.size()));
    for (auto d : shape) w.put<std::int64_t>(d);
    w.put<std::int32_t>(7);  // 4 bytes of ids
    return actor::decode_payload("prompt_batch", w.out);
  };
  auto huge = prompt_batch({std::int64_t{1} << 41, std::int64_t{1} << 42});
  REQUIRE_FALSE(huge);
  CHECK(huge.error().find("truncated tensor") != std::string::npos);
  auto negative = prompt_batch({1, -5});
  REQUIRE_FALSE(negative);
  CHECK(negative.error().find("negative tensor size -5") != std::string::npos);

  auto model = [](const nlohmann::json& cfg, std::vector<tensor> bulk) {
    actors::codec_io::writer w;
    w.put<std::int64_t>(1);                                                 // version
    w.put<std::uint8_t>(static_cast<std::uint8_t>(model_format::llama2c));
    w.put_string("");                                                       // tokenizer
    w.put_string(cfg.dump());
    w.put<std::uint8_t>(0);                                                 // no value head
    w.put<std::int32_t>(0);                                                 // the weights: bulk tensor 0
    w.put_string("");                                                       // source
    return actor::decode_payload("model", w.out, &bulk);
  };
  nlohmann::json cfg = stories260k_config();
  cfg["num_attention_heads"] = 0;
  auto zero_heads = model(cfg, {floats({3}, 0)});
  REQUIRE_FALSE(zero_heads);
  CHECK(zero_heads.error().find("n_heads must divide dim") != std::string::npos);
  cfg = stories260k_config();
  cfg["hidden_size"] = 1 << 14;  // about 2^34 parameters: 80 GB, had the decoder been made first
  cfg["intermediate_size"] = 1 << 16;
  cfg["vocab_size"] = 1 << 16;
  cfg["real_vocab_size"] = 1 << 16;
  auto big = model(cfg, {floats({3}, 0)});
  REQUIRE_FALSE(big);
  CHECK(big.error().find("do not fit the config") != std::string::npos);
  // the right size still decodes
  const model_config ok = stories260k_config();
  auto good = model(nlohmann::json(ok), {tensor::zeros({ok.num_parameters()})});
  REQUIRE(good);
  CHECK(good->as<actors::model_msg>().model->num_parameters() == ok.num_parameters());
}
