// ZeRO sharded training checkpoints: every rank writes its own share of the
// flat parameter / optimizer buffers, rank 0 commits, and a resume reassembles
// the full buffers so that any world size can re-slice them.
//
// The layout follows DeepSpeed's (deepspeed/runtime/engine.py,
// _get_zero_ckpt_name / _get_ckpt_name): a folder per step ("global_step{N}"
// there, step_XXXXXXXX here) holding one file per rank with that rank's
// partition of the fp32 master weights and the optimizer moments
// (zero_pp_rank_{r}_mp_rank_00_optim_states.pt there) plus the model/run state
// (mp_rank_00_model_states.pt there), and a `latest` file naming the newest
// complete step folder (DeepSpeed's "latest" tag file). Instead of pickles,
// tensors are stored in safetensors files (models/safetensors.h) and the
// per-rank state in a small msgpack manifest:
//
//   DIR/latest                                     "step_00001234\n": the commit point
//   DIR/step_00001234/shard_00000-of-00004.safetensors
//         tensors "<group>.<tensor>" (e.g. "base.fp32_master", "base.exp_avg",
//         "base.exp_avg_sq", "adapter.fp32_master", ...), each F32 of shape
//         (local numel,): the rank's real elements only (no ZeRO padding),
//         concatenated in the order of its ranges; __metadata__ {"format":
//         "flowrun-zero-shard", "step", "rank", "world_size"}.
//   DIR/step_00001234/shard_00000-of-00004.msgpack
//         the manifest: a msgpack map (keys below) followed by a second msgpack
//         object, the CRC-32 (zlib) of the map's bytes, so a damaged manifest is
//         detected too. Keys: format "flowrun-zero-shard", version 1, step,
//         world_size, rank, zero_stage, config_hash, data_epoch, data_cursor,
//         rng_state (bin), loss_scale (float64), loss_scale_good_steps,
//         extra (a JSON text), groups [{name, full_numel, ranges [[begin, end], ...],
//         tensors [names]}], tensors_file, tensors_bytes, tensors_crc32 (CRC-32 of
//         the whole .safetensors file), created_by, saved_at_ns (when it was written, ns
//         since the Unix epoch; absent in older manifests). Readable with any msgpack library
//         (Python: list(msgpack.Unpacker(open(f, "rb"), raw=False))).
//
// Writing is crash safe: every file is written atomically (PATH.tmp, fsync,
// rename, fsync the folder: models/safetensors.h atomic_file), the tensors
// before the manifest that records their checksum, and `latest` only after all
// ranks have written (commit_checkpoint). A crash at any point leaves `latest`
// naming the previous complete step folder.
//
// Flat buffers and ranges: a run keeps its trainable parameters in named flat
// f32 buffers ("groups": "base" = decoder::w().flat, "adapter" =
// decoder::w().adapter_flat for LoRA). With ZeRO over N ranks each rank owns
// ranges of each buffer (e.g. every block [begin, end) padded to a multiple of
// N, rank r owning [begin + r*p, min(begin + (r+1)*p, end)) with
// p = ceil((end-begin)/N)); the checkpoint stores any such layout as explicit
// ranges, and loading checks that the ranges of all ranks cover the whole
// buffer exactly once. Replicated state (ZeRO stage 0) is stored by one rank,
// the others giving empty ranges.
#pragma once

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/config.h"
#include "runtime/tensor/tensor.h"

namespace flowrun {

class decoder;

/// A checkpoint that cannot be written or used: what() names the exact file, what
/// is wrong with it and what to do. `problem` is what() without the advice, for a caller
/// that acts on its own (the step-3 resume falls back to the commit before).
struct checkpoint_error : std::runtime_error {
  explicit checkpoint_error(const std::string& what) : std::runtime_error(what), problem(what) {}
  checkpoint_error(const std::string& what_is_wrong, const std::string& advice)
      : std::runtime_error(what_is_wrong + advice), problem(what_is_wrong) {}
  std::string problem;
};

/// Elements [begin, end) of a full flat buffer.
struct flat_range {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
  bool operator==(const flat_range& o) const { return begin == o.begin && end == o.end; }
};

/// One flat buffer's share held by one rank.
struct shard_group {
  std::string name;             ///< "base", "adapter", ...: letters, digits, '_' and '-' (no '.')
  int64_t full_numel = 0;       ///< numel of the whole flat buffer
  std::vector<flat_range> ranges;  ///< in local order; the sum of their sizes is the local numel
  /// The rank's local buffers, e.g. "fp32_master", "exp_avg", "exp_avg_sq": each
  /// f32 with local numel elements (any shape, any device; stored flat).
  std::map<std::string, tensor> tensors;
  /// The local numel: the sum of the ranges' sizes.
  int64_t local_numel() const;
};

/// What a manifest says about one group (filled when a manifest is read).
struct shard_group_layout {
  std::string name;
  int64_t full_numel = 0;
  std::vector<flat_range> ranges;
  std::vector<std::string> tensor_names;  ///< sorted
};

/// One rank's run state, saved next to its tensors.
struct shard_manifest {
  int64_t step = 0;             ///< optimizer steps done
  int world_size = 1, rank = 0;
  int zero_stage = 0;
  /// Fingerprint of the model config and the settings that must match on resume
  /// (e.g. config_fingerprint(json)); load_checkpoint checks all ranks agree,
  /// the caller compares it with its own.
  std::string config_hash;
  int64_t data_epoch = 0, data_cursor = 0;  ///< data position
  std::vector<uint8_t> rng_state;           ///< opaque per-rank RNG bytes
  double loss_scale = 1.0;                  ///< fp16 dynamic loss scaler
  int64_t loss_scale_good_steps = 0;
  /// Anything else (LR scheduler state, the model config, ...): stored as JSON text.
  nlohmann::json extra = nlohmann::json::object();

  // Filled by save_shard (ignored on input) and by reading a manifest:
  std::string tensors_file;     ///< "shard_RRRRR-of-NNNNN.safetensors" (in the step folder)
  uint64_t tensors_bytes = 0;   ///< its size
  uint32_t tensors_crc32 = 0;   ///< CRC-32 (zlib crc32) of the whole file
  std::vector<shard_group_layout> groups;  ///< filled when read, sorted by name
  /// When save_shard wrote it: the system clock, ns since the Unix epoch; 0 in a manifest
  /// from before the field (2026-12-07). latest_checkpoint orders step folders by it.
  int64_t saved_at_ns = 0;
};

/// "step_00001234" (at least 8 digits).
std::string step_folder_name(int64_t step);
/// "shard_00001-of-00004" (file stem; at least 5 digits each).
std::string shard_file_stem(int rank, int world_size);

/// Write rank `m.rank`'s shard of step `m.step` into DIR/step_XXXXXXXX/ (created as
/// needed): shard_RRRRR-of-NNNNN.safetensors with every group's tensors, then the
/// manifest shard_RRRRR-of-NNNNN.msgpack (see the file comment). Each rank calls it
/// for itself (no communication); nothing is committed until commit_checkpoint.
/// Rewriting an existing shard replaces it atomically. Returns the step folder.
/// Throws std::invalid_argument on bad input (rank outside [0, world_size), a group
/// name that is empty, repeated or holds '.', a range outside [0, full_numel) or
/// reversed, a tensor that is not f32 or whose numel differs from the ranges'),
/// checkpoint_error naming the file on an I/O error (disk full, ...).
std::string save_shard(const std::string& dir, const shard_manifest& m, const std::vector<shard_group>& groups);

/// Rank 0, after every rank's save_shard returned (the caller puts a barrier
/// before): checks that the step folder holds the `world_size` manifests and
/// tensors files with the sizes the manifests record (no checksums: that is
/// load_checkpoint's job), removes leftovers in the folder (shard files of another
/// world size from an abandoned attempt, *.tmp files), then atomically writes
/// DIR/latest = "step_XXXXXXXX\n": the commit point. Then keeps the `keep` newest
/// step folders up to and including this one, removing older step_* folders
/// (never the one just committed, nor newer ones, which a run restarted from an
/// older step may have left; keep < 1 keeps all). Throws checkpoint_error naming
/// the missing or incomplete file.
void commit_checkpoint(const std::string& dir, int64_t step, int world_size, int keep = 2);

/// The committed step folder DIR/step_XXXXXXXX named by DIR/latest. Where `latest`
/// cannot say: without it (nothing committed yet, or the file deleted) the step folder
/// saved last (its rank-0 manifest's saved_at_ns, which a copy keeps; ties, as between
/// folders from before the field: the higher step) that verifies (verify_checkpoint:
/// complete, every CRC right), else "" (a crash during the first save leaves a folder that
/// does not verify); when it names a folder that is gone, the same among the folders up to
/// that step. Saved last, not the highest step: a `resume = false` run into a folder that
/// holds an earlier run's higher steps writes below them. `note`
/// (when given) gets a sentence saying which folder was taken and why, and which higher
/// ones were passed over, for the caller to print; it is left alone when `latest` decided.
/// Throws checkpoint_error when `latest` is malformed, or names a missing folder and no
/// other up to that step verifies (naming the higher ones).
std::string latest_checkpoint(const std::string& dir, std::string* note = nullptr);

/// Whether `path` looks like a checkpoint: a folder holding `latest` or shard
/// manifests (shard_*-of-*.msgpack).
bool is_checkpoint(const std::string& path);

/// The tokenizer a pretraining run's data node read: the `tokenizer` of the settings record
/// (NAME.settings.json, actors/zero_nodes.cpp's lm_batches) in `path` (the run's output_dir) or,
/// when `path` is one of its step folders, beside it; "" when no record names one that exists.
/// `flowrun generate --zero_checkpoint` reads it when --tokenizer is not given, and zero_rank's
/// export_hf writes it beside a model whose source has no tokenizer of its own (a llama2.c file).
/// `contents` (when given) gets the record's fingerprint of the tokenizer's bytes ("tokenizer (contents)",
/// actors::tokenizer_fingerprint), "" when the record has none.
std::string run_data_tokenizer(const std::string& path, std::string* contents = nullptr);

/// Read and check one manifest file (its CRC-32, format and keys). Throws
/// checkpoint_error naming the file.
shard_manifest read_shard_manifest(const std::string& path);

/// A verified checkpoint.
struct loaded_checkpoint {
  std::string folder;                       ///< the step folder
  int64_t step = 0;
  int world_size = 0;
  std::vector<shard_manifest> manifests;    ///< indexed by (old) rank
  /// group -> tensor name -> the FULL flat buffer (full_numel,) f32 on the CPU,
  /// reassembled from all shards bit for bit. Empty after verify_checkpoint.
  std::map<std::string, std::map<std::string, tensor>> full;
};

/// Check a checkpoint without loading tensors. `path` is a checkpoint folder
/// (with `latest`) or a step folder. Reads every manifest and checks: all N
/// manifests of one world size exist; each manifest's CRC; rank, world size and
/// step agree with the file names and each other, as do zero_stage, config_hash
/// and the groups (names, full_numel, tensor names); every tensors file exists
/// with the recorded size and CRC-32 and holds exactly the listed F32 tensors of
/// the local numel; the ranges of each group cover [0, full_numel) exactly once.
/// Throws checkpoint_error naming the exact file and the problem, and saying what
/// to do, e.g. "DIR/step_00000020/shard_00001-of-00002.safetensors is corrupt
/// (CRC-32 0x1234abcd != 0x9f00e1c2 recorded in shard_00001-of-00002.msgpack): the
/// checkpoint DIR/step_00000020 cannot be used; use the older step folder
/// DIR/step_00000010 (write step_00000010 into DIR/latest to resume from it), or start fresh".
loaded_checkpoint verify_checkpoint(const std::string& path);

/// verify_checkpoint, then read every shard and reassemble `full`. Nothing is
/// read unless everything verifies. Throws checkpoint_error (as above).
loaded_checkpoint load_checkpoint(const std::string& path);

/// The model of a checkpoint as a Hugging Face folder: config.json and
/// model.safetensors (save_hf) from the "base" group's "fp32_master", for a model
/// of config `cfg`. Throws checkpoint_error when the checkpoint has no base
/// fp32_master or its size is not cfg's parameter count.
void export_consolidated(const loaded_checkpoint& ckpt, const model_config& cfg, const std::string& out_dir);

/// The same with a model that has the run's layout (LoRA enabled, value head,
/// ...): its w().flat is overwritten with the base fp32_master (when the
/// checkpoint has a base group) and its w().adapter_flat with the "adapter"
/// group's fp32_master (when present); then writes save_hf(model, out_dir) and,
/// when the model has LoRA, the PEFT adapter into out_dir/adapter (save_adapter).
void export_consolidated(const loaded_checkpoint& ckpt, decoder& model, const std::string& out_dir);

/// A short fingerprint of bytes: 16 hex digits of their 64-bit FNV-1a hash.
std::string bytes_fingerprint(std::string_view bytes);

/// bytes_fingerprint of j.dump() (whose object keys are sorted): for shard_manifest::config_hash.
std::string config_fingerprint(const nlohmann::json& j);

}  // namespace flowrun
