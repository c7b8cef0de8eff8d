// DeepSpeed-Chat's data pipeline (microsoft/DeepSpeedExamples,
// applications/DeepSpeed-Chat/dschat/utils/data/{data_utils.py,raw_datasets.py}):
// loading preference data, the per-step data_split, tokenization with
// truncation, and the batch layouts of the three training steps.
//
//  - Loading: {prompt, chosen, rejected} JSONL (DahoasRmstaticDataset's fields),
//    {prompt, chosen} JSONL (SFT-only data), and raw Anthropic HH-RLHF
//    {chosen, rejected} dialogues (plain or gzip), split at the LAST
//    "\n\nAssistant:" into prompt and answer. Malformed lines are counted and
//    reported with their line numbers, never dropped silently.
//  - Splitting: get_raw_dataset_split_index (cumulative boundaries over a seeded
//    permutation); a held-out eval share is carved first, as DS-Chat does for
//    datasets that ship one split only (raw_datasets.py, "train_eval" "9,1");
//    several datasets are split one by one, concatenated, and shuffled
//    (create_prompt_dataset's blending).
//  - Tokenization: step 1 and 2 sequences = prompt + answer + EOS (DS-Chat's
//    end_of_conversation_token is the model's EOS id here), cut at max_seq_len
//    with EOS kept last; step 3 prompts longer than max_prompt_seq_len are dropped
//    as create_dataset_split does, or cut keeping their end (tokenize_settings::overflow;
//    prompt_loader's prompt_overflow, "keep_end" by default).
//  - The tok512 tokenizer has no pad id: pad_id (default 0, unk) is only a filler;
//    every batch carries explicit lengths and masks, and nothing here detects
//    padding by id.
//
// Shapes: B batch rows, T sequence length, P prompt length. ids/labels/masks are
// i32 CPU tensors.
#pragma once

#include <cstdint>
#include <functional>
#include <string_view>
#include <memory>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "models/chat_format.h"
#include "models/tokenizer.h"
#include "runtime/tensor/tensor.h"

namespace flowrun::dschat {

/// One row of a preference (or SFT) dataset: DS-Chat's get_prompt / get_chosen /
/// get_rejected. prompt ends with "\n\nAssistant:" in HH-RLHF data; the answers
/// begin with their own leading space, so prompt + chosen is the full text
/// (DahoasRmstaticDataset.get_prompt_and_chosen). rejected is empty for {prompt, chosen} data.
struct sample {
  std::string prompt, chosen, rejected;
  /// A GSM8K row (data_format::question_answer) or a TRL prompt-completion row: prompt is the user's text
  /// itself, not HH-RLHF turns; with a chat template it becomes the user's message as is (gsm8k_messages),
  /// without one prompt + answer is the text (TRL's prompt + completion).
  bool question = false;
  /// A TRL conversational row ({"messages": [{role, content}, ...]}): the messages before the last,
  /// assistant, one (whose content is chosen), as the chat template reads them (row_messages); prompt is
  /// then their DS-Chat text ("\n\nHuman: ...\n\nAssistant: ...\n\nAssistant:", a system message's
  /// content first) for the runs without a template. Empty otherwise.
  nlohmann::ordered_json messages;
};

/// File layouts the loaders understand.
enum class data_format {
  automatic,               ///< decided by the keys of the first JSON object with string values
  prompt_chosen_rejected,  ///< {"prompt", "chosen", "rejected"} (Dahoas/rm-static layout)
  prompt_chosen,           ///< {"prompt", "chosen"} (SFT-only data; other keys ignored)
  hh_rlhf_raw,             ///< Anthropic HH-RLHF {"chosen", "rejected"} full dialogues
  question_answer,         ///< GSM8K {"question", "answer"}: prompt = question, chosen = answer (ends "#### N")
  prompt_completion,       ///< TRL's standard prompt-completion {"prompt", "completion"}: chosen = completion,
                           ///< the prompt plain text (the user's message with a chat template), as question_answer
  messages,                ///< TRL's conversational {"messages": [...]}: chosen = the last (assistant) message
  prompt_only,             ///< {"prompt"} alone: RL prompts (TRL's and OpenRLHF's prompt datasets); step 3 only
};
const char* format_name(data_format f);

/// One rejected line of an input file (an item of a file that is one JSON list).
struct bad_line {
  int64_t line = 0;    ///< 1-based line number in the (decompressed) file; in a JSON list, the 1-based item number
  std::string reason;  ///< e.g. "bad JSON: ...", "missing key \"chosen\"", "empty \"rejected\""
};

/// What loading one file did. Every non-blank line is either loaded, malformed
/// or (raw HH-RLHF only) dropped because its two prompts differ. In a file that is one
/// JSON list (json_list), its items are the lines: every "line" number here is an item's.
struct load_report {
  std::string path;
  /// The file is one JSON list of rows (`json.dump(rows)`, DS-Chat's local/jsonfile data/train.json), read
  /// item by item; false: JSON Lines.
  bool json_list = false;
  /// The word a row's place is named with: "line" (JSON Lines) or "item" (json_list).
  const char* unit() const { return json_list ? "item" : "line"; }
  data_format format = data_format::automatic;  ///< the layout used (after detection)
  int64_t layout_line = 0;  ///< the line (item) whose keys decided it (automatic detection; 0: given)
  std::map<data_format, int64_t> layouts;  ///< the JSON objects of each layout the keys suggest (detect)
  /// Of the layouts `wanted` takes, the one the most of the file's objects have, and how many
  /// ({automatic, 0}: none has any).
  std::pair<data_format, int64_t> commonest(const std::function<bool(data_format)>& wanted) const;
  int64_t lines = 0;   ///< lines in the file, blank ones included (json_list: its items)
  int64_t blank = 0;   ///< whitespace-only lines (skipped, not errors)
  int64_t loaded = 0;  ///< rows kept
  std::vector<bad_line> malformed;
  /// Raw HH-RLHF pairs whose chosen and rejected dialogues differ before their last
  /// "\n\nAssistant:" (no common prompt), with their line (item) numbers.
  std::vector<int64_t> prompt_mismatch_lines;
  /// One line: "PATH: N rows loaded (FORMAT) of L lines; M malformed (line 3: bad JSON ...; ...);
  /// K dropped: prompts differ (lines ...)". Lists at most `max_listed` lines of each kind. A JSON
  /// list's says "items" and "item 3" instead (unit()).
  std::string summary(size_t max_listed = 5) const;
};

/// One loaded file.
struct source {
  std::string path;
  std::vector<sample> rows;
  load_report report;
};

/// Load one JSONL file (plain, or gzip when it starts with the gzip magic; read
/// with zlib). Lines must be JSON objects with non-empty string values for the
/// keys of `format`. Malformed lines are recorded in report.malformed.
/// A file that is one JSON list (after an optional UTF-8 byte order mark and
/// whitespace, '[' first, and the whole text one JSON array: what `json.dump(rows)`
/// writes, read as `datasets.load_dataset("json")` reads it) has its items as rows,
/// each read as a JSON Lines line is (an item that is not an object is malformed),
/// numbered as items (report.json_list); a text that starts with '[' but is not one
/// JSON value is read as JSON Lines when its first line is a JSON value (that line
/// malformed), and refused otherwise (a list cut short or with a trailing comma).
/// Throws std::runtime_error naming the file when it cannot be opened or
/// decompressed, when it is a folder, when it is a JSON list of lists or a list
/// that does not parse (with the parse error's line and column), when
/// `automatic` finds no line to decide the layout from, or when no line is
/// usable (listing the first few bad lines or items and their reasons).
source load_source(const std::string& path, data_format format = data_format::automatic);

/// Load several files (DS-Chat's --data_path list), in order.
std::vector<source> load_sources(const std::vector<std::string>& paths, data_format format = data_format::automatic);

/// Split one raw HH-RLHF dialogue at its LAST "\n\nAssistant:": prompt = the text up to
/// and including it, answer = the rest. Returns false when the marker is absent.
bool split_dialogue(const std::string& dialogue, std::string& prompt, std::string& answer);

// ---- data_split ------------------------------------------------------------

/// The weights of a data_split string ("2,4,4" -> {2, 4, 4}). Throws
/// std::invalid_argument on an empty part, a non-number, a negative weight, or a zero sum.
std::vector<double> parse_data_split(const std::string& data_split);

/// DS-Chat's cumulative split boundaries (data_utils.py get_raw_dataset_split_index):
/// w_i = weight_i / sum; b_0 = 0, b_{i+1} = b_i + round(w_i · n) (round half to even, as
/// Python's round); then every b_{i>=1} -= b_last - n so that b_last = n.
/// Returns parts + 1 boundaries.
std::vector<int64_t> split_boundaries(int64_t n, const std::vector<double>& weights);

/// DS-Chat's get_shuffle_idx(seed, n) (data_utils.py): the permutation of 0..n-1 that
/// numpy's np.random.RandomState(seed).shuffle(np.arange(n)) makes, number for number
/// (MT19937 seeded by init_genrand; Fisher–Yates from the end, each partner drawn by
/// numpy's random_interval). So each step trains on the rows DS-Chat's does with the
/// same data_split and seed. Throws std::invalid_argument when seed >= 2^32 (numpy's
/// RandomState refuses it too).
std::vector<int64_t> shuffle_indices(int64_t n, uint64_t seed);

/// The name of shuffle_indices' row order, recorded with what a split trained (settings records'
/// `data_split_order`, a trainer folder's flowrun_data.json): a record without it predates the
/// order (2026-12-05) and held out other rows.
inline constexpr std::string_view split_order = "DS-Chat get_shuffle_idx (numpy RandomState)";

/// Indices (into 0..n-1) of part `part` of `weights`: shuffle_indices(n, seed)[b_part : b_part+1].
std::vector<int64_t> split_part(int64_t n, const std::vector<double>& weights, int part, uint64_t seed);

/// The indices that training step `step_index` (0 = SFT, 1 = reward model, 2 = PPO) gets
/// of a dataset of n rows: get_raw_dataset_split_index(..., data_split, step_index, n).
/// The parts of the steps are disjoint and together cover 0..n-1.
/// Throws std::invalid_argument on a bad data_split or step_index outside its parts.
std::vector<int64_t> split_for_step(int64_t n, const std::string& data_split, int step_index, uint64_t seed);

/// How the rows of one step are chosen.
struct split_settings {
  std::string data_split = "2,4,4";  ///< DS-Chat's --data_split (default "2,4,4")
  uint64_t seed = 1234;              ///< DS-Chat's --seed (default 1234)
  /// Held-out share. DS-Chat evaluates on a dataset's own test split; for datasets with
  /// one split it first carves "9,1" train/eval with the same split function
  /// (raw_datasets.py, e.g. DahoasSyntheticinstructgptjpairwiseDataset.get_eval_data),
  /// then applies data_split to each part. We do the same with weights
  /// {1 - eval_fraction, eval_fraction}; 0 leaves no eval rows.
  double eval_fraction = 0.1;
};

/// Where a selected row came from.
struct row_ref {
  int32_t source = 0;  ///< index into the sources
  int64_t row = 0;     ///< index into that source's rows
};

/// The rows one training step trains and evaluates on.
struct step_rows {
  std::vector<sample> train, eval;
  std::vector<row_ref> train_refs, eval_refs;  ///< origin of each row, same order
  /// "step 2 (data_split 2,4,4, seed 1234, eval_fraction 0.1): train 830, eval 92 (PATH: 830 + 92)"
  std::string summary;
};

/// The train and eval rows of step `step_index` (0..parts-1) from `sources`: per source,
/// eval carve then data_split on each part (create_dataset); with several sources the
/// parts are concatenated in order and shuffled with shuffle_indices(total, seed)
/// (create_prompt_dataset's blending). Deterministic for the settings.
step_rows rows_for_step(const std::vector<source>& sources, int step_index, const split_settings& cfg);

/// The batches of one epoch over n rows: a RandomSampler-like order (shuffle = true;
/// shuffle_indices with a 32-bit seed mixed from (seed, epoch): not torch's randperm, so
/// the order differs from DS-Chat's) or SequentialSampler (shuffle = false), cut
/// into batches of batch_size; the last batch may be smaller (drop_last = False).
std::vector<std::vector<int64_t>> epoch_batches(int64_t n, int64_t batch_size, uint64_t seed, int64_t epoch,
                                                bool shuffle = true);

// ---- tokenization ----------------------------------------------------------

/// Step 3 prompts longer than max_prompt_seq_len.
enum class prompt_overflow {
  drop,      ///< DS-Chat: create_dataset_split (train_phase 3) keeps a prompt only when its
             ///< length <= max_seq_len and counts the others as `filtered`
  keep_end,  ///< keep BOS (when add_bos) and the last tokens of the prompt
};

/// Steps 1 and 2: what to cut from a sequence longer than max_seq_len.
enum class truncation_mode {
  /// Cut the end (the HF tokenizer's truncation=True as DS-Chat calls it), then put EOS
  /// back as the last token. Long HH-RLHF prompts then often leave no answer at all:
  /// chosen and rejected become identical (counted in process_report::identical).
  end,
  /// Drop the oldest prompt tokens first (after BOS), by the same count for chosen and
  /// rejected so that their shared prefix stays aligned; cut the end (EOS kept) only when
  /// the answer alone does not fit. Not DS-Chat's behaviour; keeps the answers, which
  /// carry the preference signal, for models with short contexts.
  prompt_start,
};

struct tokenize_settings {
  int64_t max_seq_len = 512;         ///< steps 1 and 2: prompt + answer + EOS
  truncation_mode truncation = truncation_mode::end;
  int64_t max_prompt_seq_len = 256;  ///< step 3 (DS-Chat's --max_prompt_seq_len, default 256)
  /// Begin each sequence with BOS where the model's tokenizer does (tokenizer::adds_bos: the HF
  /// LLaMA and OPT tokenizers, llama2.c's, not GPT-2's; DS-Chat tokenizes with the model's
  /// tokenizer); stories260K was trained with BOS first.
  bool add_bos = true;
  /// Append EOS (DS-Chat appends end_of_conversation_token; here the model's EOS id).
  /// A tokenizer without BOS or EOS (an HF folder whose tokenizer_config.json names none) adds
  /// none, as tokenizer::encode does.
  bool add_eos = true;
  /// Step 1: labels -100 on prompt tokens too. DS-Chat trains on the prompt (labels =
  /// input_ids where attention_mask, PromptDataset.__getitem__), so the default is off.
  bool mask_prompt = false;
  prompt_overflow overflow = prompt_overflow::drop;
  /// Step 2 pairs whose chosen and rejected ids are equal (after truncation) are left out
  /// (and counted in process_report::identical). The DPO step sets it: such a pair has no
  /// preference to learn (its DPO margin is 0 whatever the model). The reward model keeps them.
  bool skip_identical = false;
  /// Render rows with a model's chat template before tokenizing (the trainers' apply_chat_template
  /// setting, TRL's and OpenRLHF's name); null: the row's text as is (DS-Chat). With a template:
  ///  - the prompt is row_messages(row) rendered with add_generation_prompt = true; steps 1-2 tokenize
  ///    those messages plus the answer as the assistant's message (add_generation_prompt = false), as
  ///    TRL's SFT and reward trainers do for conversational prompt/completion data: a DS-Chat or GSM8K
  ///    answer stripped (as its prompt's turns are), a conversational row's as written;
  ///  - add_bos is ignored: the template writes the model's BOS when it has one (Llama 3's
  ///    <|begin_of_text|>; Qwen2 has none), as apply_chat_template(tokenize=True) encodes with
  ///    add_special_tokens=False;
  ///  - add_eos appends EOS only when the answer's tokens hold none (Llama 3.1's and Qwen2.5's templates
  ///    end the turn with their EOS, <|eot_id|> / <|im_end|>; a base model's template may not);
  ///  - truncation keeps a leading BOS as without a template.
  std::shared_ptr<const chat_formatter> chat;
};

/// A row's prompt as chat messages (models/chat_format.h): a GSM8K question (sample::question) is the
/// user's one message (gsm8k_messages); a DS-Chat / HH-RLHF prompt is split into its user and assistant
/// turns (dschat_messages, which throws std::runtime_error quoting a prompt with no "\n\nHuman:" turn).
nlohmann::ordered_json row_messages(const sample& row);

/// The text step 3 tokenizes for a row: its prompt as is, or with cfg.chat its messages rendered for
/// generation (add_generation_prompt = true). Throws chat_template_error naming the template file.
std::string prompt_text(const sample& row, const tokenize_settings& cfg);

/// The texts steps 1-2 tokenize for a row and one of its answers: {prompt, prompt + answer} as is, or
/// with cfg.chat {the prompt's messages rendered with add_generation_prompt = true, those messages and
/// the stripped answer as the assistant's reply} (chat_formatter::prompt_response; the first is a
/// prefix of the second). Throws chat_template_error naming the template file.
chat_prompt_response prompt_answer_text(const sample& row, const std::string& answer, const tokenize_settings& cfg);

/// With a chat template (cfg.chat), what a row becomes, as a run prints it so that it can be checked
/// (tests/hf_chat_small.sh): "TAG chat template FILE: data row R of PATH renders as JSON-STRING", the
/// text being prompt_text (`prompt_only`) or prompt_answer_text with the row's chosen answer; R is the
/// row's index in its file `path` (row_ref::row, 0-based). "" without a template. The trainers and
/// prompt_loader print it for their first training row, `flowrun eval` for its first held-out row.
std::string rendered_row_line(const std::string& tag, const sample& row, const row_ref& ref, const std::string& path,
                              const tokenize_settings& cfg, bool prompt_only);

/// What tokenizing a list of rows did.
struct process_report {
  int64_t input = 0;      ///< rows given
  int64_t kept = 0;       ///< examples made
  int64_t truncated = 0;  ///< examples cut at max_seq_len (EOS kept) / prompts cut (keep_end)
  int64_t filtered = 0;   ///< step 3 prompts dropped for length (prompt_overflow::drop)
  int64_t identical = 0;  ///< step 2 pairs whose chosen and rejected ids are equal (after truncation)
  /// examples whose whole prompt was dropped (truncation = "prompt_start" with answers alone reaching
  /// max_seq_len): the model learns their answers with no question before them
  int64_t prompt_lost = 0;
  bool identical_skipped = false;  ///< those pairs were left out (tokenize_settings::skip_identical)
  int64_t max_len = 0;    ///< longest kept sequence (tokens)
  double mean_len = 0;    ///< mean kept sequence length (for step 2: over chosen and rejected)
  std::string summary() const;
};

/// A step 1 example: ids = BOS + prompt + chosen + EOS (cut to max_seq_len as
/// tokenize_settings::truncation says, EOS last).
/// The first prompt_len ids are prompt tokens (BOS included): the longest common prefix
/// of the prompt's own tokens and the full sequence's, so a token merged across the
/// boundary counts as answer.
struct sft_example {
  std::vector<int32_t> ids;
  int64_t prompt_len = 0;
  bool truncated = false;
};

/// A step 2 example: BOS + prompt + answer + EOS for each answer (each cut to max_seq_len, EOS last).
/// The first *_prompt_len ids of each are prompt tokens, as sft_example::prompt_len (the DPO
/// step's loss covers the answer tokens only).
struct rm_example {
  std::vector<int32_t> chosen, rejected;
  int64_t chosen_prompt_len = 0, rejected_prompt_len = 0;
  bool truncated = false;
};

/// A step 3 example: BOS + prompt tokens (at most max_prompt_seq_len).
struct prompt_example {
  std::vector<int32_t> ids;
  bool truncated = false;
  std::string reference;  ///< the row's `chosen`: the reference answer rule rewards compare with
};

/// Cut `ids` to at most max_len tokens; when cut and `keep_eos`, the last kept token is
/// replaced by `eos`. Returns whether it cut. max_len < 1 throws std::invalid_argument.
bool truncate_keep_eos(std::vector<int32_t>& ids, int64_t max_len, bool keep_eos, int32_t eos);

/// With cfg.chat the three below tokenize each row's chat rendering (prompt_text / prompt_answer_text);
/// a row whose prompt has no HH-RLHF turn, or that the template cannot render, throws
/// std::invalid_argument "row I: ..." carrying the cause (chat_template_error's file, line and construct).
///
/// Step 1 examples (create_dataset_split, train_phase 1). Rows whose prompt + chosen is
/// empty are impossible (loaders reject empty answers). Throws std::invalid_argument on
/// max_seq_len < 2 (BOS and EOS).
std::vector<sft_example> make_sft_examples(const std::vector<sample>& rows, const tokenizer& tok,
                                           const tokenize_settings& cfg, process_report* report = nullptr);
/// Step 2 examples (train_phase 2); with cfg.skip_identical, pairs whose ids are equal are left out.
/// Rows without a rejected answer throw
/// std::invalid_argument naming the row index (load them as prompt_chosen_rejected or hh_rlhf_raw).
std::vector<rm_example> make_rm_examples(const std::vector<sample>& rows, const tokenizer& tok,
                                         const tokenize_settings& cfg, process_report* report = nullptr);
/// Step 3 examples (train_phase 3): prompts only; longer ones dropped or cut (cfg.overflow).
std::vector<prompt_example> make_prompt_examples(const std::vector<sample>& rows, const tokenizer& tok,
                                                 const tokenize_settings& cfg, process_report* report = nullptr);

// ---- batches ---------------------------------------------------------------

/// A step 1 batch, right-padded.
struct sft_batch_data {
  int64_t B = 0, T = 0;
  tensor ids;      ///< (B, T) i32, pad_id after each row's length
  tensor mask;     ///< (B, T) i32 attention mask: 1 on real tokens
  /// (B, T) i32: ids with -100 on padding (and on prompt tokens when mask_prompt), unshifted,
  /// as DS-Chat's PromptDataset labels (HF shifts inside the model).
  tensor labels;
  /// (B, T) i32: labels shifted left by one (targets[:, t] = labels[:, t+1], last = -100):
  /// what decoder::forward takes as next-token targets.
  tensor targets;
  tensor lengths;  ///< (B) i32 real lengths
  int64_t n_target_tokens = 0;  ///< targets != -100
};

/// Step 1 batch of examples[indices]. T = pad_to when pad_to > 0 (DS-Chat pads to
/// max_seq_len), else the longest row. Throws std::invalid_argument when a row is longer
/// than pad_to, an index is out of range, or indices is empty.
sft_batch_data sft_batch(const std::vector<sft_example>& examples, const std::vector<int64_t>& indices,
                         bool mask_prompt = false, int64_t pad_to = 0, int32_t pad_id = 0);

/// A step 2 batch: chosen and rejected, each right-padded to the same T.
struct rm_batch_data {
  int64_t B = 0, T = 0;
  tensor chosen_ids, rejected_ids;    ///< (B, T) i32
  tensor chosen_mask, rejected_mask;  ///< (B, T) i32
  tensor chosen_len, rejected_len;    ///< (B) i32
  tensor chosen_prompt_len, rejected_prompt_len;  ///< (B) i32: rm_example's prompt lengths
};

/// Step 2 batch of examples[indices] (T: as sft_batch over both answers).
rm_batch_data rm_batch(const std::vector<rm_example>& examples, const std::vector<int64_t>& indices,
                       int64_t pad_to = 0, int32_t pad_id = 0);

/// A step 3 batch, left-padded (DataCollatorRLHF: the flipped prompts are right-padded,
/// then flipped back).
struct prompt_batch_data {
  int64_t B = 0, P = 0;
  tensor ids;      ///< (B, P) i32: pad_id, then the prompt ending at column P-1
  tensor mask;     ///< (B, P) i32: 0 on padding, 1 on prompt tokens
  tensor lengths;  ///< (B) i32
};

/// Step 3 batch of examples[indices]. P = pad_to when pad_to > 0 (DataCollatorRLHF pads to
/// max_prompt_seq_len), else the longest prompt.
prompt_batch_data prompt_batch(const std::vector<prompt_example>& examples, const std::vector<int64_t>& indices,
                               int64_t pad_to = 0, int32_t pad_id = 0);

}  // namespace flowrun::dschat
