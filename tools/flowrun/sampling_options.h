// The sampling options of the commands that decode one answer at a time (generate, chat): their
// declaration, their checks, and a model folder's generation_config.json as their defaults.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "models/generate.h"

namespace flowrun::cli {

/// What the options hold (their defaults are the command's: generate samples as llama2.c's run.c does,
/// temperature 1 and top_p 0.9; chat decodes greedily, temperature 0, as DS-Chat's chat.py).
struct sampling_opts {
  float temperature = 1.0f;  ///< 0: greedy
  float top_p = 0.9f;        ///< 1: off
  int top_k = 0;             ///< 0: off
  float repetition_penalty = 1.0f;  ///< 1: off (CTRL)
  int64_t seed = 42;
  int64_t num_beams = 1;        ///< > 1: beam search (commands made with beams = true)
  float length_penalty = 1.0f;  ///< beam search's (transformers')
  /// From a model folder's generation_config.json (take_defaults; no options): transformers' token masks,
  /// generation_config::min_new_tokens, min_length, no_repeat_ngram_size, suppress_ids, begin_suppress_ids.
  int64_t min_new_tokens = 0, min_length = 0, no_repeat_ngram_size = 0;
  std::vector<int32_t> suppress_tokens, begin_suppress_tokens;
};

/// --temperature, --top_p, --top_k, --repetition_penalty and --seed on a subcommand, each checked as
/// the graph's generator setting of the same name is (one declaration of their ranges), the values
/// going to a shared sampling_opts.
class sampling_options {
 public:
  /// Adds the options to `sub`; `temperature_help` says what the command's default is. `beams`: also
  /// --num_beams and --length_penalty (beam search, transformers' generate with num_beams).
  sampling_options(CLI::App& sub, std::shared_ptr<sampling_opts> o, const std::string& temperature_help,
                   bool beams = false);

  /// The model folder `model`'s generation_config.json sampling defaults for the options not given on
  /// the command line, as transformers' generate() takes them: an HF folder (config.json) decodes
  /// greedily unless do_sample is true (also where there is no such file), and with do_sample, takes
  /// transformers' defaults for what the file leaves out (top_k 50, top_p 1); a sampling option on the
  /// command line samples. A flowrun folder takes the file's values, do_sample false being greedy; a
  /// model file (llama2.c) takes nothing. With beams, the file's num_beams and length_penalty too (as
  /// transformers takes them; do_sample with num_beams > 1, beam sampling, is refused). Each value is checked as its option is, the error naming the
  /// file. Returns what it took, for the log ("" when nothing). Throws std::invalid_argument on a file
  /// that is no JSON object, a value of the wrong type or range, do_sample true with temperature 0
  /// (transformers refuses it), or a file's temperature 0 beside --top_p / --top_k without --temperature.
  std::string take_defaults(const std::string& model);

  /// Throws std::invalid_argument when --top_p or --top_k was given while the temperature (given,
  /// the command's default or the model folder's, after take_defaults) is 0: greedy decoding would
  /// ignore them (as a model folder's do_sample true with temperature 0 is refused).
  void refuse_filters_when_greedy() const;

  /// With beams: throws std::invalid_argument when beam search (num_beams > 1, given or the folder's)
  /// meets a sampling option given (--temperature > 0, --top_p, --top_k: beam sampling is not
  /// supported), or when --length_penalty is given without beam search (it would do nothing).
  void check_beams() const;

  /// Whether --temperature, --top_p or --top_k was given on the command line.
  bool sampling_given() const;

  /// The options as a generation_config's sampling, seed and beams; the caller sets max_new_tokens and stop_ids.
  generation_config config() const;

 private:
  std::shared_ptr<sampling_opts> o_;
  std::map<std::string, CLI::Validator> checks_;
  std::map<std::string, const CLI::Option*> given_;
};

/// The lengths a model folder's generation_config.json sets: 0 where it sets none.
struct generation_lengths {
  int64_t max_new_tokens = 0;  ///< new tokens at most (transformers' generate() stops there)
  int64_t max_length = 0;      ///< prompt + new tokens at most; transformers takes it when max_new_tokens is unset
};

/// The max_new_tokens and max_length of the generation_config.json in model folder `model` (each 0: not a
/// folder, no file, no such key, or null). Throws std::invalid_argument naming the file when the file is not
/// JSON or a value is not a whole number >= 1.
generation_lengths generation_config_lengths(const std::string& model);

/// The token masks of the generation_config.json in model folder `model` (min_new_tokens, min_length,
/// no_repeat_ngram_size, suppress_tokens, begin_suppress_tokens: generation_config's fields of those names) set
/// into `g`, as transformers' generate() applies them beside a command's own decoding (eval prompts: greedy or
/// beams, as DS-Chat's prompt_eval.py asks generate()). Returns what it set, for the log ("" for none). Throws
/// std::invalid_argument naming the file and key for a value transformers would refuse.
std::string take_generation_masks(const std::string& model, generation_config& g);

}  // namespace flowrun::cli
