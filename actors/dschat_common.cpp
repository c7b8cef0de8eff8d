#include "actors/node_models.h"
#include "actors/dschat_common.h"
#include "actors/resume_check.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include <unistd.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "models/adapter.h"
#include "models/rlhf/ppo_checkpoint.h"
#include "models/safetensors.h"
#include "runtime/util/assets.h"

namespace flowrun::actors {

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

static std::string run_marker(const std::string& out) { return out + ".run.json"; }

// With a [graph] checkpoint_dir, a trainer that finished also writes CHECKPOINT_DIR/NAME.done.json
// (its output and a fingerprint of its settings): the same command run again (after a crash in
// step 3, say) loads the output instead of training again.
static std::string done_marker(const actor::node_context& ctx) {
  return (std::filesystem::path(ctx.checkpoint_dir()) / (ctx.name() + ".done.json")).string();
}

const std::set<std::string>& trainer_safe_settings() {
  static const std::set<std::string> safe = {"print_every",   "save_checkpoint_steps", "keep_checkpoints",
                                             "zero_stage",    "gradient_checkpointing", "memory_limit_gb",
                                             "output",        "verify_output"};
  return safe;
}

// What the done marker compares: the settings but those that change nothing trained (the output
// is compared by its path beside it)
static std::string settings_fingerprint(const graph::node_spec& n) {
  return fmt::format("{:016x}", graph::fnv1a64(n.kind + "\n" + settings_record(n, trainer_safe_settings()).dump()));
}

// An output's state on disk (each regular file's relative path, size and modification time), recorded in
// the done marker: a rerun takes the output only while it is the one the node wrote (a file replaced by
// hand, or by another graph's node, was taken for the trained model).
static std::string output_state(const std::string& out) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::vector<std::string> parts;
  auto add = [&](const fs::path& p, const std::string& rel) {
    parts.push_back(fmt::format("{}:{}:{}", rel, fs::file_size(p, ec), fs::last_write_time(p, ec).time_since_epoch().count()));
  };
  if (fs::is_regular_file(out, ec)) {
    add(out, ".");
  } else if (fs::is_directory(out, ec)) {
    for (const auto& e : fs::recursive_directory_iterator(out, ec))
      if (e.is_regular_file(ec)) add(e.path(), fs::relative(e.path(), out, ec).string());
  }
  std::sort(parts.begin(), parts.end());
  return fmt::format("{:016x}", graph::fnv1a64(fmt::format("{}", fmt::join(parts, "\n"))));
}

void throw_all_pairs_identical(const actor::node_context& ctx, int64_t pairs, const dschat::tokenize_settings& ts,
                               int64_t max_seq_len) {
  const bool cut_end = ts.truncation == dschat::truncation_mode::end;
  throw std::invalid_argument(fmt::format(
      "node '{}': every one of the {} training pairs of {} has chosen equal to rejected after tokenization "
      "(max_seq_len {}, truncation \"{}\"): nothing to prefer. Give pairs whose answers differ{}",
      ctx.name(), pairs, ctx.spec().get_string("data"), max_seq_len, ctx.spec().get_string("truncation"),
      cut_end ? ", raise max_seq_len, or set truncation = \"prompt_start\" so that long prompts do not cut the "
                "answers away"
              : " (or raise max_seq_len when the answers differ only past it)"));
}

void write_run_marker(const actor::node_context& ctx, const std::string& out, const std::string& exact) {
  if (!ctx.checkpoint_dir().empty()) {
    std::filesystem::create_directories(ctx.checkpoint_dir());
    nlohmann::json j{{"output", out},
                     {"settings", settings_fingerprint(ctx.spec())},
                     {"settings_record", settings_record(ctx.spec(), trainer_safe_settings())},  // check_retrain
                     {"output_state", output_state(out)}};
    if (!exact.empty()) j["exact"] = exact;
    write_text_atomic(done_marker(ctx), j.dump() + "\n");
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

/// True when an earlier attempt of this run saved `out` completely; `exact` gets the done marker's
/// exact copy of the trained tensors, when it names one that exists.
static bool saved_by_earlier_attempt(const actor::node_context& ctx, const std::string& out, std::string& exact) {
  if (!ctx.checkpoint_dir().empty() && !out.empty() && std::filesystem::exists(out)) {
    std::ifstream f(done_marker(ctx));
    try {
      if (f) {
        const auto j = nlohmann::json::parse(f);
        // the settings by their record where the marker has one (a setting newer than it, at its default,
        // is no change: with_newer_defaults), else by the fingerprint
        const nlohmann::json now = settings_record(ctx.spec(), trainer_safe_settings());
        const bool same_settings =
            j.contains("settings_record") && j["settings_record"].is_object()
                ? settings_changes(with_newer_defaults(j["settings_record"], now, ctx.spec()), now).empty()
                : j.value("settings", std::string()) == settings_fingerprint(ctx.spec());
        if (j.value("output", std::string()) == out && same_settings) {
          if (j.contains("output_state") && j["output_state"] != output_state(out)) {
            spdlog::warn("node '{}': {} changed since the run that wrote it and {} (its files' sizes or times): "
                         "it is trained again, and the output written over",
                         ctx.name(), out, done_marker(ctx));
            return false;
          }
          const std::string e = j.value("exact", std::string());
          if (!e.empty() && !std::filesystem::exists(e)) return false;  // the exact copy is gone: train again
          exact = e;
          return true;
        }
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
std::shared_ptr<decoder> resume_saved(actor::node_context& ctx, const char* step) {
  const auto& out = ctx.spec().get_string("output");
  if (out.empty() && !ctx.checkpoint_dir().empty())  // nothing to load from: each rerun trains it again
    ctx.log().info("{} has no output: a rerun of this graph (a resume from {}) trains it again; set the node's "
                   "output for a rerun to load the trained weights instead",
                   step, ctx.checkpoint_dir());
  std::string exact;
  if (!saved_by_earlier_attempt(ctx, out, exact)) return nullptr;
  auto m = std::make_shared<decoder>(load_node_model(ctx, exact.empty() ? out : exact));
  if (ctx.attempt() > 0)
    ctx.print(fmt::format("{} resumed (attempt {}): {} was saved by an earlier attempt of this run; training skipped",
                          step, ctx.attempt() + 1, out));
  else
    ctx.print(fmt::format("{} resumed: {} was saved by an earlier run of this graph with the same settings "
                          "({}); training skipped",
                          step, out, done_marker(ctx)));
  return m;
}

void remove_step_checkpoints(actor::node_context& ctx) {
  if (ctx.checkpoint_dir().empty()) return;
  const std::filesystem::path dir = std::filesystem::path(ctx.checkpoint_dir()) / ctx.name();
  std::error_code ec;
  if (!std::filesystem::exists(dir, ec)) return;
  // (a normal end removed it whatever it held: a step-1 node named like another graph's step-3 trainer on the
  // same checkpoint_dir took that trainer's checkpoints with it)
  if (ppo::checkpoint_owner(dir.string()) == ppo::trainer_dir_owner::step3) {
    ctx.log().warn("node '{}': {} holds a step-3 trainer's checkpoints (another graph's node of the same name on "
                   "this checkpoint_dir?), not this trainer's: it is left as it is",
                   ctx.name(), dir.string());
    return;
  }
  std::filesystem::remove_all(dir, ec);
}

void check_retrain(actor::node_context& ctx, const char* step) {
  if (ctx.checkpoint_dir().empty()) return;
  nlohmann::json j;
  try {
    std::ifstream f(done_marker(ctx));
    if (!f) return;  // it never finished here: nothing continues from its output
    j = nlohmann::json::parse(f);
  } catch (const std::exception&) {
    return;  // a torn marker: nothing to compare
  }
  const std::string out = ctx.spec().get_string("output");
  if (out.empty()) return;
  const bool same_output = j.value("output", std::string()) == out;
  const nlohmann::json now = settings_record(ctx.spec(), trainer_safe_settings());
  const nlohmann::json then = with_newer_defaults(j.value("settings_record", nlohmann::json()), now, ctx.spec());
  std::string why;
  bool settings_changed = true;
  if (const auto changes = settings_changes(then, now); !changes.empty()) {
    why = fmt::format("its settings changed: {}", fmt::join(changes, "; "));
  } else if (!then.is_object() && j.value("settings", std::string()) != settings_fingerprint(ctx.spec())) {
    why = fmt::format("{} is from an older flowrun (no record of each setting)", done_marker(ctx));
    settings_changed = false;  // unknown: step 3's policy compares the weights it gets
  } else if (!same_output) {
    why = fmt::format("its output is now {}, not {}", out, j.value("output", std::string()));
    settings_changed = false;
  } else if (!std::filesystem::exists(out)) {
    why = fmt::format("its output {} is gone", out);
    settings_changed = false;
  } else {
    return;  // its output changed (saved_by_earlier_attempt warned) or its exact copy is gone
  }
  if (settings_changed && ppo::step3_committed(ctx.checkpoint_dir()))
    throw std::runtime_error(fmt::format(
        "node '{}': step 3 has a checkpoint in {} that continues from this step's output {}, and this step would "
        "train again ({}): the new output would replace the model that checkpoint continues from; undo that to "
        "resume step 3, or delete {} to train every step afresh",
        ctx.name(), ctx.checkpoint_dir(), out, why, ctx.checkpoint_dir()));
  // the same settings train again to the same weights (step 3, if any, compares them)
  ctx.print(fmt::format("{} trains again, though it finished in {} before: {}", step, ctx.checkpoint_dir(), why));
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
static std::optional<model_file_info> inspect_model_setting(const graph::node_spec& n) {
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
static std::optional<model_file_info> emitted_model(const graph::node_spec& n) {
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
static std::string output_problem(const std::string& node, const std::string& out, const model_file_info& in,
                                  bool value_head, const char* setting = "output") {
  if (out.empty()) return "";
  const auto f = saved_format(in.format, value_head);
  auto why = save_problem(f, out, in.family, value_head);
  if (why.empty()) return "";
  const std::string as = f == in.format ? "the format it was given in"
                                         : "it was given as a " + std::string(to_string(in.format)) +
                                               ", which cannot hold its value head";
  return "node '" + node + "': " + setting + " \"" + out + "\" cannot be written: the model is saved as a " +
         std::string(to_string(f)) + " (" + as + "); " + why;
}

/// The graph check of the trainers (node_kind::check): their `output` fits the format of
/// the model they get (their `model` setting, or for the policy and critic what their init edge brings).
std::vector<graph::node_kind::problem> check_trainer_output(const graph::node_spec& n, const graph::graph_spec& g,
                                                            const char* setting) {
  const auto* o = n.find_setting(setting);
  if (!o || !std::holds_alternative<std::string>(o->value) || std::get<std::string>(o->value).empty()) return {};
  const auto& out = std::get<std::string>(o->value);
  std::optional<model_file_info> in;
  bool value_head = false;
  if (n.kind == "policy" || n.kind == "critic") {  // step 3: what the init edge brings
    for (const auto& e : g.edges)
      if (e.to_node == n.name && e.to_port == "init")
        if (const auto* src = g.find_node(e.from_node)) in = emitted_model(*src);
    value_head = n.kind == "critic";
  } else {
    in = inspect_model_setting(n);
    value_head = n.kind == "rm_trainer";
  }
  if (!in) return {};
  auto why = output_problem(n.name, out, *in, value_head, setting);
  if (why.empty()) return {};
  return {{setting, why, "give an output path that fits the format the model was given in (docs/rlhf.md)"}};
}

/// Refuses, before training, an `output` that the model given as `in` could not be written to.
void check_output(const actor::node_context& ctx, const model_file_info& in, bool value_head, const char* setting) {
  if (auto why = output_problem(ctx.name(), ctx.spec().get_string(setting), in, value_head, setting); !why.empty())
    throw std::invalid_argument(why);
}

/// Saves `m` to the node's `output` (when set) as `f`, with `tokenizer` beside an HF
/// folder; with verify_output, reloads it and prints the largest output difference.
void save_output(actor::node_context& ctx, const char* step, const decoder& m, model_format f,
                 const std::string& tokenizer, const std::string& source, const std::string& dtype) {
  const auto& out = ctx.spec().get_string("output");
  if (out.empty()) return;
  save_model(m, out, f, tokenizer, source);  // an HF source's stop ids go with the output
  const auto& s = ctx.spec();
  // a steps 1-2 trainer's folder says which rows it held out, for flowrun eval's defaults (not step 3's)
  if (f != model_format::llama2c && s.find_setting("data_split") && s.find_setting("eval_fraction")) {
    nlohmann::json mix = nlohmann::json::array();
    for (const auto& p : s.get_string_list("mix_data")) mix.push_back(resolve_user_path(p, "mix_data").string());
    write_text_atomic((std::filesystem::path(out) / "flowrun_data.json").string(),
                      nlohmann::json{{"node", ctx.name()},
                                     {"kind", s.kind},
                                     {"data", resolve_user_path(s.get_string("data"), "data").string()},
                                     {"mix_data", mix},
                                     {"data_split", s.get_string("data_split")},
                                     {"data_split_order", dschat::split_order},
                                     {"eval_fraction", s.get_float("eval_fraction")},
                                     {"seed", s.get_int("seed")},
                                     {"max_seq_len", s.get_int("max_seq_len")},
                                     {"truncation", s.find_setting("truncation") ? s.get_string("truncation") : ""},
                                     {"apply_chat_template",
                                      s.find_setting("apply_chat_template") && s.get_bool("apply_chat_template")},
                                     {"dtype", dtype},
                                     {"tokenizer", resolve_user_path(s.get_string("tokenizer"), "tokenizer").string()}}
                              .dump(2) +
                          "\n");
  }
  // an HF folder holds the fp32 masters whatever dtype trained (save_pretrained of DS-Chat's fp16 / bf16 engine
  // writes its half weights): said, with the way to half size
  if (f == model_format::hf && dtype != "fp32")
    ctx.log().info("saved the trained model to {} ({}, fp32 weights: the masters of this {} run; `flowrun convert "
                   "--from hf {} --to hf DIR --dtype {}` writes them at half the size)",
                   out, to_string(f), dtype, out, dtype == "fp16" ? "f16" : "bf16");
  else
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

namespace {
bool known_dtype(const std::string& dt) { return dt == "fp32" || dt == "bf16" || dt == "fp16"; }
// The spelling meant by a common other name of the three (torch's and numpy's, any case), or "".
std::string meant_dtype(std::string dt) {
  for (auto& c : dt) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (const char* p : {"torch.", "np.", "numpy."})
    if (dt.rfind(p, 0) == 0) dt = dt.substr(std::string(p).size());
  if (dt == "fp32" || dt == "float32" || dt == "float" || dt == "f32" || dt == "single") return "fp32";
  if (dt == "bf16" || dt == "bfloat16") return "bf16";
  if (dt == "fp16" || dt == "float16" || dt == "half" || dt == "f16") return "fp16";
  return "";
}
std::string unknown_dtype(const std::string& dt) {
  const std::string m = meant_dtype(dt);
  return fmt::format("dtype = \"{}\" is none of fp32, bf16, fp16 (DS-Chat's --dtype){}", dt,
                     m.empty() ? "" : fmt::format("; did you mean {}?", m));
}
}  // namespace

std::string dtype_setting(const actor::node_context& ctx) {
  std::string dt = ctx.spec().get_string("dtype");
  if (!known_dtype(dt)) throw std::invalid_argument(fmt::format("node '{}': {}", ctx.name(), unknown_dtype(dt)));
  return dt;
}

std::optional<ds_config> check_ds_config(const graph::node_spec& n, int world,
                                         std::vector<graph::node_kind::problem>& problems) {
  const auto* s = n.find_setting("deepspeed_config");
  if (!s || n.get_string("deepspeed_config").empty()) return std::nullopt;
  try {
    ds_parse_options o;
    o.auto_values = hf_auto_values(n, world);
    return load_ds_config(n.get_string("deepspeed_config"), world, o);
  } catch (const std::exception& e) {
    problems.push_back({"deepspeed_config", fmt::format("node '{}': {}", n.name, e.what()),
                        fmt::format("fix the DeepSpeed JSON at the place named ({} rank(s): replicas x processes)",
                                    world)});
    return std::nullopt;
  }
}

std::map<std::string, std::string> hf_auto_values(const graph::node_spec& n, int world) {
  std::map<std::string, std::string> a;
  auto has = [&](const std::string& k) { return n.find_setting(k) != nullptr; };
  auto num = [](double v) { return fmt::format("{}", v); };  // shortest round-trip form, JSON-readable
  const std::string who = n.kind == "policy" ? "actor_" : n.kind == "critic" ? "critic_" : "";
  const int64_t gas = has("gradient_accumulation_steps") ? n.get_int("gradient_accumulation_steps") : 0;
  int64_t micro = 0;
  if (has("per_device_train_batch_size")) {
    micro = n.get_int("per_device_train_batch_size");
  } else if (has("per_device_training_batch_size") && gas > 0) {  // step 3: the mini-batch over all ranks
    const int64_t rows = n.get_int("per_device_training_batch_size"), parts = gas * world;
    if (rows % parts == 0) micro = rows / parts;
  }
  if (micro > 0) a["train_micro_batch_size_per_gpu"] = std::to_string(micro);
  if (gas > 0) a["gradient_accumulation_steps"] = std::to_string(gas);
  if (micro > 0 && gas > 0) a["train_batch_size"] = std::to_string(micro * gas * world);
  if (has(who + "learning_rate")) {  // a trainer with its own optimizer settings (not zero_rank: the JSON's)
    const std::string lr = num(n.get_float(who + "learning_rate"));
    a["optimizer.params.lr"] = lr;
    a["scheduler.params.warmup_max_lr"] = lr;
    a["scheduler.params.warmup_min_lr"] = "0";
    a["optimizer.params.betas"] = "[0.9, 0.95]";  // dschat_settings' adam_beta1 / adam_beta2 (step1 main.py)
    a["optimizer.params.eps"] = "1e-08";
    a["gradient_clipping"] = has("gradient_clipping") ? num(n.get_float("gradient_clipping")) : "1.0";
  }
  if (has(who + "weight_decay")) a["optimizer.params.weight_decay"] = num(n.get_float(who + "weight_decay"));
  if (has("dtype")) {
    a["fp16.enabled"] = n.get_string("dtype") == "fp16" ? "true" : "false";
    a["bf16.enabled"] = n.get_string("dtype") == "bf16" ? "true" : "false";
  }
  if (has("num_warmup_steps")) a["scheduler.params.warmup_num_steps"] = std::to_string(n.get_int("num_warmup_steps"));
  if (has("steps")) a["scheduler.params.total_num_steps"] = std::to_string(n.get_int("steps"));
  if (!who.empty()) {  // step 3: the run's updates are known when its first rollouts come (ppo_trainer::plan_schedule
    // puts them in place of this value, the smallest DeepSpeed takes past the warmup, when the key said "auto")
    const int64_t w = has("num_warmup_steps") ? n.get_int("num_warmup_steps") : 0;
    a["scheduler.params.total_num_steps"] = std::to_string(std::max<int64_t>(2, w) + 1);
  }
  return a;
}

std::string lora_module_name_doc() {
  return "which Linear layers get LoRA: a prefix ending in 'layers.' = all of them (DS-Chat's default "
         "'decoder.layers.'), else PEFT target_modules such as q_proj,v_proj (the model family's names, matched as "
         "PEFT matches them; one layer's module, 'layers.0.self_attn.q_proj', and an empty value are refused)";
}

std::vector<graph::node_kind::problem> lora_module_problems(const graph::node_spec& n, const std::string& dim_setting,
                                                           const std::string& module_setting) {
  std::vector<graph::node_kind::problem> problems;
  if (n.get_int(dim_setting) <= 0) return problems;
  // written empty: DS-Chat's `"" in name` adapts every nn.Linear (lm_head and the value head too), flowrun
  // took it as its default; neither is what an empty value says (zero_rank refuses its empty
  // lora_target_modules alike)
  if (const auto* w = n.find_setting(module_setting); w && !w->from_default) {
    std::string t = n.get_string(module_setting);
    t.erase(std::remove_if(t.begin(), t.end(), [](unsigned char c) { return std::isspace(c) || c == ','; }), t.end());
    if (t.empty())
      return {{module_setting,
               module_setting + " is empty: DS-Chat's \"\" in name adapts every Linear, lm_head and the value head "
                                "included; flowrun does not guess",
               "write all-linear (every Linear of the blocks), a prefix such as decoder.layers., or names such as "
               "q_proj,v_proj"}};
  }
  try {
    const auto lc = make_lora_config(1, 1.0f, 0.0f, n.get_string(module_setting), 0);
    static const std::regex one_layer(R"((^|\.)[0-9]+\.)");
    for (const auto& t : lc.target_modules)
      if (std::regex_search(t, one_layer))
        problems.push_back({module_setting,
                            "LoRA target '" + t + "' names a module of one layer (PEFT would adapt that layer only); "
                            "flowrun adapts a module in every layer",
                            "write the module's name alone (q_proj), or a prefix such as decoder.layers. for every "
                            "Linear"});
  } catch (const std::invalid_argument& e) {
    problems.push_back({module_setting, e.what(), "write e.g. q_proj,v_proj or decoder.layers."});
  }
  return problems;
}

std::string tokenizer_model_mismatch(const std::string& tokenizer_path, const std::string& model) {
  try {
    const auto info = inspect_model(model);
    const std::string folder = resolve_user_path(model, "model").string();
    const auto tok = load_tokenizer(resolve_user_path(tokenizer_path, "tokenizer").string());
    if (info.embedding_rows > 0 && tok->vocab_size() > info.embedding_rows)
      return fmt::format("the tokenizer {} ({} tokens), and the model {} has {} embedding rows: it is not the model's "
                         "tokenizer",
                         tokenizer_path, tok->vocab_size(), model, info.embedding_rows);
    // a llama2.c file's vocab_size is its tokenizer's (llama2.c's train_vocab.sh and export write them as one);
    // an HF config may pad its embedding past the tokenizer (Qwen2's 151,936 rows for 151,665 ids). A 400-token
    // GPT-2 tokenizer trained stories260K (512 rows) on other ids without a word (a break-it review, 2026-12-07)
    if (info.format == model_format::llama2c && info.embedding_rows > 0 && tok->vocab_size() < info.embedding_rows)
      return fmt::format("the tokenizer {} ({} tokens), and the llama2.c model {} has vocab_size {}, which a llama2.c "
                         "model shares with its tokenizer: it is not the model's tokenizer",
                         tokenizer_path, tok->vocab_size(), model, info.embedding_rows);
    if (info.format != model_format::llama2c && folder_has_tokenizer(folder))
      if (const std::string why = tokenizer_difference(*load_tokenizer(folder), *tok); !why.empty())
        return fmt::format("the tokenizer {}, and the model {} has a tokenizer of its own in its folder: they differ "
                           "({})",
                           tokenizer_path, model, why);
  } catch (const std::exception&) {  // unreadable: the node's start names it
  }
  return "";
}

std::vector<graph::node_kind::problem> tokenizer_model_problems(const graph::node_spec& n) {
  const auto* m = n.find_setting("model");
  const auto* t = n.find_setting("tokenizer");
  const auto* model = m ? std::get_if<std::string>(&m->value) : nullptr;
  const auto* tok = t ? std::get_if<std::string>(&t->value) : nullptr;
  if (!model || !tok || model->empty() || tok->empty()) return {};
  const std::string why = tokenizer_model_mismatch(*tok, *model);
  if (why.empty()) return {};
  return {{"tokenizer", "node '" + n.name + "' reads its data with " + why,
           "give the model's own tokenizer (for a Hugging Face folder: tokenizer = the folder)"}};
}

std::vector<graph::node_kind::problem> split_overlap_problems(const graph::node_spec& n, const graph::graph_spec& g) {
  static const std::set<std::string, std::less<>> steps = {"sft_trainer", "rm_trainer", "dpo_trainer", "prompt_loader"};
  // the node's own data_split first: three weights, its step's above 0 (refused at the node's start, after --check)
  if (n.find_setting("data_split")) {
    const std::string text = n.get_string("data_split");
    std::vector<double> w;
    try {
      w = dschat::parse_data_split(text);
    } catch (const std::exception& e) {
      return {{"data_split", "node '" + n.name + "': " + e.what(),
               "use three weights, one per DS-Chat step: \"2,4,4\""}};
    }
    if (w.size() != 3)
      return {{"data_split",
               fmt::format("node '{}': data_split \"{}\" has {} part(s); DS-Chat's has one per step", n.name, text,
                           w.size()),
               "use three weights, one per DS-Chat step: \"2,4,4\""}};
    // the step whose share the node reads: DPO reads step 2's (DS-Chat's train_phase = 2)
    const int step = n.kind == "sft_trainer" ? 0 : n.kind == "prompt_loader" ? 2 : 1;
    if (steps.count(n.kind) && w[static_cast<size_t>(step)] == 0)
      return {{"data_split",
               fmt::format("node '{}': data_split \"{}\" gives step {}, whose share this node reads, weight 0: it "
                           "would have no rows",
                           n.name, text, step + 1),
               fmt::format("give step {} a weight above 0 (DS-Chat's default \"2,4,4\"), or \"0,0,1\"-style weights "
                           "that leave all the data to one step",
                           step + 1)}};
  }
  // data_split by its shares ("2, 4, 4" and "20,40,40" split as "2,4,4" does); unreadable: never the same
  auto shares = [](const graph::node_spec& x) {
    std::vector<double> w;
    try {
      w = dschat::parse_data_split(x.get_string("data_split"));
    } catch (const std::exception&) {
      return w;
    }
    double sum = 0;
    for (double v : w) sum += v;
    for (double& v : w) v = sum > 0 ? v / sum : v;
    return w;
  };
  auto same_data = [&](const graph::node_spec& a, const graph::node_spec& b) {
    for (const char* k : {"data", "seed"})
      if (!a.find_setting(k) || !b.find_setting(k) ||
          graph::to_string(a.find_setting(k)->value) != graph::to_string(b.find_setting(k)->value))
        return false;
    if (!a.find_setting("data_split") || !b.find_setting("data_split")) return false;
    const auto wa = shares(a), wb = shares(b);
    if (wa.empty() || wa.size() != wb.size()) return false;
    for (size_t i = 0; i < wa.size(); ++i)
      if (std::fabs(wa[i] - wb[i]) > 1e-12) return false;
    return a.find_setting("eval_fraction") && b.find_setting("eval_fraction");
  };
  for (const auto& m : g.nodes) {
    if (m.name == n.name) break;  // only earlier nodes: a difference is reported on the later node
    if (!steps.count(m.kind) || !same_data(m, n)) continue;
    // the first node of the data is the one the others follow: one problem for each node that differs from it
    const double mine = n.get_float("eval_fraction"), theirs = m.get_float("eval_fraction");
    if (mine == theirs) return {};
    return {{"eval_fraction",
             fmt::format("node '{}': eval_fraction = {} but node '{}' takes its share of the same data (data_split {}, "
                         "seed {}) with eval_fraction = {}: each step holds out its rows first (DS-Chat's fixed eval "
                         "split) and splits the rest by data_split, so with other fractions the steps' shares overlap "
                         "(a step would train on rows another step trained or evaluated on)",
                         n.name, mine, m.name, n.get_string("data_split"), n.get_int("seed"), theirs),
             fmt::format("give the steps one eval_fraction: set eval_fraction = {} on node '{}'", theirs, n.name)}};
  }
  return {};
}

std::string save_lora_doc() {
  return "at the end, also save only the LoRA weights here (a PEFT adapter folder: adapter_model.safetensors and "
         "adapter_config.json, as TRL saves a peft model; base_model_name_or_path is an HF source's folder); needs "
         "lora_dim > 0 and only_optimize_lora = true (then base + adapter is the trained model)";
}

std::vector<graph::node_kind::problem> save_lora_problems(const graph::node_spec& n) {
  if (!n.find_setting("save_lora") || n.get_string("save_lora").empty()) return {};
  if (n.get_int("lora_dim") <= 0)
    return {{"save_lora", "node '" + n.name + "': save_lora is set but lora_dim = 0: there is no adapter to save",
             "set lora_dim (e.g. 128, DS-Chat's), or remove save_lora"}};
  // DS-Chat's LoRA without only_optimize_lora trains the embeddings and norms too: base + adapter would not be
  // the trained model (PEFT trains the adapters alone)
  if (!n.get_bool("only_optimize_lora"))
    return {{"save_lora",
             "node '" + n.name + "': save_lora with only_optimize_lora = false: the embeddings and norms train too, "
             "and an adapter holds only the LoRA weights, so base + adapter would not be the trained model",
             "set only_optimize_lora = true (as PEFT, only the adapters train), or remove save_lora (output holds "
             "the whole model)"}};
  return {};
}

std::vector<graph::node_kind::problem> ds_config_problems(const graph::node_spec& n, int world) {
  std::vector<graph::node_kind::problem> problems;
  check_ds_config(n, world, problems);
  return problems;
}

std::vector<graph::node_kind::problem> lr_scheduler_problems(const graph::node_spec& n) {
  try {
    (void)lr_schedule::transformers(n.get_string("lr_scheduler_type"), 0, 1);
  } catch (const std::invalid_argument& e) {
    return {{"lr_scheduler_type", e.what(), "write one of the names given (DS-Chat's default is cosine)"}};
  }
  // transformers' get_constant_schedule takes no warmup: a written warmup with it did nothing, silently
  if (const auto* w = n.find_setting("num_warmup_steps");
      w && !w->from_default && n.get_int("num_warmup_steps") > 0 && n.get_string("lr_scheduler_type") == "constant")
    spdlog::warn("node '{}': num_warmup_steps = {} does nothing with lr_scheduler_type = \"constant\" (transformers' "
                 "constant schedule has no warmup): set lr_scheduler_type = \"constant_with_warmup\", or \"cosine\" "
                 "(DS-Chat's default)",
                 n.name, n.get_int("num_warmup_steps"));
  return {};
}

std::vector<graph::node_kind::problem> trainer_choice_problems(const graph::node_spec& n,
                                                               const std::string& lora_dim_setting,
                                                               const std::string& lr_setting,
                                                               const std::string& lora_lr_setting) {
  std::vector<graph::node_kind::problem> problems;
  // a reward model or a critic: its value head trains in the base's group, at lr_setting
  const bool value_head = n.kind == "rm_trainer" || lr_setting.rfind("critic", 0) == 0;
  if (n.find_setting("truncation"))
    if (const auto& t = n.get_string("truncation"); t != "end" && t != "prompt_start")
      problems.push_back({"truncation", "truncation = \"" + t + "\" is not a way to cut a long example",
                          "use \"prompt_start\" (the oldest prompt tokens first, the default) or \"end\" (DS-Chat's)"});
  if (n.find_setting("apply_chat_template") && n.get_bool("apply_chat_template") && n.find_setting("tokenizer"))
    try {
      (void)chat_formatter_for_tokenizer(resolve_user_path(n.get_string("tokenizer"), "tokenizer").string(),
                                         "node '" + n.name + "'", "apply_chat_template = true", "tokenizer",
                                         "set apply_chat_template = false");
    } catch (const std::exception& e) {
      problems.push_back({"apply_chat_template", e.what(),
                          "give as tokenizer an HF folder with a chat template, or set apply_chat_template = false"});
    }
  if (n.get_bool("only_optimize_lora") && n.get_int(lora_dim_setting) <= 0)
    problems.push_back({"only_optimize_lora",
                        "only_optimize_lora = true trains only the LoRA weights, and " + lora_dim_setting +
                            " = 0 adds none: nothing would train",
                        "set " + lora_dim_setting + " (e.g. 128, DS-Chat's), or only_optimize_lora = false"});
  else if (n.get_int(lora_dim_setting) > 0 && n.get_float(lr_setting) == 0 && n.get_float(lora_lr_setting) > 0)
    // the LoRA group follows learning_rate's schedule as a ratio to it (zero_settings::adapter_lr): at 0 there is no
    // ratio, and the LoRA weights trained at a constant lora_learning_rate while the log printed lr 0
    problems.push_back({lr_setting,
                        fmt::format("{} = 0 with {} = {}: the LoRA weights follow the schedule as a ratio to {}, "
                                    "which has none at 0",
                                    lr_setting, lora_lr_setting, n.get_float(lora_lr_setting), lr_setting),
                        fmt::format("give {} > 0 (with only_optimize_lora = true the base stays frozen at any rate{})",
                                    lr_setting, value_head ? "; the value head trains at it" : "")});
  else if (const auto* w = n.find_setting(lr_setting); n.get_bool("only_optimize_lora") && w && !w->from_default)
  {
    // a reward model's or critic's value head trains beside the LoRA weights, in the base's group at this rate (DS-Chat
    // keeps v_head trainable with only_optimize_lora, as force_optimize_params); the warning said only LoRA trained
    spdlog::warn("node '{}': {} = {} is the frozen base's rate with only_optimize_lora = true: {} train, at {} = {} on "
                 "the schedule{}",
                 n.name, lr_setting, n.get_float(lr_setting), value_head ? "the LoRA weights" : "only the LoRA weights",
                 lora_lr_setting, n.get_float(lora_lr_setting),
                 value_head ? fmt::format(", and the value head (v_head) at {} = {}", lr_setting, n.get_float(lr_setting))
                            : std::string());
  }
  return problems;
}

void add_schedule_hints(graph::node_kind& k) {
  k.known_as("warmup_ratio", "HF Trainer's and TRL's warmup_ratio (a share of the run) is num_warmup_steps here, in "
                             "updates: the run's updates x the ratio")
      .known_as("warmup_steps", "HF Trainer's warmup_steps is num_warmup_steps here (DS-Chat's name)")
      .known_as("lr_warmup_steps_ratio", "veRL's lr_warmup_steps_ratio is num_warmup_steps here, in updates: the "
                                         "run's updates x the ratio")
      .known_as("lr_scheduler", "the schedule is lr_scheduler_type here (transformers' names: constant, "
                                "constant_with_warmup, linear, cosine; DS-Chat's flag)");
}

void add_dschat_flag_hints(graph::node_kind& k, const std::string& dropout_flag, bool eot) {
  if (!dropout_flag.empty())
    k.known_as(dropout_flag, "DS-Chat's --" + dropout_flag +
                                 ": flowrun's models have no dropout layers, so they train as with --" + dropout_flag +
                                 " 0.0; an OPT or GPT-2 config's dropout (0.1, which DS-Chat keeps unless the flag is "
                                 "given) is not applied");
  k.known_as("offload", "DS-Chat's --offload (ZeRO's states in CPU memory) has no setting here: on the CPU everything "
                        "is in CPU memory already, and the CUDA backend keeps its states on the GPU; less memory per "
                        "rank comes from a higher ZeRO stage over more replicas, dtype = \"bf16\" or LoRA")
      .known_as("compute_fp32_loss", "the losses are computed in fp32 here in every dtype (as DS-Chat's "
                                     "--compute_fp32_loss): logits and losses are fp32 tensors (docs/zero.md, \"Mixed "
                                     "precision\")");
  if (eot)
    for (const char* flag : {"end_of_conversation_token", "add_eot_token"})
      k.known_as(flag, "DS-Chat's end-of-conversation token is the tokenizer's EOS here: every training answer ends "
                       "with it (as with --add_eot_token), and step 3's generator stops at it");
}

void add_padding_hint(graph::node_kind& k) {
  k.known_as("num_padding_at_beginning",
             "DS-Chat's --num_padding_at_beginning (1 for OPT) tells its reward model how many pad ids open a row "
             "before the end is searched for; here each row is scored at its last real token, found from its "
             "length, so there is nothing to set");
}

void add_hybrid_engine_hints(graph::node_kind& k) {
  for (const char* flag : {"enable_hybrid_engine", "inference_tp_size", "tp_gather_partition_size"})
    k.known_as(flag, "DS-Chat's hybrid engine (its faster generation from the actor's weights) has no switch here: "
                     "the generator always reads the policy's current weights (the edge policy.weights -> "
                     "generator.weights; a snapshot at max_staleness >= 1), on one rank, without tensor "
                     "parallelism (--inference_tp_size has no equivalent)");
  for (const char* flag : {"release_inference_cache", "unpin_actor_parameters"})
    k.known_as(flag, "DS-Chat's hybrid-engine memory options have no equivalent here: below ZeRO stage 3 at "
                     "max_staleness 0 the generator reads the policy's weights without a copy (at stage 3 a gathered "
                     "one, freed after the batch), and its KV cache lives for one batch");
}

void warn_scheduler_replaced(const actor::node_context& ctx, const ds_config& c) {
  if (c.scheduler.type.empty()) return;
  std::vector<std::string> written;
  for (const char* k : {"lr_scheduler_type", "num_warmup_steps"})
    if (const auto* w = ctx.spec().find_setting(k); w && !w->from_default) written.push_back(k);
  // num_warmup_steps that filled the JSON's "auto" warmup is taken, not replaced
  if (c.filled_auto("scheduler.params.warmup_num_steps")) std::erase(written, std::string("num_warmup_steps"));
  if (!written.empty())
    spdlog::warn("node '{}': {}'s scheduler ({}) replaces {} (DeepSpeed prefers a configured scheduler to the one "
                 "DS-Chat hands it): remove the JSON's scheduler section, or the node's setting",
                 ctx.name(), c.where, c.scheduler.type, fmt::join(written, " and "));
}

std::vector<graph::node_kind::problem> dtype_problems(const graph::node_spec& n) {
  const std::string dt = n.get_string("dtype");
  if (known_dtype(dt)) return {};
  return {{"dtype", unknown_dtype(dt), "write fp32, bf16 or fp16, the same on every model of the run"}};
}

void warn_mixed_dtypes(const graph::graph_spec& g) {
  static const std::set<std::string, std::less<>> step3 = {"policy", "critic", "reference_model", "reward_model"};
  std::set<std::string> seen;
  std::string each;
  for (const auto& m : g.nodes) {
    if (!step3.count(m.kind) || !m.find_setting("dtype")) continue;
    std::string dt = m.get_string("dtype");
    std::vector<graph::node_kind::problem> unread;  // a JSON that does not parse is its node's problem
    if (const auto ds = check_ds_config(m, static_cast<int>(m.replicas), unread))  // its bf16 / fp16 sections win
      dt = ds->bf16 ? "bf16" : ds->fp16 ? "fp16" : "fp32";
    seen.insert(dt);
    each += fmt::format("{}{} {}", each.empty() ? "" : ", ", m.name, dt);
  }
  if (seen.size() > 1)
    spdlog::warn("step 3's models have different dtypes ({}): DS-Chat's --dtype is one for all four, and a reference "
                 "in another dtype than the policy starts the KL away from 0; set node.NAME.dtype the same on each",
                 each);
}

void warn_json_overrides(const actor::node_context& ctx, const dschat::dschat_settings& own,
                         const dschat::dschat_settings& json, const std::string& json_where, const std::string& who) {
  const auto written = [&](const std::string& name) {
    const auto* w = ctx.spec().find_setting(name);
    return w && !w->from_default;
  };
  if (written("dtype") && own.dtype != json.dtype)
    spdlog::warn("node '{}': dtype = \"{}\", but {} makes it {} (its bf16 / fp16 sections), and the JSON wins: set "
                 "one of the two",
                 ctx.name(), own.dtype, json_where, json.dtype);
  // the settings the JSON replaces (dschat::apply_ds_config); a value it filled from "auto" is the node's own
  const auto said = [&](const std::string& name, const std::string& mine, const std::string& theirs,
                        const std::string& json_key) {
    if (written(name) && mine != theirs)
      spdlog::warn("node '{}': {} = {}, but {} makes it {} (its {}), and the JSON wins: set one of the two",
                   ctx.name(), name, mine, json_where, theirs, json_key);
  };
  const auto g = [](double v) { return fmt::format("{:g}", v); };
  said(who + "zero_stage", std::to_string(own.zero_stage), std::to_string(json.zero_stage), "zero_optimization.stage");
  said("gradient_clipping", g(own.gradient_clipping), g(json.gradient_clipping), "gradient_clipping");
  said("gradient_accumulation_steps", std::to_string(own.gradient_accumulation_steps),
       std::to_string(json.gradient_accumulation_steps), "gradient_accumulation_steps");
  if (who.empty())  // steps 1-2 and DPO: the micro-batch (step 3's trainers count rows per update instead)
    said("per_device_train_batch_size", std::to_string(own.per_device_train_batch_size),
         std::to_string(json.per_device_train_batch_size), "train_micro_batch_size_per_gpu");
  said(who + "learning_rate", g(own.learning_rate), g(json.learning_rate), "optimizer.params.lr");
  said(who + "weight_decay", g(own.weight_decay), g(json.weight_decay), "optimizer.params.weight_decay");
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
  d.lora_module_name = s.get_string("lora_module_name");
  d.lora_learning_rate = static_cast<float>(s.get_float("lora_learning_rate"));
  d.gradient_checkpointing = s.get_bool("gradient_checkpointing");
  d.zero_stage = static_cast<int>(s.get_int("zero_stage"));
  d.dtype = dtype_setting(ctx);
  d.only_optimize_lora = s.get_bool("only_optimize_lora");
  if (const auto& p = s.get_string("deepspeed_config"); !p.empty()) {  // one rank: the triple for world size 1
    const dschat::dschat_settings own = d;
    const auto c = load_node_ds_config(ctx, p, 1, true);
    dschat::apply_ds_config(d, c);
    warn_scheduler_replaced(ctx, c);
    warn_json_overrides(ctx, own, d, c.where, "");
  }
  return d;
}

ds_config load_node_ds_config(const actor::node_context& ctx, const std::string& path, int world, bool speaks) {
  ds_parse_options o;
  o.auto_values = hf_auto_values(ctx.spec(), world);
  ds_config c = load_ds_config(resolve_user_path(path, "deepspeed_config").string(), world, o);
  if (!speaks) return c;
  if (!c.auto_filled.empty())
    spdlog::info("node '{}': {}: \"auto\" filled from the node's settings (as HF Trainer fills it): {}", ctx.name(),
                 c.where, fmt::join(c.auto_filled, ", "));
  std::vector<std::string> ignored;
  const auto& typos = c.likely_typos;
  for (const auto& k : c.ignored_keys)
    if (std::none_of(typos.begin(), typos.end(), [&](const auto& t) { return t.key == k; })) ignored.push_back(k);
  for (const auto& t : typos)
    spdlog::warn("node '{}': {}: \"{}\" is not a setting flowrun reads, and is ignored: did you mean \"{}\"?",
                 ctx.name(), t.place, t.key, t.nearest);
  if (!ignored.empty())
    spdlog::info("node '{}': {}: keys that do not apply here, ignored: {}", ctx.name(), c.where, fmt::join(ignored, ", "));
  for (const auto& w : c.warnings) spdlog::warn("node '{}': {}", ctx.name(), w);
  return c;
}

// "; N of its lines hold L rows, but line K, the first, decides the layout: ..." for the layout of `wanted` most
// of the file's other lines have, or "" when none has any (load_report::layouts, layout_line); "items" and
// "item K" in a file that is one JSON list (load_report::unit)
static std::string deciding_line_note(const dschat::load_report& r, std::initializer_list<dschat::data_format> wanted) {
  const auto [best, most] = r.commonest(
      [&](dschat::data_format f) { return std::find(wanted.begin(), wanted.end(), f) != wanted.end(); });
  if (most == 0 || r.layout_line <= 0) return "";
  return fmt::format("; {} of its {}s hold {} rows, but {} {}, the first, decides the layout: give it the keys of "
                     "the others",
                     most, r.unit(), dschat::format_name(best), r.unit(), r.layout_line);
}

dschat::step_rows load_step_rows(actor::node_context& ctx, int step_index, const dschat::dschat_settings& d) {
  if (dschat::parse_data_split(d.data_split).size() != 3)
    throw std::invalid_argument("node '" + ctx.name() + "': data_split \"" + d.data_split +
                                "\" must have 3 parts, one per DS-Chat step (e.g. \"2,4,4\")");
  std::vector<std::string> paths = {resolve_user_path(ctx.spec().get_string("data"), "data").string()};
  for (const auto& extra : ctx.spec().get_string_list("mix_data"))  // DS-Chat's blending of several datasets
    paths.push_back(resolve_user_path(extra, "mix_data").string());
  auto src = dschat::load_sources(paths);
  for (auto& s : src) {  // lines dropped as malformed are a warning: the step trains on fewer rows than the file has
    if (s.report.malformed.empty()) ctx.log().info("{}", s.report.summary());
    else ctx.log().warn("{}", s.report.summary());
  }
  // step 2 (a reward model, DPO) learns from pairs: a file without them is named here, before its rows are
  // blended with the others' (the row of the blended share that failed named the `data` file, even when a
  // mix_data file was the one without pairs)
  for (size_t i = 0; step_index == 1 && i < src.size(); ++i) {
    const auto& r = src[i].report;
    if (r.format == dschat::data_format::prompt_chosen_rejected || r.format == dschat::data_format::hh_rlhf_raw)
      continue;
    // the first line decided the layout: when other lines hold pairs, name it (its missing "rejected" made 199 pairs
    // of a 200-line file read as prompt/chosen rows, and the refusal named no line)
    const std::string pairs = deciding_line_note(
        r, {dschat::data_format::prompt_chosen_rejected, dschat::data_format::hh_rlhf_raw});
    throw std::invalid_argument(fmt::format(
        "node '{}': {} {} holds {} rows (a file's layout is that of its first JSON {}){}: a reward model or DPO "
        "learns from pairs; give {{prompt, chosen, rejected}} rows or raw HH-RLHF {{chosen, rejected}}",
        ctx.name(), i == 0 ? "data" : "mix_data file", src[i].path, dschat::format_name(r.format), r.unit(), pairs));
  }
  // TRL's SFTTrainer trains prompt-completion rows on the completion alone (completion_only_loss); here step 1 is
  // DS-Chat's, on prompt and answer, unless mask_prompt: said where it was left at its default
  if (const auto* m = ctx.spec().find_setting("mask_prompt"); step_index == 0 && m && m->from_default && !ctx.spec().get_bool("mask_prompt"))
    for (const auto& src1 : src)
      if (src1.report.format == dschat::data_format::prompt_completion) {
        ctx.log().warn("{} holds TRL's prompt-completion rows, which TRL's SFTTrainer trains on the completion only "
                       "(completion_only_loss); here the prompt tokens are trained on too, as DS-Chat's step 1 does: "
                       "set mask_prompt = true for TRL's loss",
                       src1.path);
        break;
      }
  // step 1 learns from answers: a file of prompts alone is named here (a mix_data file of them failed as "row R
  // has no answer" of the blended share, naming the `data` file)
  for (size_t i = 0; step_index == 0 && i < src.size(); ++i)
    if (src[i].report.format == dschat::data_format::prompt_only)
      throw std::invalid_argument(fmt::format(
          "node '{}': {} {} holds {} rows (a file's layout is that of its first JSON {}){}: SFT learns from "
          "answers; give {{prompt, chosen}}, {{prompt, completion}} or {{question, answer}} rows",
          ctx.name(), i == 0 ? "data" : "mix_data file", src[i].path, dschat::format_name(src[i].report.format),
          src[i].report.unit(),
          deciding_line_note(src[i].report,
                             {dschat::data_format::prompt_chosen_rejected, dschat::data_format::prompt_chosen,
                              dschat::data_format::question_answer, dschat::data_format::prompt_completion,
                              dschat::data_format::messages, dschat::data_format::hh_rlhf_raw})));
  dschat::split_settings sp;
  sp.data_split = d.data_split;
  sp.seed = d.seed;
  sp.eval_fraction = ctx.spec().get_float("eval_fraction");
  auto rows = dschat::rows_for_step(src, step_index, sp);
  ctx.log().info("{}", rows.summary);
  return rows;
}

memory_report check_memory_plan(const actor::node_context& ctx, const decoder& model, const memory_plan& plan,
                                int local_ranks, const plan_settings& names) {
  memory_report est = estimate_memory(model, plan);
  const auto* set = ctx.spec().find_setting("memory_limit_gb");
  const double limit_gb = set ? ctx.spec().get_float("memory_limit_gb") : 0.0;
  const double avail = static_cast<double>(sysconf(_SC_AVPHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
  const double limit = limit_gb > 0 ? limit_gb * 1e9 : avail * 0.9;
  const double need = static_cast<double>(est.total()) * std::max(1, local_ranks);
  if (limit <= 0 || need <= limit) return est;
  std::vector<std::string> fix = {"lower " + names.batch + (names.seq.empty() ? "" : " or " + names.seq)};
  if (plan.stage < 3 && !names.zero_stage.empty()) fix.push_back("raise " + names.zero_stage + " (now " +
                                                                 std::to_string(plan.stage) + ")");
  if (!model.has_lora() && !names.lora.empty()) fix.push_back("set " + names.lora);
  if (!model.gradient_checkpointing() && !names.checkpointing.empty())
    fix.push_back("turn on " + names.checkpointing);
  if (local_ranks > 1) fix.push_back("spread the ranks over more processes");
  throw std::runtime_error(fmt::format(
      "node '{}': the plan needs about {:.3f} GB per rank ({}) x {} rank(s) in this process, more than the "
      "{:.3f} GB allowed{} for a micro-batch of {} x {} tokens: {}",
      ctx.name(), static_cast<double>(est.total()) / 1e9, est.str(), std::max(1, local_ranks), limit / 1e9,
      limit_gb > 0 ? " (memory_limit_gb)" : " (90% of the available memory; memory_limit_gb sets another limit)",
      plan.micro_batch, plan.seq_len, fmt::join(fix, ", ")));
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

std::shared_ptr<const chat_formatter> chat_template_setting(actor::node_context& ctx) {
  if (!ctx.spec().get_bool("apply_chat_template")) return nullptr;
  const auto dir = resolve_user_path(ctx.spec().get_string("tokenizer"), "tokenizer");
  auto f = chat_formatter_for_tokenizer(dir.string(), "node '" + ctx.name() + "'", "apply_chat_template = true",
                                        "tokenizer", "set apply_chat_template = false");
  ctx.log().info("rows rendered with the chat template of {}", f->chat_template_of_model().tmpl.name());
  return f;
}

void print_chat_row(actor::node_context& ctx, const char* tag, const dschat::step_rows& rows,
                    const dschat::tokenize_settings& ts, bool prompt_only) {
  if (!ts.chat || rows.train.empty()) return;
  const auto& r = rows.train.front();
  const auto& ref = rows.train_refs.front();
  std::vector<std::string> paths = {resolve_user_path(ctx.spec().get_string("data"), "data").string()};
  for (const auto& extra : ctx.spec().get_string_list("mix_data")) paths.push_back(resolve_user_path(extra, "mix_data").string());
  ctx.print(dschat::rendered_row_line(tag, r, ref, paths.at(static_cast<size_t>(ref.source)), ts, prompt_only));
}

}  // namespace flowrun::actors
