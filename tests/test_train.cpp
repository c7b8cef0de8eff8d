// Training lowers the loss on real text: from a random init of the stories260K
// shape on TinyStories, and from the pretrained weights on Tiny Shakespeare.
// Gradient checkpointing gives the gradients of the plain backward, for every
// model family, with LoRA (and its dropout) and with a value head.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <unistd.h>
#include <vector>

#include "models/decoder.h"
#include "models/llama2c.h"
#include "models/lm_data.h"
#include "models/tokenizer.h"
#include "models/train/zero.h"
#include "runtime/kernels/ops.h"
#include "test_util.h"

using namespace flowrun;

namespace {

double val_loss(decoder& m, const lm_dataset& data, int64_t B, int64_t batches) {
  activations a;
  tensor ids, tg;
  double s = 0;
  for (int64_t i = 0; i < batches; ++i) {
    data.val_batch(i, B, ids, tg);
    s += m.forward(a, ids, tg);
  }
  return s / static_cast<double>(batches);
}

// Train `steps` AdamW steps through the engine (one rank, stage 0: clip to 1, weight decay
// 0.01 except on norms and biases); returns {first-5 mean train loss, last-5 mean train loss}.
std::pair<double, double> train(decoder& m, lm_dataset& data, int64_t steps, float lr, int64_t B) {
  auto comm = comm::inproc_communicator(comm::make_inproc_group(1), 0);
  zero_settings zs;
  zs.micro_batch = B;
  zs.gradient_clipping = 1.0;
  zs.adamw.lr = lr;
  zs.adamw.weight_decay = 0.01f;
  zero_engine eng(m, *comm, zs);
  tensor ids, tg;
  double first = 0, last = 0;
  for (int64_t s = 0; s < steps; ++s) {
    data.next_batch(B, ids, tg);
    const double loss = eng.train_step(ids, tg).loss;  // throws on a non-finite loss
    REQUIRE(std::isfinite(loss));
    if (s < 5) first += loss / 5;
    if (s >= steps - 5) last += loss / 5;
  }
  eng.release_model();
  return {first, last};
}

struct grads_copy {
  std::vector<float> base, adapter;
  double loss = 0;
  uint64_t rng = 0;
};

// One forward + backward of a fixed (B, T) batch (row 1 left-padded by 3) with or
// without checkpointing, from the same dropout stream position; returns the gradients.
grads_copy run_grads(decoder& m, bool checkpointing, int64_t B, int64_t T) {
  const int64_t V = m.config().vocab_limit();
  std::vector<int32_t> ids(B * T), tg(B * T), mask(B * T, 1);
  for (int64_t i = 0; i < B * T; ++i) {
    ids[i] = static_cast<int32_t>((i * 37 + 5) % V);
    tg[i] = i % 7 == 3 ? -100 : static_cast<int32_t>((i * 11 + 2) % V);
  }
  for (int64_t t = 0; t < 3; ++t) mask[1 * T + t] = 0;
  auto I = tensor::from_ints({B, T}, ids), G = tensor::from_ints({B, T}, tg), M = tensor::from_ints({B, T}, mask);
  m.set_gradient_checkpointing(checkpointing);
  m.set_rng_state(100);
  activations a;
  grads_copy out;
  out.loss = m.forward(a, I, G, M);
  REQUIRE(a.checkpointed == checkpointing);
  m.zero_grad();
  if (m.has_value_head()) {  // L = sum_t values * R_t with a fixed R (a critic's dvalues)
    std::vector<float> dv(B * T);
    for (int64_t i = 0; i < B * T; ++i) dv[i] = 0.01f * static_cast<float>((i * 13) % 17) - 0.08f;
    m.backward(a, tensor::from_floats({B, T}, dv));
  } else {
    m.backward(a);
  }
  if (m.base_trainable()) out.base = m.grads().flat.to_floats();
  if (m.num_adapter_parameters() > 0) out.adapter = m.grads().adapter_flat.to_floats();
  out.rng = m.rng_state();
  return out;
}

// max |a - b| / max |a| (0 when both are empty); the gradients of every parameter.
double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double d = 0, n = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    d = std::max(d, std::fabs(static_cast<double>(a[i]) - b[i]));
    n = std::max(n, std::fabs(static_cast<double>(a[i])));
  }
  return n > 0 ? d / n : d;
}

// Gradients with and without checkpointing agree to 1e-6 relative, for the base and the adapters.
void check_checkpointing(decoder& m, const std::string& what, int64_t B, int64_t T) {
  INFO(what);
  const auto plain = run_grads(m, false, B, T);
  const auto ckpt = run_grads(m, true, B, T);
  CHECK(ckpt.loss == plain.loss);
  CHECK(ckpt.rng == plain.rng);  // the recomputation does not advance the dropout stream
  const double db = rel_diff(plain.base, ckpt.base), da = rel_diff(plain.adapter, ckpt.adapter);
  MESSAGE(what << ": " << plain.base.size() << " base and " << plain.adapter.size()
               << " adapter gradients, max relative difference " << db << " / " << da);
  CHECK(plain.base.size() + plain.adapter.size() > 0);
  CHECK(db <= 1e-6);
  CHECK(da <= 1e-6);
}

// LoRA's B starts at 0, which would make every dA zero: give B small nonzero values.
void set_lora_B(decoder& m) {
  for (auto& e : m.adapter_params())
    if (e.name.find("lora_B") != std::string::npos) {
      std::vector<float> v(static_cast<size_t>(e.numel));
      for (size_t i = 0; i < v.size(); ++i) v[i] = 0.02f * static_cast<float>((i * 7) % 11) - 0.1f;
      m.w().by_name.at(e.name).copy_from(tensor::from_floats(e.shape, v));
    }
}

// `check` on each family (LLaMA, OPT's post-norm layout, GPT-2; 8 layers) as a full model, with LoRA r=4 on
// every Linear (the base trained too: both gradient buffers) at `lora_dropout`, and with a value head.
void each_family_variant(float lora_dropout, const std::function<void(decoder&, const std::string&)>& check) {
  const std::pair<model_family, const char*> fams[] = {
      {model_family::llama, "llama"}, {model_family::opt, "opt-350m layout"}, {model_family::gpt2, "gpt2"}};
  for (const auto& [f, name] : fams) {
    const model_config cfg = test::eight_layer_config(f);
    {
      decoder m(cfg);
      m.init_random(5);
      check(m, std::string(name) + ", full training");
    }
    {
      decoder m(cfg);
      m.init_random(6);
      lora_config lc;
      lc.lora_r = 4;
      lc.lora_dropout = lora_dropout;
      lc.target_modules = {"all-linear"};  // each family's own names (PEFT's rule)
      lc.seed = 9;
      m.enable_lora(lc, /*freeze_base=*/false);
      set_lora_B(m);
      check(m, std::string(name) + ", LoRA r=4 dropout " + std::to_string(lora_dropout));
    }
    {
      decoder m(cfg);
      m.init_random(7);
      m.add_value_head(3);
      check(m, std::string(name) + ", value head");
    }
  }
}

}  // namespace

TEST_CASE("gradient checkpointing: the same gradients for LLaMA, OPT and GPT-2 (8 layers), LoRA and a value head") {
  each_family_variant(0.25f, [](decoder& m, const std::string& what) { check_checkpointing(m, what, 2, 24); });
}

TEST_CASE("gradient checkpointing: stories260K gives the same gradients, plain and with LoRA dropout") {
  auto m = load_llama2c(test::model_path());
  check_checkpointing(m, "stories260K", 2, 64);
  lora_config lc;
  lc.lora_r = 2;
  lc.lora_dropout = 0.1f;
  lc.seed = 4;
  m.enable_lora(lc, /*freeze_base=*/true);
  set_lora_B(m);
  check_checkpointing(m, "stories260K, LoRA q_proj v_proj, frozen base", 2, 64);
}

namespace {

struct kept_pass {
  std::vector<float> out, base, adapter;  // logits or values (B*T*W), the gradients
};

// One forward (keep_from = t0, no targets) and a backward of L = sum(out * R) with a fixed R that is 0
// before r0 (what an RLHF loss on the answer gives): the outputs and every gradient.
kept_pass run_kept(decoder& m, int64_t t0, int64_t r0, bool checkpointing, int64_t B, int64_t T) {
  const int64_t V = m.config().vocab_limit(), W = m.has_value_head() ? 1 : m.config().vocab_size;
  std::vector<int32_t> ids(B * T), mask(B * T, 1);
  for (int64_t i = 0; i < B * T; ++i) ids[i] = static_cast<int32_t>((i * 37 + 5) % V);
  for (int64_t t = 0; t < 3; ++t) mask[1 * T + t] = 0;  // row 1 left-padded by 3
  m.set_gradient_checkpointing(checkpointing);
  activations a;
  m.forward(a, tensor::from_ints({B, T}, ids), tensor{}, tensor::from_ints({B, T}, mask), tensor{}, t0);
  kept_pass r;
  r.out = (m.has_value_head() ? a.values : a.logits).to_floats();
  std::vector<float> R(B * T * W, 0.0f);
  for (int64_t i = 0; i < B * T * W; ++i)
    if ((i / W) % T >= r0) R[i] = 0.01f * static_cast<float>((i * 13) % 17) - 0.08f;
  m.zero_grad();
  m.backward(a, m.has_value_head() ? tensor::from_floats({B, T}, R) : tensor::from_floats({B, T, W}, R));
  if (m.base_trainable()) r.base = m.grads().flat.to_floats();
  if (m.num_adapter_parameters() > 0) r.adapter = m.grads().adapter_flat.to_floats();
  return r;
}

// keep_from = t0 gives the full pass's outputs at t >= t0 (0 before) and its gradients, to float rounding.
void check_keep_from(decoder& m, const std::string& what, int64_t B, int64_t T, int64_t t0) {
  for (bool ckpt : {false, true}) {
    const std::string name = what + (ckpt ? ", checkpointed" : "");
    INFO(name);
    const auto full = run_kept(m, 0, t0, ckpt, B, T), kept = run_kept(m, t0, t0, ckpt, B, T);
    const int64_t W = static_cast<int64_t>(full.out.size()) / (B * T);
    std::vector<float> full_kept(full.out.size(), 0.0f);
    for (size_t i = 0; i < full.out.size(); ++i)
      if ((static_cast<int64_t>(i) / W) % T >= t0) full_kept[i] = full.out[i];
    int64_t zeros_before = 0;
    for (size_t i = 0; i < kept.out.size(); ++i) zeros_before += (static_cast<int64_t>(i) / W) % T < t0 && kept.out[i] == 0.0f;
    CHECK(zeros_before == B * t0 * W);
    const double dout = rel_diff(full_kept, kept.out), db = rel_diff(full.base, kept.base),
                 da = rel_diff(full.adapter, kept.adapter);
    MESSAGE(name << ": outputs " << dout << ", base gradients " << db
                 << ", adapter gradients " << da << " (max relative difference)");
    CHECK(full.base.size() + full.adapter.size() > 0);
    CHECK(dout <= 1e-5);
    CHECK(db <= 1e-5);
    CHECK(da <= 1e-5);
  }
}

}  // namespace

TEST_CASE("keep_from: the kept positions' outputs and every gradient equal the full pass's (LLaMA, OPT, GPT-2, LoRA, value head)") {
  // (no LoRA dropout: its masks are drawn per row, so fewer rows draw other masks)
  const int64_t t0s[] = {15, 1, 23, 7, 12, 22, 3, 18, 10};  // from the second position to the last
  size_t k = 0;
  each_family_variant(0.0f, [&](decoder& m, const std::string& what) { check_keep_from(m, what, 2, 24, t0s[k++ % 9]); });
  // the prefill of generation (forward_cached, the last position's output only) runs the last layer's MLP and
  // the head at that position only: the same outputs as the full pass's last position
  each_family_variant(0.0f, [](decoder& m, const std::string& what) {
    INFO(what);
    const int64_t B = 2, T = 12, V = m.config().vocab_limit(), W = m.has_value_head() ? 1 : m.config().vocab_size;
    std::vector<int32_t> ids(B * T), mask(B * T, 1);
    for (int64_t i = 0; i < B * T; ++i) ids[i] = static_cast<int32_t>((i * 29 + 3) % V);
    mask[T] = mask[T + 1] = 0;  // row 1 left-padded by 2
    const tensor I = tensor::from_ints({B, T}, ids), M = tensor::from_ints({B, T}, mask);
    activations a;
    m.forward(a, I, tensor{}, M);
    const auto full = (m.has_value_head() ? a.values : a.logits).to_floats();
    auto cache = m.make_cache(B, T);
    const auto last = m.forward_cached(cache, I, {}, M, 0).to_floats();
    REQUIRE(static_cast<int64_t>(last.size()) == B * W);
    double d = 0, n = 0;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t w = 0; w < W; ++w) {
        d = std::max(d, std::fabs(static_cast<double>(last[b * W + w]) - full[(b * T + T - 1) * W + w]));
        n = std::max(n, std::fabs(static_cast<double>(full[(b * T + T - 1) * W + w])));
      }
    CHECK(d <= 1e-5 * n);
  });
  decoder m(test::eight_layer_config(model_family::llama));
  activations a;
  auto ids = tensor::from_ints({1, 4}, {1, 2, 3, 4});
  CHECK_THROWS_WITH_AS(m.forward(a, ids, ids, tensor{}, tensor{}, 1), doctest::Contains("pass keep_from = 0 with targets"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(m.forward(a, ids, tensor{}, tensor{}, tensor{}, 4), doctest::Contains("outside [0, T = 4)"),
                       std::invalid_argument);
}

TEST_CASE("random init, stories260K shape, TinyStories: loss goes down") {
  auto tok = load_tokenizer(test::tokenizer_path());
  lm_dataset data(asset_path("data/tinystories/tinystories_train_head.txt").string(), *tok, 64);
  data.set_seed(3);
  decoder m(stories260k_config());
  m.init_random(1234);
  double v0 = val_loss(m, data, 8, 4);
  auto [first, last] = train(m, data, 100, 3e-3f, 8);
  double v1 = val_loss(m, data, 8, 4);
  MESSAGE("train loss " << first << " -> " << last << ", held-out " << v0 << " -> " << v1);
  CHECK(v0 > 6.0);  // about log(512) = 6.24 at random init
  CHECK(last < first - 1.0);
  CHECK(v1 < v0 - 1.0);
}

TEST_CASE("pretrained stories260K on Tiny Shakespeare: loss goes down") {
  auto tok = load_tokenizer(test::tokenizer_path());
  lm_dataset data(asset_path("data/shakespeare/tinyshakespeare.txt").string(), *tok, 64);
  data.set_seed(5);
  auto m = load_llama2c(test::model_path());
  double v0 = val_loss(m, data, 8, 4);
  auto [first, last] = train(m, data, 40, 2e-3f, 8);
  double v1 = val_loss(m, data, 8, 4);
  MESSAGE("train loss " << first << " -> " << last << ", held-out " << v0 << " -> " << v1);
  CHECK(last < first);
  CHECK(v1 < v0 - 0.1);
}

TEST_CASE("lm_dataset refuses a folder and a file that is not UTF-8 text, naming the byte") {
  // a model file was tokenized byte by byte (1.9 M "tokens") and trained on; a folder made "0 instances"
  namespace fs = std::filesystem;
  auto tok = load_tokenizer(test::tokenizer_path());
  const fs::path dir = fs::temp_directory_path() / "flowrun_lm_data_text";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string story = "Once upon a time there was a cat. It liked the sun.\n\n";
  std::string good;
  for (int i = 0; i < 40; ++i) good += story;
  auto write = [&](const std::string& name, const std::string& bytes) {
    std::ofstream(dir / name, std::ios::binary) << bytes;
    return (dir / name).string();
  };
  auto error_of = [&](const std::string& path) {
    try {
      lm_dataset d(path, *tok, 16);
      return std::string();
    } catch (const std::runtime_error& e) {
      return std::string(e.what());
    }
  };
  // well-formed UTF-8 of every length (1-4 bytes: e, U+00E9, U+20AC, U+1F600) is text
  CHECK(error_of(write("ok.txt", "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\n\n" + good)).empty());
  CHECK(error_of(dir.string()) == dir.string() + ": is a folder; the training data is one UTF-8 text file (documents "
                                                 "separated by blank lines, e.g. data/tinystories/tinystories_train_head.txt)");
  const std::string n = std::to_string(good.size());
  // RFC 3629's malformed sequences, each after `good`: the offset is good.size()
  for (const auto& [bad, byte] : std::initializer_list<std::pair<std::string, std::string>>{
           {std::string("\0", 1), "00"},  // a NUL: binary
           {"\xc0\xaf", "c0"},            // an overlong '/'
           {"\xed\xa0\x80", "ed"},        // a UTF-16 surrogate, U+D800
           {"\xf4\x90\x80\x80", "f4"},    // above U+10FFFF
           {"\xe2\x82", "e2"},            // cut short at the end
           {"\x80", "80"}}) {              // a lone continuation byte
    CAPTURE(byte);
    CHECK(error_of(write("bad.txt", good + bad)) ==
          (dir / "bad.txt").string() + ": is not UTF-8 text (line 81, byte " + n + ", 0x" + byte +
              "): the training data is a text file; a binary (a model, an archive) is no data");
  }
  CHECK_FALSE(error_of(test::model_path()).empty());  // stories260K.bin itself
  fs::remove_all(dir);
}

TEST_CASE("split_documents: blank-line and one-a-line documents, CRLF read as LF") {
  // a CRLF file trained on every line's \r (its tokens and held-out loss differed from the LF copy's), and
  // TencentPretrain's corpus of one document a line loaded as one document (a break-it review, 2026-12-07)
  using V = std::vector<std::string>;
  const std::string lf = "Once upon a time.\nThe end.\n\n  A cat sat.  \n\n\nA dog ran.\nIt ran far.\n";
  CHECK(split_documents(lf) == V{"Once upon a time.\nThe end.", "A cat sat.", "A dog ran.\nIt ran far."});
  CHECK(split_documents(lf, document_split::lines) ==
        V{"Once upon a time.", "The end.", "A cat sat.", "A dog ran.", "It ran far."});
  std::string crlf;
  for (char c : lf) crlf += c == '\n' ? std::string("\r\n") : std::string(1, c);
  CHECK(split_documents(crlf) == split_documents(lf));
  CHECK(split_documents(crlf, document_split::lines) == split_documents(lf, document_split::lines));
  CHECK(split_documents("no newline at the end", document_split::lines) == V{"no newline at the end"});
  CHECK(split_documents(" \r\n\t\n").empty());
  // through lm_dataset: the CRLF copy of the TinyStories head has the LF file's tokens
  namespace fs = std::filesystem;
  auto tok = load_tokenizer(test::tokenizer_path());
  std::ifstream in(asset_path("data/tinystories/tinystories_train_head.txt"), std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::string text_crlf;
  for (char c : text) text_crlf += c == '\n' ? std::string("\r\n") : std::string(1, c);
  const fs::path path = fs::temp_directory_path() / ("flowrun_crlf_" + std::to_string(::getpid()) + ".txt");
  std::ofstream(path, std::ios::binary) << text_crlf;
  lm_dataset a(asset_path("data/tinystories/tinystories_train_head.txt").string(), *tok, 64);
  lm_dataset b(path.string(), *tok, 64);
  lm_dataset c(asset_path("data/tinystories/tinystories_train_head.txt").string(), *tok, 64, 0.05,
               document_split::lines);
  fs::remove(path);
  CHECK(b.num_tokens() == a.num_tokens());
  tensor ia, ta, ib, tb;
  a.val_batch(0, 4, ia, ta);
  b.val_batch(0, 4, ib, tb);
  CHECK(ia.to_floats() == ib.to_floats());
  // one a line: each non-blank line its own document, a BOS first
  size_t per_line = 0;
  for (const auto& d : split_documents(text, document_split::lines)) per_line += tok->encode(d, true).size();
  CHECK(c.num_tokens() == static_cast<int64_t>(per_line));
  CHECK(c.num_tokens() != a.num_tokens());
}

TEST_CASE("lm_dataset: a position saved exactly at an epoch's end resumes with the next epoch's order") {
  // Issue 17, "resume at an epoch boundary": a checkpoint whose data position is the end of an
  // epoch (cursor == num_train) must continue with the next epoch's shuffle, as the
  // uninterrupted run does, not repeat or skip an epoch; a mid-epoch position too.
  lm_dataset a = test::tinystories_lm64();
  a.set_seed(7);
  const int64_t n = a.num_train();
  REQUIRE(n >= 4);
  tensor ids, tg;
  std::vector<std::vector<int32_t>> seen;
  std::vector<std::pair<int64_t, int64_t>> pos;
  for (int64_t i = 0; i < 2 * n + 3; ++i) {  // batches of one instance: two epochs and a bit
    a.next_batch(1, ids, tg);
    seen.emplace_back(ids.data<int32_t>(), ids.data<int32_t>() + ids.numel());
    pos.push_back({a.epoch(), a.cursor()});
  }
  CHECK(pos[n - 1] == std::make_pair(int64_t{0}, n));  // the end of epoch 0, not yet rolled over
  for (int64_t at : {n - 1, 2 * n - 1, n / 2}) {       // two epoch ends and a mid-epoch position
    CAPTURE(at);
    lm_dataset b = test::tinystories_lm64();
    b.set_seed(7);
    b.set_position(pos[at].first, pos[at].second);
    for (int64_t i = at + 1; i < static_cast<int64_t>(seen.size()); ++i) {
      b.next_batch(1, ids, tg);
      REQUIRE(std::vector<int32_t>(ids.data<int32_t>(), ids.data<int32_t>() + ids.numel()) == seen[i]);
    }
  }
  // each epoch visits every instance once: the epochs' orders differ but hold the same instances
  auto sorted = [&](int64_t from) {
    std::vector<std::vector<int32_t>> e(seen.begin() + from, seen.begin() + from + n);
    std::sort(e.begin(), e.end());
    return e;
  };
  CHECK(sorted(0) == sorted(n));
  CHECK(std::vector<std::vector<int32_t>>(seen.begin(), seen.begin() + n) !=
        std::vector<std::vector<int32_t>>(seen.begin() + n, seen.begin() + 2 * n));
}
