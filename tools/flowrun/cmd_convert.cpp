// `flowrun convert`: weights between llama2.c files and Hugging Face folders, a ZeRO checkpoint as a model or a
// LoRA adapter, a LoRA adapter merged into its base.
//
//   flowrun convert --from llama2c stories260K.bin --to hf out/stories260K-hf --tokenizer tok512.model
//   flowrun convert --from hf out/stories260K-hf --to llama2c out/stories260K.bin
//   flowrun convert --from hf opt-125m --to hf opt-125m-bf16 --dtype bf16 --max_shard_bytes 500000000
//   flowrun convert --from hf base --lora out/adapter --to hf out/merged         (PEFT's merge_and_unload)
//   flowrun convert --from zero out/pretrain --to hf out/pretrain-step-hf        (DeepSpeed's zero_to_fp32.py)
//
// A ZeRO checkpoint (zero_rank's output_dir or a step folder; a run stopped half way, which wrote no
// export_hf) is consolidated from its shards, or for a LoRA run merged into the run's base
// (tools/flowrun/zero_source.h), and written as that run's export_hf would: with the tokenizer the run
// trained on (its data node's) and an HF base's token ids and generation_config.json.
//
// LLaMA RoPE layouts are converted on the way (llama2.c pairs adjacent channels,
// HF rotates halves; models/hf.h, to_half_rope), so the logits stay the same.
//
// Reading and writing either format shows a progress line on a terminal (tools/flowrun/progress_line.h,
// fed by the per-tensor report of load_hf, save_hf, load_llama2c and save_llama2c): "[flowrun convert] save tensors 12/291, 1.2 GB of 4.5 GB
// ETA 0:12", the ETA by bytes; each ends with a log line of the time taken.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "models/adapter.h"
#include "models/checkpoint.h"
#include "models/hf.h"
#include "models/llama2c.h"
#include "models/tokenizer.h"
#include "models/train/shard_checkpoint.h"
#include "runtime/util/assets.h"
#include "runtime/util/same_path.h"
#include "tools/flowrun/commands.h"
#include "tools/flowrun/progress_line.h"
#include "tools/flowrun/zero_source.h"

namespace flowrun::cli {

namespace fs = std::filesystem;

namespace {

struct convert_opts {
  std::vector<std::string> from, to;
  std::string dtype_name = "f32";
  std::string tokenizer;
  int64_t max_shard_bytes = 0;
  int llama2c_version = 0;  // the layout llama2.c's run.c reads, as the trainers write
  std::string lora;  // a PEFT adapter merged into the llama2c / hf source
  std::string base;  // --from zero: the run's base model, when it moved
};

dtype parse_dtype(const std::string& s) {
  if (s == "f32" || s == "float32") return dtype::f32;
  if (s == "bf16" || s == "bfloat16") return dtype::bf16;
  if (s == "f16" || s == "float16") return dtype::f16;
  throw std::runtime_error("--dtype " + s + ": use f32, bf16 or f16");
}

// Copy the tokenizer at `src` into `dst_dir` (models/tokenizer.h), logging each file.
void copy_tokenizer(const fs::path& src, const fs::path& dst_dir, bool hf_names) {
  for (const auto& f : copy_tokenizer_files(src.string(), dst_dir.string(), hf_names))
    spdlog::info("tokenizer: -> {}", f);
}

// The keys that keep an HF reward model of TRL's layout (a *ForSequenceClassification: score.weight, no LM head)
// one when written again: its architectures, labels and tie_word_embeddings as the source says (load_hf ties a
// head-less model's embedding in, and the folder read back as a CausalLM whose v_head.weight transformers dropped,
// its score head initialised at random). None for any other folder.
nlohmann::json sequence_classification_keys(const fs::path& hf_dir) {
  nlohmann::json out = nlohmann::json::object();
  std::ifstream f(hf_dir / "config.json");
  auto j = nlohmann::json::parse(f, nullptr, false);
  if (!is_sequence_classification(j)) return out;
  out["architectures"] = j["architectures"];
  for (const char* k : {"id2label", "label2id", "num_labels", "problem_type"})
    if (j.contains(k)) out[k] = j[k];
  out["tie_word_embeddings"] = hf_config_from_json(j, (hf_dir / "config.json").string()).tied_embeddings;
  return out;
}

// load_hf's / save_hf's / load_llama2c's / save_llama2c's per-tensor report on `line`: tensors k/N and bytes, the ETA by bytes.
tensor_progress_fn on_line(progress_line& line) {
  return [&line](const tensor_progress& p) {
    line.update(p.bytes_done, p.bytes_total,
                fmt::format("tensors {}/{}, {} of {}", p.tensors_done, p.tensors_total, byte_size_text(p.bytes_done),
                            byte_size_text(p.bytes_total)));
  };
}

// --from zero: a checkpoint of the one training engine as the model the run holds (zero_source.h), with what
// the written folder takes beside the weights, as the run's export would: the run's base (an HF folder's token
// ids, generation_config.json and tokenizer; a llama2.c file's stop convention) and the tokenizer the run trained with
struct zero_source {
  decoder model;
  std::string like_fmt, like_path;  // the format and path the folder's extras come from, as the run's `model`
  nlohmann::json token_keys = nlohmann::json::object();
  std::string tokenizer;  // the run's ("" when --tokenizer was given, or none is found: said)
};

// Never write into the checkpoint being read: its step folders, `latest`, the records beside them, or anything
// else under it (a DS-Chat step that finishes removes its CHECKPOINT_DIR/NODE, whatever it holds).
void refuse_inside_checkpoint(const std::string& folder, const std::string& to_path) {
  const fs::path root = fs::weakly_canonical(fs::exists(fs::path(folder) / "latest") ? fs::path(folder)
                                                                                    : fs::path(folder).parent_path());
  const fs::path to = fs::weakly_canonical(fs::absolute(to_path));
  const auto rel = to.lexically_relative(root);
  if (to == root || (!rel.empty() && *rel.begin() != ".."))
    throw std::runtime_error("convert: --to " + to_path + " is in the checkpoint folder " + root.string() +
                             " it reads (a trainer removes it when its step finishes): write the model elsewhere");
}

zero_source read_zero_source(const convert_opts& o) {
  zero_source z;
  const std::string folder = zero_step_folder(o.from[1], "--from zero");
  const auto ck = load_checkpoint(folder);
  refuse_inside_checkpoint(folder, o.to[1]);
  std::error_code ec;
  z.model = zero_checkpoint_model(ck, o.base, "--base");
  spdlog::info("read ZeRO checkpoint {} (step {}, {} shard(s))", folder, ck.step, ck.world_size);
  // the run's base: an HF folder's token ids, generation_config.json and tokenizer go with the model (as its
  // export_hf writes them), so it must be there, as it was; a llama2.c file gives only its stop convention
  const std::string recorded = zero_run_model(ck);
  const bool folder_base = !recorded.empty() && fs::path(recorded).extension() != ".bin";
  z.like_path = !o.base.empty() || folder_base || ck.full.count("base") == 0 ? zero_run_base(ck, o.base, "--base")
                                                                          : recorded;
  const bool hf_base =
      !z.like_path.empty() && fs::exists(z.like_path, ec) && inspect_model(z.like_path).format == model_format::hf;
  z.like_fmt = hf_base ? "hf" : "llama2c";
  if (z.like_fmt == "hf") z.token_keys = hf_token_keys(z.like_path);
  if (fs::exists(o.to[1], ec) && !z.like_path.empty() && fs::equivalent(o.to[1], z.like_path, ec))
    throw std::runtime_error("convert: --to " + o.to[1] + " is the run's base model: write the consolidated model "
                             "elsewhere (the base stays what the run started from)");
  if (o.tokenizer.empty()) {
    z.tokenizer = zero_run_tokenizer(ck, o.from[1]);
    if (!z.tokenizer.empty())
      spdlog::info("tokenizer: {}, the run's (--tokenizer for another)", z.tokenizer);
    else if (!(z.like_fmt == "hf" && folder_has_tokenizer(z.like_path)))
      spdlog::warn("{}: the tokenizer the run trained with is not found (no record beside the checkpoint names a file "
                   "that exists): {} gets no tokenizer files; give the run's with --tokenizer",
                   folder, o.to[1]);
  }
  return z;
}

// --from zero DIR --to lora OUT: a LoRA run's adapter as PEFT's folder (the save_lora a stopped run did not write).
void write_lora_adapter(const convert_opts& o) {
  if (o.from[0] != "zero")
    throw std::runtime_error("convert: --to lora writes the adapter of a LoRA run's ZeRO checkpoint: --from zero DIR");
  const std::string folder = zero_step_folder(o.from[1], "--from zero");
  refuse_inside_checkpoint(folder, o.to[1]);
  const auto ck = load_checkpoint(folder);
  const decoder m = zero_checkpoint_adapter(ck);
  // PEFT's AutoPeftModelForCausalLM loads the base its config names: an HF folder's (as save_lora writes it), when
  // it is there as the run had it
  std::string base;
  try {
    base = zero_run_base(ck, o.base, "--base");
  } catch (const std::invalid_argument& e) {
    if (!o.base.empty()) throw;
    spdlog::warn("{}; the adapter's config names no base", e.what());
  }
  std::error_code ec;
  save_adapter(m, o.to[1], !base.empty() && fs::exists(base, ec) && inspect_model(base).format == model_format::hf ? base : "");
  spdlog::info("wrote the LoRA adapter of {} (step {}) -> {} (PEFT's adapter_config.json + adapter_model.safetensors)",
               folder, ck.step, o.to[1]);
}

void run_convert(const convert_opts& o) {
  if (o.from.size() != 2 || o.to.size() != 2)
    throw std::runtime_error("convert: give --from FORMAT PATH and --to FORMAT PATH");
  const std::string &src_fmt = o.from[0], &dst_fmt = o.to[0];
  const dtype on_disk = parse_dtype(o.dtype_name);
  decoder model;
  nlohmann::json extra = nlohmann::json::object();
  // what the written folder takes its tokenizer, token ids and stop convention from: the source, or for a ZeRO
  // checkpoint the model its run started from (as its export_hf), with the tokenizer the run trained on
  std::string like_fmt = src_fmt, like_path = o.from[1], tokenizer_opt = o.tokenizer;
  if (!o.base.empty() && src_fmt != "zero")
    throw std::runtime_error("convert: --base names the base of a LoRA run's ZeRO checkpoint (--from zero): drop it");
  if (!o.lora.empty() && src_fmt == "zero")
    throw std::runtime_error("convert: --lora goes with --from llama2c or hf; a LoRA run's ZeRO checkpoint holds its "
                             "adapter, which --from zero merges");
  // a model written over its own source: the file or folder it reads is replaced while the conversion may lose
  // what it held (--dtype bf16 over an fp32 folder dropped its fp32 weights without a word)
  const auto source_at = [&]() -> std::string {
    try {
      return resolve_user_path(o.from[1], "source").string();
    } catch (const std::exception&) {  // not found: the load names it
      return "";
    }
  };
  if (dst_fmt != "lora" && same_path(source_at(), o.to[1]))
    throw std::runtime_error("convert: --to " + dst_fmt + " " + o.to[1] + " is the source itself: the conversion "
                             "would replace the model it reads; give another path (and move it over the source "
                             "afterwards if that is the aim)");
  // ... or the adapter it merges: the merged model beside adapter_config.json is loaded by transformers as a base
  // with that adapter, which it then applies twice
  if (!o.lora.empty() && same_path(o.lora, o.to[1]))
    throw std::runtime_error("convert: --to " + dst_fmt + " " + o.to[1] + " is the --lora adapter's folder: the merged "
                             "model beside adapter_config.json would have the adapter applied again by transformers; "
                             "give another path");
  if (dst_fmt == "lora") return write_lora_adapter(o);
  if (src_fmt == "zero") {
    zero_source z = read_zero_source(o);
    model = std::move(z.model);
    like_fmt = z.like_fmt;
    like_path = z.like_path;
    extra = z.token_keys;
    if (tokenizer_opt.empty()) tokenizer_opt = z.tokenizer;
  } else if ((src_fmt == "llama2c" || src_fmt == "hf") && is_checkpoint(o.from[1])) {
    throw std::runtime_error("convert: --from " + src_fmt + " " + o.from[1] + " is a ZeRO checkpoint: --from zero " +
                             o.from[1]);
  } else if (src_fmt == "llama2c" && fs::is_directory(o.from[1])) {
    throw std::runtime_error("convert: --from llama2c " + o.from[1] + " is a folder: --from hf for a Hugging Face "
                             "folder (a llama2.c model is one .bin file)");
  } else if (src_fmt == "llama2c") {
    progress_line line("flowrun convert", "load");
    model = load_llama2c(resolve_user_path(o.from[1], "llama2.c model").string(), device::cpu(), on_line(line));
    line.clear();
    spdlog::info("read {} in {:.1f} s", o.from[1], line.seconds());
  } else if (src_fmt == "hf") {
    progress_line line("flowrun convert", "load");
    model = load_hf(o.from[1], device::cpu(), on_line(line));
    line.clear();
    spdlog::info("read {} in {:.1f} s", o.from[1], line.seconds());
    extra = hf_token_keys(o.from[1]);
    extra.update(sequence_classification_keys(o.from[1]));
  } else {
    throw std::runtime_error("convert: --from " + src_fmt + ": use llama2c, hf or zero");
  }
  if (std::error_code ec; !o.lora.empty() && fs::exists(o.to[1], ec) && fs::equivalent(o.from[1], o.to[1], ec))
    throw std::runtime_error("convert: --lora: --to " + o.to[1] + " is the base model --from reads: write the merged "
                             "model elsewhere (the base stays what the adapter was trained on)");
  if (!o.lora.empty()) {  // PEFT's merge_and_unload: W + (lora_alpha / r) B A, the adapter's tensors gone
    try {
      load_adapter(model, resolve_user_path(o.lora, "lora").string(), /*freeze_base=*/false);
    } catch (const std::runtime_error& e) {
      throw std::runtime_error("convert: --lora " + o.lora + " on " + o.from[1] + ": " + e.what());
    }
    if (model.has_value_head())
      throw std::runtime_error("convert: --lora " + o.lora + " holds a value head (a reward or critic adapter): the "
                               "formats written here hold a language model's head only");
    model = merged_copy(model);  // the base's tensors alone, as save_pretrained of PEFT's merge_and_unload writes
    spdlog::info("LoRA adapter {} merged", o.lora);
  }
  spdlog::info("model: {}", model.config().summary());

  std::unique_ptr<tokenizer> tok;
  fs::path tok_path;
  // an HF folder's own tokenizer goes with its weights, as save_pretrained's folder keeps it (it was
  // dropped unless --tokenizer named it); --tokenizer chooses another
  // and a llama2.c file's is the one in its folder (convert --to llama2c writes it there; generate reads it:
  // converting such a file back to HF dropped it, and wrote llama2.c's BOS 1 / EOS 2 whatever it was)
  // (or the one SentencePiece .model file there, as llama2.c's own folders keep it: stories260K.bin beside
  // tok512.model was written without a tokenizer, and transformers could not read the folder's text)
  std::string beside;
  if (tokenizer_opt.empty() && like_fmt == "llama2c" && !like_path.empty()) {
    const auto dir = resolve_user_path(like_path, "model").parent_path();
    if (folder_has_tokenizer(dir.string())) {
      beside = dir.string();
    } else if (src_fmt == "llama2c") {  // (a checkpoint's run names its own tokenizer: zero_run_tokenizer)
      std::vector<fs::path> sp;
      std::error_code ec;
      for (const auto& e : fs::directory_iterator(dir, ec))
        if (e.is_regular_file(ec) && e.path().extension() == ".model") sp.push_back(e.path());
      std::sort(sp.begin(), sp.end());
      if (sp.size() == 1) {  // taken as the file's own: one that does not fit is said and not copied
        beside = sp[0].string();
      } else if (dst_fmt == "hf") {
        spdlog::warn("no tokenizer beside {} ({}): the folder gets none (transformers cannot read its text); give "
                     "the model's with --tokenizer",
                     like_path, sp.empty() ? "no tokenizer.model nor other .model file" : fmt::format("{} .model files: which one?", sp.size()));
      }
    }
  }
  const bool own = tokenizer_opt.empty() && ((like_fmt == "hf" && folder_has_tokenizer(like_path)) || !beside.empty());
  if (!tokenizer_opt.empty() || own) {
    tok_path = !beside.empty() ? fs::path(beside) : own ? fs::path(like_path) : resolve_user_path(tokenizer_opt, "tokenizer");
    if (!beside.empty())
      spdlog::info("tokenizer: {}, beside the llama2.c file{} (--tokenizer for another)", beside,
                   fs::is_regular_file(beside) ? ", the one SentencePiece file there" : "");
    else if (own) spdlog::info("tokenizer: {}'s own (--tokenizer for another)", like_path);
    tok = load_tokenizer(tok_path.string());
    if (own && tok->vocab_size() > model.config().vocab_size) {  // the source's own mismatch: said, not copied
      spdlog::warn("{}: its tokenizer{} has {} tokens and its embedding {} rows: the tokenizer is not copied "
                   "(--tokenizer to give the model's)",
                   like_path, beside.empty() ? "" : " " + beside, tok->vocab_size(), model.config().vocab_size);
      tok.reset();
    } else if (tok->vocab_size() > model.config().vocab_size)
      throw std::runtime_error(tok_path.string() + ": the tokenizer has " + std::to_string(tok->vocab_size()) +
                               " tokens but the model's embedding only " +
                               std::to_string(model.config().vocab_size) + " rows");
  }

  const std::string& dst = o.to[1];
  if (dst_fmt == "hf") {
    if (tok) {
      // record the tokenizer's real size (the embedding may be padded)
      model_config c = model.config();
      // (an HF folder's own: its config.json stays as it was)
      if ((!own || !beside.empty()) && c.real_vocab_size != tok->vocab_size()) {
        c.real_vocab_size = tok->vocab_size();
        decoder m2(c);
        m2.w().flat.copy_from(model.w().flat);
        model = std::move(m2);
      }
      if (!extra.contains("bos_token_id") && tok->bos_id() >= 0) extra["bos_token_id"] = tok->bos_id();
      if (!extra.contains("eos_token_id") && tok->eos_id() >= 0) extra["eos_token_id"] = tok->eos_id();
      if (!extra.contains("pad_token_id") && tok->pad_id() >= 0) extra["pad_token_id"] = tok->pad_id();
    }
    progress_line line("flowrun convert", "save");
    save_hf(model, dst, on_disk, o.max_shard_bytes, extra, on_line(line));
    line.clear();
    if (tok) copy_tokenizer(tok_path, dst, /*hf_names=*/true);
    if (like_fmt == "llama2c")  // a new BOS ends a text, as in run.c: the folder stops where the file did
      write_llama2c_generation_config(dst, tok ? tok->bos_id() : 1, tok ? tok->eos_id() : 2,
                                      model.config().vocab_limit());
    // from an HF folder: its stop ids and sampling defaults stay (config.json's ids came with `extra`); a folder
    // written over keeps nothing of the model before (its generation_config.json and tokenizer were read as this one's)
    const bool in_place = like_fmt == "hf" && fs::equivalent(fs::path(like_path), fs::path(dst));
    const fs::path dst_gc = fs::path(dst) / "generation_config.json";
    if (like_fmt == "hf" && copy_generation_config(like_path, dst))
      spdlog::info("generation_config.json: -> {}", dst_gc.string());
    else if (like_fmt == "hf" && !in_place && fs::remove(dst_gc))
      spdlog::warn("removed {}, an earlier model's: {} has none", dst_gc.string(), like_path);
    if (!tok && !in_place)
      if (const auto gone = remove_tokenizer_files(dst); !gone.empty())
        spdlog::warn("removed the tokenizer an earlier model left in {} ({}): this model comes without one (--tokenizer "
                     "to give it one)",
                     dst, fmt::join(gone, ", "));
    spdlog::info("wrote HF folder {} ({}) in {:.1f} s", dst, dtype_name(on_disk), line.seconds());
  } else if (dst_fmt == "llama2c") {
    if (on_disk != dtype::f32) throw std::runtime_error("convert: llama2.c files hold f32 weights only; drop --dtype");
    if (o.max_shard_bytes > 0) throw std::runtime_error("convert: llama2.c files are not sharded; drop --max_shard_bytes");
    const auto& c = model.config();
    if (c.family != model_family::llama)
      throw std::runtime_error("convert: only LLaMA models can be written as llama2.c, not " + c.summary());
    if (model.has_value_head())  // the file held its embedding as an LM head: generate told stories with a reward model
      throw std::runtime_error("convert: " + o.from[1] + " is a reward or value model (a value head, no LM head): a "
                               "llama2.c file holds a language model; --to hf keeps it as it is");
    fs::path parent = fs::absolute(dst).parent_path();
    // a llama2.c file's tokenizer is the one in its folder (generate, chat and eval read it): another model's
    // there would read this one's text, and this one's copied over it broke that model (its
    // tokenizer_config.json replaced beside its tokenizer.json), so a folder holding another tokenizer is
    // refused before anything is written
    if (tok) {
      if (const std::string why = other_tokenizer_in(parent.string(), tok_path.string()); !why.empty())
        throw std::runtime_error("convert: " + parent.string() + " already holds another model's tokenizer (" + why +
                                 " against " + tok_path.string() + "): a llama2.c file's tokenizer is the one in its "
                                 "folder, so write " + dst + " into a folder of its own");
    }
    decoder adj = to_adjacent_rope(model);
    fs::create_directories(parent);
    progress_line line("flowrun convert", "save");
    save_llama2c(adj, dst, o.llama2c_version, on_line(line));
    line.clear();
    if (tok) copy_tokenizer(tok_path, parent, /*hf_names=*/false);
    spdlog::info("wrote llama2.c v{} file {} in {:.1f} s", o.llama2c_version, dst, line.seconds());
  } else {
    throw std::runtime_error("convert: --to " + dst_fmt + ": use hf, llama2c or lora");
  }
}

}  // namespace

void add_convert(CLI::App& app) {
  auto o = std::make_shared<convert_opts>();
  auto* sub = app.add_subcommand("convert", "Convert weights between llama2.c files and Hugging Face folders; a ZeRO "
                                                "checkpoint as a model or LoRA adapter; a LoRA adapter merged");
  sub->add_option("--from", o->from, "Source: FORMAT PATH, FORMAT llama2c (a .bin file), hf (a folder) or zero (a ZeRO checkpoint: zero_rank's "
                  "output_dir or a step folder, consolidated)")
      ->expected(2)
      ->required();
  sub->add_option("--to", o->to, "Destination: FORMAT PATH, FORMAT hf (a folder), llama2c (a .bin file) or lora (a LoRA run's adapter from --from "
                  "zero, as PEFT's adapter folder: what save_lora writes)")
      ->expected(2)
      ->required();
  sub->add_option("--dtype", o->dtype_name, "Weights on disk for hf: f32, bf16 or f16")->capture_default_str();
  sub->add_option("--tokenizer", o->tokenizer,
                  "Tokenizer to copy alongside (SentencePiece .model, vocab.json, or a folder); for hf its size is "
                  "recorded as flowrun_real_vocab_size. Default from an hf folder: the folder's own tokenizer");
  sub->add_option("--max_shard_bytes", o->max_shard_bytes, "hf: shard model.safetensors above this size (0 = one file)")
      ->capture_default_str();
  sub->add_option("--lora", o->lora,
                  "A PEFT LoRA adapter folder merged into the llama2c / hf source before writing (PEFT's "
                  "merge_and_unload; zero_rank's save_lora, a trainer's LoRA output)");
  sub->add_option("--base", o->base,
                  "--from zero: the run's base model, when it moved (checked by its bytes): a LoRA run's base, or a "
                  "full run's HF base (its token ids, generation_config.json and tokenizer go with the model)");
  sub->add_option("--llama2c_version", o->llama2c_version, "llama2c: file version 0 (legacy: what llama2.c's run.c reads) or 1 (export.py's version1_export)")
      ->capture_default_str();
  sub->callback([o] { run_convert(*o); });
}

}  // namespace flowrun::cli
