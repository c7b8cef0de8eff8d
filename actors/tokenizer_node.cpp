// tokenizer: "text" -> "tokens" with a SentencePiece model (models/tokenizer.h).
#include <memory>

#include "actors/message_types.h"
#include "actors/register.h"
#include "models/tokenizer.h"
#include "runtime/util/assets.h"

namespace flowrun::actors {

namespace {

/// Encodes each text into token ids (with BOS first when `add_bos`). Counts
/// the ids it produced in its "encoded_tokens" metric.
class tokenizer_node final : public actor::node {
 public:
  void start(actor::node_context& ctx) override {
    tok_ = load_tokenizer(resolve_user_path(ctx.spec().get_string("model"), "tokenizer model").string());
    add_bos_ = ctx.spec().get_bool("add_bos");
  }

  void on_message(actor::node_context& ctx, std::string_view, actor::payload msg) override {
    token_ids ids = tok_->encode(msg.as<std::string>(), add_bos_);
    ctx.metric("encoded_tokens", static_cast<std::int64_t>(ids.size()));
    ctx.emit("tokens", actor::payload::make(tokens_type, std::move(ids)));
  }

 private:
  std::unique_ptr<tokenizer> tok_;
  bool add_bos_ = true;
};

}  // namespace

std::unique_ptr<actor::node> make_tokenizer() { return std::make_unique<tokenizer_node>(); }

}  // namespace flowrun::actors
