#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>

#include <spdlog/spdlog.h>

#include "models/decoder.h"
#include "models/checkpoint.h"
#include "models/lm_data.h"
#include "models/train/zero.h"
#include "models/tokenizer.h"
#include "runtime/kernels/ops.h"
#include "runtime/util/assets.h"
#include "tools/flowrun/commands.h"
#include "tools/flowrun/model_tokenizer.h"

namespace flowrun::cli {

namespace {
struct train_opts {
  std::string data = "data/tinystories/tinystories_train_head.txt";
  std::string tokenizer = "model/stories260K/tok512.model";
  std::string init = "random";  // "random" or a llama2.c checkpoint
  std::string output;
  int64_t seq_length = 64;
  int64_t per_device_train_batch_size = 8;
  int64_t steps = 100;
  float learning_rate = 3e-3f;
  float weight_decay = 0.01f;
  float gradient_clipping = 1.0f;
  int64_t seed = 1234;
  int64_t eval_every = 25;
};
}  // namespace

void add_train_lm(CLI::App& app) {
  auto o = std::make_shared<train_opts>();
  auto* sub = app.add_subcommand("train-lm", "Train a causal LM on a text file; prints the loss each step");
  sub->add_option("--data", o->data, "UTF-8 text, documents separated by blank lines")->capture_default_str();
  auto* tok_opt = sub->add_option("--tokenizer", o->tokenizer,
                                  "SentencePiece .model, GPT-2 BPE vocab.json, or a folder holding either (default: "
                                  "the --init folder's own tokenizer when it has one, else tok512)")
                      ->capture_default_str();
  sub->add_option("--init", o->init, "'random' (stories260K shape), or a model to continue from: llama2.c .bin, HF or flowrun model folder")
      ->capture_default_str();
  sub->add_option("--output", o->output, "Write the trained model here at the end, in the format of --init (a llama2.c file for random or a "
                  ".bin; a folder for an HF or flowrun folder, with the tokenizer beside an HF one)");
  sub->add_option("--seq_length", o->seq_length, "Tokens per instance")->capture_default_str();
  sub->add_option("--per_device_train_batch_size", o->per_device_train_batch_size, "Instances per step")
      ->capture_default_str();
  sub->add_option("--steps", o->steps, "Optimizer steps")->capture_default_str();
  sub->add_option("--learning_rate", o->learning_rate, "AdamW learning rate")->capture_default_str();
  sub->add_option("--weight_decay", o->weight_decay, "AdamW decoupled weight decay")->capture_default_str();
  sub->add_option("--gradient_clipping", o->gradient_clipping, "Global gradient-norm clip (0 = off)")
      ->capture_default_str();
  sub->add_option("--seed", o->seed, "Seed for init and data order")
      ->capture_default_str()
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{4294967295}));  // the graph files' seeds' range
  sub->add_option("--eval_every", o->eval_every, "Held-out loss every N steps (0 = only at the end)")
      ->capture_default_str();
  sub->callback([o, tok_opt] {
    if (o->per_device_train_batch_size < 1) throw std::invalid_argument("--per_device_train_batch_size must be >= 1");
    if (o->seq_length < 1) throw std::invalid_argument("--seq_length must be >= 1");
    if (o->steps < 0) throw std::invalid_argument("--steps must be >= 0");
    if (o->eval_every < 0) throw std::invalid_argument("--eval_every must be >= 0 (0 = only at the end)");
    if (!std::isfinite(o->learning_rate) || o->learning_rate <= 0)
      throw std::invalid_argument("--learning_rate must be finite and > 0");
    if (!std::isfinite(o->weight_decay) || o->weight_decay < 0)
      throw std::invalid_argument("--weight_decay must be finite and >= 0");
    if (!std::isfinite(o->gradient_clipping) || o->gradient_clipping < 0)
      throw std::invalid_argument("--gradient_clipping must be finite and >= 0 (0 = off)");
    // a model that carries its tokenizer (an HF folder, a llama2.c file with one beside it) trains on it unless
    // --tokenizer says otherwise, as generate and chat read it (tokenizer_for): the default tok512 trained a Qwen2
    // folder on other ids and wrote tok512 over its tokenizer in --output
    if (o->init != "random") o->tokenizer = tokenizer_for({o->init}, o->tokenizer, tok_opt->count() > 0);
    auto tok = load_tokenizer(resolve_user_path(o->tokenizer, "tokenizer").string());
    lm_dataset data(resolve_user_path(o->data, "training data").string(), *tok, o->seq_length);
    data.set_seed(static_cast<uint64_t>(o->seed));
    decoder model;
    model_format format = model_format::llama2c;  // the format --output is written in: that of --init
    if (o->init != "random") format = inspect_model(o->init).format;
    if (!o->output.empty()) {  // refused now rather than after training
      // --output over the run's own inputs: the data became a model file, the base model the trained one
      const auto same = [&](const std::string& input, const char* what) {
        std::error_code ec;
        const auto a = std::filesystem::weakly_canonical(std::filesystem::absolute(o->output), ec);
        const auto b = std::filesystem::weakly_canonical(resolve_user_path(input, what), ec);
        return !ec && a == b;
      };
      if (same(o->data, "training data"))
        throw std::invalid_argument("--output " + o->output + " is the training data (--data " + o->data +
                                    "): it would be overwritten by the model; write the model elsewhere");
      if (o->init != "random" && same(o->init, "--init"))
        throw std::invalid_argument("--output " + o->output + " is the model it starts from (--init " + o->init +
                                    "): the base would be lost; write the trained model elsewhere");
      const auto family = o->init == "random" ? model_family::llama : inspect_model(o->init).family;
      if (auto why = save_problem(format, o->output, family, false); !why.empty())
        throw std::invalid_argument("--output " + o->output + ": " + why);
    }
    if (o->init == "random") {  // stories260K's shape, with an embedding row per token of the tokenizer
      model_config c = stories260k_config();
      c.vocab_size = tok->vocab_size();
      model = decoder(c);
      model.init_random(static_cast<uint64_t>(o->seed));
    } else {
      model = load_model(o->init);
      // a tokenizer with ids past the embedding failed deep in embedding_forward, naming neither
      check_tokenizer_fits(*tok, o->tokenizer, model, o->init);
    }
    if (o->seq_length > model.config().max_seq_len)
      throw std::invalid_argument("--seq_length " + std::to_string(o->seq_length) + " exceeds the model's max_seq_len " +
                                  std::to_string(model.config().max_seq_len));
    spdlog::info("model: {}", model.config().summary());
    spdlog::info("data: {} tokens, {} train / {} held-out instances of {} tokens", data.num_tokens(),
                 data.num_train(), data.num_val(), o->seq_length);
    const int64_t B = o->per_device_train_batch_size;
    // the one training engine (models/train/zero.h), one rank at stage 0: AdamW (no weight
    // decay on norms and biases), the global-norm clip, the non-finite check
    auto comm = comm::inproc_communicator(comm::make_inproc_group(1), 0);
    zero_settings zs;
    zs.micro_batch = B;
    zs.gradient_clipping = o->gradient_clipping > 0 ? o->gradient_clipping : 0.0;
    zs.adamw.lr = o->learning_rate;
    zs.adamw.weight_decay = o->weight_decay;
    zero_engine engine(model, *comm, zs);
    tensor ids, targets;
    auto eval = [&] {
      activations ea;
      tensor vi, vt;
      int64_t nb = std::min<int64_t>(8, std::max<int64_t>(1, data.num_val() / B));
      double s = 0;
      for (int64_t i = 0; i < nb; ++i) {
        data.val_batch(i, B, vi, vt);
        s += model.forward(ea, vi, vt);
      }
      return s / static_cast<double>(nb);
    };
    std::printf("step 0 held-out loss %.4f\n", eval());
    auto t0 = std::chrono::steady_clock::now();
    for (int64_t step = 1; step <= o->steps; ++step) {
      auto ts = std::chrono::steady_clock::now();
      data.next_batch(B, ids, targets);
      const step_result r = engine.train_step(ids, targets);  // throws on a non-finite loss or norm
      const double loss = r.loss, norm = r.grad_norm;
      double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - ts).count();
      std::printf("step %ld/%ld loss %.4f grad_norm %.3f tokens/s %.0f\n", static_cast<long>(step),
                  static_cast<long>(o->steps), loss, norm, static_cast<double>(B * o->seq_length) / dt);
      if (o->eval_every > 0 && step % o->eval_every == 0 && step != o->steps)
        std::printf("step %ld held-out loss %.4f\n", static_cast<long>(step), eval());
      std::fflush(stdout);
    }
    double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("final held-out loss %.4f (%.1f s)\n", eval(), total);
    engine.release_model();
    if (!o->output.empty()) {
      save_model(model, o->output, format, resolve_user_path(o->tokenizer, "tokenizer").string(),
                 format == model_format::hf ? resolve_user_path(o->init, "model").string() : "");
      spdlog::info("wrote {} ({})", o->output, to_string(format));
    }
  });
}

}  // namespace flowrun::cli
