#include "models/rlhf/ppo_checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "models/safetensors.h"
#include "models/train/shard_checkpoint.h"

namespace flowrun::ppo {

namespace fs = std::filesystem;

namespace {

std::string commit_path(const std::string& dir) { return (fs::path(dir) / "step3.json").string(); }

// The subfolders of DIR that hold step-3 trainer checkpoints (step_* folders), sorted by name. A
// step-1/2 trainer's folder is passed over: one left by a run stopped between its output and the
// removal of its mid-run checkpoints made every step-3 commit look incomplete (and prune_step3
// removed its folders).
std::vector<fs::path> trainer_dirs(const std::string& dir) {
  std::vector<fs::path> out;
  if (!fs::is_directory(dir)) return out;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (!e.is_directory()) continue;
    for (const auto& f : fs::directory_iterator(e.path()))
      if (f.is_directory() && f.path().filename().string().rfind("step_", 0) == 0) {
        if (checkpoint_owner(e.path().string()) != trainer_dir_owner::steps12) out.push_back(e.path());
        break;
      }
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

// A steps 1-2 trainer's `state` is written by actors/dschat_trainer.h, a step-3 trainer's policy_version by
// ppo_nodes.cpp.
trainer_dir_owner checkpoint_owner(const std::string& folder) {
  const fs::path t(folder);
  std::error_code ec;
  if (!fs::is_directory(t, ec)) return trainer_dir_owner::unknown;
  for (const auto& d : fs::directory_iterator(t)) {
    if (!d.is_directory() || d.path().filename().string().rfind("step_", 0) != 0) continue;
    for (const auto& f : fs::directory_iterator(d.path())) {
      const std::string n = f.path().filename().string();
      if (n.rfind("shard_00000-of-", 0) != 0 || f.path().extension() != ".msgpack") continue;
      try {
        const shard_manifest m = read_shard_manifest(f.path().string());
        if (m.extra.contains("policy_version")) return trainer_dir_owner::step3;
        if (m.extra.contains("state")) return trainer_dir_owner::steps12;
        return trainer_dir_owner::unknown;
      } catch (const std::exception&) {
        break;  // this step folder's manifest is damaged: another may say
      }
    }
  }
  return trainer_dir_owner::unknown;
}

void write_step3_commit(const std::string& dir, const step3_commit& c) {
  nlohmann::json pts = nlohmann::json::array();
  for (const auto& p : c.committed) pts.push_back({{"iteration", p.iteration}, {"policy_version", p.policy_version}});
  nlohmann::json j = {{"format", "flowrun-step3"}, {"eval_before", c.eval_before},
                     {"eval_before_stderr", c.eval_before_stderr}, {"committed", pts}};
  write_text_atomic(commit_path(dir), j.dump(1) + "\n");
}

bool step3_committed(const std::string& dir) { return !dir.empty() && fs::exists(commit_path(dir)); }

std::optional<step3_resume> find_step3_resume(const std::string& dir) {
  if (!step3_committed(dir)) return std::nullopt;
  step3_commit c;
  try {
    std::ifstream f(commit_path(dir));
    const auto j = nlohmann::json::parse(f);
    if (j.value("format", std::string()) != "flowrun-step3") throw std::runtime_error("format is not flowrun-step3");
    c.eval_before = j.at("eval_before").get<double>();
    c.eval_before_stderr = j.value("eval_before_stderr", 0.0);
    for (const auto& p : j.at("committed"))
      c.committed.push_back({p.at("iteration").get<int64_t>(), p.at("policy_version").get<int64_t>()});
  } catch (const std::exception& e) {
    throw std::runtime_error(commit_path(dir) + " is not a step-3 commit (" + e.what() +
                             "): delete it (and the folder's step_* checkpoints) to start step 3 afresh");
  }
  step3_resume r;
  const auto trainers = trainer_dirs(dir);
  r.commit = c;
  for (auto p = c.committed.rbegin(); p != c.committed.rend(); ++p) {
    const int64_t it = p->iteration;
    std::string problem;
    for (const auto& t : trainers) {
      const std::string folder = (t / step_folder_name(it)).string();
      try {
        verify_checkpoint(folder);
      } catch (const checkpoint_error& e) {  // without the loader's advice (use an older step folder):
        problem = e.problem;                  // that is what happens here anyway
        break;
      } catch (const std::exception& e) {
        problem = e.what();
        break;
      }
    }
    if (problem.empty()) {
      r.point = *p;
      return r;
    }
    // numbered as the "iter K" lines: the commit of `it` iterations is "after iteration it - 1"
    r.refused.push_back("after iteration " + std::to_string(it - 1) + " refused: " + problem +
                        (std::next(p) != c.committed.rend() ? "; the commit before it is tried" : ""));
  }
  std::string all;
  for (const auto& p : r.refused) all += "\n  " + p;
  throw std::runtime_error("no committed step-3 checkpoint in " + dir + " can be used:" + all +
                           "\n  delete " + dir + " to start step 3 afresh");
}

void prune_step3(const std::string& dir, step3_commit& c, int keep) {
  if (keep < 1 || static_cast<int>(c.committed.size()) <= keep) return;
  std::vector<int64_t> drop;
  for (auto p = c.committed.begin(); p != c.committed.end() - keep; ++p) drop.push_back(p->iteration);
  c.committed.erase(c.committed.begin(), c.committed.end() - keep);
  write_step3_commit(dir, c);  // the list first: a crash leaves folders, never a list naming removed ones
  for (const auto& t : trainer_dirs(dir))
    for (int64_t it : drop) fs::remove_all(t / step_folder_name(it));
}

}  // namespace flowrun::ppo
