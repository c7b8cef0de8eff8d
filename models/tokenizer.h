// Tokenizers behind one interface: SentencePiece (LLaMA, via the SentencePiece
// library), GPT-2 byte-level BPE (GPT-2, OPT; models/bpe_tokenizer.cpp) and Hugging Face
// tokenizer.json (Llama 2/3, Mistral, Qwen2; models/hf_tokenizer.cpp).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace flowrun {

class tokenizer {
 public:
  virtual ~tokenizer() = default;
  /// Token ids of `text` (no BOS/EOS unless asked).
  virtual std::vector<int32_t> encode(const std::string& text, bool add_bos = false, bool add_eos = false) const = 0;
  /// Text of `ids`; BOS, EOS and pad ids are skipped.
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
  /// The piece string of one id (for debugging and tests).
  virtual std::string piece(int32_t id) const = 0;
  virtual int32_t vocab_size() const = 0;
  virtual int32_t bos_id() const = 0;
  virtual int32_t eos_id() const = 0;
  /// -1 when the model has no pad token.
  virtual int32_t pad_id() const = 0;
  /// Whether the model's Hugging Face tokenizer puts BOS before every text it
  /// encodes (tokenizer_config.json "add_bos_token": OPT's does, GPT-2's does not).
  /// Callers pass it as encode's add_bos to tokenize as transformers does. A bare SentencePiece
  /// .model file (llama2.c's) does: run.c puts BOS before every prompt.
  virtual bool adds_bos() const { return false; }
};

/// A prompt's ids as transformers' tokenizer gives them (tokenizer(text).input_ids): BOS first only
/// where the tokenizer puts it there (tok.adds_bos(): llama2.c and LLaMA/Llama 3 folders yes,
/// GPT-2 and Qwen2 no), and [BOS] for an empty text when the tokenizer has one (as generate
/// starts from bos_token_id without input ids). Empty when the text is and there is no BOS.
std::vector<int32_t> prompt_ids(const tokenizer& tok, const std::string& text);

/// Load a SentencePiece .model file. Beside a tokenizer_config.json (a Hugging Face folder) it encodes as
/// transformers' LlamaTokenizer: the folder's special and added tokens in a text are their ids, the text
/// between them is encoded piece by piece (the "▁" prefix on each piece; with "legacy": false on the first
/// only), and every space is kept (SentencePiece's remove_extra_whitespaces off). A bare .model file keeps
/// SentencePiece's own encoding (llama2.c's). Throws std::runtime_error naming the file.
std::unique_ptr<tokenizer> load_sentencepiece(const std::string& path);

/// Load a GPT-2 byte-level BPE tokenizer (GPT-2, OPT, RoBERTa-style vocab.json +
/// merges.txt, as transformers' GPT2Tokenizer). Special tokens (bos/eos/pad/unk
/// and added tokens) come from special_tokens_map.json, tokenizer_config.json,
/// added_tokens.json and config.json beside vocab.json; without them BOS = EOS =
/// <|endoftext|> when the vocabulary has it (GPT-2), and no pad. adds_bos() is tokenizer_config.json's
/// add_bos_token (else true for OPT only). decode turns bytes that are not UTF-8 into U+FFFD, as
/// GPT2Tokenizer's errors="replace" does.
/// Throws std::runtime_error naming the file and the problem.
std::unique_ptr<tokenizer> load_gpt2_bpe(const std::string& vocab_json, const std::string& merges_txt);

/// Load a Hugging Face tokenizer.json (the `tokenizers` library's format): a BPE model, byte-level
/// (GPT-2, Llama 3, Qwen2) or with byte fallback (Llama 2, Mistral), with its normalizer,
/// pre-tokenizer (including Split by a regex, run by PCRE2), added/special tokens, decoder and
/// post-processor; docs/rlhf.md "Tokenizers" lists the types read. encode gives the ids of
/// tokenizers' encode(text, add_special_tokens=False); with add_bos, the ids its post-processor
/// (TemplateProcessing) puts before the text, or BOS when it has none; with add_eos, those it puts
/// after, or EOS. adds_bos() is true when the template puts ids before the text (Llama 2/3: BOS;
/// Qwen2: none). decode is tokenizers' decode(ids, skip_special_tokens=False) of the ids less
/// BOS, EOS and pad (invalid UTF-8 becomes U+FFFD, as there). bos/eos/pad come from
/// tokenizer_config.json beside the file (bos_token, eos_token, pad_token); without it, BOS is the
/// template's one leading token, EOS its one trailing token, and there is no pad.
/// Throws std::runtime_error naming the file and the JSON path of anything it does not read
/// (e.g. "tok/tokenizer.json: model.type \"Unigram\" is not supported; supported: BPE ..."),
/// never approximating it. encode throws std::runtime_error naming the file for a character the model
/// cannot spell (not in the vocabulary, and no unk_token or byte_fallback), a normalizer that grows a
/// text past 32 times its size, or a regex that hits PCRE2's match limit. Thread-safe (const).
std::unique_ptr<tokenizer> load_hf_tokenizer(const std::string& tokenizer_json);

/// Load by type: a *.model file → SentencePiece; a vocab.json file (merges.txt
/// beside it) → GPT-2 BPE; a tokenizer.json file → Hugging Face tokenizers; a folder
/// holding tokenizer.json (taken first, as transformers' AutoTokenizer does), tokenizer.model
/// (SentencePiece) or vocab.json + merges.txt (GPT-2 BPE). Throws std::runtime_error with a hint otherwise.
std::unique_ptr<tokenizer> load_tokenizer(const std::string& path);

/// Why `a` and `b` are not the same tokenizer, or "" when they are: the vocabulary size, the
/// BOS/EOS/pad ids, then the first id whose piece differs (every id is compared). For a graph whose
/// nodes must read one another's token ids (the prompt loader, the generator, a rule reward).
std::string tokenizer_difference(const tokenizer& a, const tokenizer& b);

/// Whether folder `dir` holds a tokenizer load_tokenizer reads (tokenizer.json, tokenizer.model,
/// or vocab.json + merges.txt). Does not read the files.
bool folder_has_tokenizer(const std::string& dir);

/// Why folder `dir` cannot take the tokenizer at `path` beside a model (a llama2.c file's tokenizer is
/// the one in its folder): "" when it holds none, or the same one (tokenizer_difference), or is `path`
/// itself; else the difference, or why its files do not load.
std::string other_tokenizer_in(const std::string& dir, const std::string& path);

/// Copy the files of the tokenizer at `src` (what load_tokenizer takes: a SentencePiece
/// .model file, a vocab.json with merges.txt beside it, or a folder) into folder `dst_dir`
/// (created if needed), so that a saved model carries its tokenizer. From a vocab.json or a
/// folder: those of tokenizer_file_names() that exist. A .model file is named tokenizer.model (Hugging Face's
/// name, and what folder_has_tokenizer finds beside a llama2.c file).
/// With `hf_names`, a folder that then holds a tokenizer.model but no tokenizer_config.json
/// gets one (write_sentencepiece_tokenizer_config), so that transformers' AutoTokenizer loads it
/// as LlamaTokenizer (without it, transformers 5 takes a generic tokenizer that adds no BOS).
/// With `hf_names`, the destination is a model folder and holds this tokenizer only: the files of
/// that list that the source lacks are removed from it (an earlier tokenizer's tokenizer.json would
/// otherwise be loaded in place of the new tokenizer.model), unless the source is that folder.
/// Returns the paths written (a file already in place is skipped). Throws
/// std::filesystem::filesystem_error naming the file, std::runtime_error for a bad .model.
std::vector<std::string> copy_tokenizer_files(const std::string& src, const std::string& dst_dir, bool hf_names = true);

/// The names of a tokenizer's files in a model folder, what copy_tokenizer_files copies from a folder:
/// tokenizer.model, vocab.json, merges.txt, special_tokens_map.json, tokenizer_config.json,
/// added_tokens.json, tokenizer.json, chat_template.jinja, chat_template.json.
const std::vector<std::string>& tokenizer_file_names();

/// Remove from model folder `dir` the files copy_tokenizer_files would write there (those that exist);
/// returns their paths. For a folder written again without a tokenizer, where an earlier model's would
/// otherwise be read as this one's. Throws std::filesystem::filesystem_error naming a file it cannot remove.
std::vector<std::string> remove_tokenizer_files(const std::string& dir);

/// Write the tokenizer_config.json of a Hugging Face LLaMA folder for SentencePiece model `model_path`:
/// tokenizer_class "LlamaTokenizer", the model's BOS / EOS / UNK / pad pieces (null for an id the model
/// lacks), add_bos_token (when it has a BOS), add_eos_token false, legacy true (the keys of Meta's LLaMA
/// folders). transformers and load_sentencepiece then encode the folder's text alike (every space kept,
/// special tokens as their ids). Throws
/// std::runtime_error naming the file.
void write_sentencepiece_tokenizer_config(const std::string& model_path, const std::string& out_path);

}  // namespace flowrun
