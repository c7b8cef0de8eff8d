#include "models/adapter.h"

#include <cmath>
#include <cstdint>

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <string>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <stdexcept>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "models/hf.h"
#include "models/safetensors.h"

namespace flowrun {

namespace fs = std::filesystem;

namespace {
const std::string k_prefix = "base_model.model.";

bool ends_with(const std::string& s, const std::string& suf) {
  return s.size() >= suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0;
}

// PEFT adapters pair with HF checkpoints, whose LLaMA q_proj/k_proj rows are in the
// half (rotate_half) RoPE layout. A model in llama2.c's adjacent layout holds those
// rows permuted (save_hf permutes them back, see models/hf.h to_half_rope), so the
// rows of lora_B (out, r) of q_proj and k_proj are permuted the same way on save,
// and back on load: within each head of hs rows, row 2i+j (adjacent) <-> j*hs/2+i (half).
// Returns the number of heads of `name`'s rows when it needs this, else 0.
int64_t rope_rows_heads(const model_config& c, const std::string& name) {
  if (c.family != model_family::llama || !c.use_rope || c.rope != ops::rope_layout::adjacent) return 0;
  if (ends_with(name, "self_attn.q_proj.lora_B.weight")) return c.n_heads;
  if (ends_with(name, "self_attn.k_proj.lora_B.weight")) return c.n_kv_heads;
  return 0;
}

tensor permute_rope_rows(const tensor& t, int64_t n_heads, int64_t hs, bool to_half) {
  auto host = t.to(device::cpu()).clone();
  permute_heads(host.data<float>(), n_heads, hs, host.numel() / (n_heads * hs), to_half);
  return host;
}
}  // namespace

namespace {
// Our module path (decoder.cpp module_path, or the fused k_fused_qkv_path) -> the family's HF module path
// under its layer prefix, as PEFT names the adapted module. Empty: the family has no such module in HF.
std::string hf_module(model_family f, const std::string& path) {
  if (f == model_family::opt) {  // modeling_opt.py OPTDecoderLayer
    if (path == "self_attn.q_proj" || path == "self_attn.k_proj" || path == "self_attn.v_proj") return path;
    if (path == "self_attn.o_proj") return "self_attn.out_proj";
    if (path == "mlp.up_proj") return "fc1";
    if (path == "mlp.down_proj") return "fc2";
    return "";
  }
  if (f == model_family::gpt2) {  // modeling_gpt2.py GPT2Block: Conv1D c_attn (q, k, v), c_proj, c_fc, c_proj
    if (path == k_fused_qkv_path) return "attn.c_attn";
    if (path == "self_attn.o_proj") return "attn.c_proj";
    if (path == "mlp.up_proj") return "mlp.c_fc";
    if (path == "mlp.down_proj") return "mlp.c_proj";
    return "";
  }
  return path;
}

std::string hf_layer_prefix(model_family f) {
  return f == model_family::opt ? "model.decoder.layers." : f == model_family::gpt2 ? "transformer.h." : "model.layers.";
}

// "model.layers.N.<path>.lora_A.weight" -> {N, path, "lora_A.weight"}; false for other names
bool split_ours(const std::string& n, std::string& layer, std::string& path, std::string& leaf) {
  static const std::regex re(R"(model\.layers\.(\d+)\.(.+)\.(lora_[AB]\.weight))");
  std::smatch m;
  if (!std::regex_match(n, m, re)) return false;
  layer = m[1], path = m[2], leaf = m[3];
  return true;
}
}  // namespace

std::string peft_name(const model_config& c, const std::string& ours) {
  if (ours == "v_head.weight") return ours;
  std::string layer, path, leaf;
  if (c.family == model_family::llama || !split_ours(ours, layer, path, leaf)) return k_prefix + ours;
  const std::string hf = hf_module(c.family, path);
  if (hf.empty())
    throw std::invalid_argument(
        "save_adapter: " + ours + " has no PEFT name for " + c.summary() +
        (c.family == model_family::gpt2
             ? ": GPT-2's q, k and v are one Conv1D, c_attn, which PEFT adapts as a whole; target c_attn (or "
               "all-linear) rather than q_proj / k_proj / v_proj alone"
             : ": the model has no such HF module"));
  return k_prefix + hf_layer_prefix(c.family) + layer + "." + hf + "." + leaf;
}

std::string ours_from_peft(const model_config& c, const std::string& peft) {
  std::string n = peft;
  if (n.rfind(k_prefix, 0) == 0) n = n.substr(k_prefix.size());
  // PEFT keeps the adapter name inside the key in memory ("lora_A.default.weight"); files drop it
  for (const char* ab : {".lora_A.", ".lora_B."}) {
    auto p = n.find(std::string(ab) + "default.");
    if (p != std::string::npos) n.erase(p + std::string(ab).size(), std::string("default.").size());
  }
  if (c.family == model_family::llama) return n;
  const std::string pre = hf_layer_prefix(c.family);
  if (n.rfind(pre, 0) != 0) return n;
  static const std::regex re(R"((\d+)\.(.+)\.(lora_[AB]\.weight))");
  std::smatch m;
  const std::string rest = n.substr(pre.size());
  if (!std::regex_match(rest, m, re)) return n;
  for (const auto& ours_path : {std::string(k_fused_qkv_path), std::string("self_attn.q_proj"),
                                std::string("self_attn.k_proj"), std::string("self_attn.v_proj"),
                                std::string("self_attn.o_proj"), std::string("mlp.up_proj"),
                                std::string("mlp.down_proj")})
    if (hf_module(c.family, ours_path) == m[2].str())
      return "model.layers." + m[1].str() + "." + ours_path + "." + m[3].str();
  return n;
}

void save_adapter(const decoder& model_in, const std::string& dir, const std::string& base) {
  auto& model = const_cast<decoder&>(model_in);
  if (!model.has_lora()) throw std::invalid_argument("save_adapter: the model has no LoRA adapter");
  const bool merged = model.lora_merged();
  if (merged) model.unmerge_lora();
  fs::create_directories(dir);
  named_tensors ts;
  const auto& c = model.config();
  for (auto& e : model.adapter_params()) {
    const tensor& t = model.w().by_name.at(e.name);
    int64_t nh = rope_rows_heads(c, e.name);
    ts.emplace_back(peft_name(c, e.name), nh ? permute_rope_rows(t, nh, c.head_dim(), true) : t);
  }
  save_safetensors((fs::path(dir) / "adapter_model.safetensors").string(), ts);
  const auto& lc = model.lora();
  // target_modules: PEFT writes "all-linear" as a string, not a one-name list. OPT and GPT-2 adapters
  // name the HF modules adapted (our aliases o_proj, up_proj, ... are not OPT's or GPT-2's names).
  nlohmann::json targets = lc.target_modules == std::vector<std::string>{"all-linear"}
                               ? nlohmann::json("all-linear")
                               : nlohmann::json(lc.target_modules);
  if (c.family != model_family::llama && !targets.is_string()) {
    std::set<std::string> mods;
    for (auto& e : model.adapter_params()) {
      std::string layer, path, leaf;
      if (split_ours(e.name, layer, path, leaf)) mods.insert(hf_module(c.family, path));
    }
    targets = nlohmann::json(std::vector<std::string>(mods.begin(), mods.end()));
  }
  // the float's shortest decimal (0.1, not 0.10000000149011612: the float32 widened to a double), which
  // reads back as the same float
  const auto decimal = [](float f) {
    char buf[32];
    const auto end = std::to_chars(buf, buf + sizeof buf, f).ptr;  // shortest round-trip form
    return std::strtod(std::string(buf, end).c_str(), nullptr);
  };
  nlohmann::json j = {{"peft_type", "LORA"},
                      {"task_type", "CAUSAL_LM"},
                      {"r", lc.lora_r},
                      {"lora_alpha", decimal(lc.lora_alpha)},
                      {"lora_dropout", decimal(lc.lora_dropout)},
                      // PEFT writes its "all-linear" as a string, not a one-name list
                      {"target_modules", targets},
                      {"bias", "none"},
                      // GPT-2's Conv1D stores its weight (in, out): PEFT's fan_in_fan_out transposes B A when
                      // merging. lora_A (r, in) and lora_B (out, r) are shaped as for a Linear either way.
                      {"fan_in_fan_out", c.family == model_family::gpt2},
                      {"inference_mode", false},
                      {"modules_to_save", model.has_value_head() ? nlohmann::json{"v_head"} : nlohmann::json(nullptr)}};
  if (!base.empty()) j["base_model_name_or_path"] = base;
  write_text_atomic((fs::path(dir) / "adapter_config.json").string(), j.dump(2));
  if (merged) model.merge_lora();
}

namespace {

// LoraConfig's fields (peft/tuners/lora/config.py, 0.21) beyond those load_adapter reads: those that
// change nothing in a loaded adapter's forward (metadata, how the weights were initialised) may hold
// anything; every other one must be unset (null, false, empty), or the adapter is refused, naming
// it: an allow-list, so a variant PEFT adds later is refused too rather than applied as plain LoRA
// (aLoRA's alora_invocation_tokens was merged into every position).
void check_plain_lora(const nlohmann::json& j, const std::string& where) {
  static const std::set<std::string> read = {"peft_type", "r", "lora_alpha", "lora_dropout", "target_modules",
                                             "bias", "fan_in_fan_out", "modules_to_save"};
  static const std::set<std::string> no_effect = {
      "task_type",     "auto_mapping",  "peft_version",   "base_model_name_or_path", "revision",
      "inference_mode", "init_lora_weights", "megatron_config", "megatron_core", "loftq_config",
      "eva_config",    "corda_config",  "lora_ga_config", "qalora_group_size",       "runtime_config",
      "layers_pattern"};  // layers_pattern only with layers_to_transform, which must be unset
  // init_lora_weights: how PEFT initialised the adapter, which a saved one no longer depends on, except for
  // the initialisations that also change the base weights (PiSSA, OLoRA, CorDA, LoftQ: PEFT redoes them on
  // the base at load, so base + B A is not the model they trained): refused, and any name not known here
  if (const auto w = j.find("init_lora_weights"); w != j.end() && w->is_string()) {
    const std::string init = w->get<std::string>();
    if (init != "gaussian" && init != "eva")
      throw std::runtime_error(where + ": \"init_lora_weights\": \"" + init + "\" is not supported: " +
                               (init.rfind("pissa", 0) == 0 || init == "olora" || init == "corda" || init == "loftq"
                                    ? "that initialisation also changes the base model's weights, which PEFT redoes "
                                      "when it loads the adapter, and flowrun applies plain LoRA on the base as it is"
                                    : std::string("flowrun knows true, false, \"gaussian\" and \"eva\"")) +
                               "; convert the adapter to plain LoRA first (PEFT's save_pretrained with "
                               "path_initial_model_for_weight_conversion), or merge it into the model");
  }
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& k = it.key();
    const auto& v = it.value();
    if (read.count(k) || no_effect.count(k)) continue;
    const bool unset = v.is_null() || (v.is_boolean() && !v.get<bool>()) || (v.is_object() && v.empty()) ||
                       (v.is_array() && v.empty()) || (v.is_string() && v.get<std::string>().empty());
    if (!unset)
      throw std::runtime_error(where + ": \"" + k + "\": " + v.dump() +
                               " is not supported: flowrun applies plain LoRA (y = x Wᵀ + lora_alpha / r · B A x on "
                               "every target module), which this setting changes; train or save the adapter without "
                               "it");
  }
  if (const auto m = j.find("modules_to_save"); m != j.end() && !m->is_null() && !m->empty() &&
                                                  *m != nlohmann::json{"v_head"})
    throw std::runtime_error(where + ": \"modules_to_save\": " + m->dump() +
                             " (full copies of modules trained beside the adapter) is not supported; a value head "
                             "(v_head) is");
  if (const auto t = j.find("target_modules"); t != j.end() && t->is_string() && *t != "all-linear")
    throw std::runtime_error(where + ": target_modules is the string \"" + t->get<std::string>() +
                             "\", which PEFT matches as a regular expression over the full module names: not "
                             "supported; list the module names ([\"q_proj\", \"v_proj\"]) or write \"all-linear\"");
}

// PEFT saves "all-linear" (and a regex it resolved) as the full name of every module it adapted
// ("model.layers.0.mlp.gate_proj", "transformer.h.3.attn.c_proj"): names of one layer each. When they
// name the same modules in every one of the model's n_layers layers, that is plain LoRA on those
// modules: returned as their names within a layer ("mlp.gate_proj", PEFT's suffix rule matches them
// in every layer); a module named in some layers only is refused (flowrun adapts a module in every layer).
std::vector<std::string> per_layer_targets(const std::vector<std::string>& targets, int64_t n_layers,
                                           const std::string& where) {
  static const std::regex full(R"(^(?:.*\.)?(?:layers|h)\.([0-9]+)\.(.+)$)");
  std::map<std::string, std::set<int64_t>> layers_of;
  std::vector<std::string> other;
  for (const auto& t : targets) {
    std::smatch m;
    if (std::regex_match(t, m, full)) layers_of[m[2].str()].insert(std::stoll(m[1].str()));
    else other.push_back(t);
  }
  if (layers_of.empty()) return targets;  // module names (q_proj): as they are
  if (!other.empty())
    throw std::runtime_error(where + ": target_modules mixes full names of one layer's modules with others ('" +
                             other.front() + "'): list module names (q_proj), or every layer's full names as PEFT "
                             "writes them");
  std::vector<std::string> inner;
  for (const auto& [name, ls] : layers_of) {
    if (static_cast<int64_t>(ls.size()) != n_layers || *ls.begin() != 0 || *ls.rbegin() != n_layers - 1) {
      std::string which;
      for (int64_t l : ls) which += (which.empty() ? "" : ", ") + std::to_string(l);
      throw std::runtime_error(where + ": target_modules adapts " + name + " in layer(s) " + which + " of " +
                               std::to_string(n_layers) +
                               " only: flowrun adapts a module in every layer (PEFT's layers_to_transform is not "
                               "supported)");
    }
    inner.push_back(name);
  }
  return inner;
}

}  // namespace

void load_adapter(decoder& model, const std::string& dir, bool freeze_base) {
  fs::path cfg_path = fs::path(dir) / "adapter_config.json";
  fs::path st_path = fs::path(dir) / "adapter_model.safetensors";
  std::ifstream f(cfg_path);
  if (!f) {  // the wrong kind of folder, named with what takes it
    std::error_code ec;
    const fs::path d(dir);
    bool checkpoint = fs::exists(d / "latest", ec);
    for (const auto& e : fs::directory_iterator(d, ec)) {
      const std::string n = e.path().filename().string();
      if (n.rfind("step_", 0) == 0 || (n.rfind("shard_", 0) == 0 && e.path().extension() == ".msgpack"))
        checkpoint = true;
    }
    const std::string what =
        !fs::is_directory(d, ec) ? " (" + dir + " is not a folder: an adapter is one, as save_lora writes it)"
        : checkpoint ? " (" + dir + " is a ZeRO checkpoint, not an adapter folder: a LoRA run's checkpoint is read by "
                       "`flowrun generate --zero_checkpoint` and `flowrun convert --from zero`; its adapter folder is "
                       "what save_lora writes)"
        : fs::exists(d / "config.json", ec) ? " (" + dir + " is a model folder, not a LoRA adapter: a base model is "
                                              "`model` / --model, and the adapter goes on top of it)"
                                            : std::string();
    throw std::runtime_error(cfg_path.string() + ": cannot open the adapter config" + what);
  }
  lora_config lc;
  // nlohmann's own errors (bad JSON, a missing key, a wrong type) name neither the file nor what it must hold
  try {
    auto j = nlohmann::json::parse(f);
    if (j.value("peft_type", "") != "LORA")
      throw std::runtime_error(cfg_path.string() + ": peft_type is '" + j.value("peft_type", "") +
                               "', only LORA adapters are supported");
    if (j.value("bias", "none") != "none")
      throw std::runtime_error(cfg_path.string() + ": bias '" + j.value("bias", "") + "' is not supported (use \"none\")");
    // numbers checked before conversion: a float too large for an integer is undefined behaviour in C++
    const auto& r = j.at("r");
    if (!r.is_number_integer() || r.get<std::int64_t>() < 1 || r.get<std::int64_t>() > (1 << 20))
      throw std::runtime_error(cfg_path.string() + ": not a PEFT LoRA adapter config (r is " + r.dump() +
                               ", not a LoRA rank: an integer in 1..1048576)");
    lc.lora_r = r.get<std::int64_t>();
    // PEFT's LoraConfig default when the file leaves it out (save_pretrained always writes it)
    const nlohmann::json alpha = j.contains("lora_alpha") ? j["lora_alpha"] : nlohmann::json(8);
    if (!alpha.is_number() || !std::isfinite(alpha.get<double>()) || std::fabs(alpha.get<double>()) > 1e30)
      throw std::runtime_error(cfg_path.string() + ": not a PEFT LoRA adapter config (lora_alpha is " + alpha.dump() +
                               ", not a finite number)");
    lc.lora_alpha = static_cast<float>(alpha.get<double>());
    const double dropout = j.value("lora_dropout", 0.0);
    if (!(dropout >= 0 && dropout < 1))
      throw std::runtime_error(cfg_path.string() + ": not a PEFT LoRA adapter config (lora_dropout is " +
                               std::to_string(dropout) + ", not a probability in [0, 1))");
    lc.lora_dropout = static_cast<float>(dropout);
    // variants whose math differs from y = x Wᵀ + (lora_alpha / r) B A x with one r (rank_pattern, DoRA,
    // aLoRA, ...): refused, not approximated
    check_plain_lora(j, cfg_path.string());
    if (j.at("target_modules").is_string()) lc.target_modules = {j["target_modules"].get<std::string>()};
    else lc.target_modules = per_layer_targets(j.at("target_modules").get<std::vector<std::string>>(),
                                               model.config().n_layers, cfg_path.string());
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(cfg_path.string() + ": not a PEFT LoRA adapter config (" + e.what() +
                             "): it needs peft_type \"LORA\", r and lora_alpha (numbers) and target_modules "
                             "(a string or a list of strings)");
  }
  if (std::error_code ec; !fs::exists(st_path, ec) && fs::exists(fs::path(dir) / "adapter_model.bin", ec))
    throw std::runtime_error(st_path.string() + ": missing; the folder holds adapter_model.bin (PEFT's "
                             "safe_serialization=False, a PyTorch pickle), which flowrun does not read: save the "
                             "adapter with safe_serialization=True, or convert it (safetensors.torch.save_file of "
                             "torch.load of the .bin)");
  auto tensors = load_safetensors(st_path.string());
  std::map<std::string, tensor> ours;
  for (auto& [name, t] : tensors) ours[ours_from_peft(model.config(), name)] = t;
  if (ours.count("v_head.weight") && !model.has_value_head()) model.add_value_head();
  // an adapter that does not fit this model (another family's, another size's): the tensor or module at fault,
  // then which model the adapter meets, the base its config names, and the fix
  const auto misfit = [&](const std::string& why) {
    std::string base;
    try {
      std::ifstream again(cfg_path);
      base = nlohmann::json::parse(again).value("base_model_name_or_path", std::string());
    } catch (const std::exception&) {
    }
    return std::runtime_error(why + "; the adapter in " + dir + " does not fit the model it is applied to (" +
                              model.config().summary() + ")" +
                              (base.empty() ? std::string() : "; its adapter_config.json names its base: " + base) +
                              ": apply it to the base model it was trained on");
  };
  try {
    model.enable_lora(lc, freeze_base);
  } catch (const std::invalid_argument& e) {  // a target module this family does not have
    throw misfit(cfg_path.string() + ": " + e.what());
  }
  std::set<std::string> used;
  for (auto& e : model.adapter_params()) {
    auto it = ours.find(e.name);
    if (it == ours.end())
      throw misfit(st_path.string() + ": tensor '" + peft_name(model.config(), e.name) +
                   "' is missing (the adapter's target_modules do not match the file)");
    if (it->second.shape() != e.shape) {
      // only the rank side differs (A is (r, in), B is (out, r)): the config's r is not the file's, whatever the base
      const auto& got = it->second.shape();
      if (got.size() == 2 && e.shape.size() == 2 && lc.lora_r > 0 &&
          ((got[1] == e.shape[1] && e.shape[0] == lc.lora_r) || (got[0] == e.shape[0] && e.shape[1] == lc.lora_r)))
        throw std::runtime_error(fmt::format("{}: r = {} but tensor '{}' of {} has rank {} (shape {}): the config does "
                                             "not match its tensors; fix r in adapter_config.json (to {})",
                                             cfg_path.string(), lc.lora_r, it->first, st_path.string(),
                                             got[1] == e.shape[1] ? got[0] : got[1], shape_str(got),
                                             got[1] == e.shape[1] ? got[0] : got[1]));
      throw misfit(st_path.string() + ": tensor '" + it->first + "' has shape " + shape_str(it->second.shape()) +
                   ", the model needs " + shape_str(e.shape));
    }
    int64_t nh = rope_rows_heads(model.config(), e.name);
    auto& dst = model.w().by_name.at(e.name);
    if (nh) dst.copy_from(permute_rope_rows(it->second, nh, model.config().head_dim(), false).to(dst.dev()));
    else dst.copy_from(it->second);
    used.insert(e.name);
  }
  for (auto& [name, t] : ours)
    if (!used.count(name))
      throw misfit(st_path.string() + ": unexpected tensor '" + name + "' (not a LoRA tensor of this model's layers)");
}

lora_config make_lora_config(int64_t rank, float alpha, float dropout, const std::string& modules, uint64_t seed) {
  if (rank < 1)
    throw std::invalid_argument("LoRA rank (lora_dim / lora_r) must be at least 1, got " + std::to_string(rank) +
                                " (0 means no LoRA)");
  if (!(dropout >= 0.0f && dropout < 1.0f))
    throw std::invalid_argument("lora_dropout must be in [0, 1), got " + std::to_string(dropout));
  lora_config c;
  c.lora_r = rank;
  c.lora_alpha = alpha;
  c.lora_dropout = dropout;
  c.seed = seed;
  c.target_modules.clear();
  // DS-Chat's lora_module_name is a prefix of module names ("decoder.layers.", "layers."): every
  // Linear of the blocks. A PEFT name with a layer in it ("layers.0.self_attn.q_proj") is not one:
  // enable_lora refuses it (one layer only)
  auto trimmed = modules;
  trimmed.erase(0, trimmed.find_first_not_of(" \t"));
  trimmed.erase(trimmed.find_last_not_of(" \t") + 1);
  const auto ends = [&](std::string_view s) {
    return trimmed.size() >= s.size() && trimmed.compare(trimmed.size() - s.size(), s.size(), s) == 0;
  };
  if (modules.empty() || (trimmed.find(',') == std::string::npos && (ends("layers.") || ends("layers")))) {
    c.target_modules.push_back("all-linear");
    return c;
  }
  std::string part;
  for (std::size_t at = 0; at <= modules.size(); ++at) {
    if (at == modules.size() || modules[at] == ',') {
      part.erase(0, part.find_first_not_of(" \t"));
      part.erase(part.find_last_not_of(" \t") + 1);
      // a name given twice is one module (PEFT's target_modules is a set)
      if (!part.empty() && std::find(c.target_modules.begin(), c.target_modules.end(), part) == c.target_modules.end())
        c.target_modules.push_back(part);
      part.clear();
    } else {
      part += modules[at];
    }
  }
  if (c.target_modules.empty())
    throw std::invalid_argument("LoRA target modules '" + modules + "' name no module: write e.g. q_proj,v_proj or all-linear");
  return c;
}

bool same_target_modules(const lora_config& a, const lora_config& b) {
  return std::set<std::string>(a.target_modules.begin(), a.target_modules.end()) ==
         std::set<std::string>(b.target_modules.begin(), b.target_modules.end());
}

nlohmann::json lora_config_record(const lora_config& c) {
  return {{"r", c.lora_r},
          {"lora_alpha", c.lora_alpha},
          {"lora_dropout", c.lora_dropout},
          {"target_modules", c.target_modules}};
}

lora_config lora_config_from_record(const nlohmann::json& j, const std::string& where) {
  lora_config c;
  try {
    c.lora_r = j.at("r").get<int64_t>();
    c.lora_alpha = j.at("lora_alpha").get<float>();
    c.lora_dropout = j.at("lora_dropout").get<float>();
    c.target_modules = j.at("target_modules").get<std::vector<std::string>>();
  } catch (const nlohmann::json::exception& e) {
    throw std::invalid_argument(where + ": the LoRA config recorded there is malformed (" + e.what() +
                                "): it needs r, lora_alpha, lora_dropout and target_modules");
  }
  if (c.lora_r < 1 || !(c.lora_dropout >= 0 && c.lora_dropout < 1) || c.target_modules.empty())
    throw std::invalid_argument(where + ": the LoRA config recorded there is out of range (" + j.dump() +
                                "): r >= 1, lora_dropout in [0, 1) and at least one target module");
  return c;
}

}  // namespace flowrun
