#include "models/safetensors.h"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <stdexcept>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

namespace flowrun {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little endian; flowrun reads it in place on little-endian hosts only");

namespace fs = std::filesystem;

namespace {

// The safetensors limit on the header (safetensors/src/tensor.rs, MAX_HEADER_SIZE).
constexpr uint64_t k_max_header = 100'000'000;
// Bytes converted per chunk when reading or writing 16-bit data.
constexpr size_t k_chunk = size_t{1} << 20;

// Element sizes of the dtypes safetensors defines (tensor.rs, enum Dtype).
int64_t st_dtype_size(const std::string& d) {
  static const std::map<std::string, int64_t> sizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"I16", 2}, {"U16", 2},
      {"F16", 2},  {"BF16", 2}, {"I32", 4}, {"U32", 4},     {"F32", 4},     {"F64", 8}, {"I64", 8},
      {"U64", 8}};
  auto it = sizes.find(d);
  return it == sizes.end() ? -1 : it->second;
}

std::string errno_str() { return std::strerror(errno); }

void pread_all(int fd, void* dst, size_t n, uint64_t off, const std::string& path, const std::string& what) {
  char* p = static_cast<char*>(dst);
  while (n > 0) {
    ssize_t r = ::pread(fd, p, n, static_cast<off_t>(off));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0)
      throw std::runtime_error(path + ": reading " + what + " failed at byte " + std::to_string(off) + ": " +
                               (r == 0 ? std::string("unexpected end of file (truncated?)") : errno_str()));
    p += r;
    n -= static_cast<size_t>(r);
    off += static_cast<uint64_t>(r);
  }
}

void fsync_dir(const fs::path& dir) {
  int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd >= 0) {
    ::fsync(fd);  // best effort: some file systems refuse fsync on directories
    ::close(fd);
  }
}

}  // namespace

const char* safetensors_dtype_name(dtype t) {
  switch (t) {
    case dtype::f32: return "F32";
    case dtype::bf16: return "BF16";
    case dtype::f16: return "F16";
    case dtype::i32: return "I32";
    case dtype::i64: return "I64";
  }
  return "?";
}

// ------------------------------------------------------------------ atomic_file

atomic_file::atomic_file(const std::string& path) : path_(path), tmp_(path + ".tmp") {
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) throw std::runtime_error(tmp_ + ": cannot create: " + errno_str());
}

atomic_file::~atomic_file() {
  if (!done_) {
    if (fd_ >= 0) ::close(fd_);
    ::unlink(tmp_.c_str());
  }
}

void atomic_file::write(const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd_, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) throw std::runtime_error(tmp_ + ": write failed: " + errno_str() + " (disk full?)");
    p += w;
    n -= static_cast<size_t>(w);
  }
}

void atomic_file::commit() {
  if (::fsync(fd_) != 0) throw std::runtime_error(tmp_ + ": fsync failed: " + errno_str());
  int rc = ::close(fd_);
  fd_ = -1;
  if (rc != 0) throw std::runtime_error(tmp_ + ": close failed: " + errno_str());
  if (::rename(tmp_.c_str(), path_.c_str()) != 0)
    throw std::runtime_error(tmp_ + ": cannot rename to " + path_ + ": " + errno_str());
  done_ = true;
  fsync_dir(fs::path(path_).parent_path());
}

void write_text_atomic(const std::string& path, const std::string& text) {
  atomic_file f(path);
  f.write(text);
  f.commit();
}

// ------------------------------------------------------------------ reading

safetensors_file::safetensors_file(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw std::runtime_error(path + ": cannot open safetensors file: " + errno_str());
  try {
    struct stat st {};
    if (::fstat(fd_, &st) != 0) throw std::runtime_error(path + ": cannot stat: " + errno_str());
    const uint64_t file_size = static_cast<uint64_t>(st.st_size);
    if (file_size < 8)
      throw std::runtime_error(path + ": not a safetensors file: " + std::to_string(file_size) +
                               " bytes, smaller than the 8-byte header length");
    uint64_t n = 0;
    pread_all(fd_, &n, 8, 0, path, "the header length");
    if (n > k_max_header || n > file_size - 8)
      throw std::runtime_error(path + ": bad safetensors header: header length " + std::to_string(n) +
                               " exceeds the file size (" + std::to_string(file_size) +
                               " bytes) or the 100 MB limit; truncated or not a safetensors file");
    std::string text(n, '\0');
    pread_all(fd_, text.data(), n, 8, path, "the header");
    data_start_ = 8 + n;
    const uint64_t data_size = file_size - data_start_;
    nlohmann::json h;
    try {
      h = nlohmann::json::parse(text);
    } catch (const std::exception& e) {
      throw std::runtime_error(path + ": bad safetensors header: not JSON (" + e.what() + ")");
    }
    if (!h.is_object()) throw std::runtime_error(path + ": bad safetensors header: not a JSON object");
    for (auto& [key, val] : h.items()) {
      if (key == "__metadata__") {
        if (!val.is_object())
          throw std::runtime_error(path + ": bad safetensors header: __metadata__ is not an object");
        for (auto& [mk, mv] : val.items()) {
          if (!mv.is_string())
            throw std::runtime_error(path + ": bad safetensors header: __metadata__[\"" + mk +
                                     "\"] is not a string (safetensors allows string values only)");
          metadata_[mk] = mv.get<std::string>();
        }
        continue;
      }
      auto bad = [&](const std::string& why) {
        return std::runtime_error(path + ": bad safetensors header entry for tensor '" + key + "': " + why);
      };
      if (!val.is_object() || !val.contains("dtype") || !val.contains("shape") || !val.contains("data_offsets"))
        throw bad("needs an object with dtype, shape and data_offsets");
      safetensors_entry e;
      e.name = key;
      if (!val["dtype"].is_string()) throw bad("dtype is not a string");
      e.dtype = val["dtype"].get<std::string>();
      const int64_t esize = st_dtype_size(e.dtype);
      if (esize < 0) throw bad("unknown dtype '" + e.dtype + "'");
      if (!val["shape"].is_array()) throw bad("shape is not an array");
      for (auto& d : val["shape"]) {
        if (!d.is_number_unsigned()) throw bad("shape " + val["shape"].dump() + " has a non-integer or negative size");
        e.shape.push_back(d.get<int64_t>());
      }
      auto& off = val["data_offsets"];
      if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
        throw bad("data_offsets must be [BEGIN, END] with non-negative integers, got " + off.dump());
      e.begin = off[0].get<uint64_t>();
      e.end = off[1].get<uint64_t>();
      if (e.end < e.begin) throw bad("data_offsets " + off.dump() + " are reversed");
      const uint64_t want = static_cast<uint64_t>(shape_numel(e.shape)) * static_cast<uint64_t>(esize);
      if (e.end - e.begin != want)
        throw bad("data_offsets " + off.dump() + " span " + std::to_string(e.end - e.begin) + " bytes but shape " +
                  shape_str(e.shape) + " of " + e.dtype + " needs " + std::to_string(want));
      if (e.end > data_size)
        throw bad("data_offsets " + off.dump() + " run past the end of the data (" + std::to_string(data_size) +
                  " bytes): the file is truncated");
      entries_.push_back(std::move(e));
    }
    std::sort(entries_.begin(), entries_.end(), [](const auto& a, const auto& b) {
      return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
    });
    for (size_t i = 0; i < entries_.size(); ++i) {
      if (i > 0 && entries_[i].begin < entries_[i - 1].end)
        throw std::runtime_error(path + ": bad safetensors header: tensors '" + entries_[i - 1].name + "' and '" +
                                 entries_[i].name + "' overlap in the data buffer");
      index_[entries_[i].name] = i;
    }
  } catch (...) {
    ::close(fd_);
    fd_ = -1;
    throw;
  }
}

safetensors_file::~safetensors_file() {
  if (fd_ >= 0) ::close(fd_);
}

const safetensors_entry* safetensors_file::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &entries_[it->second];
}

const safetensors_entry& safetensors_file::at(const std::string& name) const {
  auto* e = find(name);
  if (!e) throw std::runtime_error(path_ + ": no tensor named '" + name + "'");
  return *e;
}

tensor safetensors_file::read(const std::string& name) const {
  auto t = tensor::empty(at(name).shape, dtype::f32);
  read_into(name, t);
  return t;
}

void safetensors_file::read_into(const std::string& name, tensor& dst) const {
  const auto& e = at(name);
  const int64_t n = shape_numel(e.shape);
  if (!dst.defined() || dst.type() != dtype::f32 || dst.dev() != device::cpu() || dst.numel() != n)
    throw std::invalid_argument(path_ + ": tensor '" + name + "' " + shape_str(e.shape) +
                                " cannot be read into " + (dst.defined() ? dst.str() : std::string("an undefined tensor")) +
                                " (needs a CPU f32 tensor of the same size)");
  float* out = dst.data<float>();
  const uint64_t off = data_start_ + e.begin;
  const std::string what = "tensor '" + name + "'";
  if (e.dtype == "F32") {
    pread_all(fd_, out, static_cast<size_t>(n) * 4, off, path_, what);
    return;
  }
  if (e.dtype != "BF16" && e.dtype != "F16")
    throw std::runtime_error(path_ + ": tensor '" + name + "' has dtype " + e.dtype +
                             ", unsupported: flowrun reads F32, BF16 and F16 weights (convert the checkpoint, e.g. "
                             "model.to(torch.float32).save_pretrained(dir, safe_serialization=True))");
  const bool bf = e.dtype == "BF16";
  std::vector<uint16_t> buf(std::min<size_t>(static_cast<size_t>(n), k_chunk));
  for (int64_t i = 0; i < n;) {
    size_t m = std::min<size_t>(buf.size(), static_cast<size_t>(n - i));
    pread_all(fd_, buf.data(), m * 2, off + static_cast<uint64_t>(i) * 2, path_, what);
    for (size_t j = 0; j < m; ++j) out[i + j] = bf ? bf16_to_float(buf[j]) : f16_to_float(buf[j]);
    i += static_cast<int64_t>(m);
  }
}

// ------------------------------------------------------------------ checkpoints

safetensors_checkpoint::safetensors_checkpoint(const std::string& dir_or_file) : where_str_(dir_or_file) {
  fs::path p(dir_or_file);
  auto add_file = [&](const fs::path& f) {
    files_.push_back(std::make_unique<safetensors_file>(f.string()));
    return files_.size() - 1;
  };
  if (!fs::exists(p)) throw std::runtime_error(dir_or_file + ": no such safetensors file or folder");
  if (!fs::is_directory(p)) {
    size_t i = add_file(p);
    for (auto& e : files_[i]->entries()) where_[e.name] = i;
    return;
  }
  if (fs::exists(p / "model.safetensors")) {
    size_t i = add_file(p / "model.safetensors");
    for (auto& e : files_[i]->entries()) where_[e.name] = i;
    return;
  }
  fs::path index = p / "model.safetensors.index.json";
  if (!fs::exists(index)) {
    std::string hint;
    if (fs::exists(p / "pytorch_model.bin") || fs::exists(p / "pytorch_model.bin.index.json"))
      hint = "; it holds pytorch_model.bin (pickle), which flowrun does not read: convert it with "
             "transformers (AutoModelForCausalLM.from_pretrained(dir).save_pretrained(dir, safe_serialization=True))";
    throw std::runtime_error(dir_or_file + ": no model.safetensors or model.safetensors.index.json" + hint);
  }
  nlohmann::json j;
  try {
    std::ifstream f(index);
    j = nlohmann::json::parse(f);
  } catch (const std::exception& e) {
    throw std::runtime_error(index.string() + ": not valid JSON: " + e.what());
  }
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
    throw std::runtime_error(index.string() + ": no \"weight_map\" object (not a safetensors index)");
  std::map<std::string, size_t> shard_ix;
  for (auto& [name, file] : j["weight_map"].items()) {
    if (!file.is_string())
      throw std::runtime_error(index.string() + ": weight_map[\"" + name + "\"] is not a file name");
    std::string fname = file.get<std::string>();
    auto it = shard_ix.find(fname);
    if (it == shard_ix.end()) {
      fs::path shard = p / fname;
      if (!fs::exists(shard))
        throw std::runtime_error(index.string() + ": shard " + fname + " (holding '" + name + "') is missing");
      it = shard_ix.emplace(fname, add_file(shard)).first;
    }
    if (!files_[it->second]->find(name))
      throw std::runtime_error(index.string() + ": weight_map puts tensor '" + name + "' in " + fname +
                               ", but that shard has no such tensor");
    where_[name] = it->second;
  }
  where_str_ = index.string();
}

std::vector<std::string> safetensors_checkpoint::names() const {
  std::vector<std::string> out;
  for (auto& [n, i] : where_) out.push_back(n);
  return out;
}

const safetensors_file& safetensors_checkpoint::file_for(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) throw std::runtime_error(where_str_ + ": no tensor named '" + name + "'");
  return *files_[it->second];
}

const safetensors_entry& safetensors_checkpoint::entry(const std::string& name) const {
  return *file_for(name).find(name);
}

const std::string& safetensors_checkpoint::file_of(const std::string& name) const { return file_for(name).path(); }

tensor safetensors_checkpoint::read(const std::string& name) const { return file_for(name).read(name); }

void safetensors_checkpoint::read_into(const std::string& name, tensor& dst) const {
  file_for(name).read_into(name, dst);
}

std::vector<std::string> safetensors_checkpoint::files() const {
  std::vector<std::string> out;
  for (auto& f : files_) out.push_back(f->path());
  return out;
}

std::map<std::string, tensor> load_safetensors(const std::string& path) {
  safetensors_checkpoint ck(path);
  std::map<std::string, tensor> out;
  for (auto& n : ck.names()) out[n] = ck.read(n);
  return out;
}

// ------------------------------------------------------------------ writing

namespace {

void check_storable(const std::string& path, dtype on_disk) {
  if (on_disk != dtype::f32 && on_disk != dtype::bf16 && on_disk != dtype::f16)
    throw std::invalid_argument(path + ": weights can be stored as f32, bf16 or f16, not " +
                                std::string(dtype_name(on_disk)));
}

// Write one tensor's data as `on_disk`.
void write_data(atomic_file& f, const std::string& name, const tensor& t_in, dtype on_disk) {
  tensor t = t_in.to(device::cpu());
  if (t.type() != dtype::f32 && t.type() != dtype::bf16 && t.type() != dtype::f16)
    throw std::invalid_argument(f.path() + ": tensor '" + name + "' is " + t.str() +
                                "; only f32, bf16 and f16 tensors are written");
  if (t.type() == on_disk) {
    f.write(t.raw(), t.nbytes());
    return;
  }
  if (t.type() != dtype::f32) t = t.to(dtype::f32);
  const float* p = t.data<float>();
  const int64_t n = t.numel();
  if (on_disk == dtype::f32) {
    f.write(p, t.nbytes());
    return;
  }
  std::vector<uint16_t> buf(std::min<size_t>(static_cast<size_t>(n), k_chunk));
  for (int64_t i = 0; i < n;) {
    size_t m = std::min<size_t>(buf.size(), static_cast<size_t>(n - i));
    for (size_t j = 0; j < m; ++j) buf[j] = on_disk == dtype::bf16 ? float_to_bf16(p[i + j]) : float_to_f16(p[i + j]);
    f.write(buf.data(), m * 2);
    i += static_cast<int64_t>(m);
  }
}

// save_safetensors with a progress report after each tensor (`at` counts over all files of a checkpoint).
void write_file(const std::string& path, const named_tensors& tensors, dtype on_disk,
                const std::map<std::string, std::string>& metadata, tensor_progress* at,
                const tensor_progress_fn& progress) {
  check_storable(path, on_disk);
  // nlohmann::ordered_json keeps the data order in the header, like the Rust writer.
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  if (!metadata.empty()) h["__metadata__"] = metadata;
  uint64_t off = 0;
  std::set<std::string> seen;
  for (auto& [name, t] : tensors) {
    if (name == "__metadata__" || !seen.insert(name).second)
      throw std::invalid_argument(path + ": tensor name '" + name + "' is duplicated or reserved");
    if (!t.defined()) throw std::invalid_argument(path + ": tensor '" + name + "' is undefined");
    uint64_t nb = static_cast<uint64_t>(t.numel()) * dtype_size(on_disk);
    h[name] = {{"dtype", safetensors_dtype_name(on_disk)}, {"shape", t.shape()}, {"data_offsets", {off, off + nb}}};
    off += nb;
  }
  std::string text = h.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the Rust writer aligns the data to 8 bytes
  uint64_t n = text.size();
  atomic_file f(path);
  f.write(&n, 8);
  f.write(text);
  for (auto& [name, t] : tensors) {
    write_data(f, name, t, on_disk);
    if (progress) {
      ++at->tensors_done;
      at->bytes_done += t.numel() * static_cast<int64_t>(dtype_size(on_disk));
      at->name = name;
      progress(*at);
    }
  }
  f.commit();
}

}  // namespace

void save_safetensors(const std::string& path, const named_tensors& tensors, dtype on_disk,
                      const std::map<std::string, std::string>& metadata) {
  write_file(path, tensors, on_disk, metadata, nullptr, {});
}

std::vector<std::string> save_safetensors_checkpoint(const std::string& dir, const named_tensors& tensors,
                                                     dtype on_disk, int64_t max_shard_bytes,
                                                     const std::map<std::string, std::string>& metadata,
                                                     const tensor_progress_fn& progress) {
  check_storable(dir, on_disk);
  fs::path d(dir);
  std::error_code ec;
  fs::create_directories(d, ec);
  if (!fs::is_directory(d)) throw std::runtime_error(dir + ": cannot create the checkpoint folder: " + ec.message());
  // group tensors into shards greedily, in order (transformers' shard_checkpoint)
  std::vector<named_tensors> shards(1);
  uint64_t cur = 0, total = 0;
  for (auto& nt : tensors) {
    uint64_t nb = static_cast<uint64_t>(nt.second.numel()) * dtype_size(on_disk);
    if (max_shard_bytes > 0 && !shards.back().empty() && cur + nb > static_cast<uint64_t>(max_shard_bytes)) {
      shards.emplace_back();
      cur = 0;
    }
    shards.back().push_back(nt);
    cur += nb;
    total += nb;
  }
  tensor_progress at;
  at.tensors_total = static_cast<int64_t>(tensors.size());
  at.bytes_total = static_cast<int64_t>(total);
  if (progress) progress(at);
  std::vector<std::string> written;
  std::set<std::string> keep;
  if (shards.size() == 1) {
    write_file((d / "model.safetensors").string(), tensors, on_disk, metadata, &at, progress);
    written.push_back("model.safetensors");
  } else {
    const size_t K = shards.size();
    nlohmann::ordered_json wm = nlohmann::ordered_json::object();
    char buf[64];
    for (size_t i = 0; i < K; ++i) {
      std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", i + 1, K);
      write_file((d / buf).string(), shards[i], on_disk, metadata, &at, progress);
      for (auto& [name, t] : shards[i]) wm[name] = buf;
      written.push_back(buf);
    }
    nlohmann::ordered_json idx = {{"metadata", {{"total_size", total}}}, {"weight_map", wm}};
    write_text_atomic((d / "model.safetensors.index.json").string(), idx.dump(2) + "\n");
    written.push_back("model.safetensors.index.json");
  }
  // remove files of another layout left by an earlier save into this folder
  keep.insert(written.begin(), written.end());
  static const std::regex shard_re(R"(model-\d{5}-of-\d{5}\.safetensors)");
  for (auto& ent : fs::directory_iterator(d)) {
    std::string fn = ent.path().filename().string();
    bool ours = fn == "model.safetensors" || fn == "model.safetensors.index.json" || std::regex_match(fn, shard_re);
    if (ours && !keep.count(fn)) fs::remove(ent.path(), ec);
  }
  return written;
}

}  // namespace flowrun
