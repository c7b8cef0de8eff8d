// Step 3's checkpoints (issue 16): a PPO run that dies at hour 9 resumes from its last
// committed iteration, not from the start.
//
// Layout, under the run's checkpoint folder ([graph] checkpoint_dir):
//   DIR/step3.json                  the commit point, written atomically by the controller after
//                                   every trainer has committed its shards of that iteration:
//                                   {"format": "flowrun-step3", "eval_before", "eval_before_stderr", "committed":
//                                    [{"iteration": J (iterations done), "policy_version"}, ...]}
//   DIR/<trainer>/step_XXXXXXXX/    each trainer's ZeRO shards of iteration J (shard_checkpoint.h:
//                                   fp32 masters, AdamW moments, the EMA, the RNG state and the
//                                   ptx data position; any world size resumes them)
// The prompt loader's position and the generator's sampling seeds are functions of the
// iteration, so the commit's iteration restores them.
//
// Resuming: every node calls find_step3_resume on the same files and gets the same answer:
// the newest committed iteration whose every trainer folder verifies (CRCs, sizes, ranks);
// a corrupt one is refused, naming the file, and the previous committed one is used.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace flowrun::ppo {

/// One committed iteration.
struct step3_point {
  int64_t iteration = 0;       ///< PPO iterations done (the next one to run)
  int64_t policy_version = 0;  ///< the policy's updates so far (the generator waits for this version)
};

/// What the controller commits.
struct step3_commit {
  double eval_before = 0;             ///< the held-out reward before training (the final line's "before")
  double eval_before_stderr = 0;      ///< ... and its standard error
  std::vector<step3_point> committed; ///< every committed iteration still on disk, oldest first
  /// The newest (the one to resume from); {0, 0} when none.
  step3_point last() const { return committed.empty() ? step3_point{} : committed.back(); }
};

/// Whether DIR holds step 3's commit file, DIR/step3.json (false for DIR ""): step 3 resumes
/// (find_step3_resume then names where, or throws). A cheap test: no checkpoint is read.
bool step3_committed(const std::string& dir);

/// Write DIR/step3.json atomically (temp file, fsync, rename). Throws std::runtime_error
/// naming the file on an I/O error.
void write_step3_commit(const std::string& dir, const step3_commit& c);

/// The resume point of DIR: `point`, the newest committed iteration J whose every trainer
/// folder (each subfolder of DIR holding step_* folders, but a steps 1-2 trainer's:
/// checkpoint_owner) has a step folder for J that verify_checkpoint accepts; `refused` says, per newer one
/// passed over, which file is wrong. nullopt: no DIR/step3.json (nothing committed, or
/// DIR is ""). Throws std::runtime_error when step3.json is unreadable or when no
/// committed iteration verifies (naming each problem).
struct step3_resume {
  step3_commit commit;  ///< as read
  step3_point point;    ///< where to resume
  std::vector<std::string> refused;
};
std::optional<step3_resume> find_step3_resume(const std::string& dir);

/// Whose checkpoints FOLDER (DIR/<trainer> of a checkpoint_dir) holds, by the first rank-0 manifest
/// of its step folders that reads: a steps 1-2 trainer's (sft_trainer, rm_trainer, dpo_trainer: their
/// `state`), a step-3 trainer's (its `policy_version`), or unknown (no folder, no manifest that reads,
/// another writer's). Step 3 passes over a steps 1-2 folder (one left by a stopped run made every
/// commit look incomplete); a steps 1-2 trainer removes its folder unless it is a step-3 trainer's.
enum class trainer_dir_owner { unknown, steps12, step3 };
trainer_dir_owner checkpoint_owner(const std::string& folder);

/// Remove every trainer's step folders (and their commits in step3.json's list) but the
/// `keep` newest committed iterations. Called by the controller after a commit.
void prune_step3(const std::string& dir, step3_commit& c, int keep);

}  // namespace flowrun::ppo
