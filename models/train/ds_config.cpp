// DeepSpeed's JSON configuration: see ds_config.h for the semantics and the
// DeepSpeed sources each part follows.
#include "models/train/ds_config.h"
#include "runtime/util/nearest.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>
#include <functional>
#include <limits>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

namespace flowrun {

namespace {

using ojson = nlohmann::ordered_json;

std::string join_path(const std::string& parent, const std::string& key) {
  return parent.empty() ? key : parent + "." + key;
}

std::string parent_path(const std::string& path) {
  if (path.empty()) return "";
  if (path.back() == ']') {
    auto b = path.rfind('[');
    return b == std::string::npos ? "" : path.substr(0, b);
  }
  auto d = path.rfind('.');
  auto b = path.rfind('[');
  if (d == std::string::npos && b == std::string::npos) return "";
  if (d == std::string::npos) return path.substr(0, b);
  if (b == std::string::npos) return path.substr(0, d);
  return path.substr(0, std::max(d, b));
}

std::string fmt_double(double v) {
  std::ostringstream os;
  os.precision(17);
  os << v;
  // shortest text that reads back as the same double
  for (int p = 1; p <= 17; ++p) {
    std::ostringstream s;
    s.precision(p);
    s << v;
    if (std::stod(s.str()) == v) return s.str();
  }
  return os.str();
}

std::string describe(const ojson& v) {
  std::string s = v.dump();
  if (s.size() > 80) s = s.substr(0, 77) + "...";
  return s;
}

// --------------------------------------------------------------------------
// Key positions. nlohmann::json keeps no source positions, so a small scanner
// walks the (already validated) text and records where each key path starts.
// It also rejects duplicate keys, as DeepSpeed does
// (config_utils.py dict_raise_error_on_duplicate_keys).
struct text_pos {
  int line = 1;
  int column = 1;
};

struct key_locator {
  std::map<std::string, text_pos> pos;
};

key_locator locate_keys(const std::string& text, const std::string& where) {
  key_locator out;
  struct frame {
    bool object = false;
    std::string path;
    int64_t index = 0;
    bool expect_key = false;
    std::string last_key;
    std::set<std::string> keys;
  };
  std::vector<frame> stack;
  int line = 1, col = 1;
  size_t i = 0;
  const size_t n = text.size();
  auto advance = [&](size_t k) {
    for (size_t j = 0; j < k && i < n; ++j, ++i) {
      if (text[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
  };
  auto value_path = [&]() -> std::string {
    if (stack.empty()) return "";
    const frame& f = stack.back();
    if (f.object) return join_path(f.path, f.last_key);
    return f.path + "[" + std::to_string(f.index) + "]";
  };
  while (i < n) {
    char c = text[i];
    if (c == '/' && i + 1 < n && text[i + 1] == '/') {
      while (i < n && text[i] != '\n') advance(1);
      continue;
    }
    if (c == '/' && i + 1 < n && text[i + 1] == '*') {
      advance(2);
      while (i < n && !(text[i] == '*' && i + 1 < n && text[i + 1] == '/')) advance(1);
      advance(2);
      continue;
    }
    if (c == '"') {
      text_pos start{line, col};
      advance(1);
      std::string s;
      while (i < n && text[i] != '"') {
        if (text[i] == '\\' && i + 1 < n) {
          char e = text[i + 1];
          switch (e) {
            case 'n': s += '\n'; break;
            case 't': s += '\t'; break;
            case 'r': s += '\r'; break;
            case 'b': s += '\b'; break;
            case 'f': s += '\f'; break;
            case 'u': s += "\\u"; break;  // keys with \u escapes are not DeepSpeed's
            default: s += e; break;
          }
          advance(2);
          continue;
        }
        s += text[i];
        advance(1);
      }
      advance(1);
      if (!stack.empty() && stack.back().object && stack.back().expect_key) {
        frame& f = stack.back();
        std::string path = join_path(f.path, s);
        if (!f.keys.insert(s).second) {
          throw std::invalid_argument(where + ":" + std::to_string(start.line) + ":" + std::to_string(start.column) +
                                      ": duplicate key \"" + path +
                                      "\" (DeepSpeed rejects duplicate keys; keep one of them)");
        }
        out.pos.emplace(path, start);
        f.last_key = s;
        f.expect_key = false;
      }
      continue;
    }
    if (c == '{' || c == '[') {
      frame f;
      f.object = c == '{';
      f.path = value_path();
      f.expect_key = f.object;
      stack.push_back(std::move(f));
      advance(1);
      continue;
    }
    if (c == '}' || c == ']') {
      if (!stack.empty()) stack.pop_back();
      advance(1);
      continue;
    }
    if (c == ',') {
      if (!stack.empty()) {
        if (stack.back().object)
          stack.back().expect_key = true;
        else
          ++stack.back().index;
      }
      advance(1);
      continue;
    }
    advance(1);
  }
  return out;
}

// --------------------------------------------------------------------------
ojson value_from_text(const std::string& text) {
  try {
    return ojson::parse(text, nullptr, true, true);
  } catch (const nlohmann::json::parse_error&) {
    return ojson(text);  // not JSON: a plain string (e.g. scheduler.type=WarmupLR)
  } catch (const nlohmann::json::out_of_range&) {
    return ojson(text);  // a number past a double (1e999): the key's type check names the override
  }
}

std::vector<std::string> split_path(const std::string& path) {
  std::vector<std::string> parts;
  std::string cur;
  for (char c : path) {
    if (c == '.') {
      parts.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  parts.push_back(cur);
  return parts;
}

bool is_auto(const ojson& v) { return v.is_string() && v.get_ref<const std::string&>() == "auto"; }

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

int64_t floordiv(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

std::string list_keys(const std::vector<std::string>& keys) {
  std::string s;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (i) s += i + 1 == keys.size() ? " or " : ", ";
    s += keys[i];
  }
  return s;
}

class reader {
 public:
  reader(const std::string& where, const key_locator& loc, const ds_parse_options& opts)
      : where_(where), loc_(loc), opts_(opts) {}

  /// "file:line:col" of the key (or its nearest located parent), or the override.
  std::string place(const std::string& path) const {
    for (std::string p = path; !p.empty(); p = parent_path(p)) {
      if (auto it = opts_.overrides.find(p); it != opts_.overrides.end())
        return where_ + ": override " + p + "=" + it->second;
      if (auto it = auto_used_.find(p); it != auto_used_.end())
        return where_ + ": auto_values " + p + "=" + it->second;
      if (auto it = loc_.pos.find(p); it != loc_.pos.end())
        return where_ + ":" + std::to_string(it->second.line) + ":" + std::to_string(it->second.column);
    }
    return where_;
  }

  [[noreturn]] void fail(const std::string& path, const std::string& msg) const {
    throw std::invalid_argument(place(path) + ": " + msg);
  }

  /// The value at obj[key] (path = its key path), with "auto" replaced from
  /// auto_values; nullopt when absent or null.
  std::optional<ojson> get(const ojson& obj, const std::string& path, const std::string& key) {
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return std::nullopt;
    if (is_auto(*it)) {
      auto a = opts_.auto_values.find(path);
      if (a == opts_.auto_values.end()) {  // reported with every other such key by check_auto()
        auto_missing_.push_back(path);
        return std::nullopt;
      }
      if (auto_used_.emplace(path, a->second).second) auto_order_.push_back(path + "=" + a->second);
      ojson v = value_from_text(a->second);
      if (v.is_null() || is_auto(v)) fail(path, "auto_values[\"" + path + "\"] must be a value, not " + a->second);
      return v;
    }
    return *it;
  }

  /// Throws when a key read was "auto" with no entry in auto_values: one error naming every such key and
  /// its place (each refused in turn, an HF Trainer config took a dozen tries).
  /// After another error (`root` given), every other "auto" outside zero_optimization is named too: that
  /// error stopped the reading before the keys after it (zero_optimization's "auto" keys are not read).
  void check_auto(const ojson* root = nullptr) {
    if (auto_missing_.empty()) return;
    if (root) {
      std::vector<std::string> all;
      std::function<void(const ojson&, const std::string&)> scan = [&](const ojson& v, const std::string& path) {
        if (is_auto(v) && path != "zero_optimization" && path.rfind("zero_optimization.", 0) != 0 &&
            !opts_.auto_values.count(path))
          all.push_back(path);
        if (v.is_object())
          for (auto it = v.begin(); it != v.end(); ++it) scan(it.value(), join_path(path, it.key()));
      };
      scan(*root, "");
      for (const auto& p : auto_missing_)
        if (std::find(all.begin(), all.end(), p) == all.end()) all.push_back(p);
      auto_missing_ = all;
    }
    std::string fix = "write a value for it in the file";
    if (auto_missing_.size() > 1) fix = "write a value for each in the file";
    if (!opts_.auto_values.empty()) {
      std::vector<std::string> filled;
      for (const auto& [k, v] : opts_.auto_values) filled.push_back(k);
      fix += " (\"auto\" is filled here only for " + list_keys(filled) + ")";
    }
    const std::string why = "HF Trainer's DeepSpeed integration fills \"auto\" in from its own arguments, and "
                            "nothing here gives a value for ";
    if (auto_missing_.size() == 1)
      fail(auto_missing_[0], auto_missing_[0] + " is \"auto\": " + why + "it: " + fix);
    std::string keys;
    for (const auto& p : auto_missing_) {  // "key (line:col)", the file named once
      std::string at = place(p);
      if (at.rfind(where_ + ":", 0) == 0) at = at.substr(where_.size() + 1);
      keys += (keys.empty() ? "" : ", ") + p + " (" + at + ")";
    }
    throw std::invalid_argument(where_ + ": " + std::to_string(auto_missing_.size()) + " keys are \"auto\": " +
                                keys + ". " + why + "them: " + fix);
  }

  /// "key=value" of each "auto" filled from auto_values, in the order read.
  const std::vector<std::string>& auto_filled() const { return auto_order_; }

  int64_t as_int(const std::string& path, const ojson& v, const std::string& what = "an integer") const {
    if (v.is_number_integer()) {
      if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        fail(path, path + " is " + describe(v) + ", too large; it must be " + what);
      return v.get<int64_t>();
    }
    if (v.is_number_float()) {
      double d = v.get<double>();
      if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.2e18) return static_cast<int64_t>(d);
    }
    fail(path, path + " is " + describe(v) + "; it must be " + what);
  }

  double as_number(const std::string& path, const ojson& v, const std::string& what = "a number") const {
    if (v.is_number()) {
      double d = v.get<double>();
      if (std::isfinite(d)) return d;
    }
    fail(path, path + " is " + describe(v) + "; it must be " + what);
  }

  bool as_bool(const std::string& path, const ojson& v) const {
    // pydantic's lax bool (DeepSpeed's config sections are pydantic models)
    if (v.is_boolean()) return v.get<bool>();
    if (v.is_number_integer()) {
      int64_t i = v.get<int64_t>();
      if (i == 0 || i == 1) return i == 1;
    }
    if (v.is_string()) {
      std::string s = lower(v.get<std::string>());
      if (s == "true" || s == "1" || s == "yes" || s == "on" || s == "t" || s == "y") return true;
      if (s == "false" || s == "0" || s == "no" || s == "off" || s == "f" || s == "n") return false;
    }
    fail(path, path + " is " + describe(v) + "; it must be true or false");
  }

  std::string as_string(const std::string& path, const ojson& v) const {
    if (v.is_string()) return v.get<std::string>();
    fail(path, path + " is " + describe(v) + "; it must be a string");
  }

  const ojson& as_object(const std::string& path, const ojson& v) const {
    if (!v.is_object()) fail(path, path + " is " + describe(v) + "; it must be an object {...}");
    return v;
  }

 private:
  const std::string& where_;
  const key_locator& loc_;
  const ds_parse_options& opts_;
  std::map<std::string, std::string> auto_used_;
  std::vector<std::string> auto_missing_;
  std::vector<std::string> auto_order_;
};

void apply_overrides(ojson& root, const ds_parse_options& opts, const std::string& where) {
  for (const auto& [path, text] : opts.overrides) {
    auto parts = split_path(path);
    for (const auto& p : parts)
      if (p.empty()) throw std::invalid_argument(where + ": override \"" + path + "\" is not a key path like a.b.c");
    ojson* node = &root;
    std::string sofar;
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      sofar = join_path(sofar, parts[i]);
      ojson& child = (*node)[parts[i]];
      if (child.is_null()) child = ojson::object();
      if (!child.is_object())
        throw std::invalid_argument(where + ": override " + path + "=" + text + ": " + sofar + " is " +
                                    describe(child) + ", not an object");
      node = &child;
    }
    (*node)[parts.back()] = value_from_text(text);
  }
}

const std::vector<std::string>& ignored_fp16_keys() {
  static const std::vector<std::string> k = {"auto_cast", "fp16_master_weights_and_grads"};
  return k;
}

void parse_fp16(reader& r, const ojson& sec, ds_config& cfg) {
  const std::string base = "fp16";
  static const std::vector<std::string> known = {"enabled",        "auto_cast",          "loss_scale",
                                                 "initial_scale_power", "loss_scale_window", "hysteresis",
                                                 "consecutive_hysteresis", "min_loss_scale",
                                                 "fp16_master_weights_and_grads"};
  for (auto it = sec.begin(); it != sec.end(); ++it) {
    const std::string& k = it.key();
    std::string path = join_path(base, k);
    if (std::find(known.begin(), known.end(), k) == known.end())
      r.fail(path, path + " is not an fp16 setting (DeepSpeed rejects it too); fp16 takes " + list_keys(known));
  }
  if (auto v = r.get(sec, "fp16.enabled", "enabled")) cfg.fp16 = r.as_bool("fp16.enabled", *v);
  if (auto v = r.get(sec, "fp16.loss_scale", "loss_scale")) {
    if (v->is_boolean()) r.fail("fp16.loss_scale", "fp16.loss_scale must be a number, not " + describe(*v));
    cfg.loss_scale = r.as_number("fp16.loss_scale", *v);
  }
  if (auto v = r.get(sec, "fp16.initial_scale_power", "initial_scale_power")) {
    int64_t p = r.as_int("fp16.initial_scale_power", *v);
    if (p < -1022 || p > 1023)
      r.fail("fp16.initial_scale_power", "fp16.initial_scale_power is " + std::to_string(p) +
                                             "; 2^it must be a finite double (16 is DeepSpeed's default)");
    cfg.initial_scale_power = static_cast<int>(p);
  }
  if (auto v = r.get(sec, "fp16.loss_scale_window", "loss_scale_window"))
    cfg.loss_scale_window = r.as_int("fp16.loss_scale_window", *v);
  if (auto v = r.get(sec, "fp16.hysteresis", "hysteresis")) cfg.hysteresis = r.as_int("fp16.hysteresis", *v);
  if (auto v = r.get(sec, "fp16.consecutive_hysteresis", "consecutive_hysteresis"))
    cfg.consecutive_hysteresis = r.as_bool("fp16.consecutive_hysteresis", *v);
  if (auto v = r.get(sec, "fp16.min_loss_scale", "min_loss_scale"))
    cfg.min_loss_scale = r.as_number("fp16.min_loss_scale", *v);
  for (const auto& k : ignored_fp16_keys())
    if (sec.contains(k)) cfg.ignored_keys.push_back(join_path(base, k));

  if (!cfg.fp16) return;
  if (cfg.loss_scale < 0)
    r.fail("fp16.loss_scale", "fp16.loss_scale is " + fmt_double(cfg.loss_scale) +
                                  "; it must be >= 0 (0 enables dynamic loss scaling)");
  if (cfg.loss_scale == 0) {
    if (cfg.loss_scale_window <= 0)
      r.fail("fp16.loss_scale_window", "fp16.loss_scale_window is " + std::to_string(cfg.loss_scale_window) +
                                           "; it must be > 0 when dynamic loss scaling is enabled (loss_scale 0)");
    if (cfg.min_loss_scale <= 0)
      r.fail("fp16.min_loss_scale", "fp16.min_loss_scale is " + fmt_double(cfg.min_loss_scale) +
                                        "; it must be > 0 when dynamic loss scaling is enabled (loss_scale 0)");
    if (cfg.hysteresis <= 0)
      r.fail("fp16.hysteresis", "fp16.hysteresis is " + std::to_string(cfg.hysteresis) +
                                    "; it must be >= 1 (1: halve the scale on every overflow; DeepSpeed's default 2)");
  }
}

void parse_bf16(reader& r, const std::string& base, const ojson& sec, ds_config& cfg) {
  static const std::vector<std::string> known = {"enabled", "immediate_grad_update", "check_grad_overflow",
                                                 "bf16_master_weights_and_grads", "bf16_optimizer_states"};
  for (auto it = sec.begin(); it != sec.end(); ++it) {
    const std::string& k = it.key();
    std::string path = join_path(base, k);
    if (std::find(known.begin(), known.end(), k) == known.end())
      r.fail(path, path + " is not a bf16 setting (DeepSpeed rejects it too); " + base + " takes " +
                       list_keys(known));
    if (k != "enabled") cfg.ignored_keys.push_back(path);
  }
  std::string p = join_path(base, "enabled");
  if (auto v = r.get(sec, p, "enabled")) cfg.bf16 = r.as_bool(p, *v);
}

void parse_zero(reader& r, const ojson& sec, ds_config& cfg) {
  const std::string base = "zero_optimization";
  if (sec.is_boolean()) {  // deprecated: true means stage 1 (zero/config.py read_zero_config_deprecated)
    cfg.zero_stage = sec.get<bool>() ? 1 : 0;
    cfg.warnings.push_back("\"zero_optimization\": " + std::string(sec.get<bool>() ? "true" : "false") +
                           " is DeepSpeed's deprecated form of {\"stage\": " + std::to_string(cfg.zero_stage) + "}");
    return;
  }
  r.as_object(base, sec);
  // DeepSpeedZeroConfig's fields and their aliases (deepspeed/runtime/zero/config.py, 0.19): DeepSpeed
  // refuses any other key (its config models forbid extras), and a misspelt "stage" fell back to stage 0
  static const std::vector<std::string> known = {
      "stage", "contiguous_gradients", "reduce_scatter", "reduce_bucket_size", "use_multi_rank_bucket_allreduce",
      "allgather_partitions", "allgather_bucket_size", "allgather_size", "overlap_comm", "load_from_fp32_weights",
      "elastic_checkpoint", "offload_param", "offload_optimizer", "zenflow", "sub_group_size", "cpu_offload_param",
      "cpu_offload_use_pin_memory", "cpu_offload", "prefetch_bucket_size", "stage3_prefetch_bucket_size",
      "param_persistence_threshold", "stage3_param_persistence_threshold", "model_persistence_threshold",
      "stage3_model_persistence_threshold", "max_live_parameters", "stage3_max_live_parameters", "max_reuse_distance",
      "stage3_max_reuse_distance", "gather_16bit_weights_on_model_save", "stage3_gather_16bit_weights_on_model_save",
      "stage3_gather_fp16_weights_on_model_save", "module_granularity_threshold",
      "stage3_module_granularity_threshold", "use_all_reduce_for_fetch_params",
      "stage3_use_all_reduce_for_fetch_params", "allgather_sequential", "stage3_allgather_sequential",
      "partition_stream_chunk_size", "stage3_partition_stream_chunk_size", "ignore_unused_parameters",
      "legacy_stage1", "round_robin_gradients", "zero_hpz_partition_size", "zero_quantized_weights",
      "zero_quantized_nontrainable_weights", "zero_quantized_gradients", "zeropp_loco_param", "mics_shard_size",
      "mics_hierarchical_params_gather", "memory_efficient_linear", "pipeline_loading_checkpoint",
      "override_module_apply", "log_trace_cache_warnings", "enable_sanity_checks",
      "save_muon_momentum_buffer_in_memory", "leaf_module"};
  for (auto it = sec.begin(); it != sec.end(); ++it) {
    const std::string& k = it.key();
    std::string path = join_path(base, k);
    if (std::find(known.begin(), known.end(), k) == known.end()) {
      const std::string near = nearest_name(k, known);
      r.fail(path, path + " is not a zero_optimization setting (DeepSpeed rejects it too)" +
                       (near.empty() ? std::string() : ": did you mean \"" + near + "\"?"));
    }
    if (k == "stage") {
      auto v = r.get(sec, path, k);
      if (!v) continue;
      bool ok = !v->is_boolean() && v->is_number();
      int64_t s = -1;
      if (ok) {
        double d = v->get<double>();
        ok = d == std::floor(d) && d >= 0 && d <= 3;  // before the cast: 3e37 has no int64_t (fuzz_ds_config)
        if (ok) s = static_cast<int64_t>(d);
      }
      if (!ok || s < 0 || s > 3)
        r.fail(path, path + " is " + describe(*v) +
                         "; zero_optimization.stage must be 0, 1, 2 or 3 (0 off, 1 optimizer states, 2 + gradients, "
                         "3 + parameters)");
      cfg.zero_stage = static_cast<int>(s);
      continue;
    }
    cfg.ignored_keys.push_back(path);
    // DeepSpeedZeroOffloadParamConfig's and DeepSpeedZeroOffloadOptimizerConfig's fields
    // (deepspeed/runtime/zero/offload_config.py): DeepSpeed refuses any other key there too
    static const std::vector<std::string> param_keys = {"device",     "nvme_path",  "buffer_count",
                                                        "buffer_size", "max_in_cpu", "pin_memory"};
    static const std::vector<std::string> optimizer_keys = {
        "device",        "nvme_path", "buffer_count", "pin_memory",          "pipeline_read",     "pipeline_write",
        "fast_init",     "ratio",     "super_offload", "convert_grad_on_cpu", "cpuadam_cores_perc"};
    auto device_of = [&](const ojson& o, const std::string& opath) -> std::optional<std::string> {
      if (!o.is_object()) return std::nullopt;
      const auto& keys = k == "offload_param" ? param_keys : optimizer_keys;
      for (auto f = o.begin(); f != o.end(); ++f)
        if (std::find(keys.begin(), keys.end(), f.key()) == keys.end()) {
          const std::string fpath = join_path(opath, f.key()), near = nearest_name(f.key(), keys);
          r.fail(fpath, fpath + " is not an " + k + " setting (DeepSpeed rejects it too)" +
                            (near.empty() ? std::string() : ": did you mean \"" + near + "\"?"));
        }
      auto d = o.find("device");
      if (d == o.end() || d->is_null()) return std::nullopt;
      std::string dpath = join_path(opath, "device");
      std::string dev = lower(r.as_string(dpath, *d));
      if (dev != "none" && dev != "cpu" && dev != "nvme")
        r.fail(dpath, dpath + " is " + describe(*d) + "; it must be \"none\", \"cpu\" or \"nvme\"");
      return dev;
    };
    if (k == "offload_optimizer") {
      if (auto d = device_of(*it, path)) cfg.offload_optimizer_device = *d;
    } else if (k == "offload_param") {
      if (auto d = device_of(*it, path)) cfg.offload_param_device = *d;
    } else if (k == "cpu_offload" && it->is_boolean() && it->get<bool>()) {
      cfg.offload_optimizer_device = "cpu";
    } else if (k == "cpu_offload_param" && it->is_boolean() && it->get<bool>()) {
      cfg.offload_param_device = "cpu";
    }
  }
}

// An optimizer or scheduler key other than "type" and "params", a letter or two from one of them: DeepSpeed
// ignores it as it ignores every unknown key there, and then trains at the section's defaults ("param" for
// "params" ran at lr 1e-3 instead of the file's 3e-5). Refused, naming the key meant.
void refuse_misspelt(reader& r, const std::string& base, const std::string& key, const std::string& effect) {
  const std::string near = nearest_name(key, {"type", "params"});
  if (near.empty()) return;
  const std::string path = join_path(base, key);
  r.fail(path, path + " is not read (DeepSpeed ignores it too, and " + effect + "): did you mean \"" + base + "." +
                   near + "\"?");
}

void parse_optimizer(reader& r, const ojson& sec, ds_config& cfg) {
  const std::string base = "optimizer";
  r.as_object(base, sec);
  cfg.optimizer_given = true;
  for (auto it = sec.begin(); it != sec.end(); ++it)
    if (it.key() != "type" && it.key() != "params") {
      refuse_misspelt(r, base, it.key(), "the optimizer would run at its defaults (lr 1e-3)");
      cfg.ignored_keys.push_back(join_path(base, it.key()));
    }
  auto tv = r.get(sec, "optimizer.type", "type");
  if (!tv)
    r.fail(base, "optimizer.type is missing; flowrun runs \"AdamW\" or \"Adam\" (drop the optimizer section for "
                 "AdamW with DeepSpeed's defaults)");
  std::string type = r.as_string("optimizer.type", *tv);
  std::string lt = lower(type);
  if (lt != "adam" && lt != "adamw")
    r.fail("optimizer.type", "optimizer.type is \"" + type +
                                 "\"; flowrun runs \"AdamW\" or \"Adam\" (DeepSpeed's \"Adam\" is AdamW unless "
                                 "params.adam_w_mode is false)");

  bool adam_w_mode = true;
  bool amsgrad = false;
  bool wd_given = false;
  if (auto pv = r.get(sec, "optimizer.params", "params")) {
    const ojson& p = r.as_object("optimizer.params", *pv);
    static const std::vector<std::string> applied = {"lr", "betas", "eps", "weight_decay", "bias_correction",
                                                     "adam_w_mode", "torch_adam", "amsgrad"};
    static const std::vector<std::string> implementation = {"set_grad_none", "foreach", "fused", "capturable",
                                                            "differentiable", "maximize"};
    for (auto it = p.begin(); it != p.end(); ++it) {
      const std::string& k = it.key();
      std::string path = join_path("optimizer.params", k);
      if (k == "max_grad_norm")
        r.fail(path, "optimizer.params.max_grad_norm is not supported as an optimizer parameter (DeepSpeed refuses "
                     "it too); use the top-level \"gradient_clipping\"");
      if (std::find(implementation.begin(), implementation.end(), k) != implementation.end()) {
        if (k == "maximize" && !it->is_null() && r.as_bool(path, *it))
          r.fail(path, "optimizer.params.maximize true is not supported (flowrun minimizes the loss)");
        cfg.ignored_keys.push_back(path);
        continue;
      }
      if (std::find(applied.begin(), applied.end(), k) == applied.end()) {
        std::vector<std::string> all = applied;
        all.insert(all.end(), implementation.begin(), implementation.end());
        r.fail(path, path + " is not an Adam/AdamW parameter (DeepSpeed's optimizer would reject it too); params "
                            "takes " + list_keys(all));
      }
    }
    if (auto v = r.get(p, "optimizer.params.lr", "lr")) {
      cfg.lr = r.as_number("optimizer.params.lr", *v, "a number >= 0");
      if (cfg.lr < 0)
        r.fail("optimizer.params.lr", "optimizer.params.lr is " + fmt_double(cfg.lr) + "; it must be >= 0");
    }
    if (auto v = r.get(p, "optimizer.params.betas", "betas")) {
      const std::string path = "optimizer.params.betas";
      if (!v->is_array() || v->size() != 2)
        r.fail(path, path + " is " + describe(*v) + "; it must be [beta1, beta2], e.g. [0.9, 0.999]");
      cfg.beta1 = r.as_number(path + "[0]", (*v)[0]);
      cfg.beta2 = r.as_number(path + "[1]", (*v)[1]);
      for (double b : {cfg.beta1, cfg.beta2})
        if (b < 0 || b >= 1) r.fail(path, path + " is " + describe(*v) + "; each beta must be in [0, 1)");
    }
    if (auto v = r.get(p, "optimizer.params.eps", "eps")) {
      cfg.eps = r.as_number("optimizer.params.eps", *v);
      if (cfg.eps < 0)
        r.fail("optimizer.params.eps", "optimizer.params.eps is " + fmt_double(cfg.eps) + "; it must be >= 0");
    }
    if (auto v = r.get(p, "optimizer.params.weight_decay", "weight_decay")) {
      cfg.weight_decay = r.as_number("optimizer.params.weight_decay", *v);
      wd_given = true;
      if (cfg.weight_decay < 0)
        r.fail("optimizer.params.weight_decay",
               "optimizer.params.weight_decay is " + fmt_double(cfg.weight_decay) + "; it must be >= 0");
    }
    if (auto v = r.get(p, "optimizer.params.bias_correction", "bias_correction"))
      cfg.bias_correction = r.as_bool("optimizer.params.bias_correction", *v);
    if (auto v = r.get(p, "optimizer.params.adam_w_mode", "adam_w_mode"))
      adam_w_mode = r.as_bool("optimizer.params.adam_w_mode", *v);
    if (auto v = r.get(p, "optimizer.params.torch_adam", "torch_adam"))
      cfg.torch_adam = r.as_bool("optimizer.params.torch_adam", *v);
    if (auto v = r.get(p, "optimizer.params.amsgrad", "amsgrad")) amsgrad = r.as_bool("optimizer.params.amsgrad", *v);
  }
  if (amsgrad)
    r.fail("optimizer.params.amsgrad", "optimizer.params.amsgrad true is not supported (DeepSpeed's FusedAdam refuses "
                                       "it too); remove it or set it to false");
  // engine.py _configure_basic_optimizer: effective_adam_w_mode = name == "adamw" or adam_w_mode
  bool adamw = lt == "adamw" || adam_w_mode;
  cfg.optimizer_type = adamw ? "AdamW" : "Adam";
  if (!wd_given) cfg.weight_decay = (cfg.torch_adam && adamw) ? 0.01 : 0.0;
}

void parse_scheduler(reader& r, const ojson& sec, ds_config& cfg) {
  const std::string base = "scheduler";
  r.as_object(base, sec);
  for (auto it = sec.begin(); it != sec.end(); ++it)
    if (it.key() != "type" && it.key() != "params") {
      refuse_misspelt(r, base, it.key(), "the schedule would run at its defaults");
      cfg.ignored_keys.push_back(join_path(base, it.key()));
    }
  static const std::vector<std::string> types = {"WarmupLR", "WarmupDecayLR", "WarmupCosineLR"};
  auto tv = r.get(sec, "scheduler.type", "type");
  if (!tv) r.fail(base, "scheduler.type is missing; it must be " + list_keys(types) + " (or drop the section)");
  std::string type = r.as_string("scheduler.type", *tv);
  if (std::find(types.begin(), types.end(), type) == types.end())
    r.fail("scheduler.type", "scheduler.type is \"" + type + "\"; flowrun runs " + list_keys(types) +
                                 " (DeepSpeed's names, case-sensitive)");
  lr_schedule& s = cfg.scheduler;
  s = lr_schedule{};
  s.type = type;

  std::vector<std::string> known;
  if (type == "WarmupCosineLR")
    known = {"total_num_steps", "warmup_min_ratio", "warmup_num_steps", "cos_min_ratio", "warmup_type",
             "last_batch_iteration"};
  else if (type == "WarmupDecayLR")
    known = {"total_num_steps", "warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type",
             "last_batch_iteration"};
  else
    known = {"warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type", "last_batch_iteration"};

  ojson empty = ojson::object();
  const ojson* pp = &empty;
  std::optional<ojson> pv = r.get(sec, "scheduler.params", "params");
  if (pv) pp = &r.as_object("scheduler.params", *pv);
  const ojson& p = *pp;
  for (auto it = p.begin(); it != p.end(); ++it) {
    std::string path = join_path("scheduler.params", it.key());
    if (std::find(known.begin(), known.end(), it.key()) == known.end()) {
      std::string hint;
      if (type == "WarmupCosineLR" && (it.key() == "warmup_min_lr" || it.key() == "warmup_max_lr"))
        hint = " (WarmupCosineLR works in ratios of the optimizer's lr: warmup_min_ratio, cos_min_ratio)";
      r.fail(path, path + " is not a " + type + " parameter (DeepSpeed would reject it too)" + hint + "; " + type +
                       " takes " + list_keys(known));
    }
  }
  auto num = [&](const char* key, double& out) {
    std::string path = join_path("scheduler.params", key);
    if (auto v = r.get(p, path, key)) {
      if (v->is_array())
        r.fail(path, path + " is a list; per-parameter-group values are not supported, give one number");
      out = r.as_number(path, *v);
      return true;
    }
    return false;
  };
  num("warmup_min_lr", s.warmup_min_lr);
  bool max_given = num("warmup_max_lr", s.warmup_max_lr);
  // lr_schedules.py: WarmupLR(warmup_max_lr=None) takes the optimizer's lr; WarmupDecayLR defaults to 0.001
  if (type == "WarmupLR" && !max_given) s.warmup_max_lr_from_optimizer = true;
  num("warmup_min_ratio", s.warmup_min_ratio);
  num("cos_min_ratio", s.cos_min_ratio);
  if (auto v = r.get(p, "scheduler.params.warmup_num_steps", "warmup_num_steps")) {
    s.warmup_num_steps = r.as_int("scheduler.params.warmup_num_steps", *v, "an integer >= 0");
    // 0 is HF Trainer's default warmup, which it writes for "auto"; DeepSpeed's WarmupLR takes
    // max(2, warmup_num_steps) (lr_schedules.py), as lr_at does. A negative count is a typo: refused
    if (s.warmup_num_steps < 0)
      r.fail("scheduler.params.warmup_num_steps", "scheduler.params.warmup_num_steps is " +
                                                      std::to_string(s.warmup_num_steps) +
                                                      "; it must be an integer >= 0 (DeepSpeed would warm up over 2 "
                                                      "steps, as for 0 to 2)");
  }
  if (auto v = r.get(p, "scheduler.params.warmup_type", "warmup_type")) {
    s.warmup_type = r.as_string("scheduler.params.warmup_type", *v);
    if (s.warmup_type != "log" && s.warmup_type != "linear") {
      cfg.warnings.push_back(r.place("scheduler.params.warmup_type") + ": unknown warmup_type \"" + s.warmup_type +
                             "\"; DeepSpeed uses \"log\" instead, and so do we (\"log\" or \"linear\")");
      s.warmup_type = "log";
    }
  }
  if (auto v = r.get(p, "scheduler.params.last_batch_iteration", "last_batch_iteration")) {
    int64_t l = r.as_int("scheduler.params.last_batch_iteration", *v);
    if (l != -1)
      r.fail("scheduler.params.last_batch_iteration",
             "scheduler.params.last_batch_iteration is " + std::to_string(l) +
                 "; only -1 (start from the beginning) is supported: resume from a flowrun checkpoint instead");
  }
  if (type != "WarmupLR") {
    auto v = r.get(p, "scheduler.params.total_num_steps", "total_num_steps");
    if (!v)
      r.fail(pv ? "scheduler.params" : "scheduler",
             "scheduler.params.total_num_steps is required for " + type +
                 " (the optimizer updates over which the lr decays)");
    s.total_num_steps = r.as_int("scheduler.params.total_num_steps", *v);
    int64_t n = std::max<int64_t>(2, s.warmup_num_steps);
    if (s.total_num_steps < n)
      cfg.warnings.push_back(r.place("scheduler.params.total_num_steps") + ": total_num_steps " +
                             std::to_string(s.total_num_steps) + " is less than the warmup's " + std::to_string(n) +
                             " steps" +
                             (n != s.warmup_num_steps
                                  ? " (warmup_num_steps " + std::to_string(s.warmup_num_steps) + ", which DeepSpeed raises to " +
                                        std::to_string(n) + ")"
                                  : std::string(" (warmup_num_steps)")) +
                             " (DeepSpeed warns too)");
  }
}

void resolve_batch(reader& r, const ojson& root, ds_config& cfg) {
  const char* T = "train_batch_size";
  const char* M = "train_micro_batch_size_per_gpu";
  const char* G = "gradient_accumulation_steps";
  auto opt_int = [&](const char* key) -> std::optional<int64_t> {
    if (auto v = r.get(root, key, key)) return r.as_int(key, *v, "a positive integer");
    return std::nullopt;
  };
  std::optional<int64_t> t = opt_int(T), m = opt_int(M), g = opt_int(G);
  const int64_t w = cfg.world_size;
  const std::string ws = std::to_string(w);
  // Zero or negative given values: DeepSpeed's _batch_assertion, in its order
  // (checked before deriving so that nothing divides by zero).
  if (t && *t <= 0) r.fail(T, std::string(T) + " is " + std::to_string(*t) + "; it has to be greater than 0");
  if (m && *m <= 0) r.fail(M, std::string(M) + " is " + std::to_string(*m) + "; it has to be greater than 0");
  if (g && *g <= 0) r.fail(G, std::string(G) + " is " + std::to_string(*g) + "; it has to be greater than 0");

  std::string derived;  // how the missing ones were computed, for error messages
  std::string at = t ? T : (m ? M : G);
  if (t && m && g) {
  } else if (t && m) {
    g = floordiv(floordiv(*t, *m), w);
    derived = std::string(G) + " = " + std::to_string(*t) + " // " + std::to_string(*m) + " // " + ws + " = " +
              std::to_string(*g);
  } else if (t && g) {
    m = floordiv(floordiv(*t, w), *g);
    derived = std::string(M) + " = " + std::to_string(*t) + " // " + ws + " // " + std::to_string(*g) + " = " +
              std::to_string(*m);
  } else if (m && g) {
    t = *m * *g * w;
  } else if (t) {
    g = 1;
    m = floordiv(*t, w);
    derived = std::string(G) + " = 1 and " + M + " = " + std::to_string(*t) + " // " + ws + " = " + std::to_string(*m);
  } else if (m) {
    t = *m * w;
    g = 1;
  } else {
    r.fail(g ? G : "", std::string("either ") + T + " or " + M + " needs to be given" +
                          (g ? std::string(" (") + G + " alone does not set a batch size)" : std::string()) +
                          "; e.g. \"train_micro_batch_size_per_gpu\": 4");
  }
  auto why = derived.empty() ? std::string() : " (derived: " + derived + ")";
  if (*m <= 0)
    r.fail(at, std::string(M) + " comes out as " + std::to_string(*m) + why + "; " + T +
                   " must be at least gradient_accumulation_steps * world_size (" + std::to_string(*g * w) + ")");
  if (*g <= 0)
    r.fail(at, std::string(G) + " comes out as " + std::to_string(*g) + why + "; " + T + " must be at least " + M +
                   " * world_size (" + std::to_string(*m * w) + ")");
  if (*t != *m * *g * w)
    r.fail(at, std::string(T) + " " + std::to_string(*t) + " != " + M + " " + std::to_string(*m) + " * " + G + " " +
                   std::to_string(*g) + " * world_size " + ws + " = " + std::to_string(*m * *g * w) + why +
                   "; DeepSpeed requires train_batch_size == micro batch * gradient accumulation * world size: "
                   "fix the values for " + ws + " rank" + (w == 1 ? "" : "s") + ", or give only two of the three");
  cfg.train_batch_size = *t;
  cfg.train_micro_batch_size_per_gpu = *m;
  cfg.gradient_accumulation_steps = *g;
}

std::pair<int, int> line_col(const std::string& text, size_t byte) {
  // nlohmann's parse_error::byte: 1-based index of the last character read
  size_t end = std::min(byte == 0 ? size_t(0) : byte - 1, text.size());
  int line = 1, col = 1;
  for (size_t i = 0; i < end; ++i) {
    if (text[i] == '\n') {
      ++line;
      col = 1;
    } else {
      ++col;
    }
  }
  return {line, col};
}

}  // namespace

// ----------------------------------------------------------------------------
std::string ds_config::ignored_keys_warning() const {
  if (ignored_keys.empty()) return "";
  std::string s = "DeepSpeed config " + where + ": flowrun ignores ";
  for (size_t i = 0; i < ignored_keys.size(); ++i) s += (i ? ", " : "") + ignored_keys[i];
  return s;
}

std::string ds_config::summary() const {
  std::ostringstream os;
  os << "batch " << train_batch_size << " = " << train_micro_batch_size_per_gpu << " x " << gradient_accumulation_steps
     << " accumulation x " << world_size << " rank" << (world_size == 1 ? "" : "s") << ", ZeRO stage " << zero_stage;
  if (fp16) {
    os << ", fp16 ";
    if (loss_scale > 0)
      os << "(static loss scale " << fmt_double(loss_scale) << ")";
    else
      os << "(dynamic loss scale 2^" << initial_scale_power << ", window " << loss_scale_window << ", hysteresis "
         << hysteresis << ", min " << fmt_double(min_loss_scale) << ")";
  } else if (bf16) {
    os << ", bf16";
  } else {
    os << ", fp32";
  }
  os << ", gradient clipping " << (gradient_clipping > 0 ? fmt_double(gradient_clipping) : std::string("off")) << ", "
     << optimizer_type << " lr " << fmt_double(lr) << " betas (" << fmt_double(beta1) << ", " << fmt_double(beta2)
     << ") eps " << fmt_double(eps) << " weight_decay " << fmt_double(weight_decay);
  if (!scheduler.type.empty()) {
    const auto& s = scheduler;
    os << ", " << s.type << "(warmup " << s.warmup_num_steps << " " << s.warmup_type;
    if (s.type == "WarmupCosineLR")
      os << ", ratio " << fmt_double(s.warmup_min_ratio) << " -> 1 -> " << fmt_double(s.cos_min_ratio);
    else
      os << ", lr " << fmt_double(s.warmup_min_lr) << " -> "
         << (s.warmup_max_lr_from_optimizer ? fmt_double(lr) : fmt_double(s.warmup_max_lr));
    if (s.type != "WarmupLR") os << ", total " << s.total_num_steps;
    os << ")";
  }
  return os.str();
}

const std::vector<std::string>& ds_config_top_level_keys() {
  static const std::vector<std::string> keys = {"train_batch_size", "train_micro_batch_size_per_gpu",
                                                "gradient_accumulation_steps", "gradient_clipping", "zero_optimization",
                                                "fp16", "bf16", "bfloat16", "optimizer", "scheduler"};
  return keys;
}

// The sections of a parsed config, read through r (parse_ds_config's body).
ds_config read_ds_config(reader& r, const ojson& root, const std::string& where, int world_size) {
  ds_config cfg;
  cfg.where = where;
  cfg.world_size = world_size;

  static const std::set<std::string> batch_keys = {"train_batch_size", "train_micro_batch_size_per_gpu",
                                                   "gradient_accumulation_steps"};  // ds_config_top_level_keys too
  bool bf16_section = root.contains("bf16") && !root["bf16"].is_null();
  for (auto it = root.begin(); it != root.end(); ++it) {
    const std::string& k = it.key();
    const ojson& v = it.value();
    if (batch_keys.count(k)) continue;  // resolved below
    if (v.is_null()) continue;
    if (k == "gradient_clipping") {
      auto gv = r.get(root, k, k);
      if (gv) cfg.gradient_clipping = r.as_number(k, *gv);
    } else if (k == "zero_optimization") {
      parse_zero(r, v, cfg);
    } else if (k == "fp16") {
      parse_fp16(r, r.as_object(k, v), cfg);
    } else if (k == "bf16" || (k == "bfloat16" && !bf16_section)) {
      parse_bf16(r, k, r.as_object(k, v), cfg);
    } else if (k == "optimizer") {
      parse_optimizer(r, v, cfg);
    } else if (k == "scheduler") {
      parse_scheduler(r, v, cfg);
    } else {
      cfg.ignored_keys.push_back(k);
      // DeepSpeed's TensorBoard monitor, turned on: the user expects event files, which flowrun writes from the
      // node's own settings (a line among the ignored keys went unseen, and no files came)
      if (k == "tensorboard" && v.is_object() && v.contains("enabled") && v["enabled"].is_boolean() &&
          v["enabled"].get<bool>())
        cfg.warnings.push_back(r.place("tensorboard") +
                               ": DeepSpeed's TensorBoard monitor is not read here: set enable_tensorboard = true "
                               "(and tensorboard_path, its output_path) on the node to write event files");
      // DeepSpeed's other sections are many and let through; one a letter or two from a key read here is
      // most likely that key misspelt ("train_batch_sizee" left the batch triple to resolve without it)
      if (std::string near = nearest_name(k, ds_config_top_level_keys()); !near.empty() && near != k)
        cfg.likely_typos.push_back({k, near, r.place(k)});
    }
  }
  try {
    resolve_batch(r, root, cfg);
  } catch (const std::invalid_argument& e) {  // a misspelt batch key is likely why the triple does not resolve
    std::string msg = e.what();
    for (const auto& t : cfg.likely_typos) msg += "; " + t.str();
    throw std::invalid_argument(msg);
  }
  if (cfg.fp16 && cfg.bf16) {
    std::string b = bf16_section ? "bf16" : "bfloat16";
    r.fail(b + ".enabled", "fp16.enabled and " + b +
                               ".enabled are both true; DeepSpeed cannot run both: enable one of them (bf16 needs no "
                               "loss scaling)");
  }
  return cfg;
}

ds_config parse_ds_config(const std::string& json_text, int world_size, const std::string& where,
                          const ds_parse_options& options) {
  if (world_size < 1)
    throw std::invalid_argument(where + ": world_size must be >= 1 (data-parallel ranks), got " +
                                std::to_string(world_size));
  ojson root;
  try {
    root = ojson::parse(json_text, nullptr, /*allow_exceptions=*/true, /*ignore_comments=*/true);
  } catch (const nlohmann::json::parse_error& e) {
    auto [line, col] = line_col(json_text, e.byte);
    std::string msg = e.what();
    // "[json.exception.parse_error.101] parse error at line 3, column 5: syntax error ..." -> "syntax error ..."
    auto p = msg.find(": ", msg.find("parse error"));
    if (p != std::string::npos) msg = msg.substr(p + 2);
    throw std::invalid_argument(where + ":" + std::to_string(line) + ":" + std::to_string(col) +
                                ": not valid JSON: " + msg);
  } catch (const nlohmann::json::out_of_range& e) {
    // e.g. 1e999 (tests/fuzz/fuzz_ds_config): nlohmann's out_of_range.406 escaped, naming neither file nor fix
    std::string msg = e.what();
    const auto p = msg.find("] ");
    if (p != std::string::npos) msg = msg.substr(p + 2);
    throw std::invalid_argument(where + ": not valid JSON: " + msg + " (larger than a double can hold)");
  }
  if (!root.is_object())
    throw std::invalid_argument(where + ": a DeepSpeed config is a JSON object {...}, not " + describe(root));
  key_locator loc = locate_keys(json_text, where);
  apply_overrides(root, options, where);

  reader r(where, loc, options);
  try {
    ds_config cfg = read_ds_config(r, root, where, world_size);
    r.check_auto();
    cfg.auto_filled = r.auto_filled();
    return cfg;
  } catch (const std::invalid_argument&) {
    r.check_auto(&root);  // a key left "auto" is the likelier cause (an unresolved batch triple, say)
    throw;
  }
}

ds_config load_ds_config(const std::string& path, int world_size, const ds_parse_options& options) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::invalid_argument(path + ": cannot open DeepSpeed config file (does it exist?)");
  std::ostringstream ss;
  ss << f.rdbuf();
  if (f.bad()) throw std::invalid_argument(path + ": cannot read DeepSpeed config file");
  return parse_ds_config(ss.str(), world_size, path, options);
}

// ----------------------------------------------------------------------------
dynamic_loss_scaler::dynamic_loss_scaler(const ds_config& cfg) {
  if (!cfg.fp16) return;  // bf16 / fp32: no scaling
  if (cfg.loss_scale > 0) {
    scale_ = cfg.loss_scale;
    return;
  }
  dynamic_ = true;
  use_hysteresis_ = cfg.zero_stage > 0;
  scale_ = std::ldexp(1.0, cfg.initial_scale_power);
  min_scale_ = cfg.min_loss_scale;
  window_ = cfg.loss_scale_window;
  hysteresis_ = cfg.hysteresis;
  consecutive_hysteresis_ = cfg.consecutive_hysteresis;
  hysteresis_left_ = hysteresis_;
  if (window_ <= 0 || hysteresis_ <= 0 || !(min_scale_ > 0))
    throw std::invalid_argument("dynamic_loss_scaler: loss_scale_window, hysteresis and min_loss_scale must be > 0");
}

bool dynamic_loss_scaler::update(bool overflow) {
  if (overflow) ++overflows_;
  if (!dynamic_) return overflow;
  if (overflow) {
    if (!use_hysteresis_) {
      // fused_optimizer.py FP16_Optimizer._update_scale
      scale_ = std::max(scale_ / 2.0, min_scale_);
    } else if (hysteresis_ == 1 || hysteresis_left_ == 1) {
      // loss_scaler.py DynamicLossScaler.update_scale (raise_error_at_min_scale=True)
      if (scale_ == min_scale_)
        throw std::runtime_error(
            "fp16 gradients overflow with the dynamic loss scale already at fp16.min_loss_scale (" +
            fmt_double(min_scale_) +
            "): DeepSpeed stops here too (\"Current loss scale already at minimum\"). Look for the source of the "
            "inf/NaN, lower min_loss_scale, or train in bf16");
      scale_ = std::max(scale_ / 2.0, min_scale_);
    } else {
      --hysteresis_left_;
    }
    good_steps_ = 0;
    return true;
  }
  if (use_hysteresis_ && consecutive_hysteresis_) hysteresis_left_ = hysteresis_;
  if (good_steps_ > 0 && good_steps_ % window_ == 0) {
    if (use_hysteresis_ && !consecutive_hysteresis_) hysteresis_left_ = hysteresis_;
    scale_ *= 2.0;
  }
  ++good_steps_;
  return false;
}

void dynamic_loss_scaler::restore(double scale, int64_t good_steps, int64_t hysteresis_left) {
  if (!(scale > 0) || !std::isfinite(scale))
    throw std::invalid_argument("dynamic_loss_scaler::restore: scale " + fmt_double(scale) + " must be > 0 and finite");
  if (good_steps < 0)
    throw std::invalid_argument("dynamic_loss_scaler::restore: good_steps " + std::to_string(good_steps) + " < 0");
  if (hysteresis_left < 0)
    throw std::invalid_argument("dynamic_loss_scaler::restore: hysteresis_left " + std::to_string(hysteresis_left) +
                                " < 0");
  if (!dynamic_) return;  // a static scale (or none) comes from the config
  scale_ = scale;
  good_steps_ = good_steps;
  hysteresis_left_ = hysteresis_left;
}

}  // namespace flowrun
