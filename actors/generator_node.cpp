// generator: "tokens" (prompts) -> "text" (completions), batched, with a
// llama2.c model (models/llama2c.h) and models/generate.h.
#include <algorithm>
#include <memory>
#include <vector>

#include "actors/node_models.h"
#include "actors/message_types.h"
#include "actors/register.h"
#include "models/generate.h"
#include "models/checkpoint.h"
#include "models/tokenizer.h"
#include "runtime/util/assets.h"

namespace flowrun::actors {

namespace {

/// Collects prompts until `batch_size` are waiting (or the input ends), then
/// generates for all of them in one left-padded batch and emits one "text"
/// per prompt, in arrival order: the prompt followed by its completion (or
/// the completion alone when include_prompt = false). Generation stops at
/// `max_new_tokens`, at EOS or at a new BOS (how llama2.c models end a story).
/// Prompt k of the node (counting from 0) samples with seed S + k, where S is
/// the `seed` setting or, when it is -1, the node's seed from the graph seed.
/// Prompts longer than the model's context minus max_new_tokens keep their
/// last tokens. Metrics: "tokens" (generated), "prompts", "batches".
class generator_node final : public actor::node {
 public:
  void start(actor::node_context& ctx) override {
    const auto& s = ctx.spec();
    model_ = std::make_unique<decoder>(load_node_model(ctx, s.get_string("model")));
    tok_ = load_tokenizer(resolve_user_path(s.get_string("tokenizer"), "tokenizer model").string());
    cfg_.max_new_tokens = s.get_int("max_new_tokens");
    cfg_.sampling.temperature = static_cast<float>(s.get_float("temperature"));
    cfg_.sampling.top_k = static_cast<int>(s.get_int("top_k"));
    cfg_.sampling.top_p = static_cast<float>(s.get_float("top_p"));
    cfg_.stop_ids = stop_ids_for(s.get_string("model"), tok_->bos_id(), tok_->eos_id());
    const std::int64_t seed = s.get_int("seed");
    base_seed_ = seed >= 0 ? static_cast<std::uint64_t>(seed) : ctx.seed();
    batch_size_ = static_cast<std::size_t>(std::max<std::int64_t>(1, s.get_int("batch_size")));
    include_prompt_ = s.get_bool("include_prompt");
    const std::int64_t ctx_len = model_->config().max_seq_len;
    if (cfg_.max_new_tokens >= ctx_len) cfg_.max_new_tokens = ctx_len - 1;
    max_prompt_ = static_cast<std::size_t>(std::max<std::int64_t>(1, ctx_len - cfg_.max_new_tokens));
    ctx.log().info("model {}, batch {}, max_new_tokens {}, temperature {}", model_->config().summary(), batch_size_,
                   cfg_.max_new_tokens, cfg_.sampling.temperature);
  }

  void on_message(actor::node_context& ctx, std::string_view, actor::payload msg) override {
    token_ids prompt = msg.as<token_ids>();
    if (prompt.empty()) prompt.push_back(tok_->bos_id());
    if (prompt.size() > max_prompt_) {
      ctx.log().warn("prompt of {} tokens cut to its last {}", prompt.size(), max_prompt_);
      prompt.erase(prompt.begin(), prompt.end() - static_cast<std::ptrdiff_t>(max_prompt_));
    }
    pending_.push_back(std::move(prompt));
    if (pending_.size() >= batch_size_) run_batch(ctx);
  }

  void finish(actor::node_context& ctx) override {
    if (!pending_.empty()) run_batch(ctx);
  }

 private:
  void run_batch(actor::node_context& ctx) {
    generation_config g = cfg_;
    g.seed = base_seed_ + prompts_done_;
    auto results = generate(*model_, pending_, g);
    std::int64_t new_tokens = 0;
    for (std::size_t i = 0; i < results.size(); ++i) {
      new_tokens += static_cast<std::int64_t>(results[i].tokens.size());
      token_ids all = include_prompt_ ? pending_[i] : token_ids{};
      all.insert(all.end(), results[i].tokens.begin(), results[i].tokens.end());
      ctx.emit("completions", actor::payload::make(text_type, tok_->decode(all)));
    }
    prompts_done_ += pending_.size();
    ctx.metric("tokens", new_tokens);
    ctx.metric("prompts", static_cast<std::int64_t>(pending_.size()));
    ctx.metric("batches");
    pending_.clear();
  }

  std::unique_ptr<decoder> model_;
  std::unique_ptr<tokenizer> tok_;
  generation_config cfg_;
  std::uint64_t base_seed_ = 0;
  std::uint64_t prompts_done_ = 0;
  std::size_t batch_size_ = 4;
  std::size_t max_prompt_ = 1;
  bool include_prompt_ = true;
  std::vector<token_ids> pending_;
};

}  // namespace

std::unique_ptr<actor::node> make_generator() { return std::make_unique<generator_node>(); }

}  // namespace flowrun::actors
