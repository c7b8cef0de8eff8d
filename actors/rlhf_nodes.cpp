// DeepSpeed-Chat's three steps as node kinds (docs/rlhf.md):
//
//   sft_trainer      step 1: SFT on prompt + chosen, emits the trained model
//   rm_trainer       step 2: reward model (base + value head), emits it
//   prompt_loader    step 3's prompts, one batch per `tick` from the controller
//   ppo_controller   orders the phases of each PPO iteration and prints them
//   rollout_generator  the hybrid engine: generates with the policy's live weights
//   reference_model, reward_model, critic, policy   score the rollouts
//   experience_maker rewards (KL-penalised, clipped score) and GAE
//
// The controller's loop is DS-Chat's main loop (step3 main.py): for each prompt
// batch, generate_experience, then train_rlhf, then print. Phases are ordered by
// messages: the controller asks for the next batch only when the policy and the
// critic have reported, so the generator never runs while the policy trains.
#include <chrono>
#include <cmath>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>

#include <unistd.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "actors/rank_group.h"
#include "actors/register.h"
#include "actors/rlhf_types.h"
#include "models/rlhf/dschat_data.h"
#include "models/rlhf/dschat_steps.h"
#include "models/adapter.h"
#include "models/checkpoint.h"
#include "models/lm_data.h"
#include "models/rlhf/ppo.h"
#include "models/rlhf/ppo_checkpoint.h"
#include "models/train/shard_checkpoint.h"
#include "models/safetensors.h"
#include "models/tokenizer.h"
#include "runtime/util/assets.h"

namespace flowrun::actors {

namespace {

using clk = std::chrono::steady_clock;
double since(clk::time_point t) { return std::chrono::duration<double>(clk::now() - t).count(); }

std::shared_ptr<decoder> copy_model(const decoder& m) {
  auto c = std::make_shared<decoder>(m.config());
  c->w().flat.copy_from(m.w().flat);
  return c;
}

// -- resuming a restarted run (on_node_lost = "restart", docs/scaling.md) --------------
//
// A trainer that saved its output writes OUTPUT.run.json beside it (after the
// output itself, each file atomically) naming the run id. A later attempt of
// the same run (node_context::attempt() > 0, same run_id()) loads the output
// instead of training again: what was checkpointed is not lost, nor redone.

std::string run_marker(const std::string& out) { return out + ".run.json"; }

// With a [graph] checkpoint_dir, a trainer that finished also writes CHECKPOINT_DIR/NAME.done.json
// (its output and a fingerprint of its settings): the same command run again (after a crash in
// step 3, say) loads the output instead of training again.
std::string done_marker(const actor::node_context& ctx) {
  return (std::filesystem::path(ctx.checkpoint_dir()) / (ctx.name() + ".done.json")).string();
}

std::string settings_fingerprint(const graph::node_spec& n) {
  std::string text = n.kind;
  for (const auto& [k, v] : n.settings) text += "\n" + k + "=" + graph::to_string(v.value);
  return fmt::format("{:016x}", graph::fnv1a64(text));
}

void write_run_marker(const actor::node_context& ctx, const std::string& out) {
  if (!ctx.checkpoint_dir().empty()) {
    std::filesystem::create_directories(ctx.checkpoint_dir());
    write_text_atomic(done_marker(ctx),
                      nlohmann::json{{"output", out}, {"settings", settings_fingerprint(ctx.spec())}}.dump() + "\n");
  }
  if (ctx.run_id().empty()) return;
  const std::string path = run_marker(out), tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::trunc);
    f << nlohmann::json{{"run_id", ctx.run_id()}, {"node", ctx.name()}, {"attempt", ctx.attempt()}}.dump() << "\n";
    if (!f) throw std::runtime_error("node '" + ctx.name() + "': cannot write " + tmp);
  }
  std::filesystem::rename(tmp, path);
}

/// True when an earlier attempt of this run saved `out` completely.
bool saved_by_earlier_attempt(const actor::node_context& ctx, const std::string& out) {
  if (!ctx.checkpoint_dir().empty() && !out.empty() && std::filesystem::exists(out)) {
    std::ifstream f(done_marker(ctx));
    try {
      if (f) {
        const auto j = nlohmann::json::parse(f);
        if (j.value("output", std::string()) == out && j.value("settings", std::string()) == settings_fingerprint(ctx.spec()))
          return true;
      }
    } catch (const std::exception&) {
      // a torn marker: train again
    }
  }
  if (ctx.attempt() == 0 || ctx.run_id().empty() || out.empty()) return false;
  std::ifstream f(run_marker(out));
  if (!f) return false;
  try {
    auto j = nlohmann::json::parse(f);
    return j.value("run_id", std::string()) == ctx.run_id() && j.value("node", std::string()) == ctx.name() &&
           std::filesystem::exists(out);
  } catch (const std::exception&) {
    return false;  // a torn or foreign marker: train again
  }
}

/// The trainer's `output` loaded with `load`, when an earlier attempt of this
/// run saved it (and a line saying that training is skipped); else null.
template <class Load>
std::shared_ptr<decoder> resume_saved(actor::node_context& ctx, const char* step, Load load) {
  const auto& out = ctx.spec().get_string("output");
  if (!saved_by_earlier_attempt(ctx, out)) return nullptr;
  auto m = std::make_shared<decoder>(load(out));
  if (ctx.attempt() > 0)
    ctx.print(fmt::format("{} resumed (attempt {}): {} was saved by an earlier attempt of this run; training skipped",
                          step, ctx.attempt() + 1, out));
  else
    ctx.print(fmt::format("{} resumed: {} was saved by an earlier run of this graph with the same settings "
                          "({}); training skipped",
                          step, out, done_marker(ctx)));
  return m;
}

// -- the models the trainers read and write (models/checkpoint.h) ------------------------
//
// Every trainer loads its model with load_model (llama2.c files, flowrun model folders,
// Hugging Face folders of LLaMA, OPT and GPT-2) and saves it in the format it was given
// (saved_format: HF in, HF out, with the tokenizer the node used copied beside it). A save
// that cannot succeed is refused before training: by the graph check of each kind
// (check_trainer_output, at validation) and again in start() / when the model arrives.

/// The node's `model` setting, inspected (for the graph checks); nullopt when it is
/// missing or unreadable (then the node's start names the problem).
std::optional<model_file_info> inspect_model_setting(const graph::node_spec& n) {
  const auto* m = n.find_setting("model");
  if (!m || !std::holds_alternative<std::string>(m->value)) return std::nullopt;
  try {
    return inspect_model(std::get<std::string>(m->value));
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

/// What a node emits on its "model" port, from its settings alone (for the graph
/// checks): sft_trainer and model_source pass on the format of their `model`;
/// rm_trainer adds a value head. nullopt for other kinds or an unreadable model.
std::optional<model_file_info> emitted_model(const graph::node_spec& n) {
  if (n.kind != "sft_trainer" && n.kind != "rm_trainer" && n.kind != "model_source") return std::nullopt;
  auto info = inspect_model_setting(n);
  if (info && n.kind == "rm_trainer") {
    info->format = saved_format(info->format, true);
    info->value_head = true;
  }
  return info;
}

/// The problem with writing a model (`in`: what the node was given) to the node's
/// `output` in the format it was given, as a sentence with the fix; "" when none.
std::string output_problem(const std::string& node, const std::string& out, const model_file_info& in,
                           bool value_head) {
  if (out.empty()) return "";
  const auto f = saved_format(in.format, value_head);
  auto why = save_problem(f, out, in.family, value_head);
  if (why.empty()) return "";
  const std::string as = f == in.format ? "the format it was given in"
                                         : "it was given as a " + std::string(to_string(in.format)) +
                                               ", which cannot hold its value head";
  return "node '" + node + "': output \"" + out + "\" cannot be written: the model is saved as a " +
         std::string(to_string(f)) + " (" + as + "); " + why;
}

/// The graph check of the trainers (node_kind::check): their `output` fits the format of
/// the model they get (their `model` setting, or for the policy what its init edge brings).
std::vector<graph::node_kind::problem> check_trainer_output(const graph::node_spec& n, const graph::graph_spec& g) {
  const auto* o = n.find_setting("output");
  if (!o || !std::holds_alternative<std::string>(o->value) || std::get<std::string>(o->value).empty()) return {};
  const auto& out = std::get<std::string>(o->value);
  std::optional<model_file_info> in;
  bool value_head = false;
  if (n.kind == "policy") {
    for (const auto& e : g.edges)
      if (e.to_node == n.name && e.to_port == "init")
        if (const auto* src = g.find_node(e.from_node)) in = emitted_model(*src);
  } else {
    in = inspect_model_setting(n);
    value_head = n.kind == "rm_trainer";
  }
  if (!in) return {};
  auto why = output_problem(n.name, out, *in, value_head);
  if (why.empty()) return {};
  return {{"output", why, "give an output path that fits the format the model was given in (docs/rlhf.md)"}};
}

/// Refuses, before training, an `output` that the model given as `in` could not be written to.
void check_output(const actor::node_context& ctx, const model_file_info& in, bool value_head) {
  if (auto why = output_problem(ctx.name(), ctx.spec().get_string("output"), in, value_head); !why.empty())
    throw std::invalid_argument(why);
}

/// Saves `m` to the node's `output` (when set) as `f`, with `tokenizer` beside an HF
/// folder; with verify_output, reloads it and prints the largest output difference.
void save_output(actor::node_context& ctx, const char* step, const decoder& m, model_format f,
                 const std::string& tokenizer) {
  const auto& out = ctx.spec().get_string("output");
  if (out.empty()) return;
  save_model(m, out, f, tokenizer);
  ctx.log().info("saved the trained model to {} ({})", out, to_string(f));
  if (ctx.spec().get_bool("verify_output"))
    ctx.print(fmt::format("{} saved {} as a {}; reloaded: max |output difference| {:.3g}", step, out, to_string(f),
                          reload_max_diff(m, out)));
}

/// The node's `model`, inspected: what it is and where it resolves.
std::pair<std::string, model_file_info> given_model(const actor::node_context& ctx) {
  auto path = resolve_user_path(ctx.spec().get_string("model"), "model").string();
  return {path, inspect_model(path)};
}

/// Learned positions (OPT, GPT-2) stop at the model's max_position_embeddings.
void check_seq_len(const actor::node_context& ctx, const model_config& c, int64_t T, const char* setting) {
  if (T > c.max_seq_len)
    throw std::invalid_argument(fmt::format("node '{}': {} = {} exceeds the model's {} positions "
                                            "(max_position_embeddings): lower {}",
                                            ctx.name(), setting, T, c.max_seq_len, setting));
}

dschat::dschat_settings common_settings(const actor::node_context& ctx) {
  const auto& s = ctx.spec();
  dschat::dschat_settings d;
  d.per_device_train_batch_size = s.get_int("per_device_train_batch_size");
  d.learning_rate = static_cast<float>(s.get_float("learning_rate"));
  d.weight_decay = static_cast<float>(s.get_float("weight_decay"));
  d.max_seq_len = s.get_int("max_seq_len");
  d.lr_scheduler_type = s.get_string("lr_scheduler_type");
  d.num_warmup_steps = s.get_int("num_warmup_steps");
  d.seed = static_cast<uint64_t>(s.get_int("seed"));
  d.data_split = s.get_string("data_split");
  d.gradient_accumulation_steps = s.get_int("gradient_accumulation_steps");
  d.lora_dim = s.get_int("lora_dim");
  d.gradient_checkpointing = s.get_bool("gradient_checkpointing");
  d.zero_stage = static_cast<int>(s.get_int("zero_stage"));
  d.dtype = s.get_string("dtype");
  d.only_optimize_lora = s.get_bool("only_optimize_lora");
  if (const auto& p = s.get_string("deepspeed_config"); !p.empty())  // one rank: the triple for world size 1
    dschat::apply_ds_config(d, load_ds_config(resolve_user_path(p, "deepspeed_config").string(), 1));
  return d;
}

dschat::step_rows load_step_rows(actor::node_context& ctx, int step_index, const dschat::dschat_settings& d) {
  if (dschat::parse_data_split(d.data_split).size() != 3)
    throw std::invalid_argument("node '" + ctx.name() + "': data_split \"" + d.data_split +
                                "\" must have 3 parts, one per DS-Chat step (e.g. \"2,4,4\")");
  std::vector<std::string> paths = {resolve_user_path(ctx.spec().get_string("data"), "data").string()};
  for (const auto& extra : ctx.spec().get_string_list("mix_data"))  // DS-Chat's blending of several datasets
    paths.push_back(resolve_user_path(extra, "mix_data").string());
  auto src = dschat::load_sources(paths);
  for (auto& s : src) ctx.log().info("{}", s.report.summary());
  dschat::split_settings sp;
  sp.data_split = d.data_split;
  sp.seed = d.seed;
  sp.eval_fraction = ctx.spec().get_float("eval_fraction");
  auto rows = dschat::rows_for_step(src, step_index, sp);
  ctx.log().info("{}", rows.summary);
  return rows;
}

// The memory a training node needs: f32 weights, gradients and two AdamW moments, plus
// the activations the decoder keeps for backward (per token and layer: the residual
// streams, norms, q/k/v, attention output and MLP hidden, and the (H, T) attention row;
// per token: logits and their gradient). Refuses, before training starts, a plan that
// does not fit the memory the machine has available, saying what to change.
void check_memory_plan(const actor::node_context& ctx, const model_config& c, int64_t B, int64_t T,
                       const char* batch_setting) {
  const double params = static_cast<double>(c.num_parameters()) * 4.0 * 4.0;
  const double per_token = static_cast<double>(c.n_layers) *
                               (8.0 * c.dim + static_cast<double>(c.n_heads) * T + 3.0 * c.hidden_dim) +
                           2.0 * c.vocab_size;
  const double need = params + 4.0 * per_token * static_cast<double>(B) * static_cast<double>(T);
  const double avail = static_cast<double>(sysconf(_SC_AVPHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
  if (avail > 0 && need > 0.9 * avail)
    throw std::runtime_error(fmt::format(
        "node '{}': the plan needs about {:.1f} GiB ({:.1f} GiB weights, gradients and AdamW states; the rest "
        "activations for {} x {} tokens) but {:.1f} GiB are available: lower {} or max_seq_len, or set lora_dim",
        ctx.name(), need / 1073741824.0, params / 1073741824.0, B, T, avail / 1073741824.0, batch_setting));
}

// "end" cuts the end of prompt + answer (DS-Chat); "prompt_start" drops the oldest prompt
// tokens first, so the answers survive (HH-RLHF prompts are long in tok512's pieces).
dschat::truncation_mode truncation_of(const actor::node_context& ctx) {
  const auto& t = ctx.spec().get_string("truncation");
  if (t == "end") return dschat::truncation_mode::end;
  if (t == "prompt_start") return dschat::truncation_mode::prompt_start;
  throw std::invalid_argument("node '" + ctx.name() + "': truncation must be \"end\" or \"prompt_start\", not \"" + t +
                              "\"");
}

std::unique_ptr<tokenizer> load_tok(const actor::node_context& ctx) {
  return load_tokenizer(resolve_user_path(ctx.spec().get_string("tokenizer"), "tokenizer").string());
}

/// Batches of row indices, epoch after epoch, in dschat::epoch_batches' seeded order.
/// With full_only, a last partial batch of an epoch is skipped.
class batch_cycle {
 public:
  batch_cycle() = default;
  batch_cycle(int64_t rows, int64_t batch, uint64_t seed, bool full_only = false)
      : rows_(rows), batch_(batch), seed_(seed), full_only_(full_only) {}
  /// The next batch. Throws std::invalid_argument when the rows cannot fill one.
  std::vector<int64_t> next(const std::string& node) {
    if (rows_ < 1 || (full_only_ && rows_ < batch_))
      throw std::invalid_argument("node '" + node + "': its share of the data has " + std::to_string(rows_) +
                                  " rows, too few for a batch of " + std::to_string(batch_) +
                                  ": lower the batch size or give this step a larger data_split share");
    while (queue_.empty())
      for (auto& b : dschat::epoch_batches(rows_, batch_, seed_, epoch_++))
        if (!full_only_ || static_cast<int64_t>(b.size()) == batch_) queue_.push_back(std::move(b));
    auto b = std::move(queue_.front());
    queue_.pop_front();
    return b;
  }

 private:
  int64_t rows_ = 0, batch_ = 1;
  uint64_t seed_ = 0;
  bool full_only_ = false;
  int64_t epoch_ = 0;
  std::deque<std::vector<int64_t>> queue_;
};

/// A trainer's engine: ZeRO stage zero_stage, the DS-Chat settings' AdamW, clip, accumulation
/// and dtype (dschat::engine_settings), over the given communicator (step 3's rank group) or
/// an inproc group of one (steps 1-2).
struct trainer_engine {
  std::unique_ptr<comm::communicator> own_comm;
  std::unique_ptr<zero_engine> engine;
  lr_schedule schedule;

  void make(decoder& model, const dschat::dschat_settings& d, int64_t steps, comm::communicator* comm = nullptr) {
    if (!comm) {
      own_comm = comm::inproc_communicator(comm::make_inproc_group(1), 0);
      comm = own_comm.get();
    }
    engine = std::make_unique<zero_engine>(model, *comm, dschat::engine_settings(model, d));
    schedule = dschat::schedule_from(d, steps);
  }
  /// The lr of the next update (transformers.get_scheduler over `steps` updates).
  double next_lr(const dschat::dschat_settings& d) const {
    return schedule.lr_at(engine->step_count(), d.learning_rate);
  }
  /// Training is over: the model whole again (for eval, save and the next step), the engine gone.
  void finish() {
    if (!engine) return;
    engine->release_model();
    engine.reset();
    own_comm.reset();
  }
};

// ---------------------------------------------------------------- step 1

/// Step 1: supervised fine-tuning (step1 main.py). A source: each produce() is one
/// optimizer update through the engine; at the end it evaluates and emits the model on `model`.
class sft_trainer final : public actor::node {
 public:
  void start(actor::node_context& ctx) override {
    const auto [model_path, given] = given_model(ctx);
    format_ = saved_format(given.format, false);
    check_output(ctx, given, false);
    tokenizer_ = resolve_user_path(ctx.spec().get_string("tokenizer"), "tokenizer").string();
    if ((model_ = resume_saved(ctx, "[step 1 sft]", [](const std::string& f) { return load_model(f); }))) {
      resumed_ = true;
      return;
    }
    d_ = common_settings(ctx);
    d_.mask_prompt = ctx.spec().get_bool("mask_prompt");
    steps_ = ctx.spec().get_int("steps");
    if (steps_ < 1) throw std::invalid_argument("node '" + ctx.name() + "': steps must be >= 1");
    tok_ = load_tok(ctx);
    auto rows = load_step_rows(ctx, 0, d_);
    dschat::tokenize_settings ts;
    ts.max_seq_len = d_.max_seq_len;
    ts.mask_prompt = d_.mask_prompt;
    ts.truncation = truncation_of(ctx);
    train_ = dschat::make_sft_examples(rows.train, *tok_, ts);
    order_ = batch_cycle(static_cast<int64_t>(train_.size()), d_.per_device_train_batch_size, d_.seed);
    auto eval = dschat::make_sft_examples(rows.eval, *tok_, ts);
    n_eval_ = static_cast<int64_t>(eval.size());
    for (auto& b : dschat::epoch_batches(static_cast<int64_t>(eval.size()), d_.per_device_train_batch_size, 0, 0, false))
      eval_.push_back(dschat::sft_batch(eval, b, d_.mask_prompt));
    model_ = std::make_shared<decoder>(load_model(model_path));
    check_seq_len(ctx, model_->config(), d_.max_seq_len, "max_seq_len");
    check_memory_plan(ctx, model_->config(), d_.per_device_train_batch_size, d_.max_seq_len,
                      "per_device_train_batch_size");
    dschat::apply_lora(*model_, d_);
    model_->set_gradient_checkpointing(d_.gradient_checkpointing);
    before_ = dschat::sft_eval(*model_, eval_);
    engine_.make(*model_, d_, steps_);
    ctx.print(fmt::format("[step 1 sft] {} train / {} held-out examples; held-out loss {:.4f} (ppl {:.2f}) before",
                          train_.size(), n_eval_, before_.loss, before_.perplexity));
    t0_ = clk::now();
  }

  bool produce(actor::node_context& ctx) override {
    if (done_) return false;
    if (resumed_) {
      ctx.emit("model", actor::payload::make("model", model_msg{model_, 0, format_, tokenizer_}));
      done_ = true;
      return false;
    }
    if (step_ < steps_) {  // one update: gradient_accumulation_steps micro-batches
      std::vector<dschat::sft_batch_data> micro;
      int64_t tokens = 0;
      for (int64_t g = 0; g < d_.gradient_accumulation_steps; ++g) {
        micro.push_back(dschat::sft_batch(train_, order_.next(ctx.name()), d_.mask_prompt));
        tokens += micro.back().n_target_tokens;
      }
      auto t = clk::now();
      const step_result r = dschat::sft_update(*engine_.engine, micro, engine_.next_lr(d_));
      ctx.signal("loss", r.loss);
      ++step_;
      tokens_ += tokens;
      ctx.metric("tokens", tokens);
      ctx.metric("steps");
      if (step_ % ctx.spec().get_int("print_every") == 0 || step_ == steps_)
        ctx.print(fmt::format("[step 1 sft] step {}/{} loss {:.4f} lr {:.2e} ({:.0f} tokens/s)", step_, steps_, r.loss,
                              r.lr, tokens / since(t)));
      return true;
    }
    engine_.finish();
    auto after = dschat::sft_eval(*model_, eval_);
    ctx.print(fmt::format("[step 1 sft] held-out loss {:.4f} -> {:.4f} (ppl {:.2f} -> {:.2f}), {:.1f} s",
                          before_.loss, after.loss, before_.perplexity, after.perplexity, since(t0_)));
    if (const auto& out = ctx.spec().get_string("output"); !out.empty()) {
      save_output(ctx, "[step 1 sft]", *model_, format_, tokenizer_);
      // llama2.c and HF files hold the merged weights: bit-exact on reload only without LoRA
      if (!model_->has_lora() || format_ == model_format::flowrun) write_run_marker(ctx, out);
    }
    ctx.emit("model", actor::payload::make("model", model_msg{model_, 0, format_, tokenizer_}));
    done_ = true;
    return false;
  }

 private:
  bool resumed_ = false;
  model_format format_ = model_format::llama2c;
  std::string tokenizer_;
  dschat::dschat_settings d_;
  int64_t steps_ = 0, step_ = 0, tokens_ = 0, n_eval_ = 0;
  std::unique_ptr<tokenizer> tok_;
  std::vector<dschat::sft_example> train_;
  std::vector<dschat::sft_batch_data> eval_;
  batch_cycle order_;
  std::shared_ptr<decoder> model_;
  trainer_engine engine_;
  dschat::sft_eval_result before_;
  clk::time_point t0_;
  bool done_ = false;
};

// ---------------------------------------------------------------- step 2

/// Step 2: the reward model (step2 main.py): base + v_head, pairwise loss.
class rm_trainer final : public actor::node {
 public:
  void start(actor::node_context& ctx) override {
    const auto [model_path, given] = given_model(ctx);
    format_ = saved_format(given.format, true);
    check_output(ctx, given, true);
    tokenizer_ = resolve_user_path(ctx.spec().get_string("tokenizer"), "tokenizer").string();
    if ((model_ = resume_saved(ctx, "[step 2 rm]", [](const std::string& f) { return load_model(f); }))) {
      resumed_ = true;
      return;
    }
    d_ = common_settings(ctx);
    steps_ = ctx.spec().get_int("steps");
    if (steps_ < 1) throw std::invalid_argument("node '" + ctx.name() + "': steps must be >= 1");
    tok_ = load_tok(ctx);
    auto rows = load_step_rows(ctx, 1, d_);
    dschat::tokenize_settings ts;
    ts.max_seq_len = d_.max_seq_len;
    ts.truncation = truncation_of(ctx);
    dschat::process_report rep;
    train_ = dschat::make_rm_examples(rows.train, *tok_, ts, &rep);
    order_ = batch_cycle(static_cast<int64_t>(train_.size()), d_.per_device_train_batch_size, d_.seed + 1);
    ctx.log().info("{}", rep.summary());
    auto eval = dschat::make_rm_examples(rows.eval, *tok_, ts);
    for (auto& b : dschat::epoch_batches(static_cast<int64_t>(eval.size()), d_.per_device_train_batch_size, 0, 0, false))
      eval_.push_back(dschat::rm_batch(eval, b));
    model_ = std::make_shared<decoder>(load_model(model_path));
    if (!model_->has_value_head()) model_->add_value_head(ctx.seed());
    check_seq_len(ctx, model_->config(), d_.max_seq_len, "max_seq_len");
    check_memory_plan(ctx, model_->config(), 2 * d_.per_device_train_batch_size, d_.max_seq_len,
                      "per_device_train_batch_size");
    dschat::apply_lora(*model_, d_);
    model_->set_gradient_checkpointing(d_.gradient_checkpointing);
    auto ev = dschat::rm_eval(*model_, eval_);
    engine_.make(*model_, d_, steps_);
    ctx.print(fmt::format("[step 2 rm] {} train / {} held-out pairs; held-out accuracy {:.3f} ± {:.3f} before",
                          train_.size(), ev.pairs, ev.accuracy, ev.accuracy_stderr));
    t0_ = clk::now();
  }

  bool produce(actor::node_context& ctx) override {
    if (done_) return false;
    if (resumed_) {
      ctx.emit("model", actor::payload::make("model", model_msg{model_, 0, format_, tokenizer_}));
      done_ = true;
      return false;
    }
    if (step_ < steps_) {  // one update: gradient_accumulation_steps micro-batches
      std::vector<dschat::rm_batch_data> micro;
      int64_t tokens = 0;
      for (int64_t g = 0; g < d_.gradient_accumulation_steps; ++g) {
        micro.push_back(dschat::rm_batch(train_, order_.next(ctx.name())));
        tokens += 2 * micro.back().B * micro.back().T;
      }
      auto r = dschat::rm_update(*engine_.engine, micro, engine_.next_lr(d_));
      ctx.signal("loss", r.loss);
      ctx.signal("accuracy", r.accuracy);
      ++step_;
      ctx.metric("tokens", tokens);
      ctx.metric("steps");
      acc_sum_ += r.accuracy;
      ++acc_n_;
      if (step_ % ctx.spec().get_int("print_every") == 0 || step_ == steps_) {
        ctx.print(fmt::format("[step 2 rm] step {}/{} loss {:.4f} acc {:.3f} chosen {:.3f} rejected {:.3f}", step_,
                              steps_, r.loss, acc_sum_ / acc_n_, r.chosen_mean, r.rejected_mean));
        acc_sum_ = 0;
        acc_n_ = 0;
      }
      return true;
    }
    engine_.finish();
    auto ev = dschat::rm_eval(*model_, eval_);
    ctx.print(fmt::format("[step 2 rm] held-out accuracy {:.3f} ± {:.3f} over {} pairs; mean chosen {:.3f}, "
                          "rejected {:.3f}; {:.1f} s",
                          ev.accuracy, ev.accuracy_stderr, ev.pairs, ev.chosen_mean, ev.rejected_mean, since(t0_)));
    if (const auto& out = ctx.spec().get_string("output"); !out.empty()) {
      // a flowrun folder keeps every tensor in f32, LoRA and v_head included: bit-exact on reload
      save_output(ctx, "[step 2 rm]", *model_, format_, tokenizer_);
      if (!model_->has_lora() || format_ == model_format::flowrun) write_run_marker(ctx, out);
    }
    ctx.emit("model", actor::payload::make("model", model_msg{model_, 0, format_, tokenizer_}));
    done_ = true;
    return false;
  }

 private:
  bool resumed_ = false;
  model_format format_ = model_format::llama2c;
  std::string tokenizer_;
  dschat::dschat_settings d_;
  int64_t steps_ = 0, step_ = 0;
  double acc_sum_ = 0;
  int64_t acc_n_ = 0;
  std::unique_ptr<tokenizer> tok_;
  std::vector<dschat::rm_example> train_;
  std::vector<dschat::rm_batch_data> eval_;
  batch_cycle order_;
  std::shared_ptr<decoder> model_;
  trainer_engine engine_;
  clk::time_point t0_;
  bool done_ = false;
};

// ---------------------------------------------------------------- model files

/// Loads a model (llama2.c .bin, a flowrun model folder, or a HF folder) and emits it once:
/// how graphs/ppo.graph starts from the outputs of sft.graph and rm.graph.
class model_source final : public actor::node {
 public:
  bool produce(actor::node_context& ctx) override {
    if (done_) return false;
    const auto [path, info] = given_model(ctx);
    auto m = std::make_shared<decoder>(load_model(path));
    if (ctx.spec().get_bool("value_head") && !m->has_value_head())
      throw std::runtime_error("node '" + ctx.name() + "': " + ctx.spec().get_string("model") +
                               " has no value head; give the folder written by rm_trainer's output");
    ctx.log().info("loaded {}: {}", ctx.spec().get_string("model"), m->config().summary());
    // an HF folder carries its tokenizer (a trainer that starts from it copies it on)
    const std::filesystem::path dir(path);
    const bool has_tok = info.format == model_format::hf &&
                         (std::filesystem::exists(dir / "tokenizer.model") ||
                          (std::filesystem::exists(dir / "vocab.json") && std::filesystem::exists(dir / "merges.txt")));
    ctx.emit("model", actor::payload::make("model", model_msg{m, 0, info.format, has_tok ? path : ""}));
    done_ = true;
    return false;
  }

 private:
  bool done_ = false;
};

// ---------------------------------------------------------------- step 3: prompts

/// Step 3's prompts: first a held-out batch (iteration -1), then one training
/// batch per tick, then the held-out batch again (iteration -2).
class prompt_loader final : public actor::node {
 public:
  void start(actor::node_context& ctx) override {
    dschat::dschat_settings d;
    d.seed = static_cast<uint64_t>(ctx.spec().get_int("seed"));
    d.data_split = ctx.spec().get_string("data_split");
    auto tok = load_tok(ctx);
    auto rows = load_step_rows(ctx, 2, d);
    dschat::tokenize_settings ts;
    ts.max_prompt_seq_len = ctx.spec().get_int("max_prompt_seq_len");
    ts.overflow = dschat::prompt_overflow::keep_end;
    train_ = dschat::make_prompt_examples(rows.train, *tok, ts);
    eval_ = dschat::make_prompt_examples(rows.eval, *tok, ts);
    B_ = ctx.spec().get_int("per_device_generation_batch_size");
    iterations_ = ctx.spec().get_int("iterations");
    eval_rows_ = std::min<int64_t>(ctx.spec().get_int("eval_prompts"), static_cast<int64_t>(eval_.size()));
    order_ = batch_cycle(static_cast<int64_t>(train_.size()), B_, d.seed + 2, /*full_only=*/true);
    // step-3 resume: the held-out "before" batch was scored and J batches trained on before the
    // commit; the order is a function of the batches drawn, so draw them again
    if (const auto rp = ppo::find_step3_resume(ctx.checkpoint_dir())) {
      for (int64_t i = 0; i < std::min(rp->point.iteration, iterations_); ++i) order_.next(ctx.name());
      next_ = 1 + rp->point.iteration;
    }
  }
  void on_message(actor::node_context&, std::string_view, actor::payload) override { ready_ = true; }
  bool produce(actor::node_context& ctx) override {
    if (!ready_) {
      ctx.wait_for_input();
      return true;
    }
    if (next_ > iterations_ + 1) return false;
    prompt_msg m;
    std::vector<int64_t> idx;
    if (next_ == 0 || next_ == iterations_ + 1) {
      for (int64_t i = 0; i < eval_rows_; ++i) idx.push_back(i);
      auto pb = dschat::prompt_batch(eval_, idx);
      m = {pb.ids, pb.mask, next_ == 0 ? -1 : -2, true};
    } else {
      auto pb = dschat::prompt_batch(train_, order_.next(ctx.name()));
      m = {pb.ids, pb.mask, next_ - 1, false};
    }
    ++next_;
    ready_ = false;
    ctx.emit("batch", actor::payload::make("prompt_batch", std::move(m)));
    return true;
  }

 private:
  std::vector<dschat::prompt_example> train_, eval_;
  batch_cycle order_;
  int64_t B_ = 4, iterations_ = 0, eval_rows_ = 0, next_ = 0;
  bool ready_ = true;
};

// ---------------------------------------------------------------- step 3: controller

/// Orders each iteration's phases and prints DS-Chat's per-iteration figures.
class ppo_controller final : public actor::node {
 public:
  void start(actor::node_context& ctx) override {
    t0_ = clk::now();
    dir_ = ctx.checkpoint_dir();
    save_every_ = ctx.spec().get_int("save_checkpoint_steps");
    keep_ = static_cast<int>(ctx.spec().get_int("keep_checkpoints"));
    if (const auto rp = ppo::find_step3_resume(dir_)) {  // the same answer every node gets
      for (const auto& why : rp->refused) ctx.print("[step 3 ppo] checkpoint " + why);
      commit_.eval_before = eval_before_ = rp->commit.eval_before;
      for (const auto& pt : rp->commit.committed)
        if (pt.iteration <= rp->point.iteration) commit_.committed.push_back(pt);
      updates_ = rp->point.policy_version;
      ctx.print(fmt::format("[step 3 ppo] resuming after iteration {} from {} (policy version {})",
                            rp->point.iteration, dir_, updates_));
    }
  }
  void on_message(actor::node_context& ctx, std::string_view port, actor::payload msg) override {
    if (port == "prompts") {
      prompt_msg p = msg.as<prompt_msg>();  // tensor handles: no data copy
      cur_ = p.iteration;
      eval_ = p.eval;
      have_summary_ = have_actor_ = have_critic_ = false;
      p.policy_version = updates_;  // generate with the weights of every update reported so far
      // every save_checkpoint_steps iterations the trainers save after this batch's update
      p.checkpoint = !eval_ && !dir_.empty() && save_every_ > 0 && (cur_ + 1) % save_every_ == 0;
      if (p.checkpoint) commit_due_ = true;
      ctx.emit("generate", actor::payload::make("prompt_batch", std::move(p)));
      return;
    }
    if (port == "summary") {
      sum_ = msg.as<summary_msg>();
      have_summary_ = true;
    } else if (port == "actor_stats") {
      actor_ = msg.as<stats_msg>();
      have_actor_ = true;
      ++updates_;  // the policy bumps its version once per update, when it reports
    } else if (port == "critic_stats") {
      critic_ = msg.as<stats_msg>();
      have_critic_ = true;
    }
    bool complete = have_summary_ && (eval_ || sum_.dropped || !sum_.trains || (have_actor_ && have_critic_));
    if (!complete) return;
    double gen_tps = sum_.generate_seconds > 0 ? sum_.generated_tokens / sum_.generate_seconds : 0;
    if (!eval_ && !sum_.dropped) ctx.signal("reward", sum_.reward_mean);
    if (!eval_ && !sum_.dropped) ctx.signal("kl", sum_.kl_mean);
    if (!eval_ && !sum_.dropped) ctx.signal("generation_tokens_per_s", gen_tps);
    if (eval_) {
      ctx.print(fmt::format("[step 3 ppo] held-out {}: mean reward {:.4f}, KL to reference {:.4f}, answer length "
                            "{:.1f} ({} prompts)",
                            cur_ == -1 ? "before" : "after", sum_.reward_mean, sum_.kl_mean, sum_.answer_len_mean,
                            sum_.rows));
      if (cur_ == -1) eval_before_ = sum_.reward_mean;
      else
        ctx.print(fmt::format("[step 3 ppo] held-out mean reward {:.4f} -> {:.4f} ({:+.4f}), {:.1f} s", eval_before_,
                              sum_.reward_mean, sum_.reward_mean - eval_before_, since(t0_)));
    } else if (sum_.dropped) {
      ctx.print(fmt::format("[step 3 ppo] iter {}: every answer was too short, batch dropped (as DS-Chat)", cur_));
    } else if (!sum_.trains) {
      ctx.print(fmt::format("[step 3 ppo] iter {} reward {:.4f} kl {:.4f} answer_len {:.1f} gen {:.0f} tok/s "
                            "(experience kept for the next update)",
                            cur_, sum_.reward_mean, sum_.kl_mean, sum_.answer_len_mean, gen_tps));
    } else {
      double train_tps = (actor_.tokens + critic_.tokens) / std::max(1e-9, actor_.seconds + critic_.seconds);
      ctx.signal("actor_loss", actor_.loss);
      ctx.signal("critic_loss", critic_.loss);
      ctx.signal("training_tokens_per_s", train_tps);
      ctx.print(fmt::format("[step 3 ppo] iter {} reward {:.4f} kl {:.4f} actor_loss {:.4f} critic_loss {:.4f}{} "
                            "answer_len {:.1f} gen {:.0f} tok/s train {:.0f} tok/s{}",
                            cur_, sum_.reward_mean, sum_.kl_mean, actor_.loss, critic_.loss,
                            actor_.unsup_loss > 0 ? fmt::format(" unsup_loss {:.4f}", actor_.unsup_loss) : "",
                            sum_.answer_len_mean, gen_tps, train_tps,
                            actor_.gather_theory_bytes > 0
                                ? fmt::format(" hybrid-engine gather {:.3f} MB/rank (theory {:.3f})",
                                              actor_.gather_bytes / 1e6, actor_.gather_theory_bytes / 1e6)
                                : ""));
      ctx.metric("steps");
      if (commit_due_) commit(ctx);
    }
    ctx.emit("next", actor::payload::make("tick", cur_));
  }

 private:
  // The trainers saved their shards of this iteration before they reported: commit it.
  void commit(actor::node_context& ctx) {
    commit_due_ = false;
    commit_.eval_before = eval_before_;
    commit_.committed.push_back({cur_ + 1, updates_});
    ppo::write_step3_commit(dir_, commit_);
    ppo::prune_step3(dir_, commit_, keep_);
    ctx.print(fmt::format("[step 3 ppo] checkpoint after iteration {} -> {}", cur_, dir_));
  }

  std::string dir_;
  int64_t save_every_ = 0;
  int keep_ = 2;
  bool commit_due_ = false;
  ppo::step3_commit commit_;
  int64_t cur_ = 0, updates_ = 0;
  bool eval_ = false, have_summary_ = false, have_actor_ = false, have_critic_ = false;
  summary_msg sum_;
  stats_msg actor_, critic_;
  double eval_before_ = 0;
  clk::time_point t0_;
};

// ---------------------------------------------------------------- step 3: generation

/// The hybrid engine: generates with the policy's live weights (a handle, never
/// reloaded from disk); buffers prompt batches until the policy has sent them.
class rollout_generator final : public actor::node {
 public:
  void start(actor::node_context& ctx) override {
    const auto& s = ctx.spec();
    ps_.max_answer_seq_len = s.get_int("max_answer_seq_len");
    if (ps_.max_answer_seq_len < 2)
      throw std::invalid_argument("node '" + ctx.name() + "': max_answer_seq_len must be >= 2 (DS-Chat drops answers "
                                  "of at most one token)");
    ps_.temperature = static_cast<float>(s.get_float("temperature"));
    ps_.top_k = static_cast<int>(s.get_int("top_k"));
    ps_.top_p = static_cast<float>(s.get_float("top_p"));
    tok_ = load_tok(ctx);
  }
  void on_message(actor::node_context& ctx, std::string_view port, actor::payload msg) override {
    if (port == "weights") {
      weights_ = msg.as<model_msg>();
    } else {
      pending_.push_back(msg);
    }
    // A batch waits for the policy version the controller stamped on it: on
    // another node the weights are a copy that arrives on its own path, and
    // may come after the prompts that need it.
    while (weights_.model && !pending_.empty() &&
           weights_.version >= pending_.front().as<prompt_msg>().policy_version) {
      const auto& p = pending_.front().as<prompt_msg>();
      ppo::ppo_settings s = ps_;
      if (p.eval) s.temperature = 0.0f;  // held-out answers are greedy, so before/after compare like with like
      ctx.phase("generation");
      auto t = clk::now();
      auto e = ppo::generate_rollouts(*weights_.model, p.ids, p.mask, s, tok_->eos_id(), 0,
                                      ctx.seed() + static_cast<uint64_t>(p.iteration + 10));
      rollout_msg r;
      r.iteration = p.iteration;
      r.eval = p.eval;
      r.batch = emitted_++ * static_cast<int64_t>(ctx.replicas()) + static_cast<int64_t>(ctx.replica());
      r.checkpoint = p.checkpoint;
      r.generate_seconds = since(t);
      if (e) {
        for (auto n : e->answer_len) r.generated_tokens += n;
        r.exp = std::make_shared<const ppo::experience>(std::move(*e));
      }
      ctx.metric("tokens", r.generated_tokens);
      ctx.emit("rollouts", actor::payload::make("rollouts", std::move(r)));
      pending_.pop_front();
    }
  }

 private:
  ppo::ppo_settings ps_;
  std::unique_ptr<tokenizer> tok_;
  model_msg weights_;
  std::deque<actor::payload> pending_;
  int64_t emitted_ = 0;
};

// ---------------------------------------------------------------- step 3: frozen scorers

/// The reference model (log-probs) or the reward model (end scores): frozen, scores each
/// rollout batch with the model it got on `init` (a copy: DS-Chat loads each role's model).
class frozen_scorer final : public actor::node {
 public:
  explicit frozen_scorer(bool reward) : reward_(reward) {}

  void on_message(actor::node_context& ctx, std::string_view port, actor::payload msg) override {
    if (port == "init") {
      const auto& m = msg.as<model_msg>();
      model_ = copy_model(*m.model);
      if (m.model->has_value_head()) {
        model_->add_value_head();
        model_->w().v_head.copy_from(m.model->w().v_head);
      }
      ctx.log().info("model ready: {}", model_->config().summary());
    } else if (port == "rollouts") {
      pending_.push_back(msg);
    }
    while (model_ && !pending_.empty()) {
      auto r = pending_.front().shared<rollout_msg>();
      pending_.pop_front();
      ctx.phase("scoring");
      score_msg out;
      out.rollouts = r;
      if (r->exp) {
        const auto& e = *r->exp;
        activations a;
        out.value = reward_ ? ppo::reward_scores(*model_, e.seq, e.attention_mask)
                            : ppo::sequence_logprobs(*model_, a, e.seq, e.attention_mask);
        rlhf::check_finite(out.value, ctx.name(), reward_ ? "reward_score" : "ref_logprobs");
      }
      ctx.emit("scored", actor::payload::make("scores", std::move(out)));
    }
  }

 private:
  bool reward_;
  std::shared_ptr<decoder> model_;
  std::deque<actor::payload> pending_;
};

// ---------------------------------------------------------------- step 3: trainers

/// The policy (old log-probs; the clipped policy loss, + ptx) or the critic (values; the
/// clipped value loss) of step 3, trained through the engine (models/train/zero.h) like every
/// trainer. `replicas = N` makes N ranks of one data-parallel group (rank_group.h): every
/// rank gets every rollout and experience batch, scores and trains on its 1/N of the rows,
/// and the gradients meet in the communicator; at actor_zero_stage / critic_zero_stage 3 the
/// ranks own 1/N of the parameters and AdamW moments. Rank 0 speaks for the group (scores,
/// stats, the generator's weights, the saved output).
class ppo_trainer final : public actor::node {
 public:
  explicit ppo_trainer(bool policy) : policy_(policy) {}

  void start(actor::node_context& ctx) override {
    const auto& s = ctx.spec();
    const std::string who = policy_ ? "actor" : "critic";
    ps_.ppo_epochs = s.get_int("ppo_epochs");
    ps_.ppo.cliprange = static_cast<float>(s.get_float("cliprange"));
    ps_.ppo.cliprange_value = static_cast<float>(s.get_float("cliprange_value"));
    ps_.per_device_training_batch_size = s.get_int("per_device_training_batch_size");
    // the engine's settings, DS-Chat's names: dschat::engine_settings is the one conversion
    d_.learning_rate = static_cast<float>(s.get_float(who + "_learning_rate"));
    d_.weight_decay = static_cast<float>(s.get_float(who + "_weight_decay"));
    d_.zero_stage = static_cast<int>(s.get_int(who + "_zero_stage"));
    d_.lora_dim = s.get_int(who + "_lora_dim");
    d_.lora_module_name = s.get_string(who + "_lora_module_name");
    d_.only_optimize_lora = s.get_bool("only_optimize_lora");
    d_.gradient_checkpointing = s.get_bool(who + "_gradient_checkpointing");
    d_.gradient_clipping = static_cast<float>(s.get_float("gradient_clipping"));
    d_.gradient_accumulation_steps = s.get_int("gradient_accumulation_steps");
    d_.dtype = s.get_string("dtype");
    d_.seed = 0;  // the LoRA init: the same on every rank
    group_ = join_rank_group(ctx);
    if (group_.local_ranks > 1) ops::set_thread_budget(std::max(1, ops::hardware_threads() / group_.local_ranks));
    if (const auto& p = s.get_string("deepspeed_config"); !p.empty()) {
      const auto c = load_ds_config(resolve_user_path(p, "deepspeed_config").string(), group_.world);
      dschat::apply_ds_config(d_, c);
      if (group_.rank == 0 && !c.ignored_keys.empty())
        ctx.log().info("{}: keys that do not apply here, ignored: {}", c.where, fmt::join(c.ignored_keys, ", "));
    }
    if (policy_) {
      ps_.enable_ema = s.get_bool("enable_ema");
      ps_.unsup_coef = static_cast<float>(s.get_float("unsup_coef"));
      if (const auto& u = s.get_string("unsup_data"); !u.empty()) {  // ptx: DS-Chat's unsupervised mixing
        if (s.get_string("tokenizer").empty())
          throw std::invalid_argument("node '" + ctx.name() + "': unsup_data needs the tokenizer setting");
        unsup_tok_ = load_tokenizer(resolve_user_path(s.get_string("tokenizer"), "tokenizer").string());
        unsup_ = std::make_unique<lm_dataset>(resolve_user_path(u, "unsup_data").string(), *unsup_tok_,
                                              s.get_int("unsup_seq_len"));
        auto seed = tensor::empty({1}, dtype::i64);  // every rank draws the same ptx rows: rank 0's seed
        seed.data<int64_t>()[0] = static_cast<int64_t>(ctx.seed());
        group_.comm->broadcast(seed, 0);
        unsup_->set_seed(static_cast<uint64_t>(seed.data<int64_t>()[0]));
      }
    }
  }

  void on_message(actor::node_context& ctx, std::string_view port, actor::payload msg) override {
    if (port == "init") {
      init(ctx, msg.as<model_msg>());
    } else if (port == "rollouts") {
      pending_.push_back(msg);
    } else if (port == "train") {
      train(ctx, msg.as<experience_batch>());
    }
    while (engine_.engine && !pending_.empty()) {
      auto r = pending_.front().shared<rollout_msg>();
      pending_.pop_front();
      score(ctx, r);
    }
  }

  void stop(actor::node_context& ctx) override {
    if (!engine_.engine || ctx.reason() != actor::stop_reason::completed) return;
    if (speaks())  // DeepSpeed's see_memory_usage split, rank 0's (docs/zero.md)
      ctx.print(fmt::format("[step 3 ppo] {} memory {}", ctx.name(), engine_.engine->memory().str()));
    engine_.finish();  // every rank: at stage 3 the parameters are gathered
    if (policy_ && group_.rank == 0) save_output(ctx, "[step 3 ppo]", *model_, format_, tokenizer_);
  }

 private:
  bool speaks() const { return group_.rank == 0; }

  void init(actor::node_context& ctx, const model_msg& m) {
    if (policy_) {  // saved as given (checked at validation too): refused before training
      check_output(ctx, {m.format, m.model->config().family, false}, false);
      format_ = saved_format(m.format, false);
      const auto& t = ctx.spec().get_string("tokenizer");
      tokenizer_ = t.empty() ? m.tokenizer : resolve_user_path(t, "tokenizer").string();
      // the model's own tokenizer path is the sender's: on another cluster node it may be missing
      if (format_ == model_format::hf && !tokenizer_.empty() && !ctx.spec().get_string("output").empty() &&
          !std::filesystem::exists(tokenizer_))
        throw std::invalid_argument("node '" + ctx.name() + "': the tokenizer of the model it got, " + tokenizer_ +
                                    ", is not on this machine, so it cannot be copied beside the output: set "
                                    "the policy's tokenizer setting to a copy here");
    } else if (!m.model->has_value_head()) {
      throw std::invalid_argument("node '" + ctx.name() + "': the critic starts from a model with a value head "
                                  "(the reward model of step 2)");
    }
    // the step-1/2 outputs are copied: each role owns its model (DS-Chat loads them separately)
    model_ = copy_model(*m.model);
    if (m.model->has_value_head()) {
      model_->add_value_head();
      model_->w().v_head.copy_from(m.model->w().v_head);
    }
    dschat::apply_lora(*model_, d_);
    model_->set_gradient_checkpointing(d_.gradient_checkpointing);
    engine_.make(*model_, d_, 1, group_.comm.get());
    if (ps_.enable_ema) ema_ = engine_.engine->owned_params();  // this rank's pieces (ZeRO-3: DS-Chat's EMA is sharded too)
    if (const auto rp = ppo::find_step3_resume(ctx.checkpoint_dir())) restore(ctx, rp->point.iteration);
    if (policy_) publish_weights(ctx);
    if (speaks())
      ctx.log().info("model ready: {} ({} rank(s), ZeRO stage {}, {})", model_->config().summary(), group_.world,
                     d_.zero_stage, d_.dtype);
  }

  // The hybrid engine: the generator reads the policy's current weights. Below stage 3 rank 0's
  // model holds them all (a handle, no copy). At stage 3 every rank gathers the blocks once per
  // update (DS-Chat's hybrid engine gathers the ZeRO-3 partitions to generate) into a model
  // that lives until the generator has used it; the bytes moved are counted.
  void publish_weights(actor::node_context& ctx) {
    std::shared_ptr<decoder> gen = model_;
    gather_bytes_ = 0;
    if (d_.zero_stage == 3) {
      const int64_t b0 = group_.comm->stats().bytes_sent;
      tensor full = engine_.engine->gather_full_params();  // a collective: every rank
      gather_bytes_ = group_.comm->stats().bytes_sent - b0;
      if (speaks()) {
        gen = std::make_shared<decoder>(model_->config());
        gen->w().flat.copy_from(full);
        if (model_->has_lora()) {
          gen->enable_lora(model_->lora(), false);
          gen->w().adapter_flat.copy_from(model_->w().adapter_flat);
        }
      }
    }
    if (speaks()) ctx.emit("weights", actor::payload::make("model", model_msg{gen, version_}));
  }

  // Rank r scores rows micro_slice_of(B, N, r) and the group all-gathers them: (B, L) log-probs or values.
  void score(actor::node_context& ctx, const std::shared_ptr<const rollout_msg>& r) {
    ctx.phase("scoring");
    score_msg out;
    out.rollouts = r;
    if (r->exp) {
      const auto& e = *r->exp;
      const int64_t B = e.seq.size(0), L = e.seq.size(1) - 1, N = group_.world;
      const auto m = ppo::micro_slice_of(B, N, group_.rank);
      activations a;
      const tensor seq = e.seq.rows(m.a, m.b), mask = e.attention_mask.rows(m.a, m.b);
      tensor mine = policy_ ? ppo::sequence_logprobs(*model_, a, seq, mask) : ppo::sequence_values(*model_, a, seq, mask);
      if (N == 1) {
        out.value = mine;
      } else {
        const int64_t c = (B + N - 1) / N;
        auto send = tensor::zeros({c, L});
        if (!m.empty) send.rows(0, m.b - m.a).copy_from(mine);
        auto all = tensor::empty({N * c, L});
        group_.comm->all_gather(send, all);
        out.value = all.rows(0, B).clone();
      }
      rlhf::check_finite(out.value, ctx.name(), policy_ ? "logprobs" : "values");
    }
    if (speaks()) ctx.emit("scored", actor::payload::make("scores", std::move(out)));
  }

  void train(actor::node_context& ctx, const experience_batch& xb) {
    ctx.phase("training");
    auto t = clk::now();
    stats_msg st;
    st.iteration = xb.iteration;
    const int64_t mb = ps_.per_device_training_batch_size;
    const double lr = d_.learning_rate;  // DS-Chat step 3 here: a constant learning rate
    double loss_sum = 0;
    int64_t updates = 0, tokens = 0;
    for (const auto& x : xb.items) tokens += x.exp->seq.numel();
    for (int64_t ep = 0; ep < ps_.ppo_epochs * static_cast<int64_t>(xb.items.size()); ++ep) {
      const auto& x = xb.items[static_cast<size_t>(ep) % xb.items.size()];  // ppo_epochs passes over the batches
      const auto& e = *x.exp;
      const int64_t B = e.seq.size(0);
      for (int64_t a = 0; a < B; a += mb) {  // DS-Chat: one train_rlhf per mini-batch of the experience
        const int64_t b = std::min(B, a + mb);
        const ppo::experience sub = ppo::slice_rows(e, a, b);
        step_result r;
        if (policy_) {
          r = ppo::actor_update(*engine_.engine, sub, x.advantages.rows(a, b), ps_, lr);
          if (unsup_) {  // DS-Chat train_unsupervised: unsup_coef x LM loss, its own optimizer step
            tensor ids, tg;
            unsup_->next_batch(b - a, ids, tg);
            st.unsup_loss = ppo::ptx_update(*engine_.engine, ids, tg, ps_, lr).loss;
          }
        } else {
          r = ppo::critic_update(*engine_.engine, sub, x.returns.rows(a, b), ps_, lr);
        }
        loss_sum += r.loss;
        st.grad_norm = r.grad_norm;
        ++updates;
      }
    }
    st.loss = loss_sum / static_cast<double>(std::max<int64_t>(1, updates));
    if (ema_.defined()) rlhf::ema_update(ema_, engine_.engine->owned_params(), ps_.ema_beta);
    const memory_report mem = engine_.engine->memory();
    ctx.memory({{"params", mem.param_bytes}, {"gathered_peak", mem.gathered_peak_bytes}, {"grads", mem.grad_bytes},
                {"optimizer", mem.optimizer_bytes}, {"activations", mem.activation_bytes}});
    if (policy_) ++version_;
    if (xb.checkpoint && !ctx.checkpoint_dir().empty()) save(ctx, xb.iteration + 1);
    if (policy_) {
      publish_weights(ctx);
      st.gather_bytes = gather_bytes_;
      if (d_.zero_stage == 3)
        for (const auto& blk : model_->param_blocks())
          st.gather_theory_bytes += (group_.world - 1) * ((blk.numel() + group_.world - 1) / group_.world) * 4;
    }
    st.seconds = since(t);
    st.tokens = tokens * ps_.ppo_epochs;
    ctx.metric("tokens", st.tokens);
    if (speaks()) ctx.emit("stats", actor::payload::make("stats", st));
  }

  // ---- step-3 checkpoints (models/rlhf/ppo_checkpoint.h): CHECKPOINT_DIR/NAME/step_J

  std::string folder(const actor::node_context& ctx) const {
    return (std::filesystem::path(ctx.checkpoint_dir()) / ctx.name()).string();
  }
  std::string config_hash() const {
    nlohmann::json j = model_->config();
    j["lora"] = model_->has_lora();
    j["value_head"] = model_->has_value_head();
    j["base_trains"] = model_->base_trainable();
    return config_fingerprint(j);
  }

  // Every rank writes its pieces (fp32 master, AdamW moments, EMA); rank 0 the replicated
  // adapter / value head; then the folder's commit (the controller commits the iteration).
  void save(actor::node_context& ctx, int64_t iteration) {
    auto& eng = *engine_.engine;
    shard_manifest m;
    m.step = iteration;
    m.world_size = group_.world;
    m.rank = group_.rank;
    m.zero_stage = d_.zero_stage;
    m.config_hash = config_hash();
    if (unsup_) {
      m.data_epoch = unsup_->epoch();
      m.data_cursor = unsup_->cursor();
    }
    const uint64_t rng = model_->rng_state();
    m.rng_state.resize(sizeof rng);
    std::memcpy(m.rng_state.data(), &rng, sizeof rng);
    m.extra["optimizer_steps"] = eng.step_count();
    m.extra["policy_version"] = version_;
    if (d_.dtype == "fp16" && eng.settings().loss_scaler) {
      m.loss_scale = eng.settings().loss_scaler->scale();
      m.loss_scale_good_steps = eng.settings().loss_scaler->good_steps();
      m.extra["loss_scale_hysteresis_left"] = eng.settings().loss_scaler->hysteresis_left();
    }
    std::vector<shard_group> groups;
    if (model_->base_trainable()) {
      shard_group g;
      g.name = "base";
      g.full_numel = model_->num_parameters();
      for (auto& [lo, hi] : eng.owned_ranges()) g.ranges.push_back({lo, hi});
      g.tensors["fp32_master"] = eng.owned_params();
      if (auto t = eng.owned_exp_avg(); t.defined()) g.tensors["exp_avg"] = t;
      if (auto t = eng.owned_exp_avg_sq(); t.defined()) g.tensors["exp_avg_sq"] = t;
      if (ema_.defined()) g.tensors["ema"] = ema_.clone();
      groups.push_back(std::move(g));
    }
    if (model_->num_adapter_parameters() > 0 && group_.rank == 0) {  // replicated: rank 0 saves it
      shard_group g;
      g.name = "adapter";
      g.full_numel = model_->num_adapter_parameters();
      g.ranges.push_back({0, g.full_numel});
      g.tensors["fp32_master"] = eng.adapter_params().clone();
      if (auto t = eng.adapter_exp_avg(); t.numel() > 0) g.tensors["exp_avg"] = t;
      if (auto t = eng.adapter_exp_avg_sq(); t.numel() > 0) g.tensors["exp_avg_sq"] = t;
      groups.push_back(std::move(g));
    }
    save_shard(folder(ctx), m, groups);
    group_.comm->barrier();  // every shard on disk before the folder's commit
    if (group_.rank == 0) commit_checkpoint(folder(ctx), iteration, group_.world, /*keep=*/0);  // the controller prunes
    group_.comm->barrier();
  }

  // Load iteration J's shards (any world size and stage: the buffers are reassembled whole).
  void restore(actor::node_context& ctx, int64_t iteration) {
    const std::string f = (std::filesystem::path(folder(ctx)) / step_folder_name(iteration)).string();
    const auto ck = load_checkpoint(f);
    const auto& m0 = ck.manifests.at(0);
    if (m0.config_hash != config_hash())
      throw std::runtime_error("node '" + ctx.name() + "': checkpoint " + f +
                               " was made for another model, LoRA or value-head setting (config hash differs): "
                               "use another [graph] checkpoint_dir, or delete it to start step 3 afresh");
    auto get = [&](const char* g, const char* t) -> tensor {
      auto gi = ck.full.find(g);
      if (gi == ck.full.end()) return {};
      auto ti = gi->second.find(t);
      return ti == gi->second.end() ? tensor{} : ti->second;
    };
    auto& eng = *engine_.engine;
    eng.restore(get("base", "fp32_master"), get("base", "exp_avg"), get("base", "exp_avg_sq"),
                get("adapter", "fp32_master"), get("adapter", "exp_avg"), get("adapter", "exp_avg_sq"),
                m0.extra.value("optimizer_steps", int64_t{0}));
    if (const tensor e = get("base", "ema"); e.defined() && ema_.defined()) {  // this rank's pieces of it
      int64_t at = 0;
      for (const auto& [lo, hi] : eng.owned_ranges()) {
        ema_.flat_view(at, {hi - lo}).copy_from(e.flat_view(lo, {hi - lo}));
        at += hi - lo;
      }
    }
    if (eng.settings().loss_scaler && m0.loss_scale > 0)
      eng.settings().loss_scaler->restore(m0.loss_scale, m0.loss_scale_good_steps,
                                          m0.extra.value("loss_scale_hysteresis_left", int64_t{0}));
    const auto& mine = m0.world_size == group_.world ? ck.manifests.at(group_.rank) : m0;
    if (mine.rng_state.size() == sizeof(uint64_t)) {
      uint64_t rng;
      std::memcpy(&rng, mine.rng_state.data(), sizeof rng);
      model_->set_rng_state(rng);
    }
    if (unsup_) unsup_->set_position(m0.data_epoch, m0.data_cursor);
    version_ = m0.extra.value("policy_version", int64_t{0});
    if (speaks())
      ctx.log().info("restored iteration {} from {} ({} ranks, stage {}) on {} ranks, stage {}", iteration, f,
                     m0.world_size, m0.zero_stage, group_.world, d_.zero_stage);
  }

  bool policy_;
  model_format format_ = model_format::llama2c;
  std::string tokenizer_;
  ppo::ppo_settings ps_;
  dschat::dschat_settings d_;
  rank_group group_;
  trainer_engine engine_;
  int64_t version_ = 0, gather_bytes_ = 0;
  std::shared_ptr<decoder> model_;
  tensor ema_;
  std::deque<actor::payload> pending_;
  std::unique_ptr<tokenizer> unsup_tok_;
  std::unique_ptr<lm_dataset> unsup_;
};

// ---------------------------------------------------------------- step 3: experience maker

/// Joins the four scores of a rollout batch, computes rewards and GAE
/// (ppo_trainer.py compute_rewards, get_advantages_and_returns), emits the
/// experience to the trainers and a summary to the controller.
class experience_maker final : public actor::node {
 public:
  void start(actor::node_context& ctx) override {
    const auto& s = ctx.spec();
    cfg_.kl_ctl = static_cast<float>(s.get_float("kl_ctl"));
    cfg_.clip_reward_value = static_cast<float>(s.get_float("clip_reward_value"));
    cfg_.gamma = static_cast<float>(s.get_float("gamma"));
    cfg_.lam = static_cast<float>(s.get_float("lam"));
    generation_batches_ = std::max<int64_t>(1, s.get_int("generation_batches"));
  }
  void on_message(actor::node_context& ctx, std::string_view port, actor::payload msg) override {
    const auto& sm = msg.as<score_msg>();
    ctx.phase("experience");
    // Joined by the batch's id, not the rollouts' address: scores from other
    // processes each bring their own copy of the rollouts.
    auto& slot = joins_[sm.rollouts->batch];
    if (!slot.rollouts) slot.rollouts = sm.rollouts;
    slot.parts[std::string(port)] = sm.value;
    if (slot.parts.size() < 4) return;
    auto j = std::move(slot);
    joins_.erase(sm.rollouts->batch);
    const auto& r = *j.rollouts;
    summary_msg sum;
    sum.iteration = r.iteration;
    sum.eval = r.eval;
    sum.generate_seconds = r.generate_seconds;
    sum.generated_tokens = r.generated_tokens;
    if (r.checkpoint) pending_.checkpoint = true;  // kept past a dropped batch, to the next update
    if (!r.exp) {
      sum.dropped = true;
      ctx.emit("summary", actor::payload::make("summary", sum));
      return;
    }
    auto e = std::make_shared<ppo::experience>(*r.exp);
    e->logprobs = j.parts.at("logprobs");
    e->ref_logprobs = j.parts.at("ref_logprobs");
    e->values = j.parts.at("values");
    e->reward_score = j.parts.at("reward");
    experience_msg x;
    x.iteration = r.iteration;
    ppo::make_advantages(*e, cfg_, x.advantages, x.returns);
    rlhf::check_finite(x.advantages, ctx.name(), "advantages");
    const int64_t B = e->seq.size(0);
    for (int64_t b = 0; b < B; ++b) {
      sum.reward_mean += e->reward_score.item(b) / static_cast<double>(B);
      sum.answer_len_mean += static_cast<double>(e->answer_len[b]) / static_cast<double>(B);
    }
    sum.kl_mean = ppo::mean_kl(*e);
    sum.rows = B;
    if (!r.eval) {
      x.exp = e;
      pending_.items.push_back(std::move(x));
      pending_.iteration = r.iteration;
      if (static_cast<int64_t>(pending_.items.size()) == generation_batches_) {
        sum.trains = true;
        ctx.emit("experience", actor::payload::make("experience", std::move(pending_)));
        pending_ = experience_batch{};
      }
    }
    ctx.emit("summary", actor::payload::make("summary", sum));
  }

 private:
  struct join {
    std::shared_ptr<const rollout_msg> rollouts;
    std::map<std::string, tensor> parts;
  };
  rlhf::ppo_config cfg_;
  int64_t generation_batches_ = 1;
  experience_batch pending_;
  std::map<int64_t, join> joins_;  // by rollout_msg::batch
};

}  // namespace

void register_rlhf_nodes(graph::node_kind_registry& kinds, actor::node_factory_registry& factories) {
  register_rlhf_codecs();
  using T = graph::setting_type;
  auto trainer_settings = [](graph::node_kind& k, double lr, int64_t steps) {
    k.require("model", T::path, "initial weights: llama2.c .bin, a flowrun model folder, or a HF folder (LLaMA, OPT, GPT-2)")
        .require("tokenizer", T::path, "SentencePiece .model, GPT-2 BPE vocab.json, or a folder holding either")
        .require("data", T::path, "DS-Chat JSONL: {prompt, chosen, rejected} or {prompt, chosen}, or raw HH-RLHF")
        .option("mix_data", T::string_list, std::vector<std::string>{}, "more datasets blended with data (each split alike)")
        .option("data_split", T::string, std::string("2,4,4"), "DS-Chat's --data_split: each step's share")
        .option("eval_fraction", T::float_, 0.1, "held-out share of this step's rows").in_range(0, 1, false, /*high_open=*/true)
        .option("per_device_train_batch_size", T::int_, std::int64_t{8}, "rows per micro-batch").at_least(1)
        .option("gradient_accumulation_steps", T::int_, std::int64_t{1}, "micro-batches per optimizer step").at_least(1)
        .option("learning_rate", T::float_, lr, "AdamW peak learning rate").at_least(0)
        .option("weight_decay", T::float_, 0.0, "AdamW decoupled weight decay").at_least(0)
        .option("lr_scheduler_type", T::string, std::string("cosine"), "cosine, linear or constant")
        .option("num_warmup_steps", T::int_, std::int64_t{0}, "linear warmup steps").at_least(0)
        .option("max_seq_len", T::int_, std::int64_t{128}, "prompt + answer tokens, EOS kept when cut").at_least(2)
        .option("truncation", T::string, std::string("prompt_start"),
                "over max_seq_len: prompt_start drops the oldest prompt tokens; end cuts the end (DS-Chat)")
        .option("steps", T::int_, steps, "optimizer updates, each of gradient_accumulation_steps micro-batches").at_least(1)
        .option("zero_stage", T::int_, std::int64_t{0}, "ZeRO stage 0-3 of the trainer's engine (DS-Chat's --zero_stage)").in_range(0, 3)
        .option("dtype", T::string, std::string("fp32"),
                "fp32, bf16 or fp16 (fp32 masters; fp16 with dynamic loss scaling): DS-Chat's --dtype")
        .option("deepspeed_config", T::string, std::string(""),
                "a DeepSpeed JSON whose zero_optimization.stage, bf16/fp16, gradient_clipping, batch triple and "
                "optimizer override these settings")
        .option("only_optimize_lora", T::bool_, false, "train only the LoRA weights (DS-Chat's --only_optimize_lora)")
        .option("lora_dim", T::int_, std::int64_t{0}, "LoRA rank (0: full fine-tuning)").at_least(0)
        .option("gradient_checkpointing", T::bool_, false,
                "recompute each layer's activations in backward (less memory, one more forward per layer)")
        .option("seed", T::int_, std::int64_t{1234}, "data split and order")
        .option("print_every", T::int_, std::int64_t{10}, "print the loss every N steps").at_least(1)
        .option("verify_output", T::bool_, false, "reload the saved output and print its largest output difference");
    k.check = check_trainer_output;
  };
  {
    graph::node_kind k{"sft_trainer", "DS-Chat step 1: supervised fine-tuning on prompt + chosen"};
    trainer_settings(k, 1e-3, 150);
    k.output("model", "model", "the fine-tuned model, when training ends")
        .option("mask_prompt", T::bool_, false, "no loss on prompt tokens")
        .option("output", T::string, std::string(""),
                "also save the model here, in the format of `model`: a llama2.c file, or a folder (HF: with the "
                "tokenizer)");
    actor::register_node_kind(kinds, factories, k, [] { return std::unique_ptr<actor::node>(new sft_trainer); });
  }
  {
    graph::node_kind k{"rm_trainer", "DS-Chat step 2: reward model = base + v_head, pairwise loss"};
    trainer_settings(k, 5e-4, 300);
    k.output("model", "model", "the reward model (with its value head), when training ends")
        .option("output", T::string, std::string(""),
                "also save it into this folder: HF (with v_head.weight and the tokenizer) from a HF model, else "
                "flowrun_config.json + safetensors");
    actor::register_node_kind(kinds, factories, k, [] { return std::unique_ptr<actor::node>(new rm_trainer); });
  }
  {
    graph::node_kind k{"model_source", "loads a model file or folder and emits it once"};
    k.output("model", "model", "the loaded model", true)
        .require("model", T::path, "llama2.c .bin, a flowrun model folder (rm_trainer output) or a HF folder")
        .option("value_head", T::bool_, false, "require a value head (reward and critic models)");
    actor::register_node_kind(kinds, factories, k, [] { return std::unique_ptr<actor::node>(new model_source); });
  }
  {
    graph::node_kind k{"prompt_loader", "DS-Chat step 3 prompts: a held-out batch, one batch per tick, held-out again"};
    k.input("next", "tick", "the controller asks for the next batch", true, true)
        .output("batch", "prompt_batch", "left-padded prompts")
        .require("tokenizer", T::path, "SentencePiece .model")
        .require("data", T::path, "DS-Chat JSONL with prompts")
        .option("mix_data", T::string_list, std::vector<std::string>{}, "more datasets blended with data")
        .option("data_split", T::string, std::string("2,4,4"), "DS-Chat's --data_split")
        .option("eval_fraction", T::float_, 0.1, "held-out share").in_range(0, 1, false, /*high_open=*/true)
        .option("max_prompt_seq_len", T::int_, std::int64_t{48}, "prompt tokens kept (the end of the prompt)").at_least(1)
        .option("per_device_generation_batch_size", T::int_, std::int64_t{8}, "prompts per PPO iteration").at_least(1)
        .option("iterations", T::int_, std::int64_t{20}, "PPO iterations").at_least(0)
        .option("eval_prompts", T::int_, std::int64_t{32}, "held-out prompts scored before and after").at_least(0)
        .option("seed", T::int_, std::int64_t{1234}, "data split and order");
    actor::register_node_kind(kinds, factories, k, [] { return std::unique_ptr<actor::node>(new prompt_loader); });
  }
  {
    graph::node_kind k{"ppo_controller", "orders the PPO phases (generate, score, train) and prints each iteration"};
    k.input("prompts", "prompt_batch", "prompt batches from the loader")
        .input("summary", "summary", "rewards and KL of a batch", true, true)
        .input("actor_stats", "stats", "the policy's update", true, true)
        .input("critic_stats", "stats", "the critic's update", true, true)
        .output("generate", "prompt_batch", "prompts for the generator", true)
        .output("next", "tick", "ask the loader for the next batch", true)
        .option("save_checkpoint_steps", T::int_, std::int64_t{0},
                "with [graph] checkpoint_dir: the policy and critic save and the controller commits every N "
                "iterations (0: never); the same command resumes from the last commit")
        .option("keep_checkpoints", T::int_, std::int64_t{2}, "committed iterations kept (the older ones removed)")
        .at_least(2);
    actor::register_node_kind(kinds, factories, k, [] { return std::unique_ptr<actor::node>(new ppo_controller); });
  }
  {
    graph::node_kind k{"rollout_generator", "the hybrid engine: answers prompts with the policy's live weights"};
    k.input("prompts", "prompt_batch", "prompts to answer")
        .input("weights", "model", "the policy's model handle, after each update", true, true)
        .output("rollouts", "rollouts", "prompt + answer sequences", true)
        .require("tokenizer", T::path, "SentencePiece .model (EOS id)")
        .option("max_answer_seq_len", T::int_, std::int64_t{32}, "answer tokens at most").at_least(1)
        .option("temperature", T::float_, 1.0, "sampling temperature for training rollouts (held-out: greedy)").at_least(0)
        .option("top_k", T::int_, std::int64_t{0}, "top-k filter (0: off)").at_least(0)
        .option("top_p", T::float_, 1.0, "nucleus threshold (1: off)").in_range(0, 1, /*low_open=*/true);
    actor::register_node_kind(kinds, factories, k, [] { return std::unique_ptr<actor::node>(new rollout_generator); });
  }
  auto frozen_kind = [&](const char* name, const char* doc, bool reward) {
    graph::node_kind k{name, doc};
    k.input("init", "model", "the model this node starts from (copied)")
        .input("rollouts", "rollouts", "sequences to score")
        .output("scored", "scores", reward ? "per-row reward scores" : "per-token log-probs", true);
    actor::register_node_kind(kinds, factories, k,
                              [reward] { return std::unique_ptr<actor::node>(new frozen_scorer(reward)); });
  };
  frozen_kind("reference_model", "frozen copy of the step-1 model: reference log-probs", false);
  frozen_kind("reward_model", "frozen step-2 model: the reward score at each answer's end", true);
  auto trainer_kind = [&](const char* name, const char* doc, bool policy) {
    graph::node_kind k{name, doc};
    const std::string who = policy ? "actor" : "critic";
    k.blocking = true;  // ranks block in collectives: a thread each
    k.input("init", "model", "the model this node starts from (copied)")
        .input("rollouts", "rollouts", "sequences to score")
        .input("train", "experience", "experience to train on", true, true)
        .output("scored", "scores", policy ? "per-token log-probs (the old policy)" : "per-token values", true)
        .output("stats", "stats", "the update's loss and gradient norm", true)
        .option(who + "_learning_rate", T::float_, 1e-4, "AdamW learning rate").at_least(0)
        .option("per_device_training_batch_size", T::int_, std::int64_t{8},
                "rollouts per PPO update, all ranks together (the experience is cut into mini-batches of this "
                "size; each of the N ranks trains on 1/N of one)").at_least(1)
        .option("gradient_accumulation_steps", T::int_, std::int64_t{1},
                "micro-batches per rank per PPO update (the mini-batch is cut into ranks x this)").at_least(1)
        .option("ppo_epochs", T::int_, std::int64_t{1}, "passes over each experience batch").at_least(1)
        .option("cliprange", T::float_, 0.2, "policy ratio clip").above(0)
        .option("cliprange_value", T::float_, 0.2, "value clip").above(0)
        .option("gradient_clipping", T::float_, 1.0, "global gradient-norm clip (0: off)").at_least(0)
        .option(who + "_zero_stage", T::int_, std::int64_t{0},
                "ZeRO stage 0-3 of this model's engine over its replicas (DS-Chat's --" + who + "_zero_stage)")
        .in_range(0, 3)
        .option("dtype", T::string, std::string("fp32"),
                "fp32, bf16 or fp16 (fp32 masters; fp16 with dynamic loss scaling): DS-Chat's --dtype")
        .option("deepspeed_config", T::string, std::string(""),
                "a DeepSpeed JSON whose zero_optimization.stage, bf16/fp16, gradient_clipping, "
                "gradient_accumulation_steps and optimizer override these settings")
        .option(who + "_lora_dim", T::int_, std::int64_t{0}, "LoRA rank (0: full fine-tuning)").at_least(0)
        .option("only_optimize_lora", T::bool_, false, "train only the LoRA weights (DS-Chat's --only_optimize_lora)")
        .option(who + "_weight_decay", T::float_, 0.0, "AdamW decoupled weight decay (DS-Chat's default 0)").at_least(0)
        .option(who + "_lora_module_name", T::string, std::string("decoder.layers."),
                "which Linear layers get LoRA: a value containing 'layers' = all of them (DS-Chat's default), "
                "else PEFT target_modules such as q_proj,v_proj")
        .option(who + "_gradient_checkpointing", T::bool_, false,
                "recompute each layer's activations in backward (less memory, one more forward per layer)");
    add_rank_group_settings(k);
    if (policy) {
      k.output("weights", "model", "the live policy for the generator (hybrid engine)", true)
          .option("enable_ema", T::bool_, false, "keep an EMA of the actor (beta 0.992)")
          .option("unsup_coef", T::float_, 27.8, "weight of the unsupervised (ptx) LM loss").at_least(0)
          .option("unsup_data", T::string, std::string(""), "text for ptx mixing (empty: off), e.g. TinyStories")
          .option("unsup_seq_len", T::int_, std::int64_t{64}, "ptx instance length").at_least(2)
          .option("tokenizer", T::string, std::string(""),
                  "tokenizer for unsup_data; also copied beside a HF output (default: the model's own)")
          .option("output", T::string, std::string(""),
                  "save the trained actor here at the end, in the format of the model it got (llama2.c file, or "
                  "a HF folder with the tokenizer)")
          .option("verify_output", T::bool_, false, "reload the saved output and print its largest output difference");
      k.check = check_trainer_output;
    }
    actor::register_node_kind(kinds, factories, k,
                              [policy] { return std::unique_ptr<actor::node>(new ppo_trainer(policy)); });
  };
  trainer_kind("critic", "value model (from the reward model): values, trained on the clipped value loss", false);
  trainer_kind("policy", "the actor (from step 1): old log-probs, trained on the clipped policy loss", true);
  {
    graph::node_kind k{"experience_maker", "KL-penalised rewards with the clipped score, and GAE"};
    k.input("logprobs", "scores", "the policy's log-probs")
        .input("ref_logprobs", "scores", "the reference's log-probs")
        .input("values", "scores", "the critic's values")
        .input("reward", "scores", "the reward model's scores")
        .output("experience", "experience", "to the policy and the critic", true)
        .output("summary", "summary", "rewards and KL for the controller", true)
        .option("kl_ctl", T::float_, 0.1, "KL penalty coefficient").at_least(0)
        .option("clip_reward_value", T::float_, 5.0, "reward score clip").above(0)
        .option("gamma", T::float_, 1.0, "discount").in_range(0, 1)
        .option("lam", T::float_, 0.95, "GAE lambda").in_range(0, 1)
        .option("generation_batches", T::int_, std::int64_t{1},
                "generation batches collected before each PPO update (DS-Chat's exp_dataset size)").at_least(1);
    actor::register_node_kind(kinds, factories, k, [] { return std::unique_ptr<actor::node>(new experience_maker); });
  }
}

}  // namespace flowrun::actors
