#include "runtime/graph/validate.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <system_error>
#include <tuple>

#include "runtime/graph/parse.h"
#include "runtime/util/same_path.h"
#include "runtime/util/writable.h"

namespace flowrun::graph {

namespace fs = std::filesystem;

namespace {

std::string join(const std::vector<std::string>& v, std::string_view sep = ", ") {
  std::string s;
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? std::string(sep) : std::string()) + v[i];
  return s;
}

std::string where(const source_pos& p) { return p.file + ":" + std::to_string(p.line) + ":" + std::to_string(p.col); }

std::string suggest(std::string_view name, const std::vector<std::string>& valid, const std::string& what) {
  std::string near = nearest_name(name, valid);
  if (!near.empty()) return "did you mean '" + near + "'?";
  if (valid.empty()) return "there are no " + what;
  return "valid " + what + ": " + join(valid);
}

// An example value of a setting's type, for hints.
std::string example_value(const setting_decl& d) {
  if (!d.required && d.type != setting_type::path && d.type != setting_type::output) return to_string(d.default_value);
  switch (d.type) {
    case setting_type::int_:
      return "1";
    case setting_type::float_:
      return "0.5";
    case setting_type::bool_:
      return "true";
    case setting_type::string:
      return "\"...\"";
    case setting_type::path:
      return "\"path/to/file\"";
    case setting_type::string_list:
      return "[\"a\", \"b\"]";
    case setting_type::output:
      return "\"out/name\"";
    case setting_type::path_list:
      return "[\"path/a\", \"path/b\"]";
  }
  return "...";
}

class validator {
 public:
  validator(const graph_spec& spec, const node_kind_registry& kinds, const validate_options& options)
      : kinds_(kinds), options_(options) {
    result_.spec = spec;
    default_file_ = spec.source_file.empty() ? std::string("<graph>") : spec.source_file.string();
  }

  validation_result run() {
    graph_spec& spec = result_.spec;
    if (spec.steps < 0)
      error(spec.steps_pos, "graph steps must be >= 0, got " + std::to_string(spec.steps),
            "steps = 0 runs until the sources are exhausted");
    if (spec.nodes.empty())
      error({default_file_, 1, 1}, "graph '" + spec.name + "' has no nodes",
            "add a [node.NAME] table with kind = \"...\" for each node (`flowrun kinds` lists the kinds)");
    resolve_output(spec.checkpoint_dir, spec.checkpoint_dir_pos);  // the run's checkpoint folder: an output
    if (options_.check_files && !spec.checkpoint_dir.empty())
      if (auto why = unwritable_reason(spec.checkpoint_dir, output_kind::folder); !why.empty())
        error(spec.checkpoint_dir_pos, "graph checkpoint_dir: " + why,
              "give checkpoint_dir a folder that can be created and written (the first checkpoint would fail "
              "there, after the training before it)");
    check_nodes();
    check_outputs_over_inputs();
    check_edges();
    if (!spec.incomplete) check_required_ports();
    check_cycles();
    if (result_.errors.empty() && options_.check_files) check_kinds();
    sort_errors(result_.errors);
    return std::move(result_);
  }

 private:
  const node_kind_registry& kinds_;
  const validate_options& options_;
  validation_result result_;
  std::string default_file_;
  std::vector<const node_kind*> kind_of_;                  // per node; nullptr if unknown
  std::map<std::string, std::size_t, std::less<>> index_;  // node name -> first index
  std::set<std::size_t> nodes_with_edge_errors_;
  std::set<std::pair<std::size_t, std::string>> connected_;
  struct arc {
    std::size_t to;
    std::size_t edge;
  };
  std::vector<std::vector<arc>> arcs_;  // non-feedback edges, by source node
  std::map<std::string, std::tuple<std::string, std::string, source_pos>> model_outputs_;  // path -> node, setting, where
  std::map<std::string, std::tuple<std::string, std::string, source_pos>> inputs_;  // the files and folders read, alike

  // The part of same_path_key `inner` below the folder `outer` ("a/b" for "/x/a/b" in "/x"); nullopt
  // when `inner` is not strictly inside it.
  static std::optional<std::string> below(const std::string& inner, const std::string& outer) {
    if (outer.empty() || inner.size() <= outer.size() || inner.compare(0, outer.size(), outer) != 0)
      return std::nullopt;
    if (outer == "/") return inner.substr(1);
    if (inner[outer.size()] != '/') return std::nullopt;
    return inner.substr(outer.size() + 1);
  }

  // What a path `rel` below a checkpoint folder enters of what the run's checkpoints write, replace and prune, by
  // its first part: a step folder (step_NNNNNNNN, models/train/shard_checkpoint.h) or the commit file `latest`
  // (zero_rank's output_dir holds them), its lock file and the nodes' NAME.done.json and NAME.settings.json; in
  // [graph] checkpoint_dir (`graph_dir`) also a node's own folder (step 3's trainers keep their step folders
  // there) and step3.json.
  // "" when none: a folder of its own beside them (export_hf = "OUTPUT_DIR/hf", the shipped pretrain.graph's).
  std::string checkpoint_part(const std::string& rel, bool graph_dir) const {
    const std::string p = fs::path(rel).begin()->string();
    if (p == "latest") return "the commit file `latest`";
    if (p.size() > 5 && p.compare(0, 5, "step_") == 0 &&
        std::all_of(p.begin() + 5, p.end(), [](char c) { return c >= '0' && c <= '9'; }))
      return "a step folder";
    if (p.rfind(".flowrun.lock", 0) == 0) return "the folder's lock file";  // runtime/util/dir_lock.h rewrites it
    for (const auto& n : result_.spec.nodes)  // the settings record a node keeps beside its checkpoints
      if (p == n.name + ".done.json" || p == n.name + ".settings.json") return "the record of node '" + n.name + "'";
    if (!graph_dir) return "";
    if (p == "step3.json") return "step 3's commit file";
    for (const auto& n : result_.spec.nodes)
      if (p == n.name) return "the folder of node '" + n.name + "'";
    return "";
  }

  // A model output (output, export_hf, save_lora, ema_output) that would overwrite or change what the run
  // reads or keeps:
  // - at the place of a file or folder the graph reads (a node's model, data, tokenizer or adapter): the
  //   save would overwrite it (zero_rank's export_hf over its HF base folder replaced the weights it
  //   started from, and the rerun then refused its own checkpoint);
  // - directly in a folder the graph reads (an output into the lora_pretrained adapter's or the base
  //   model's folder): the save replaces one of its files, or the rerun's record of that folder, file by
  //   file, no longer matches (a folder of its own deeper inside changes neither);
  // - in what a checkpoint folder's runs write and prune (checkpoint_part: a step folder, `latest`, the lock
  //   file, a node's settings record, a node's folder of [graph] checkpoint_dir): the run replaces or prunes
  //   the model (a policy output at CHECKPOINT_DIR/policy passed, and the run failed at its end, after training).
  void check_outputs_over_inputs() {
    std::vector<std::pair<std::string, std::string>> checkpoints;  // same_path_key -> how the graph names it
    if (!result_.spec.checkpoint_dir.empty())
      checkpoints.emplace_back(same_path_key(result_.spec.checkpoint_dir), "[graph] checkpoint_dir");
    for (const auto& n : result_.spec.nodes)
      if (const auto it = n.settings.find("output_dir"); it != n.settings.end())
        if (const auto* dir = std::get_if<std::string>(&it->second.value); dir && !dir->empty())
          checkpoints.emplace_back(same_path_key(*dir), "output_dir of node '" + n.name + "'");
    for (const auto& [key, out] : model_outputs_) {
      const auto& [node, name, pos] = out;
      const std::string what = "setting '" + name + "' of node '" + node + "' saves ";
      if (const auto in = inputs_.find(key); in != inputs_.end()) {
        const auto& [in_node, in_name, in_pos] = in->second;
        error(pos,
              what + "to the place '" + in_name + "' of node '" + in_node + "' reads" +
                  (in_pos.known() ? " (" + where(in_pos) + ")" : std::string()) +
                  ": the save would overwrite what the run starts from",
              "give " + name + " a path of its own");
        continue;
      }
      bool said = false;
      for (const auto& [in_key, in] : inputs_) {
        std::error_code ec;
        const auto rel = below(key, in_key);
        if (!rel || rel->find('/') != std::string::npos || !fs::is_directory(in_key, ec)) continue;
        const auto& [in_node, in_name, in_pos] = in;
        error(pos,
              what + "into the folder '" + in_name + "' of node '" + in_node + "' reads" +
                  (in_pos.known() ? " (" + where(in_pos) + ")" : std::string()) +
                  ": the save would add to or replace the files the run starts from (a rerun or resume compares "
                  "that folder's files)",
              "give " + name + " a path outside '" + in_key + "'");
        said = true;
        break;
      }
      if (said) continue;
      std::stable_partition(checkpoints.begin(), checkpoints.end(),  // the saving node's own output_dir first
                            [&](const auto& c) { return c.second == "output_dir of node '" + node + "'"; });
      for (const auto& [dir, named] : checkpoints) {
        const auto rel = below(key, dir);
        const std::string part = rel ? checkpoint_part(*rel, named == "[graph] checkpoint_dir") : "";
        if (part.empty()) continue;
        error(pos,
              what + "into " + part + " of the checkpoints in " + named + " ('" + dir +
                  "'): the run's checkpoints write, replace or prune it, and the model with it",
              "give " + name + " a path of its own outside the checkpoints' step folders, `latest` and node folders, "
                               "such as a folder beside them in '" + dir + "'");
        break;
      }
    }
  }

  void error(source_pos p, std::string message, std::string hint) {
    if (p.file.empty()) p.file = default_file_;
    result_.errors.push_back(graph_error::at(p, std::move(message), std::move(hint)));
  }

  static const source_pos& first_known(const source_pos& a, const source_pos& b) { return a.known() ? a : b; }

  std::string node_desc(std::size_t i) const {
    const node_spec& n = result_.spec.nodes[i];
    return "node '" + n.name + "' (kind " + n.kind + ")";
  }

  // ------------------------------------------------------------- node_kind::check

  void check_kinds() {
    const graph_spec& spec = result_.spec;
    for (std::size_t i = 0; i < spec.nodes.size(); ++i) {
      const node_kind* kind = kind_of_[i];
      if (!kind || !kind->check) continue;
      const node_spec& node = spec.nodes[i];
      std::vector<node_kind::problem> problems;
      try {
        problems = kind->check(node, spec);
      } catch (const std::exception& e) {
        problems.push_back({"", node_desc(i) + ": " + e.what(), ""});
      }
      for (const auto& p : problems) {
        const setting* s = p.setting.empty() ? nullptr : node.find_setting(p.setting);
        const source_pos& pos = s ? first_known(s->value_pos, node.pos) : node.pos;
        error(pos, p.message, p.hint);
      }
    }
  }

  // ------------------------------------------------------------- nodes

  void check_nodes() {
    graph_spec& spec = result_.spec;
    kind_of_.assign(spec.nodes.size(), nullptr);
    for (std::size_t i = 0; i < spec.nodes.size(); ++i) {
      node_spec& node = spec.nodes[i];
      if (!is_identifier(node.name)) {
        error(node.pos, "invalid node name '" + node.name + "'",
              "node names are identifiers: letters, digits and '_', not starting with a digit");
      } else if (auto it = index_.find(node.name); it != index_.end()) {
        const source_pos& first = spec.nodes[it->second].pos;
        error(node.pos, "duplicate node name '" + node.name + "'",
              (first.known() ? "first defined at " + where(first) + "; " : std::string()) +
                  "node names must be unique: rename one of them");
        continue;  // the edges cannot tell the two apart: check only the first
      } else {
        index_.emplace(node.name, i);
      }
      if (node.replicas < 1)
        error(first_known(node.replicas_pos, node.pos),
              "node '" + node.name + "' has replicas = " + std::to_string(node.replicas) + "; replicas must be >= 1",
              "replicas is how many copies of the node run; leave it out for one");
      else if (node.replicas > max_replicas)
        error(first_known(node.replicas_pos, node.pos),
              "node '" + node.name + "' has replicas = " + std::to_string(node.replicas) + "; replicas must be <= " +
                  std::to_string(max_replicas),
              "each replica is an actor (a thread of its own for blocking kinds such as zero_rank) and every "
              "replica of a node links to every replica of its neighbours, so more would only exhaust the "
              "machine: use fewer replicas, or spread the work over a [cluster]");
      if (node.threads_pos.known() && (node.threads < 1 || node.threads > max_node_threads))
        error(node.threads_pos,
              "node '" + node.name + "' has threads = " + std::to_string(node.threads) + "; threads must be in 1.." +
                  std::to_string(max_node_threads),
              "threads is the most cores each replica's ops use (its OpenMP team); leave it out for all of them");
      if (node.kind.empty()) {
        error(node.pos, "node '" + node.name + "' has no kind",
              "add kind = \"...\" to [node." + node.name + "]; kinds: " + join(kinds_.names()));
        continue;
      }
      const node_kind* kind = kinds_.lookup(node.kind);
      if (!kind) {
        error(first_known(node.kind_pos, node.pos), "unknown node kind '" + node.kind + "'",
              suggest(node.kind, kinds_.names(), "node kinds") + " (`flowrun kinds` lists them)");
        continue;
      }
      kind_of_[i] = kind;
      if (!kind->single_replica.empty() && node.replicas > 1)
        error(first_known(node.replicas_pos, node.pos),
              "node '" + node.name + "' has replicas = " + std::to_string(node.replicas) + ", but kind " + kind->name +
                  " runs as one replica: " + kind->single_replica,
              "leave replicas out (one)");
      check_settings(node, *kind);
    }
  }

  // another tool's name, or the node that has the setting (unknown_setting_hint); else "did you mean"
  // a near name of the kind's, or its valid names
  std::string setting_hint(const std::string& name, const node_spec& node, const node_kind& kind) const {
    const auto valid = kind.setting_names();
    if (std::string h = unknown_setting_hint(result_.spec, kinds_, kind, name, node.name, valid); !h.empty()) return h;
    return suggest(name, valid, "settings of " + kind.name);
  }

  // For a path setting that got several files: where the others go, when the kind takes more (DS-Chat's
  // several --data_path are `data` and `mix_data`).
  static std::string more_files_hint(const node_kind& kind, const std::string& name, const setting_decl& decl) {
    if (decl.type != setting_type::path || name != "data" || !kind.find_setting("mix_data")) return "";
    return "; the other files go in mix_data = [\"b.jsonl\", ...] (DS-Chat's several --data_path)";
  }

  void check_settings(node_spec& node, const node_kind& kind) {
    for (auto& [name, s] : node.settings) {
      const setting_decl* decl = kind.find_setting(name);
      if (!decl) {
        error(first_known(s.key_pos, node.pos),
              "unknown setting '" + name + "' for node '" + node.name + "' (kind " + kind.name + ")",
              setting_hint(name, node, kind));
        continue;
      }
      if (!value_matches(decl->type, s.value)) {
        // a number TOML could not hold (1e999, an integer past 2^63) arrives as a string; one that parses
        // whole ("40" for an int) is kept in the hint instead of the default
        std::string why, fix = example_value(*decl);
        if (const auto* text = std::get_if<std::string>(&s.value); text && !text->empty()) {
          if (decl->type == setting_type::float_ || decl->type == setting_type::int_) {
            char* end = nullptr;
            errno = 0;
            double parsed = 0;
            if (decl->type == setting_type::int_) std::strtoll(text->c_str(), &end, 10);
            else parsed = std::strtod(text->c_str(), &end);
            if (end == text->c_str() + text->size() && errno == ERANGE)
              why = " (" + *text + " is out of the range of a " +
                    (decl->type == setting_type::int_ ? "64-bit integer" : "double, about 1.8e308") + ")";
            else if (end == text->c_str() + text->size() && !std::isfinite(parsed))
              why = " (not a finite number)";  // "NaN", "inf": offered back as the fix, they read as strings again
            else if (end == text->c_str() + text->size())
              fix = *text;
          } else if (decl->type == setting_type::bool_ && (*text == "true" || *text == "false")) {
            fix = *text;
          } else if (decl->type == setting_type::path_list || decl->type == setting_type::string_list) {
            // one name for a list: the user's value in a list (mix_data = "a.jsonl" offered the empty default);
            // a comma-separated string becomes one entry each
            std::vector<std::string> items;
            for (std::size_t at = 0; at <= text->size();) {
              const std::size_t end = std::min(text->find(',', at), text->size());
              std::string item = text->substr(at, end - at);
              item.erase(0, item.find_first_not_of(' '));
              item.erase(item.find_last_not_of(' ') + 1);
              if (!item.empty()) items.push_back(item);
              at = end + 1;
            }
            fix = to_string(setting_value(items));
          }
        } else if (const auto* f = std::get_if<double>(&s.value);
                   f && decl->type == setting_type::int_ && std::isfinite(*f) && std::fabs(*f) < 9e15) {
          // 8.5 for an int: the user's number without its fraction, not the default, moved inside the
          // setting's range (0.5 for a setting >= 1 offered 0)
          std::int64_t v = static_cast<std::int64_t>(std::trunc(*f));
          const auto& r = decl->range;
          if (r.low && v < *r.low + (r.low_open ? 1 : 0)) v = static_cast<std::int64_t>(std::ceil(*r.low)) + (r.low_open ? 1 : 0);
          if (r.high && v > *r.high - (r.high_open ? 1 : 0)) v = static_cast<std::int64_t>(std::floor(*r.high)) - (r.high_open ? 1 : 0);
          if (r.non_zero && v == 0) v = 1;
          fix = std::to_string(v);
        }
        error(first_known(s.value_pos, node.pos),
              "setting '" + name + "' of node '" + node.name + "' must be " + std::string(to_string(decl->type)) +
                  ", got " + std::string(value_type_name(s.value)) + " " + to_string(s.value) + why,
              "write " + name + " = " + fix + more_files_hint(kind, name, *decl) + " (`flowrun explain " + kind.name +
                  "`)");
        continue;
      }
      // a list written as the text of one path (`--set node.rm.data='["a.jsonl","b.jsonl"]'`): not a file name
      if (const auto* text = std::get_if<std::string>(&s.value); decl->type == setting_type::path && text &&
                                                                  text->size() > 1 && text->front() == '[' &&
                                                                  text->back() == ']' && !fs::exists(*text)) {
        error(first_known(s.value_pos, node.pos),
              "setting '" + name + "' of node '" + node.name + "' takes one path, got the list " + *text,
              "give one file" + more_files_hint(kind, name, *decl));
        continue;
      }
      if (decl->type == setting_type::float_)
        if (const auto* i = std::get_if<std::int64_t>(&s.value)) s.value = static_cast<double>(*i);
      if (auto why = range_violation(*decl, s.value)) {
        error(first_known(s.value_pos, node.pos),
              "setting '" + name + "' of node '" + node.name + "' (kind " + kind.name + ") " + *why +
                  (decl->range.why.empty() ? std::string() : " (" + decl->range.why + ")"),
              (decl->doc.empty() ? std::string() : name + ": " + decl->doc + "; ") + "write " + name + " = " +
                  example_value(*decl) + " (`flowrun explain " + kind.name + "`)");
        continue;
      }
      if (decl->type == setting_type::path) check_path(node, name, s, *decl);
      if (decl->type == setting_type::path_list) check_path_list(node, name, s);
      if (decl->type == setting_type::output) check_output(node, name, s);
    }
    for (const auto& decl : kind.settings) {
      if (node.settings.count(decl.name)) continue;
      if (decl.required) {
        error(node.pos,
              "node '" + node.name + "' (kind " + kind.name + ") is missing required setting '" + decl.name + "' (" +
                  std::string(to_string(decl.type)) + ")",
              "add " + decl.name + " = " + example_value(decl) + " to [node." + node.name + "]" +
                  (decl.doc.empty() ? std::string() : ": " + decl.doc));
        continue;
      }
      node.settings.emplace(decl.name, setting{decl.default_value, {}, {}, true});
    }
    // defaults that depend on the node's other settings (node_kind::default_by), once all have a value
    for (const auto& decl : kind.settings) {
      auto it = node.settings.find(decl.name);
      if (!decl.default_for || it == node.settings.end() || !it->second.from_default) continue;
      setting_value v = decl.default_for(node);
      if (decl.type == setting_type::float_)
        if (const auto* i = std::get_if<std::int64_t>(&v)) v = static_cast<double>(*i);
      std::optional<std::string> why;
      if (!value_matches(decl.type, v)) why = "is " + std::string(value_type_name(v)) + ", not " + std::string(to_string(decl.type));
      else why = range_violation(decl, v);
      if (why) {
        error(node.pos, "the default of setting '" + decl.name + "' of node '" + node.name + "' (kind " + kind.name +
                            ") for its other settings " + *why,
              "write " + decl.name + " = " + example_value(decl) + " in [node." + node.name + "]");
        continue;
      }
      it->second.value = std::move(v);
    }
  }

  // The folder a relative path in a value written at `p` resolves against (validate.h, "Path settings"): the
  // folder of the file it was written in, or the working directory for a value given on the command line.
  fs::path base_dir(const source_pos& p) const {
    std::error_code ec;
    if (p.from_command_line()) return fs::current_path(ec);
    if (!p.file.empty() && fs::is_regular_file(p.file, ec)) return fs::path(p.file).parent_path();
    return result_.spec.source_file.parent_path();
  }

  static std::string absolute_text(const fs::path& p) {
    std::error_code ec;
    fs::path abs = fs::absolute(p, ec);
    return (ec ? p : abs).lexically_normal().string();
  }

  // An output setting: resolved; with check_files, its folder must take a file (else the work before
  // the save is lost when the save fails), and no two nodes may save a model to the same path (the
  // later save would overwrite the earlier model, which a rerun then takes as its own).
  void check_output(const node_spec& node, const std::string& name, setting& s) {
    std::string& text = std::get<std::string>(s.value);
    resolve_output(text, s.value_pos);
    if (text.empty() || !options_.check_files) return;
    // the settings that name a folder (a model output may be a llama2.c file or a folder)
    const bool folder = name == "output_dir" || name == "export_hf" || name == "save_lora" || name == "store_dir";
    if (auto why = unwritable_reason(text, folder ? output_kind::folder : output_kind::either); !why.empty())
      error(first_known(s.value_pos, node.pos), "setting '" + name + "' of node '" + node.name + "': " + why,
            why.find("symbolic link") != std::string::npos ? "create the link's target, or give " + name + " another path"
            : folder ? "give " + name + " a folder that can be created and written"
                     : "give " + name + " a path in a folder that can be written");
    if (name != "output" && name != "export_hf" && name != "save_lora" && name != "ema_output")
      return;  // shared folders are by design
    const std::string key = same_path_key(text);  // the same place however it is spelled
    auto [it, fresh] = model_outputs_.emplace(key, std::make_tuple(node.name, name, s.value_pos));
    if (!fresh)  // another node's, or another setting of this node (export_hf and save_lora in one folder)
      error(first_known(s.value_pos, node.pos),
            "setting '" + name + "' of node '" + node.name + "' saves to '" + text + "', as '" +
                std::get<1>(it->second) + "' of node '" + std::get<0>(it->second) + "' does" +
                (std::get<2>(it->second).known() ? " (" + where(std::get<2>(it->second)) + ")" : std::string()) +
                ": the later save would overwrite the earlier model",
            "give each node's " + name + " a path of its own");
  }

  // An output (a file or folder a node writes): absolute, from the same base as an input; it need not exist.
  void resolve_output(std::string& text, const source_pos& pos) const {
    if (text.empty()) return;  // not set
    fs::path p(text);
    text = absolute_text(p.is_absolute() ? p : base_dir(pos) / p);
  }

  // An input: the absolute path of the first of (base folder, asset root) that holds it; else the places tried.
  std::optional<std::string> resolve_input(const std::string& text, const source_pos& pos,
                                           std::vector<fs::path>& tried) const {
    fs::path p(text);
    if (p.is_absolute()) {
      tried.push_back(p);
    } else {
      tried.push_back((base_dir(pos) / p).lexically_normal());
      if (!options_.asset_root.empty()) tried.push_back((options_.asset_root / p).lexically_normal());
    }
    std::error_code ec;
    for (const auto& t : tried)
      if (fs::exists(t, ec)) return absolute_text(t);
    return std::nullopt;
  }

  void report_missing(const node_spec& node, const std::string& name, const std::string& text, const source_pos& pos,
                      const std::vector<fs::path>& tried) {
    std::string looked;
    for (std::size_t i = 0; i < tried.size(); ++i) {  // absolute, whatever the asset root was given as
      std::error_code ec;
      const fs::path abs = fs::absolute(tried[i].empty() ? fs::path(".") : tried[i], ec).lexically_normal();
      looked += (i ? " and '" : "'") + (ec ? tried[i].string() : abs.string()) + "'";
    }
    const std::string base = pos.from_command_line() ? "relative paths given with --set are looked up in the "
                                                       "working directory"
                                                     : "relative paths in a file are looked up next to that file";
    std::string hint =
        fs::path(text).is_absolute() ? "check the path"
        : options_.asset_root.empty()
            ? base + ", then under the asset root, but no asset root was given: set FLOWRUN_ASSETS, or fix the path"
            : base + ", then under the asset root (FLOWRUN_ASSETS): fix the path, or point FLOWRUN_ASSETS at the "
                     "folder that holds it";
    // another graph beside this one writes it (dpo.graph and ppo.graph start from what sft.graph wrote): say to run
    // that one first, rather than to fix a path that is right
    if (!pos.from_command_line() && !pos.file.empty() && !fs::path(text).is_absolute()) {
      std::error_code ec;
      const fs::path here = fs::path(pos.file);
      for (const auto& e : fs::directory_iterator(here.parent_path().empty() ? "." : here.parent_path(), ec)) {
        if (e.path().extension() != ".graph" || fs::equivalent(e.path(), here, ec)) continue;
        // the sibling, parsed: a node's output, output_dir, export_hf or save_lora that names this place (both
        // graphs' relative paths are looked up in this folder)
        const parse_result sibling = parse_graph_file(e.path());
        bool writes = false;
        for (const auto& n : sibling.spec.nodes)
          for (const auto& [key, st] : n.settings) {
            const auto* out = std::get_if<std::string>(&st.value);
            writes = writes || (out && !out->empty() &&
                                (key == "output" || key == "output_dir" || key == "export_hf" || key == "save_lora") &&
                                same_path(*out, text));
          }
        if (writes) {
          hint = e.path().filename().string() + " beside it writes this file: run `flowrun " + e.path().string() +
                 "` first";
          break;
        }
      }
    }
    error(first_known(pos, node.pos),
          "file not found for setting '" + name + "' of node '" + node.name + "': '" + text + "' (looked in " + looked +
              ")",
          hint);
  }

  void check_path(node_spec& node, const std::string& name, setting& s, const setting_decl& decl) {
    const std::string& text = std::get<std::string>(s.value);
    if (text.empty()) {
      if (decl.required)
        error(first_known(s.value_pos, node.pos),
              "required path setting '" + name + "' of node '" + node.name + "' is empty",
              "name the file: " + name + " = \"path/to/file\"");
      return;
    }
    if (!options_.check_files) return;
    std::vector<fs::path> tried;
    if (auto found = resolve_input(text, s.value_pos, tried)) {
      s.value = *found;
      inputs_.emplace(same_path_key(*found), std::make_tuple(node.name, name, s.value_pos));
      return;
    }
    report_missing(node, name, text, s.value_pos, tried);
  }

  void check_path_list(node_spec& node, const std::string& name, setting& s) {
    if (!options_.check_files) return;
    for (auto& text : std::get<std::vector<std::string>>(s.value)) {
      if (text.empty()) {
        error(first_known(s.value_pos, node.pos), "setting '" + name + "' of node '" + node.name + "' has an empty path",
              "remove the empty entry");
        continue;
      }
      std::vector<fs::path> tried;
      if (auto found = resolve_input(text, s.value_pos, tried)) {
        text = *found;
        inputs_.emplace(same_path_key(text), std::make_tuple(node.name, name, s.value_pos));
      } else
        report_missing(node, name, text, s.value_pos, tried);
    }
  }

  // ------------------------------------------------------------- edges

  std::vector<std::string> node_names() const {
    std::vector<std::string> out;
    for (const auto& n : result_.spec.nodes) out.push_back(n.name);
    return out;
  }

  static std::vector<std::string> port_names(const node_kind& k, port_dir d, bool with_types = false) {
    std::vector<std::string> out;
    for (const auto* p : k.ports_of(d)) out.push_back(with_types ? p->name + " (" + p->message_type + ")" : p->name);
    return out;
  }

  // Out ports (or in ports) of type `type` on any node, as "node.port".
  std::vector<std::string> ports_of_type(const std::string& type, port_dir d) const {
    std::vector<std::string> out;
    for (std::size_t i = 0; i < kind_of_.size(); ++i) {
      if (!kind_of_[i]) continue;
      for (const auto* p : kind_of_[i]->ports_of(d))
        if (p->message_type == type) out.push_back(result_.spec.nodes[i].name + "." + p->name);
    }
    return out;
  }

  /// The port to suggest for a missing edge of `type` into (d = in) or out of (d = out) port `own` of node
  /// `self`: one on another node; a port no edge uses yet first (a stats port left unconnected pairs with
  /// the other one left unconnected, not with its connected sibling); among those, a required one, or one
  /// named as self or `own` (experience.reward for reward.scored, not the critic's experience.values);
  /// then the first in the graph. "" when the graph has none.
  std::string suggested_port(const std::string& type, port_dir d, std::size_t self, const std::string& own) const {
    std::string best;
    int best_rank = -1;
    const std::string& self_name = result_.spec.nodes[self].name;
    for (std::size_t i = 0; i < kind_of_.size(); ++i) {
      if (!kind_of_[i] || i == self) continue;
      for (const auto* p : kind_of_[i]->ports_of(d)) {
        if (p->message_type != type) continue;
        const bool named = p->name == self_name || p->name == own ||
                           result_.spec.nodes[i].name == own;  // reward.scored -> experience.reward
        const int rank = (connected_.count({i, p->name}) ? 0 : 4) + (p->required ? 2 : 0) + (named ? 1 : 0);
        if (rank > best_rank) {
          best_rank = rank;
          best = result_.spec.nodes[i].name + "." + p->name;
        }
      }
    }
    return best;
  }

  std::optional<std::size_t> find_index(const std::string& name, const source_pos& at, std::string_view role) {
    auto it = index_.find(name);
    if (it != index_.end()) return it->second;
    std::string near = nearest_name(name, node_names());
    // The edge was probably meant for the nearest node: do not also report its ports as unconnected.
    if (auto it = index_.find(near); it != index_.end()) nodes_with_edge_errors_.insert(it->second);
    error(at, "edge " + std::string(role) + " unknown node '" + name + "'", suggest(name, node_names(), "nodes"));
    return std::nullopt;
  }

  const port_decl* resolve_from(edge_spec& e, std::size_t fi, const node_kind& k) {
    if (e.from_port.empty()) {
      auto outs = k.ports_of(port_dir::out);
      if (outs.size() == 1) {
        e.from_port = outs[0]->name;
        return outs[0];
      }
      if (outs.empty())
        error(e.from_pos, node_desc(fi) + " has no out ports, so no edge can start at it",
              "edges start at an out port; " + k.name + " only receives");
      else
        error(
            e.from_pos, node_desc(fi) + " has several out ports: name one",
            "write " + e.from_node + "." + outs[0]->name + " (out ports: " + join(port_names(k, port_dir::out)) + ")");
      return nullptr;
    }
    const port_decl* p = k.find_port(e.from_port);
    if (!p) {
      error(e.from_pos, node_desc(fi) + " has no port '" + e.from_port + "'",
            suggest(e.from_port, port_names(k, port_dir::out), "out ports of " + k.name));
      return nullptr;
    }
    if (p->dir != port_dir::out) {
      error(e.from_pos, "'" + e.from_node + "." + p->name + "' is an in port; an edge must start at an out port",
            "edges go from an out port to an in port; out ports of " + k.name + ": " +
                join(port_names(k, port_dir::out)));
      return nullptr;
    }
    return p;
  }

  const port_decl* resolve_to(edge_spec& e, std::size_t ti, const node_kind& k, const port_decl* from) {
    if (e.to_port.empty()) {
      if (!from) return nullptr;  // the source end is wrong already: nothing to match against
      std::vector<const port_decl*> match;
      for (const auto* p : k.ports_of(port_dir::in))
        if (p->message_type == from->message_type) match.push_back(p);
      if (match.size() == 1) {
        e.to_port = match[0]->name;
        return match[0];
      }
      std::string src = e.from_node + "." + from->name;
      if (match.empty()) {
        auto ins = port_names(k, port_dir::in, true);
        error(e.to_pos, node_desc(ti) + " has no in port of type '" + from->message_type + "' for '" + src + "'",
              ins.empty() ? k.name + " has no in ports" : "in ports of " + k.name + ": " + join(ins));
      } else {
        std::vector<std::string> names;
        for (const auto* p : match) names.push_back(e.to_node + "." + p->name);
        error(e.to_pos,
              "ambiguous edge target: " + node_desc(ti) + " has several in ports of type '" + from->message_type + "'",
              "name the port: " + join(names, " or "));
      }
      return nullptr;
    }
    const port_decl* p = k.find_port(e.to_port);
    if (!p) {
      error(e.to_pos, node_desc(ti) + " has no port '" + e.to_port + "'",
            suggest(e.to_port, port_names(k, port_dir::in), "in ports of " + k.name));
      return nullptr;
    }
    if (p->dir != port_dir::in) {
      error(
          e.to_pos, "'" + e.to_node + "." + p->name + "' is an out port; an edge must end at an in port",
          "edges go from an out port to an in port; in ports of " + k.name + ": " + join(port_names(k, port_dir::in)));
      return nullptr;
    }
    return p;
  }

  void check_edges() {
    graph_spec& spec = result_.spec;
    arcs_.assign(spec.nodes.size(), {});
    std::map<std::tuple<std::size_t, std::string, std::size_t, std::string>, std::size_t> seen;
    for (std::size_t ei = 0; ei < spec.edges.size(); ++ei) {
      edge_spec& e = spec.edges[ei];
      if (!e.from_pos.known()) e.from_pos = e.pos;
      if (!e.to_pos.known()) e.to_pos = e.pos;
      std::size_t errors_before = result_.errors.size();
      if (e.credit < 0)
        error(e.pos, "edge credit must be >= 1, got " + std::to_string(e.credit), "write [credit=4], or leave it out");
      else if (e.credit > max_credit)
        error(e.pos, "edge credit must be <= " + std::to_string(max_credit) + ", got " + std::to_string(e.credit),
              "credit is how many messages may be in flight per link, and each link keeps a slot per credit: "
              "write [credit=4], or leave it out");
      auto fi = find_index(e.from_node, e.from_pos, "from");
      auto ti = find_index(e.to_node, e.to_pos, "to");
      const port_decl* fp = nullptr;
      const port_decl* tp = nullptr;
      if (fi && kind_of_[*fi]) fp = resolve_from(e, *fi, *kind_of_[*fi]);
      if (ti && kind_of_[*ti]) tp = resolve_to(e, *ti, *kind_of_[*ti], fp);
      if (fp && tp) {
        connected_.emplace(*fi, fp->name);
        connected_.emplace(*ti, tp->name);
        if (fp->message_type != tp->message_type) {
          auto producers = ports_of_type(tp->message_type, port_dir::out);
          error(e.to_pos,
                "message type mismatch: '" + e.from_node + "." + fp->name + "' sends '" + fp->message_type + "' but '" +
                    e.to_node + "." + tp->name + "' expects '" + tp->message_type + "'",
                producers.empty() ? "no node in the graph has an out port of type '" + tp->message_type + "'"
                                  : "out ports of type '" + tp->message_type + "': " + join(producers));
        } else {
          e.feedback = e.feedback || tp->feedback;
          auto key = std::make_tuple(*fi, e.from_port, *ti, e.to_port);
          if (auto it = seen.find(key); it != seen.end()) {
            const source_pos& first = spec.edges[it->second].pos;
            error(e.pos, "duplicate edge '" + e.to_string() + "'",
                  (first.known() ? "it is also written at " + where(first) + "; " : std::string()) + "remove one");
          } else {
            seen.emplace(key, ei);
            if (!e.feedback) arcs_[*fi].push_back({*ti, ei});
          }
        }
      }
      if (result_.errors.size() != errors_before) {
        if (fi) nodes_with_edge_errors_.insert(*fi);
        if (ti) nodes_with_edge_errors_.insert(*ti);
      }
    }
  }

  void check_required_ports() {
    const graph_spec& spec = result_.spec;
    for (std::size_t i = 0; i < spec.nodes.size(); ++i) {
      const node_kind* k = kind_of_[i];
      if (!k || nodes_with_edge_errors_.count(i)) continue;
      const node_spec& node = spec.nodes[i];
      for (const auto& p : k->ports) {
        if (!p.required || connected_.count({i, p.name})) continue;
        // an edge names the port but its other end's node is of an unknown kind: that node's error says what to
        // fix ("unknown node kind 'zero_ranks' (did you mean 'zero_rank'?)"); this one was said first and misled
        const bool named = std::any_of(spec.edges.begin(), spec.edges.end(), [&](const edge_spec& e) {
          const bool from = e.from_node == node.name && (e.from_port.empty() || e.from_port == p.name);
          const bool to = e.to_node == node.name && (e.to_port.empty() || e.to_port == p.name);
          if (!(p.dir == port_dir::out ? from : to)) return false;
          const auto other = index_.find(p.dir == port_dir::out ? e.to_node : e.from_node);
          return other != index_.end() && !kind_of_[other->second];
        });
        if (named) continue;
        std::string here = node.name + "." + p.name;
        std::string hint;
        if (p.dir == port_dir::in) {
          const std::string producer = suggested_port(p.message_type, port_dir::out, i, p.name);
          hint = producer.empty() ? "add an edge \"NODE.PORT -> " + here + "\" from an out port of type '" +
                                        p.message_type + "' to edges"
                                  : "add an edge such as \"" + producer + " -> " + here + "\" to edges";
        } else {
          const std::string consumer = suggested_port(p.message_type, port_dir::in, i, p.name);
          hint = consumer.empty() ? "add an edge \"" + here + " -> NODE.PORT\" to an in port of type '" +
                                        p.message_type + "' to edges"
                                  : "add an edge such as \"" + here + " -> " + consumer + "\" to edges";
        }
        error(node.pos,
              "required " + std::string(to_string(p.dir)) + " port '" + p.name + "' (" + p.message_type + ") of " +
                  node_desc(i) + " is not connected",
              hint);
      }
    }
  }

  // ------------------------------------------------------------- cycles

  // Linear in nodes + edges: Tarjan's strongly connected components
  // (iterative, so a long chain cannot overflow the stack), then one BFS per
  // component that holds a cycle, over that component's nodes only, with
  // scratch arrays shared by all of them (reset only where a BFS wrote).
  void check_cycles() {
    const std::size_t n = arcs_.size();
    std::vector<long> index(n, -1), low(n, 0), comp(n, -1);
    std::vector<bool> on_stack(n, false);
    std::vector<std::size_t> stack;
    long counter = 0, ncomp = 0;
    struct frame {
      std::size_t v;
      std::size_t next;  // the next arc of v to look at
    };
    std::vector<frame> calls;
    for (std::size_t root = 0; root < n; ++root) {
      if (index[root] >= 0) continue;
      calls.push_back({root, 0});
      index[root] = low[root] = counter++;
      stack.push_back(root);
      on_stack[root] = true;
      while (!calls.empty()) {
        frame& f = calls.back();
        const std::size_t v = f.v;
        if (f.next < arcs_[v].size()) {
          const std::size_t w = arcs_[v][f.next++].to;
          if (index[w] < 0) {
            index[w] = low[w] = counter++;
            stack.push_back(w);
            on_stack[w] = true;
            calls.push_back({w, 0});
          } else if (on_stack[w]) {
            low[v] = std::min(low[v], index[w]);
          }
          continue;
        }
        if (low[v] == index[v]) {
          while (true) {
            std::size_t w = stack.back();
            stack.pop_back();
            on_stack[w] = false;
            comp[w] = ncomp;
            if (w == v) break;
          }
          ++ncomp;
        }
        calls.pop_back();
        if (!calls.empty()) low[calls.back().v] = std::min(low[calls.back().v], low[v]);
      }
    }

    std::vector<bool> reported(static_cast<std::size_t>(ncomp), false);
    const graph_spec& spec = result_.spec;
    std::vector<long> via_edge(n, -1);
    std::vector<std::size_t> prev(n, n);
    std::vector<bool> seen(n, false);
    std::vector<std::size_t> touched;
    for (std::size_t start = 0; start < n; ++start) {
      const long c = comp[start];
      if (reported[static_cast<std::size_t>(c)]) continue;
      // A node alone in its component is on a cycle only through a self loop.
      bool has_cycle = false;
      for (const auto& a : arcs_[start]) has_cycle = has_cycle || comp[a.to] == c;
      if (!has_cycle) continue;
      // Shortest cycle through `start` inside its component (BFS).
      for (std::size_t t : touched) {
        seen[t] = false;
        prev[t] = n;
        via_edge[t] = -1;
      }
      touched.clear();
      std::deque<std::size_t> queue{start};
      seen[start] = true;
      touched.push_back(start);
      long closing = -1;
      std::size_t last = n;
      while (!queue.empty() && closing < 0) {
        std::size_t v = queue.front();
        queue.pop_front();
        for (const auto& a : arcs_[v]) {
          if (comp[a.to] != c) continue;
          if (a.to == start) {
            closing = static_cast<long>(a.edge);
            last = v;
            break;
          }
          if (!seen[a.to]) {
            seen[a.to] = true;
            touched.push_back(a.to);
            prev[a.to] = v;
            via_edge[a.to] = static_cast<long>(a.edge);
            queue.push_back(a.to);
          }
        }
      }
      if (closing < 0) continue;  // cannot happen: a component with an inner arc has a cycle through each node
      reported[static_cast<std::size_t>(c)] = true;
      std::vector<std::string> names{spec.nodes[start].name};  // built backwards, then reversed (linear)
      for (std::size_t v = last; v != start; v = prev[v]) names.push_back(spec.nodes[v].name);
      names.push_back(spec.nodes[start].name);
      std::reverse(names.begin(), names.end());
      const edge_spec& e = spec.edges[static_cast<std::size_t>(closing)];
      error(e.pos, "cycle without a feedback edge: " + join(names, " -> "),
            "a cycle only makes progress if one of its edges carries messages from an earlier step: mark one, e.g. \"" +
                e.to_string() + " [feedback]\", or declare its in port feedback in the node kind");
    }
  }
};

// Whether two stored values are one: equal, or the same number as an int and a float (1 and 1.0).
bool same_value(const setting_value& a, const setting_value& b) {
  if (a == b) return true;
  const auto* ia = std::get_if<std::int64_t>(&a);
  const auto* ib = std::get_if<std::int64_t>(&b);
  const auto* da = std::get_if<double>(&a);
  const auto* db = std::get_if<double>(&b);
  return (ia && db && static_cast<double>(*ia) == *db) || (da && ib && *da == static_cast<double>(*ib));
}

}  // namespace

validation_result validate(const graph_spec& spec, const node_kind_registry& kinds, const validate_options& options) {
  return validator(spec, kinds, options).run();
}

validation_result load_graph(const fs::path& file, const node_kind_registry& kinds, const validate_options& options,
                             const std::vector<std::string>& overrides) {
  parse_result parsed = parse_graph_file(file);
  validation_result out;
  out.errors = std::move(parsed.errors);
  if (parsed.fatal) {
    out.spec = std::move(parsed.spec);
    sort_errors(out.errors);
    return out;
  }
  // A PATH given twice with two values: the later holds (as every --set overrides the file), said, since one of them
  // was meant (flowrun train --actor-zero-stage 3 with a --set node.sft.zero_stage=1 after it ran stage 1). The
  // values are compared as stored (they were compared as text, then as TOML values, which a string setting is not).
  std::map<std::string, std::pair<std::string, setting_value>> given;  // PATH -> (text, value stored) so far
  for (const auto& o : overrides) {
    setting_value stored;
    if (auto e = apply_override(parsed.spec, o, &kinds, &stored)) {
      out.errors.push_back(std::move(*e));
      continue;
    }
    const auto eq = o.find('=');
    const std::string path = o.substr(0, eq), text = o.substr(eq + 1);
    if (const auto it = given.find(path); it != given.end() && !same_value(it->second.second, stored))
      out.warnings.push_back("--set " + path + " is given twice, as " + it->second.first + " and then " + text +
                             ": the later one holds");
    given[path] = {text, std::move(stored)};
  }
  validation_result v = validate(parsed.spec, kinds, options);
  out.spec = std::move(v.spec);
  out.errors.insert(out.errors.end(), std::make_move_iterator(v.errors.begin()),
                    std::make_move_iterator(v.errors.end()));
  sort_errors(out.errors);
  return out;
}

}  // namespace flowrun::graph
