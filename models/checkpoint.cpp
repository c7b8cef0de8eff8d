#include "models/checkpoint.h"

#include <algorithm>
#include <set>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "models/hf.h"
#include "models/llama2c.h"
#include "models/safetensors.h"
#include "models/tokenizer.h"
#include "runtime/util/assets.h"
#include "runtime/util/writable.h"

namespace flowrun {

namespace {
// What a folder that is not a model is, when it is something else flowrun writes: a ZeRO checkpoint
// (zero_rank's output_dir or a step folder: shard_*.msgpack, or a `latest` file) or a PEFT adapter.
std::string not_a_model_hint(const std::filesystem::path& p) {
  std::error_code ec;
  if (!std::filesystem::is_directory(p, ec)) return "";
  if (std::filesystem::is_regular_file(p / "adapter_config.json", ec))
    return " (it is a LoRA adapter, which goes on top of its base model: `flowrun generate --model BASE --lora " +
           p.string() + "`, or a trainer's lora_pretrained)";
  bool shards = std::filesystem::is_regular_file(p / "latest", ec);
  for (const auto& e : std::filesystem::directory_iterator(p, ec))
    shards |= e.path().extension() == ".msgpack" && e.path().filename().string().rfind("shard_", 0) == 0;
  if (shards)
    return " (it is a ZeRO checkpoint: `flowrun generate --zero_checkpoint " + p.string() +
           "` reads it; zero_rank's export_hf writes the model whole)";
  return "";
}
}  // namespace

namespace fs = std::filesystem;

namespace {

nlohmann::json read_json_file(const fs::path& p) {
  std::ifstream f(p);
  if (!f) throw std::runtime_error(p.string() + ": cannot open");
  auto j = nlohmann::json::parse(f, nullptr, false);
  if (j.is_discarded() || !j.is_object()) throw std::runtime_error(p.string() + ": not a JSON object");
  return j;
}

const char* family_name(model_family f) {
  return f == model_family::llama ? "LLaMA" : f == model_family::opt ? "OPT" : "GPT-2";
}

bool ends_with(const std::string& s, std::string_view suf) {
  return s.size() >= suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0;
}

}  // namespace

std::string_view to_string(model_format f) {
  switch (f) {
    case model_format::llama2c: return "llama2.c file";
    case model_format::flowrun: return "flowrun model folder";
    case model_format::hf: return "Hugging Face folder";
  }
  return "?";
}

model_file_info inspect_model(const std::string& path_in) {
  fs::path p = resolve_user_path(path_in, "model");
  model_file_info info;
  if (fs::is_regular_file(p)) {  // llama2.c: LLaMA, no value head; its header's vocabulary
    const auto cfg = llama2c_config(p.string());
    info.embedding_rows = cfg.vocab_size;
    info.context = cfg.max_seq_len;
    return info;
  }
  if (fs::exists(p / "flowrun_config.json")) {
    auto j = read_json_file(p / "flowrun_config.json");
    info.format = model_format::flowrun;
    const auto cfg = j.at("model").get<model_config>();
    info.family = cfg.family;
    info.embedding_rows = cfg.vocab_size;
    info.context = cfg.max_seq_len;
    info.value_head = j.value("value_head", false);
    return info;
  }
  if (fs::exists(p / "config.json")) {
    info.format = model_format::hf;
    const auto cfg = hf_config_from_json(read_json_file(p / "config.json"), (p / "config.json").string());
    info.family = cfg.family;
    info.embedding_rows = cfg.vocab_size;
    info.context = cfg.max_seq_len;
    return info;
  }
  throw std::runtime_error(p.string() + ": not a model: expected a llama2.c .bin file, a folder with "
                                        "flowrun_config.json, or a Hugging Face folder with config.json" +
                           not_a_model_hint(p));
}

void write_llama2c_generation_config(const std::string& dir, int64_t bos_id, int64_t eos_id, int64_t vocab_limit) {
  nlohmann::json stops = nlohmann::json::array();
  for (int64_t id : {eos_id, bos_id})
    if (id >= 0 && id < vocab_limit && std::find(stops.begin(), stops.end(), id) == stops.end()) stops.push_back(id);
  if (stops.empty()) return;
  nlohmann::json g = {{"eos_token_id", stops}};
  if (bos_id >= 0 && bos_id < vocab_limit) g["bos_token_id"] = bos_id;
  std::string text = g.dump(2);
  text.push_back('\n');
  write_text_atomic((fs::path(dir) / "generation_config.json").string(), text);
}

std::vector<int32_t> stop_ids_for(const std::string& path, int32_t bos_id, int32_t eos_id) {
  std::vector<int32_t> ids;
  auto add = [&](int64_t id) {
    if (id >= 0 && id <= INT32_MAX && std::find(ids.begin(), ids.end(), id) == ids.end())
      ids.push_back(static_cast<int32_t>(id));
  };
  add(eos_id);
  if (inspect_model(path).format != model_format::hf) {
    add(bos_id);
    return ids;
  }
  const fs::path p = resolve_user_path(path, "model");
  for (const char* f : {"generation_config.json", "config.json"}) {
    if (!fs::exists(p / f)) continue;
    const auto j = read_json_file(p / f);
    const auto e = j.find("eos_token_id");
    if (e == j.end() || e->is_null()) continue;
    if (e->is_number_integer()) add(e->get<int64_t>());
    if (e->is_array())
      for (const auto& v : *e)
        if (v.is_number_integer()) add(v.get<int64_t>());
    break;
  }
  return ids;
}

model_format saved_format(model_format given, bool value_head) {
  return given == model_format::llama2c && value_head ? model_format::flowrun : given;
}

std::string save_problem(model_format f, const std::string& path, model_family family, bool value_head) {
  if (path.empty()) return "the output path is empty: give a path";
  if (f == model_format::llama2c) {
    if (family != model_family::llama)
      return std::string("a ") + family_name(family) + " model cannot be written as a llama2.c file (LLaMA only): "
             "give a folder, written as a Hugging Face folder";
    if (value_head)
      return "a model with a value head cannot be written as a llama2.c file (it has no place for v_head): give a "
             "folder (a flowrun model folder)";
    if (path.back() == '/' || fs::is_directory(path))
      return "'" + path + "' is a folder, but a llama2.c model is one file: give a file path such as out/actor.bin";
  } else {
    if (ends_with(path, ".bin"))
      return "'" + path + "' names a .bin file, but a " + std::string(to_string(f)) +
             " is a folder: give a folder path such as out/actor" +
             (f == model_format::hf && family == model_family::llama
                  ? " (a llama2.c file can be made from it afterwards: flowrun convert --from hf DIR --to llama2c FILE)"
                  : "");
    if (fs::exists(path) && !fs::is_directory(path))
      return "'" + path + "' is an existing file, but the model is written as a " + std::string(to_string(f)) +
             ": give a folder path, or remove the file";
  }
  // the nearest existing folder above the path must take a new file: the save creates the rest
  if (auto why = unwritable_reason(path, f == model_format::llama2c ? output_kind::file : output_kind::folder); !why.empty())
    return why + ": give a path in a writable folder";
  return "";
}

bool copy_generation_config(const std::string& source, const std::string& dir) {
  std::error_code ec;
  const fs::path from = fs::path(source) / "generation_config.json";
  if (!fs::exists(from, ec) || (fs::exists(dir, ec) && fs::equivalent(source, dir, ec))) return false;
  std::ifstream in(from, std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  write_text_atomic((fs::path(dir) / "generation_config.json").string(), text);
  return true;
}

void save_model(const decoder& model, const std::string& path, model_format f, const std::string& tokenizer,
                const std::string& source) {
  if (auto why = save_problem(f, path, model.config().family, model.has_value_head()); !why.empty())
    throw std::runtime_error("cannot save the model to " + path + ": " + why);
  switch (f) {
    case model_format::flowrun:
      save_model_dir(model, path);
      return;
    case model_format::llama2c: {
      decoder m = merged_copy(model);
      if (m.config().rope != ops::rope_layout::adjacent) m = to_adjacent_rope(m);
      fs::path parent = fs::absolute(path).parent_path();
      fs::create_directories(parent);
      // version 0, the layout of the stories models and the one llama2.c's run.c reads (it reads no
      // version header): a trainer's output from stories260K.bin runs in run.c as its input did
      save_llama2c(m, path, 0);
      // a model folder's tokenizer (a llama2.c file convert wrote beside one, an HF tokenizer) goes beside the
      // file, where generate and the trainers look for it (tok512 read a 902-token model's text); not over
      // another tokenizer there (a folder of other models' files): then the model alone, said
      std::error_code ec;
      if (!tokenizer.empty() && fs::is_directory(tokenizer, ec) && folder_has_tokenizer(tokenizer)) {
        const std::string other = other_tokenizer_in(parent.string(), tokenizer);
        if (other.empty()) copy_tokenizer_files(tokenizer, parent.string(), /*hf_names=*/false);
        else
          std::fprintf(stderr,
                       "flowrun: warning: %s holds another tokenizer (%s): %s is saved without %s beside it; give it "
                       "--tokenizer %s when you read it\n",
                       parent.c_str(), other.c_str(), path.c_str(), tokenizer.c_str(), tokenizer.c_str());
      }
      return;
    }
    case model_format::hf: {
      nlohmann::json extra = nlohmann::json::object();
      std::unique_ptr<flowrun::tokenizer> tok;
      if (!tokenizer.empty()) {
        tok = load_tokenizer(tokenizer);
        const int64_t real = model.config().vocab_limit();
        if (tok->bos_id() >= 0 && tok->bos_id() < real) extra["bos_token_id"] = tok->bos_id();
        if (tok->eos_id() >= 0 && tok->eos_id() < real) extra["eos_token_id"] = tok->eos_id();
        if (tok->pad_id() >= 0 && tok->pad_id() < real) extra["pad_token_id"] = tok->pad_id();
      }
      std::error_code ec;
      const fs::path src = !source.empty() ? fs::path(source) : tok ? fs::path(tokenizer) : fs::path();
      const bool from_hf = !src.empty() && fs::is_directory(src, ec) && fs::exists(src / "config.json", ec);
      if (from_hf) {  // the source's own token ids, as save_pretrained keeps them (the tokenizer's filled the rest)
        const nlohmann::json keys = hf_token_keys(src.string());
        for (const auto& [k, v] : keys.items()) extra[k] = v;
      }
      save_hf(merged_copy(model), path, dtype::f32, 0, extra);
      if (tok) copy_tokenizer_files(tokenizer, path, /*hf_names=*/true);
      if (from_hf) {
        // the source's stop ids and sampling defaults, when it has them; else none: an earlier model's left in the
        // folder would sample and stop as that model (flowrun convert removes it alike)
        const fs::path gc = fs::path(path) / "generation_config.json";
        if (!copy_generation_config(src.string(), path) && !fs::equivalent(src, fs::path(path), ec) &&
            fs::remove(gc, ec))
          std::fprintf(stderr, "flowrun: warning: removed %s, an earlier model's: %s has none\n", gc.c_str(),
                       src.c_str());
      } else if (tok || (!src.empty() && inspect_model(src.string()).format != model_format::hf)) {
        // a llama2.c model (a .bin or a flowrun folder): without a tokenizer, llama2.c's own ids
        write_llama2c_generation_config(path, tok ? tok->bos_id() : 1, tok ? tok->eos_id() : 2,
                                        model.config().vocab_limit());
      }
      return;
    }
  }
}

nlohmann::json hf_token_keys(const std::string& hf_dir) {
  nlohmann::json out = nlohmann::json::object();
  std::ifstream f(fs::path(hf_dir) / "config.json");
  if (!f) return out;
  auto j = nlohmann::json::parse(f, nullptr, false);
  if (!j.is_object()) return out;
  for (const char* k : {"bos_token_id", "eos_token_id", "pad_token_id"})
    if (j.contains(k) && !j[k].is_null()) out[k] = j[k];  // null: none (transformers' default), as the source says
  return out;
}

double reload_max_diff(const decoder& model_in, const std::string& path) {
  auto& model = const_cast<decoder&>(model_in);  // forward needs a non-const model; weights are not changed
  decoder back = load_model(path);
  const auto& c = model.config();
  const int64_t B = 2, T = std::max<int64_t>(1, std::min<int64_t>(8, c.max_seq_len));
  const int64_t V = c.vocab_limit();
  std::vector<int32_t> ids(static_cast<size_t>(B * T));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((i * 37 + 11) % static_cast<size_t>(V));
  const tensor x = tensor::from_ints({B, T}, ids);
  auto out = [&](decoder& m) {
    activations a;
    m.forward(a, x, tensor{});
    return (m.has_value_head() ? a.values : a.logits).to(device::cpu()).to_floats();
  };
  auto want = out(model), got = out(back);
  if (want.size() != got.size())
    throw std::runtime_error(path + ": the reloaded model's outputs have " + std::to_string(got.size()) +
                             " values, the saved model's " + std::to_string(want.size()));
  double d = 0;
  for (size_t i = 0; i < want.size(); ++i) d = std::max(d, std::fabs(static_cast<double>(want[i]) - got[i]));
  return d;
}

void save_model_dir(const decoder& model_in, const std::string& dir) {
  auto& model = const_cast<decoder&>(model_in);
  const bool merged = model.lora_merged();
  if (merged) model.unmerge_lora();  // the file holds base and adapter apart
  fs::create_directories(dir);
  nlohmann::json j;
  j["model"] = model.config();
  j["value_head"] = model.has_value_head();
  j["lora"] = model.has_lora() ? nlohmann::json{{"lora_r", model.lora().lora_r},
                                               {"lora_alpha", model.lora().lora_alpha},
                                               {"lora_dropout", model.lora().lora_dropout},
                                               {"target_modules", model.lora().target_modules}}
                               : nlohmann::json(nullptr);
  named_tensors ts;
  for (auto& e : model.params()) ts.emplace_back(e.name, model.w().by_name.at(e.name));
  for (auto& e : model.adapter_params()) ts.emplace_back(e.name, model.w().by_name.at(e.name));
  save_safetensors((fs::path(dir) / "model.safetensors").string(), ts);
  write_text_atomic((fs::path(dir) / "flowrun_config.json").string(), j.dump(2));
  if (merged) model.merge_lora();
}

decoder merged_copy(const decoder& model) {
  decoder out = clone_decoder(model, device::cpu());
  if (!model.has_lora() || model.lora_merged()) return out;  // merged: the base weights hold the adapters
  out.enable_lora(model.lora(), /*freeze_base=*/false);
  for (const auto& e : model.adapter_params())
    if (e.name != "v_head.weight") out.w().by_name.at(e.name).copy_from(model.w().by_name.at(e.name).to(device::cpu()));
  out.merge_lora();
  return clone_decoder(out, device::cpu());
}

bool is_model_file(const std::string& f) {
  static const std::set<std::string> names = [] {
    std::set<std::string> n = {"config.json", "flowrun_config.json", "model.safetensors.index.json"};
    n.insert(tokenizer_file_names().begin(), tokenizer_file_names().end());
    return n;
  }();
  return names.count(f) > 0 || (f.size() > 12 && f.compare(f.size() - 12, 12, ".safetensors") == 0);
}

decoder load_model(const std::string& path_in) {
  fs::path p = resolve_user_path(path_in, "model");
  if (fs::is_regular_file(p)) {
    // a file of a model folder (model.safetensors, config.json, a shard): the folder is the model
    const auto ext = p.extension().string();
    if (ext == ".safetensors" || ext == ".json")
      throw std::runtime_error(p.string() + " is one file of a model folder: give the folder, " +
                               p.parent_path().string());
    return load_llama2c(p.string());
  }
  if (fs::exists(p / "flowrun_config.json")) {
    std::ifstream f(p / "flowrun_config.json");
    auto j = nlohmann::json::parse(f);
    decoder m(j.at("model").get<model_config>());
    if (j.value("value_head", false)) m.add_value_head();
    if (!j["lora"].is_null()) {
      lora_config lc;
      lc.lora_r = j["lora"]["lora_r"];
      lc.lora_alpha = j["lora"]["lora_alpha"];
      lc.lora_dropout = j["lora"]["lora_dropout"];
      lc.target_modules = j["lora"]["target_modules"].get<std::vector<std::string>>();
      m.enable_lora(lc);
    }
    auto tensors = load_safetensors((p / "model.safetensors").string());
    for (auto& [name, t] : m.w().by_name) {
      auto it = tensors.find(name);
      if (it == tensors.end())
        throw std::runtime_error((p / "model.safetensors").string() + ": tensor '" + name + "' is missing");
      if (it->second.shape() != t.shape())
        throw std::runtime_error((p / "model.safetensors").string() + ": tensor '" + name + "' has shape " +
                                 shape_str(it->second.shape()) + ", the config needs " + shape_str(t.shape()));
      t.copy_from(it->second);
    }
    return m;
  }
  if (fs::exists(p / "config.json")) return load_hf(p.string());
  throw std::runtime_error(p.string() + ": not a model: expected a llama2.c .bin file, a folder with "
                                        "flowrun_config.json, or a Hugging Face folder with config.json" +
                           not_a_model_hint(p));
}

}  // namespace flowrun
