// Hugging Face safetensors files (https://github.com/huggingface/safetensors,
// format described in its README and implemented in safetensors/src/tensor.rs):
//
//   [8 bytes]  N, the header length, unsigned 64-bit little endian
//   [N bytes]  a UTF-8 JSON object {"NAME": {"dtype": "F32", "shape": [2, 3],
//              "data_offsets": [BEGIN, END]}, ..., "__metadata__": {"k": "v"}}
//              (padded with spaces to a multiple of 8 bytes)
//   [rest]     the byte buffer; tensor NAME is bytes [BEGIN, END) of it,
//              row-major, little endian
//
// A sharded checkpoint (transformers' modeling_utils.py, SAFE_WEIGHTS_INDEX_NAME)
// is a folder with model-00001-of-0000K.safetensors files and
// model.safetensors.index.json = {"metadata": {"total_size": BYTES},
// "weight_map": {"NAME": "model-00001-of-0000K.safetensors", ...}}.
//
// flowrun computes in f32: reads convert F32, BF16 and F16 to f32 tensors;
// writes store a chosen dtype (f32, bf16, f16; round to nearest even).
// Every write is atomic: PATH.tmp, fsync, rename over PATH, fsync the folder.
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/tensor/tensor.h"

namespace flowrun {

/// One tensor of a safetensors header. `dtype` is the file's spelling ("F32",
/// "BF16", "F16", "I64", ...); begin/end are byte offsets into the data buffer.
struct safetensors_entry {
  std::string name;
  std::string dtype;
  shape_t shape;
  uint64_t begin = 0, end = 0;
};

/// An open safetensors file: the validated header, with tensors read on demand
/// (pread, so one file serves concurrent readers).
///
/// Errors (std::runtime_error, naming the file and, where one is at fault, the
/// tensor): missing file, header length beyond the file, header not a JSON
/// object, an entry without dtype/shape/data_offsets, an unknown dtype string,
/// offsets that are reversed, overlap another tensor or do not match
/// shape x dtype size, and a truncated file (offsets past the end of the data).
class safetensors_file {
 public:
  explicit safetensors_file(const std::string& path);
  ~safetensors_file();
  safetensors_file(const safetensors_file&) = delete;
  safetensors_file& operator=(const safetensors_file&) = delete;

  const std::string& path() const { return path_; }
  /// Entries in data-offset order.
  const std::vector<safetensors_entry>& entries() const { return entries_; }
  /// nullptr when absent.
  const safetensors_entry* find(const std::string& name) const;
  /// The "__metadata__" map (string to string), empty when absent.
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  /// Tensor `name` as a new CPU f32 tensor of its shape. Throws std::runtime_error
  /// naming the file and tensor when absent or of a dtype other than F32/BF16/F16.
  tensor read(const std::string& name) const;
  /// Read `name` into `dst`, a CPU f32 tensor with the same number of elements
  /// (the shape may differ, e.g. a view of a flat parameter buffer).
  void read_into(const std::string& name, tensor& dst) const;

 private:
  const safetensors_entry& at(const std::string& name) const;
  std::string path_;
  int fd_ = -1;
  uint64_t data_start_ = 0;  ///< file offset of the data buffer (8 + N)
  std::vector<safetensors_entry> entries_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

/// How far a long read or write of many tensors is (load_hf, save_hf, save_safetensors_checkpoint):
/// reported after each tensor, so `flowrun convert` can show "tensors k/N, bytes" with an ETA.
struct tensor_progress {
  int64_t tensors_done = 0, tensors_total = 0;  ///< tensors read or written so far, of all
  int64_t bytes_done = 0, bytes_total = 0;      ///< their bytes in the file(s) (the dtype on disk)
  std::string name;                             ///< the tensor just done (its name in the file)
};
/// Called once with nothing done (tensors_done 0) before the first tensor, then after each tensor,
/// on the calling thread. An empty function: no reports. An exception it throws ends the read or
/// write (each file is atomic_file: none is left half-written; of a sharded write the shards already
/// committed stay, without the index, and save_hf writes no config.json).
using tensor_progress_fn = std::function<void(const tensor_progress&)>;

/// A checkpoint: one .safetensors file, or a folder holding model.safetensors
/// or model.safetensors.index.json with its shards (transformers prefers
/// model.safetensors when both exist, and so do we).
/// Errors name the folder and what was looked for (a folder with only
/// pytorch_model.bin gets a hint to convert it to safetensors), a shard named in
/// the index that is missing, and a tensor whose index entry and shard disagree.
class safetensors_checkpoint {
 public:
  explicit safetensors_checkpoint(const std::string& dir_or_file);

  /// All tensor names, sorted.
  std::vector<std::string> names() const;
  bool contains(const std::string& name) const { return where_.count(name) != 0; }
  /// Throws std::runtime_error naming the checkpoint when absent.
  const safetensors_entry& entry(const std::string& name) const;
  /// The file holding `name`.
  const std::string& file_of(const std::string& name) const;
  tensor read(const std::string& name) const;
  void read_into(const std::string& name, tensor& dst) const;
  /// The files making up the checkpoint.
  std::vector<std::string> files() const;
  /// What the checkpoint was opened from (for messages).
  const std::string& where() const { return where_str_; }

 private:
  const safetensors_file& file_for(const std::string& name) const;
  std::string where_str_;
  std::vector<std::unique_ptr<safetensors_file>> files_;
  std::map<std::string, size_t> where_;
};

/// All tensors of one file (or checkpoint folder), as CPU f32 tensors.
std::map<std::string, tensor> load_safetensors(const std::string& path);

/// Named tensors to write, in order.
using named_tensors = std::vector<std::pair<std::string, tensor>>;

/// Write `tensors` (f32, bf16 or f16, on any device) to one file, stored as
/// `on_disk` (f32, bf16 or f16), in the given order, with "__metadata__" =
/// `metadata` (transformers needs {"format": "pt"}). Atomic. Throws
/// std::runtime_error naming the file on an I/O error, std::invalid_argument on
/// a duplicate name or a dtype that cannot be stored.
void save_safetensors(const std::string& path, const named_tensors& tensors, dtype on_disk = dtype::f32,
                      const std::map<std::string, std::string>& metadata = {{"format", "pt"}});

/// Write a checkpoint into folder `dir` (created if needed): DIR/model.safetensors,
/// or, when max_shard_bytes > 0 and the data exceeds it, shards
/// model-0000i-of-0000K.safetensors of at most max_shard_bytes each (a larger
/// tensor gets a shard of its own, as transformers' shard_checkpoint does) plus
/// model.safetensors.index.json, written last. Stale files of the other layout
/// (an older single file, index or shards) are removed afterwards so the folder
/// is unambiguous. Returns the file names written (without the folder). `progress`, when given,
/// hears of each tensor as its bytes are written, over all shards (tensor_progress).
std::vector<std::string> save_safetensors_checkpoint(const std::string& dir, const named_tensors& tensors,
                                                     dtype on_disk = dtype::f32, int64_t max_shard_bytes = 0,
                                                     const std::map<std::string, std::string>& metadata = {
                                                         {"format", "pt"}},
                                                     const tensor_progress_fn& progress = {});

/// The safetensors spelling of a storable dtype ("F32", "BF16", "F16", "I32", "I64").
const char* safetensors_dtype_name(dtype t);

/// A file written atomically: bytes go to PATH.tmp; commit() fsyncs, closes,
/// renames it over PATH and fsyncs the folder. Destroyed uncommitted, the
/// temporary file is removed. Errors name the file (std::runtime_error).
class atomic_file {
 public:
  explicit atomic_file(const std::string& path);
  ~atomic_file();
  atomic_file(const atomic_file&) = delete;
  atomic_file& operator=(const atomic_file&) = delete;
  void write(const void* data, size_t n);
  void write(const std::string& s) { write(s.data(), s.size()); }
  void commit();
  const std::string& path() const { return path_; }

 private:
  std::string path_, tmp_;
  int fd_ = -1;
  bool done_ = false;
};

/// Write `text` to `path` atomically (config.json, index files).
void write_text_atomic(const std::string& path, const std::string& text);

}  // namespace flowrun
