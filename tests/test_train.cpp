// Training lowers the loss on real text: from a random init of the stories260K
// shape on TinyStories, and from the pretrained weights on Tiny Shakespeare.
#include <doctest/doctest.h>

#include <cmath>

#include "models/decoder.h"
#include "models/llama2c.h"
#include "models/lm_data.h"
#include "models/tokenizer.h"
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

// Train `steps` AdamW steps; returns {first-5 mean train loss, last-5 mean train loss}.
std::pair<double, double> train(decoder& m, lm_dataset& data, int64_t steps, float lr, int64_t B) {
  ops::adamw_config oc;
  oc.lr = lr;
  oc.weight_decay = 0.01f;
  adamw_optimizer opt(m, oc);
  activations a;
  tensor ids, tg;
  double first = 0, last = 0;
  for (int64_t s = 0; s < steps; ++s) {
    data.next_batch(B, ids, tg);
    double loss = m.forward(a, ids, tg);
    REQUIRE(std::isfinite(loss));
    m.zero_grad();
    m.backward(a);
    std::vector<tensor> g = {m.grads().flat};
    ops::clip_grad_norm(g, 1.0);
    opt.step();
    if (s < 5) first += loss / 5;
    if (s >= steps - 5) last += loss / 5;
  }
  return {first, last};
}

}  // namespace

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
