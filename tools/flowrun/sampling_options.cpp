#include "tools/flowrun/sampling_options.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "runtime/graph/node_kind.h"
#include "runtime/util/assets.h"
#include "tools/flowrun/commands.h"

namespace flowrun::cli {

namespace {
// A model folder's generation_config.json sampling defaults, as transformers' generate() takes them, for the options
// the command line did not give (`given`: each option's name -> whether it was given). Each value is checked as
// the option's (`check`: the option's name and value -> "" or why not), naming the file. A Hugging Face folder
// (config.json) decodes as transformers does: greedily unless do_sample is true (a folder without the file, or
// whose file holds only stop ids, as a conversion from llama2.c writes, sampled here and decoded greedily there),
// and with do_sample true, transformers' defaults for what the file leaves out (top_k 50, top_p 1); a sampling
// option on the command line samples. A flowrun folder takes the file's values, do_sample false being greedy.
// Returns what it took, for the log ("" when nothing).
// The JSON object of generation_config.json at `file` (one that exists); std::invalid_argument naming it otherwise.
nlohmann::json read_generation_config(const std::filesystem::path& file) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(std::ifstream(file));
  } catch (const std::exception& e) {
    throw std::invalid_argument(file.string() + " is not JSON (" + e.what() + "): fix or remove it");
  }
  if (!j.is_object()) throw std::invalid_argument(file.string() + " is not a JSON object: fix or remove it");
  return j;
}

// generation_config.json's token masks (generation_config::min_new_tokens), checked as transformers would take them
// (whole numbers >= 0, lists of ids), naming the file and key; "key value" of each set into `took`.
void read_token_masks(const nlohmann::json& j, const std::filesystem::path& file, int64_t& min_new_tokens,
                      int64_t& min_length, int64_t& no_repeat_ngram_size, std::vector<int32_t>& suppress,
                      std::vector<int32_t>& begin_suppress, std::vector<std::string>& took) {
  for (const auto& [key, n] : {std::pair<const char*, int64_t*>{"min_new_tokens", &min_new_tokens},
                               {"min_length", &min_length}, {"no_repeat_ngram_size", &no_repeat_ngram_size}}) {
    if (!j.contains(key) || j[key].is_null()) continue;
    if (!j[key].is_number_integer() || j[key].get<int64_t>() < 0)
      throw std::invalid_argument(fmt::format("{}: {} = {} is not a whole number >= 0: fix or remove it",
                                              file.string(), key, j[key].dump()));
    *n = j[key].get<int64_t>();
    if (*n > 0) took.push_back(fmt::format("{} {}", key, *n));
  }
  for (const auto& [key, ids] : {std::pair<const char*, std::vector<int32_t>*>{"suppress_tokens", &suppress},
                                 {"begin_suppress_tokens", &begin_suppress}}) {
    if (!j.contains(key) || j[key].is_null()) continue;
    const auto& v = j[key];
    const bool ok = v.is_array() && std::all_of(v.begin(), v.end(), [](const nlohmann::json& x) {
      return x.is_number_integer() && x.get<int64_t>() >= 0 && x.get<int64_t>() <= std::numeric_limits<int32_t>::max();
    });
    if (!ok)
      throw std::invalid_argument(fmt::format("{}: {} = {} is not a list of token ids: fix or remove it", file.string(),
                                              key, v.dump()));
    *ids = v.get<std::vector<int32_t>>();
    if (!ids->empty()) took.push_back(fmt::format("{} {}", key, v.dump()));
  }
}

// The keys of a generation_config.json object that transformers' GenerationConfig applies when they differ from its
// defaults (a logits processor, a search mode), and flowrun's generation does not (models/generate.h): "key value"
// each, in name order. early_stopping matters to beam search only (num_beams > 1: flowrun's is
// early_stopping false).
std::vector<std::string> unapplied_generation_keys(const nlohmann::json& j, int64_t num_beams, bool samples,
                                                   bool beams_here) {
  // transformers' defaults (generation/configuration_utils.py, GenerationConfig.__init__)
  static const std::vector<std::pair<const char*, nlohmann::json>> keys = {
      {"encoder_no_repeat_ngram_size", 0}, {"encoder_repetition_penalty", 1.0}, {"bad_words_ids", nullptr},
      {"force_words_ids", nullptr}, {"forced_bos_token_id", nullptr}, {"forced_eos_token_id", nullptr},
      {"sequence_bias", nullptr}, {"exponential_decay_length_penalty", nullptr}, {"diversity_penalty", 0.0},
      {"num_beam_groups", 1}, {"penalty_alpha", nullptr}, {"renormalize_logits", false}, {"guidance_scale", nullptr},
      {"dola_layers", nullptr}, {"watermarking_config", nullptr}, {"stop_strings", nullptr}, {"max_time", nullptr}};
  // the warpers transformers adds only when it samples (greedy, it says they "may be ignored", and they are)
  static const std::vector<std::pair<const char*, nlohmann::json>> sampling_keys = {
      {"typical_p", 1.0}, {"epsilon_cutoff", 0.0}, {"eta_cutoff", 0.0}, {"min_p", nullptr}, {"top_h", nullptr}};
  const auto differs = [&](const auto& table, const std::string& key, const nlohmann::json& v) {
    const auto k = std::find_if(table.begin(), table.end(), [&](const auto& d) { return key == d.first; });
    return k != table.end() && !v.is_null() && v != k->second;
  };
  // a command without beam search (chat) decodes a file's num_beams > 1 greedily: said with its beam keys
  const bool file_beams = j.value("num_beams", nlohmann::json(1)).is_number_integer() && j.value("num_beams", 1) > 1;
  std::vector<std::string> out;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& key = it.key();
    const nlohmann::json& v = it.value();
    const bool beam_key = (key == "num_beams" && file_beams) ||
                          (!beams_here && file_beams && (key == "length_penalty" || key == "early_stopping"));
    const bool stopping = key == "early_stopping" && num_beams > 1 && !v.is_null() && v != false;
    if ((beam_key && !beams_here) || stopping || differs(keys, key, v) || (samples && differs(sampling_keys, key, v)))
      out.push_back(key + " " + v.dump());
  }
  return out;
}

std::string take_generation_defaults(sampling_opts& o, const std::string& model,
                                     const std::map<std::string, bool>& given,
                                     const std::function<std::string(const std::string&, std::string)>& check) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path dir = resolve_user_path(model, "model");
  const fs::path file = dir / "generation_config.json";
  if (!fs::is_directory(dir, ec)) return "";
  const bool hf = fs::is_regular_file(dir / "config.json", ec), has_file = fs::is_regular_file(file, ec);
  if (!has_file && !hf) return "";
  nlohmann::json j = has_file ? read_generation_config(file) : nlohmann::json::object();
  std::vector<std::string> took;
  auto take = [&](const char* key, auto& field) {
    if (!j.contains(key) || j[key].is_null() || given.at(key)) return;
    if (!j[key].is_number())
      throw std::invalid_argument(fmt::format("{}: {} = {} is not a number: fix or remove it", file.string(), key, j[key].dump()));
    if (const std::string why = check(key, j[key].dump()); !why.empty())
      throw std::invalid_argument(fmt::format("{}: {} = {}: {}; fix or remove it", file.string(), key, j[key].dump(), why));
    field = j[key].get<std::decay_t<decltype(field)>>();
    took.push_back(fmt::format("{} {}", key, j[key].dump()));
  };
  if (j.contains("do_sample") && !j["do_sample"].is_null() && !j["do_sample"].is_boolean())
    throw std::invalid_argument(fmt::format("{}: do_sample = {} is not true or false: fix or remove it", file.string(),
                                            j["do_sample"].dump()));
  const bool do_sample = j.value("do_sample", nlohmann::json()) == true;
  const bool cli_samples = given.at("temperature") || given.at("top_p") || given.at("top_k");
  if (hf && (do_sample || cli_samples)) {  // transformers' GenerationConfig defaults for what neither gives
    if (!given.at("temperature")) o.temperature = 1.0f;
    if (!given.at("top_p")) o.top_p = 1.0f;
    if (!given.at("top_k")) o.top_k = 50;
  }
  if (!hf || do_sample || cli_samples) {
    take("temperature", o.temperature);
    take("top_p", o.top_p);
    take("top_k", o.top_k);
    if (hf) took.push_back(fmt::format("{}: temperature {:g}, top_k {}, top_p {:g}",
                                       do_sample ? "do_sample true" : "sampling (a sampling option given)",
                                       o.temperature, o.top_k, o.top_p));
    // transformers refuses a temperature of 0 with do_sample (TemperatureLogitsWarper: strictly positive); a
    // sampling option given beside the file's 0 decoded greedily while the log said it sampled
    if (hf && !given.at("temperature") && o.temperature == 0)
      throw std::invalid_argument(
          file.string() + (do_sample ? ": do_sample true with temperature 0: transformers refuses it (a temperature "
                                       "must be above 0 to sample); set do_sample false to decode greedily"
                                     : ": temperature 0 (greedy) with --top_p / --top_k given to sample: give "
                                       "--temperature too"));
  }
  take("repetition_penalty", o.repetition_penalty);
  // transformers' token masks (generation_config::min_new_tokens): applied as its logits processors are
  read_token_masks(j, file, o.min_new_tokens, o.min_length, o.no_repeat_ngram_size, o.suppress_tokens,
                   o.begin_suppress_tokens, took);
  if (given.count("num_beams")) {  // the command searches beams: the file's beams, as transformers' generate()
    take("num_beams", o.num_beams);
    take("length_penalty", o.length_penalty);
    if (do_sample && !given.at("num_beams") && o.num_beams > 1)
      throw std::invalid_argument(fmt::format("{}: do_sample true with num_beams {}: beam sampling is not supported "
                                              "here; set do_sample false (beam search) or num_beams 1 (sampling), or "
                                              "give --num_beams 1",
                                              file.string(), o.num_beams));
  }
  if ((hf ? !do_sample : j.value("do_sample", nlohmann::json()) == false) && !cli_samples) {
    o.temperature = 0;  // transformers samples only with do_sample
    took.push_back(j.value("do_sample", nlohmann::json()).is_boolean() ? "do_sample false: greedy"
                                           : "no do_sample: greedy, as transformers' generate() decodes this folder");
  }
  // what transformers' generate() would apply from the file and this command does not (its logits processors and
  // search modes): said, not silently left out (a min_new_tokens 10 stopped here after 3 tokens)
  const bool beams_here = given.count("num_beams") > 0;
  if (const auto skipped = unapplied_generation_keys(j, o.num_beams, o.temperature > 0, beams_here); !skipped.empty())
    spdlog::warn("{}: {} shape transformers' decoding and are not applied here: the tokens may differ from "
                 "transformers' generate() (applied: do_sample, temperature, top_k, top_p, repetition_penalty, {}"
                 "max_new_tokens, max_length, min_new_tokens, min_length, no_repeat_ngram_size, suppress_tokens, "
                 "begin_suppress_tokens and the eos_token_id list)",
                 file.string(), fmt::join(skipped, ", "), beams_here ? "num_beams, length_penalty, " : "");
  if (took.empty()) return "";
  return fmt::format("{} ({}; the command line's options win)", fmt::join(took, ", "),
                     has_file ? file.string() : dir.string() + " has no generation_config.json");
}

}  // namespace

sampling_options::sampling_options(CLI::App& sub, std::shared_ptr<sampling_opts> o, const std::string& temperature_help,
                                   bool beams)
    : o_(std::move(o)) {
  // one declaration of the ranges: the graph's generator settings
  graph::node_kind_registry declared;
  graph::register_example_kinds(declared);
  const graph::node_kind& gen = *declared.lookup("generator");
  for (const char* name : {"temperature", "top_p", "top_k"})
    checks_.emplace(name, setting_check(*gen.find_setting(name), gen.name));
  checks_.emplace("repetition_penalty",
                  CLI::Validator(
                      [](std::string& v) {
                        float x = 0;
                        try {
                          x = std::stof(v);
                        } catch (const std::exception&) {
                          return std::string("must be a number, got ") + v;
                        }
                        return std::isfinite(x) && x > 0 ? std::string() : "must be finite and > 0 (1 = off), got " + v;
                      },
                      "FLOAT > 0"));
  given_["temperature"] =
      sub.add_option("--temperature", o_->temperature, temperature_help)->capture_default_str()->check(checks_.at("temperature"));
  given_["top_p"] = sub.add_option("--top_p", o_->top_p, "Nucleus sampling threshold (1 = off)")
                        ->capture_default_str()
                        ->check(checks_.at("top_p"));
  given_["top_k"] =
      sub.add_option("--top_k", o_->top_k, "Top-k filter (0 = off)")->capture_default_str()->check(checks_.at("top_k"));
  given_["repetition_penalty"] =
      sub.add_option("--repetition_penalty", o_->repetition_penalty, "1 = off; > 1 discourages repeats (CTRL)")
          ->capture_default_str()
          ->check(checks_.at("repetition_penalty"));
  sub.add_option("--seed", o_->seed, "Sampling seed")
      ->capture_default_str()
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{4294967295}));
  if (!beams) return;
  checks_.emplace("num_beams", CLI::Range(std::int64_t{1}, std::int64_t{64}));
  checks_.emplace("length_penalty", CLI::Range(-10.0, 10.0));
  given_["num_beams"] = sub.add_option("--num_beams", o_->num_beams,
                                       "Beam search over this many beams (transformers' generate with num_beams, "
                                       "do_sample false: the sampling options do not apply); 1 = off (default: an "
                                       "HF folder's generation_config.json, as transformers takes it)")
                            ->capture_default_str()
                            ->check(checks_.at("num_beams"));
  given_["length_penalty"] =
      sub.add_option("--length_penalty", o_->length_penalty,
                     "Beam search: a finished beam scores sum log p / (new tokens)^length_penalty (transformers')")
          ->capture_default_str()
          ->check(checks_.at("length_penalty"));
}

void sampling_options::check_beams() const {
  if (!given_.count("num_beams")) return;
  if (o_->num_beams > 1 && o_->temperature != 0 && sampling_given())
    throw std::invalid_argument("--num_beams " + std::to_string(o_->num_beams) +
                                " searches beams deterministically (transformers' num_beams without do_sample): "
                                "drop --temperature / --top_p / --top_k, or --num_beams to sample");
  if (o_->num_beams <= 1 && given_.at("length_penalty")->count() > 0)
    throw std::invalid_argument("--length_penalty scores the beams of beam search, and there is none here (num_beams "
                                "1): give --num_beams > 1, or drop it");
}

generation_lengths generation_config_lengths(const std::string& model) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path file = resolve_user_path(model, "model") / "generation_config.json";
  if (!fs::is_regular_file(file, ec)) return {};
  const nlohmann::json j = read_generation_config(file);
  const auto length = [&](const char* key) -> int64_t {
    if (!j.contains(key) || j[key].is_null()) return 0;
    if (!j[key].is_number_integer() || j[key].get<int64_t>() < 1)
      throw std::invalid_argument(fmt::format("{}: {} = {} is not a whole number >= 1: fix or remove it",
                                              file.string(), key, j[key].dump()));
    return j[key].get<int64_t>();
  };
  return {length("max_new_tokens"), length("max_length")};
}

std::string take_generation_masks(const std::string& model, generation_config& g) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path file = resolve_user_path(model, "model") / "generation_config.json";
  if (!fs::is_regular_file(file, ec)) return "";
  std::vector<std::string> took;
  read_token_masks(read_generation_config(file), file, g.min_new_tokens, g.min_length, g.no_repeat_ngram_size,
                   g.suppress_ids, g.begin_suppress_ids, took);
  return took.empty() ? "" : fmt::format("{} ({})", fmt::join(took, ", "), file.string());
}

std::string sampling_options::take_defaults(const std::string& model) {
  std::map<std::string, bool> given;
  for (const auto& [name, opt] : given_) given[name] = opt->count() > 0;
  return take_generation_defaults(*o_, model, given,
                                  [&](const std::string& name, std::string value) { return checks_.at(name)(value); });
}

void sampling_options::refuse_filters_when_greedy() const {
  if (o_->temperature != 0 || (given_.at("top_p")->count() == 0 && given_.at("top_k")->count() == 0)) return;
  throw std::invalid_argument(
      std::string("--top_p / --top_k shape sampling, but the temperature is 0 (") +
      (given_.at("temperature")->count() > 0 ? "--temperature 0" : "the default here") +
      "): greedy decoding would ignore them; give --temperature > 0 to sample (1: the model's own distribution), "
      "or drop them");
}

bool sampling_options::sampling_given() const {
  return given_.at("temperature")->count() > 0 || given_.at("top_p")->count() > 0 || given_.at("top_k")->count() > 0;
}

generation_config sampling_options::config() const {
  generation_config g;
  g.sampling.temperature = o_->temperature;
  g.sampling.top_p = o_->top_p;
  g.sampling.top_k = o_->top_k;
  g.sampling.repetition_penalty = o_->repetition_penalty;
  g.seed = static_cast<uint64_t>(o_->seed);
  g.num_beams = o_->num_beams;
  g.length_penalty = o_->length_penalty;
  g.min_new_tokens = o_->min_new_tokens;
  g.min_length = o_->min_length;
  g.no_repeat_ngram_size = o_->no_repeat_ngram_size;
  g.suppress_ids = o_->suppress_tokens;
  g.begin_suppress_ids = o_->begin_suppress_tokens;
  return g;
}

}  // namespace flowrun::cli
