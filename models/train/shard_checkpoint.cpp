// ZeRO sharded checkpoints: see shard_checkpoint.h for the file layout.
#include "models/train/shard_checkpoint.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <cctype>
#include <cerrno>
#include <cinttypes>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include <msgpack.hpp>

#include "models/adapter.h"
#include "models/decoder.h"
#include "models/hf.h"
#include "models/safetensors.h"

namespace fs = std::filesystem;

namespace flowrun {

namespace {

constexpr const char* k_format = "flowrun-zero-shard";
constexpr int k_version = 1;
constexpr size_t k_chunk = size_t{4} << 20;

std::string errno_str() { return std::strerror(errno); }

std::string hex32(uint32_t v) {
  char b[16];
  std::snprintf(b, sizeof b, "0x%08" PRIx32, v);
  return b;
}

uint32_t crc_update(uint32_t crc, const void* p, size_t n) {
  const auto* b = static_cast<const Bytef*>(p);
  while (n > 0) {
    const uInt m = static_cast<uInt>(std::min<size_t>(n, size_t{1} << 30));
    crc = static_cast<uint32_t>(::crc32(crc, b, m));
    b += m;
    n -= m;
  }
  return crc;
}

uint32_t crc_init() { return static_cast<uint32_t>(::crc32(0L, Z_NULL, 0)); }

/// CRC-32 of a whole file (and its size); throws checkpoint_error naming it.
uint32_t file_crc32(const std::string& path, uint64_t& size) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw checkpoint_error(path + ": cannot open: " + errno_str());
  std::vector<char> buf(k_chunk);
  uint32_t crc = crc_init();
  size = 0;
  for (;;) {
    ssize_t r = ::read(fd, buf.data(), buf.size());
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      std::string e = errno_str();
      ::close(fd);
      throw checkpoint_error(path + ": read failed: " + e);
    }
    if (r == 0) break;
    crc = crc_update(crc, buf.data(), static_cast<size_t>(r));
    size += static_cast<uint64_t>(r);
  }
  ::close(fd);
  return crc;
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw checkpoint_error(path + ": cannot open: " + errno_str());
  std::ostringstream s;
  s << f.rdbuf();
  if (f.bad()) throw checkpoint_error(path + ": read failed");
  return s.str();
}

/// step number of a folder name "step_XXXXXXXX", or -1.
int64_t parse_step_name(const std::string& name) {
  static const std::regex re("step_([0-9]{1,18})");
  std::smatch m;
  if (!std::regex_match(name, m, re)) return -1;
  return std::stoll(m[1].str());
}

/// Step folders of DIR: step -> path, sorted.
std::map<int64_t, fs::path> step_folders(const fs::path& dir) {
  std::map<int64_t, fs::path> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  for (auto& e : fs::directory_iterator(dir, ec)) {
    if (!e.is_directory(ec)) continue;
    int64_t s = parse_step_name(e.path().filename().string());
    if (s >= 0) out[s] = e.path();
  }
  return out;
}

struct shard_file_name {
  int rank = 0, world = 0;
  fs::path path;
};

/// Manifests (shard_RRRRR-of-NNNNN.msgpack) in a folder.
std::vector<shard_file_name> manifest_files(const fs::path& folder) {
  static const std::regex re("shard_([0-9]{5,9})-of-([0-9]{5,9})\\.msgpack");
  std::vector<shard_file_name> out;
  std::error_code ec;
  for (auto& e : fs::directory_iterator(folder, ec)) {
    std::smatch m;
    std::string n = e.path().filename().string();
    if (!std::regex_match(n, m, re)) continue;
    out.push_back({std::stoi(m[1].str()), std::stoi(m[2].str()), e.path()});
  }
  std::sort(out.begin(), out.end(), [](auto& a, auto& b) {
    return a.world != b.world ? a.world < b.world : a.rank < b.rank;
  });
  return out;
}

/// "...: the checkpoint FOLDER cannot be used; use the older step folder DIR/step_X
/// (write step_X into DIR/latest to resume from it), or start fresh"
std::string cannot_use(const fs::path& folder) {
  std::string s = ": the checkpoint " + folder.string() + " cannot be used; ";
  const int64_t here = parse_step_name(folder.filename().string());
  const fs::path parent = folder.parent_path();
  fs::path older;
  for (auto& [st, p] : step_folders(parent.empty() ? fs::path(".") : parent))
    if (here < 0 || st < here) older = p;
  if (here >= 0 && !older.empty() && older != folder)
    s += "use the older step folder " + older.string() + " (write " + older.filename().string() + " into " +
         (parent / "latest").string() + " to resume from it), or start fresh";
  else
    s += "there is no older step folder in " + (parent.empty() ? fs::path(".") : parent).string() + ": start fresh";
  return s;
}

void check_group_name(const std::string& n) {
  if (n.empty() || n.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") !=
                       std::string::npos)
    throw std::invalid_argument("save_shard: group name '" + n +
                                "' must be non-empty letters, digits, '_' or '-' (it prefixes tensor names with '.')");
}

// ------------------------------------------------------------------ msgpack

template <class S>
void pack_key(msgpack::packer<S>& pk, const char* k) {
  pk.pack(std::string(k));
}

std::string pack_manifest(const shard_manifest& m, const std::vector<shard_group>& groups) {
  msgpack::sbuffer sb;
  msgpack::packer<msgpack::sbuffer> pk(sb);
  pk.pack_map(19);
  pack_key(pk, "format"); pk.pack(std::string(k_format));
  pack_key(pk, "version"); pk.pack(k_version);
  pack_key(pk, "step"); pk.pack(m.step);
  pack_key(pk, "world_size"); pk.pack(m.world_size);
  pack_key(pk, "rank"); pk.pack(m.rank);
  pack_key(pk, "zero_stage"); pk.pack(m.zero_stage);
  pack_key(pk, "config_hash"); pk.pack(m.config_hash);
  pack_key(pk, "data_epoch"); pk.pack(m.data_epoch);
  pack_key(pk, "data_cursor"); pk.pack(m.data_cursor);
  pack_key(pk, "rng_state");
  pk.pack_bin(static_cast<uint32_t>(m.rng_state.size()));
  pk.pack_bin_body(reinterpret_cast<const char*>(m.rng_state.data()), static_cast<uint32_t>(m.rng_state.size()));
  pack_key(pk, "loss_scale"); pk.pack_double(m.loss_scale);
  pack_key(pk, "loss_scale_good_steps"); pk.pack(m.loss_scale_good_steps);
  pack_key(pk, "extra"); pk.pack(m.extra.is_null() ? std::string("null") : m.extra.dump());
  pack_key(pk, "groups");
  pk.pack_array(static_cast<uint32_t>(groups.size()));
  for (auto& g : groups) {
    pk.pack_map(4);
    pack_key(pk, "name"); pk.pack(g.name);
    pack_key(pk, "full_numel"); pk.pack(g.full_numel);
    pack_key(pk, "ranges");
    pk.pack_array(static_cast<uint32_t>(g.ranges.size()));
    for (auto& r : g.ranges) {
      pk.pack_array(2);
      pk.pack(r.begin);
      pk.pack(r.end);
    }
    pack_key(pk, "tensors");
    pk.pack_array(static_cast<uint32_t>(g.tensors.size()));
    for (auto& [n, t] : g.tensors) pk.pack(n);
  }
  pack_key(pk, "tensors_file"); pk.pack(m.tensors_file);
  pack_key(pk, "tensors_bytes"); pk.pack(m.tensors_bytes);
  pack_key(pk, "tensors_crc32"); pk.pack(m.tensors_crc32);
  pack_key(pk, "created_by"); pk.pack(std::string("flowrun"));
  pack_key(pk, "saved_at_ns"); pk.pack(m.saved_at_ns);
  std::string body(sb.data(), sb.size());
  // trailer: the CRC-32 of the map's bytes, as a second msgpack object
  msgpack::sbuffer tb;
  msgpack::packer<msgpack::sbuffer> tp(tb);
  tp.pack(crc_update(crc_init(), body.data(), body.size()));
  body.append(tb.data(), tb.size());
  return body;
}

struct obj_reader {
  const std::string& path;
  const msgpack::object& map;
  const msgpack::object* find(const char* key) const {
    for (uint32_t i = 0; i < map.via.map.size; ++i) {
      const auto& kv = map.via.map.ptr[i];
      if (kv.key.type == msgpack::type::STR && kv.key.as<std::string>() == key) return &kv.val;
    }
    return nullptr;
  }
  const msgpack::object& at(const char* key) const {
    auto* o = find(key);
    if (!o) throw checkpoint_error(path + ": bad manifest: key '" + key + "' is missing");
    return *o;
  }
  template <class T>
  T get(const char* key) const {
    try {
      return at(key).as<T>();
    } catch (const msgpack::type_error&) {
      throw checkpoint_error(path + ": bad manifest: key '" + std::string(key) + "' has the wrong type");
    }
  }
};

}  // namespace

int64_t shard_group::local_numel() const {
  int64_t n = 0;
  for (auto& r : ranges) n += r.size();
  return n;
}

std::string step_folder_name(int64_t step) {
  char b[40];
  std::snprintf(b, sizeof b, "step_%08" PRId64, step);
  return b;
}

std::string shard_file_stem(int rank, int world_size) {
  char b[64];
  std::snprintf(b, sizeof b, "shard_%05d-of-%05d", rank, world_size);
  return b;
}

shard_manifest read_shard_manifest(const std::string& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) throw checkpoint_error(path + ": no such manifest file");
  const std::string bytes = read_file(path);
  shard_manifest m;
  try {
    std::size_t off = 0;
    msgpack::object_handle oh = msgpack::unpack(bytes.data(), bytes.size(), off);
    const size_t body_end = off;
    if (off >= bytes.size())
      throw checkpoint_error(path + " is corrupt (no CRC-32 after the manifest map: truncated?)");
    msgpack::object_handle th = msgpack::unpack(bytes.data(), bytes.size(), off);
    uint32_t want = 0;
    try {
      want = th.get().as<uint32_t>();
    } catch (const msgpack::type_error&) {
      throw checkpoint_error(path + " is corrupt (the trailer is not a CRC-32)");
    }
    const uint32_t got = crc_update(crc_init(), bytes.data(), body_end);
    if (got != want)
      throw checkpoint_error(path + " is corrupt (CRC-32 of the manifest " + hex32(got) + " != " + hex32(want) +
                             " recorded in its trailer)");
    if (off != bytes.size())
      throw checkpoint_error(path + " is corrupt (" + std::to_string(bytes.size() - off) +
                             " stray bytes after the CRC-32)");
    const msgpack::object& o = oh.get();
    if (o.type != msgpack::type::MAP) throw checkpoint_error(path + ": bad manifest: not a msgpack map");
    obj_reader r{path, o};
    auto fmt = r.get<std::string>("format");
    if (fmt != k_format)
      throw checkpoint_error(path + ": not a flowrun shard manifest (format '" + fmt + "', expected '" + k_format + "')");
    int ver = r.get<int>("version");
    if (ver > k_version)
      throw checkpoint_error(path + ": manifest version " + std::to_string(ver) + " is newer than this flowrun (" +
                             std::to_string(k_version) + "): update flowrun");
    m.step = r.get<int64_t>("step");
    m.world_size = r.get<int>("world_size");
    m.rank = r.get<int>("rank");
    m.zero_stage = r.get<int>("zero_stage");
    m.config_hash = r.get<std::string>("config_hash");
    m.data_epoch = r.get<int64_t>("data_epoch");
    m.data_cursor = r.get<int64_t>("data_cursor");
    const auto& rng = r.at("rng_state");
    if (rng.type != msgpack::type::BIN) throw checkpoint_error(path + ": bad manifest: rng_state is not binary");
    m.rng_state.assign(reinterpret_cast<const uint8_t*>(rng.via.bin.ptr),
                       reinterpret_cast<const uint8_t*>(rng.via.bin.ptr) + rng.via.bin.size);
    m.loss_scale = r.get<double>("loss_scale");
    m.loss_scale_good_steps = r.get<int64_t>("loss_scale_good_steps");
    try {
      m.extra = nlohmann::json::parse(r.get<std::string>("extra"));
    } catch (const nlohmann::json::exception& e) {
      throw checkpoint_error(path + ": bad manifest: 'extra' is not JSON (" + e.what() + ")");
    }
    m.tensors_file = r.get<std::string>("tensors_file");
    m.tensors_bytes = r.get<uint64_t>("tensors_bytes");
    m.tensors_crc32 = r.get<uint32_t>("tensors_crc32");
    if (r.find("saved_at_ns")) m.saved_at_ns = r.get<int64_t>("saved_at_ns");  // absent before 2026-12-07
    const auto& gs = r.at("groups");
    if (gs.type != msgpack::type::ARRAY) throw checkpoint_error(path + ": bad manifest: 'groups' is not an array");
    for (uint32_t i = 0; i < gs.via.array.size; ++i) {
      const auto& go = gs.via.array.ptr[i];
      if (go.type != msgpack::type::MAP) throw checkpoint_error(path + ": bad manifest: a group is not a map");
      obj_reader gr{path, go};
      shard_group_layout g;
      g.name = gr.get<std::string>("name");
      g.full_numel = gr.get<int64_t>("full_numel");
      auto rs = gr.get<std::vector<std::vector<int64_t>>>("ranges");
      for (auto& p : rs) {
        if (p.size() != 2) throw checkpoint_error(path + ": bad manifest: group '" + g.name + "' has a range that is not [begin, end]");
        g.ranges.push_back({p[0], p[1]});
      }
      g.tensor_names = gr.get<std::vector<std::string>>("tensors");
      std::sort(g.tensor_names.begin(), g.tensor_names.end());
      m.groups.push_back(std::move(g));
    }
    std::sort(m.groups.begin(), m.groups.end(), [](auto& a, auto& b) { return a.name < b.name; });
  } catch (const checkpoint_error&) {
    throw;
  } catch (const std::exception& e) {
    throw checkpoint_error(path + " is corrupt (not a readable msgpack manifest: " + e.what() + ")");
  }
  return m;
}

// ------------------------------------------------------------------ saving

std::string save_shard(const std::string& dir, const shard_manifest& in, const std::vector<shard_group>& groups) {
  if (in.world_size < 1 || in.rank < 0 || in.rank >= in.world_size)
    throw std::invalid_argument("save_shard: rank " + std::to_string(in.rank) + " is outside [0, world_size " +
                                std::to_string(in.world_size) + ")");
  if (in.step < 0) throw std::invalid_argument("save_shard: negative step " + std::to_string(in.step));
  std::set<std::string> names;
  for (auto& g : groups) {
    check_group_name(g.name);
    if (!names.insert(g.name).second) throw std::invalid_argument("save_shard: group '" + g.name + "' is repeated");
    if (g.full_numel < 0) throw std::invalid_argument("save_shard: group '" + g.name + "' has negative full_numel");
    for (auto& r : g.ranges)
      if (r.begin < 0 || r.end < r.begin || r.end > g.full_numel)
        throw std::invalid_argument("save_shard: group '" + g.name + "' range [" + std::to_string(r.begin) + ", " +
                                    std::to_string(r.end) + ") is reversed or outside [0, " +
                                    std::to_string(g.full_numel) + ")");
    const int64_t n = g.local_numel();
    for (auto& [tn, t] : g.tensors) {
      if (tn.empty()) throw std::invalid_argument("save_shard: group '" + g.name + "' has a tensor with an empty name");
      if (!t.defined() || t.type() != dtype::f32 || t.numel() != n)
        throw std::invalid_argument("save_shard: tensor '" + g.name + "." + tn + "' is " +
                                    (t.defined() ? t.str() : std::string("undefined")) + ", expected f32 with " +
                                    std::to_string(n) + " elements (the sum of the group's ranges)");
    }
  }

  const fs::path folder = fs::path(dir) / step_folder_name(in.step);
  std::error_code ec;
  fs::create_directories(folder, ec);
  if (!fs::is_directory(folder))
    throw checkpoint_error(folder.string() + ": cannot create the step folder: " + ec.message());
  const std::string stem = shard_file_stem(in.rank, in.world_size);
  const fs::path tpath = folder / (stem + ".safetensors");

  // --- the tensors, streamed through the CRC
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  h["__metadata__"] = {{"format", k_format},
                       {"step", std::to_string(in.step)},
                       {"rank", std::to_string(in.rank)},
                       {"world_size", std::to_string(in.world_size)}};
  std::vector<std::pair<std::string, const tensor*>> order;
  uint64_t off = 0;
  for (auto& g : groups)
    for (auto& [tn, t] : g.tensors) {
      const std::string name = g.name + "." + tn;
      const uint64_t nb = static_cast<uint64_t>(t.numel()) * 4;
      h[name] = {{"dtype", "F32"}, {"shape", {t.numel()}}, {"data_offsets", {off, off + nb}}};
      off += nb;
      order.emplace_back(name, &t);
    }
  std::string text = h.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t hn = text.size();
  shard_manifest m = in;
  m.saved_at_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::chrono::system_clock::now().time_since_epoch()).count();
  {
    atomic_file f(tpath.string());
    uint32_t crc = crc_init();
    auto put = [&](const void* p, size_t n) {
      f.write(p, n);
      crc = crc_update(crc, p, n);
    };
    try {
      put(&hn, 8);
      put(text.data(), text.size());
      for (auto& [name, t] : order) {
        if (t->dev() == device::cpu()) {
          put(t->raw(), t->nbytes());
        } else {
          tensor c = t->to(device::cpu());
          put(c.raw(), c.nbytes());
        }
      }
      f.commit();
    } catch (const std::runtime_error& e) {
      throw checkpoint_error(std::string(e.what()));
    }
    m.tensors_crc32 = crc;
    m.tensors_bytes = 8 + hn + off;
  }
  m.tensors_file = tpath.filename().string();

  // --- the manifest (after the tensors: it records their checksum)
  try {
    write_text_atomic((folder / (stem + ".msgpack")).string(), pack_manifest(m, groups));
  } catch (const std::runtime_error& e) {
    throw checkpoint_error(std::string(e.what()));
  }
  return folder.string();
}

void commit_checkpoint(const std::string& dir, int64_t step, int world_size, int keep) {
  if (world_size < 1) throw std::invalid_argument("commit_checkpoint: world_size must be >= 1");
  const fs::path folder = fs::path(dir) / step_folder_name(step);
  std::error_code ec;
  if (!fs::is_directory(folder, ec))
    throw checkpoint_error(folder.string() + ": no such step folder: cannot commit step " + std::to_string(step) +
                           " (did every rank call save_shard?)");
  for (int r = 0; r < world_size; ++r) {
    const std::string stem = shard_file_stem(r, world_size);
    const fs::path mp = folder / (stem + ".msgpack");
    if (!fs::is_regular_file(mp, ec))
      throw checkpoint_error(mp.string() + " is missing: rank " + std::to_string(r) +
                             " has not written its shard; cannot commit step " + std::to_string(step));
    shard_manifest m = read_shard_manifest(mp.string());
    if (m.step != step || m.rank != r || m.world_size != world_size)
      throw checkpoint_error(mp.string() + " is for step " + std::to_string(m.step) + ", rank " +
                             std::to_string(m.rank) + " of " + std::to_string(m.world_size) + ", not step " +
                             std::to_string(step) + ", rank " + std::to_string(r) + " of " +
                             std::to_string(world_size) + "; cannot commit");
    const fs::path tp = folder / m.tensors_file;
    const auto sz = fs::file_size(tp, ec);
    if (ec) throw checkpoint_error(tp.string() + " is missing; cannot commit step " + std::to_string(step));
    if (sz != m.tensors_bytes)
      throw checkpoint_error(tp.string() + " has " + std::to_string(sz) + " bytes but " + mp.filename().string() +
                             " records " + std::to_string(m.tensors_bytes) + "; cannot commit step " +
                             std::to_string(step));
  }
  // leftovers of an abandoned attempt at this step (another world size) and temporaries
  {
    static const std::regex shard_re("shard_[0-9]+-of-([0-9]+)\\.(msgpack|safetensors)");
    std::vector<fs::path> stale;
    for (auto& e : fs::directory_iterator(folder, ec)) {
      const std::string n = e.path().filename().string();
      std::smatch mt;
      if (std::regex_match(n, mt, shard_re)) {
        if (std::stoi(mt[1].str()) != world_size) stale.push_back(e.path());
      } else if (n.size() > 4 && n.compare(n.size() - 4, 4, ".tmp") == 0) {
        stale.push_back(e.path());
      }
    }
    for (auto& p : stale) fs::remove(p, ec);
  }
  write_text_atomic((fs::path(dir) / "latest").string(), step_folder_name(step) + "\n");
  if (keep < 1) return;
  // retention: the `keep` newest folders up to this step stay
  std::vector<fs::path> older;
  for (auto& [s, p] : step_folders(dir))
    if (s < step) older.push_back(p);
  const size_t keep_older = static_cast<size_t>(keep - 1);
  if (older.size() > keep_older) {
    for (size_t i = 0; i + keep_older < older.size(); ++i) {
      fs::remove_all(older[i], ec);
    }
  }
}

namespace {

// When a step folder was saved: its first manifest's saved_at_ns (the writer's clock, kept by a copy, as
// file times are not by `cp -r`); 0 for a manifest from before that field or one that cannot be read (the
// folder then counts as the oldest).
int64_t saved_at(const fs::path& folder) {
  const auto manifests = manifest_files(folder);
  if (manifests.empty()) return 0;
  try {
    return read_shard_manifest(manifests.front().path.string()).saved_at_ns;
  } catch (const checkpoint_error&) {
    return 0;
  }
}

// The step folder of `dir` that verifies (each file's size and CRC-32 are in its manifest) and was saved
// last (saved_at): where `latest` cannot say (it is missing, or names a folder that is gone), the checkpoints
// themselves can. Only folders up to `max_step` count (`latest` named that step: higher ones are not what its
// run committed). Saved last, not the highest step: a `resume = false` run into a folder that holds an
// earlier run's higher steps writes below them, and the highest was the earlier run's (it was taken). Ties
// (folders saved before flowrun recorded saved_at_ns): the higher step.
struct verified_pick {
  std::string folder;               // "" when none verifies
  std::vector<std::string> higher;  // folders of higher steps saved before it (passed over; not verified)
  bool untimed = false;             // it has no save time, and neither have the others it was chosen among
};
verified_pick newest_verified(const fs::path& dir, int64_t max_step) {
  std::vector<std::pair<int64_t, std::pair<int64_t, fs::path>>> order;  // (saved at, (step, folder))
  for (const auto& [step, path] : step_folders(dir))
    if (step <= max_step) order.push_back({saved_at(path), {step, path}});
  std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second.first > b.second.first;
  });
  verified_pick pick;
  for (std::size_t i = 0; i < order.size(); ++i) {
    try {
      verify_checkpoint(order[i].second.second.string());
    } catch (const checkpoint_error&) {  // incomplete (a save the crash cut) or damaged: an older one
      continue;
    }
    pick.folder = order[i].second.second.string();
    for (std::size_t k = i + 1; k < order.size(); ++k) {
      const auto& [when, folder] = order[k];
      if (folder.first > order[i].second.first) pick.higher.push_back(folder.second.filename().string());
      else if (when == order[i].first && when == 0) pick.untimed = true;
    }
    break;
  }
  return pick;
}

// "a, b, c"
std::string names(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& n : v) s += (s.empty() ? "" : ", ") + n;
  return s;
}

// What latest_checkpoint's note adds about the folders newest_verified passed over, or "".
std::string pick_note(const verified_pick& pick, const fs::path& latest) {
  std::string s;
  if (!pick.higher.empty())
    s += "; " + names(pick.higher) +
         (pick.higher.size() == 1 ? ", of a higher step but saved before it, is" : ", of higher steps but saved "
                                                                                    "before it, are") +
         " an earlier run's (write " + (pick.higher.size() == 1 ? "its" : "one's") + " name into " + latest.string() +
         " to resume there)";
  if (pick.untimed)
    s += "; its folders have no save time to tell (written before flowrun recorded one): the highest step is taken";
  return s;
}

}  // namespace

std::string latest_checkpoint(const std::string& dir, std::string* note) {
  const fs::path lp = fs::path(dir) / "latest";
  std::error_code ec;
  if (!fs::is_regular_file(lp, ec)) {
    // no commit point: before the first commit (a crash during the first save: its folder does not
    // verify), or `latest` deleted, which discarded complete checkpoints without a word
    const verified_pick pick = newest_verified(dir, std::numeric_limits<int64_t>::max());
    if (!pick.folder.empty() && note)
      *note = lp.string() + " is missing: taking " + pick.folder + ", the step folder there saved last that verifies "
              "(write another's name into " + lp.string() + " to resume there instead)" + pick_note(pick, lp);
    return pick.folder;
  }
  std::string s = read_file(lp.string());
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  const int64_t named = parse_step_name(s);
  if (named < 0)
    throw checkpoint_error(lp.string() + " is malformed (holds '" + s.substr(0, 64) +
                           "', expected step_XXXXXXXX): write the name of a complete step folder into it, "
                           "or start fresh");
  const fs::path folder = fs::path(dir) / s;
  if (!fs::is_directory(folder, ec)) {
    if (const verified_pick pick = newest_verified(dir, named); !pick.folder.empty()) {
      if (note)
        *note = lp.string() + " names " + folder.string() + ", which does not exist: taking " + pick.folder +
                ", the step folder up to that step saved last that verifies" + pick_note(pick, lp);
      return pick.folder;
    }
    std::vector<std::string> higher;  // folders above the named step are not the run's that committed it: not taken
    for (const auto& [step, path] : step_folders(dir))
      if (step > named) higher.push_back(path.filename().string());
    throw checkpoint_error(lp.string() + " names " + folder.string() + ", which does not exist, and no other step " +
                           "folder up to that step verifies" +
                           (higher.empty() ? std::string()
                                           : " (not counted: " + names(higher) + ", above the step it names, which its "
                                                                                 "run did not commit; write a name "
                                                                                 "into " +
                                                 lp.string() + " to resume there)") +
                           ": start fresh");
  }
  return folder.string();
}

std::string run_data_tokenizer(const std::string& path, std::string* contents) {
  namespace fs = std::filesystem;
  std::error_code ec;
  for (const fs::path& dir : {fs::path(path), fs::path(path).parent_path()}) {
    std::vector<fs::path> records;
    for (const auto& e : fs::directory_iterator(dir, ec))
      if (const auto n = e.path().filename().string(); n.size() > 14 && n.compare(n.size() - 14, 14, ".settings.json") == 0)
        records.push_back(e.path());
    std::sort(records.begin(), records.end());
    for (const auto& r : records) {
      std::ifstream f(r);
      try {
        const auto rec = nlohmann::json::parse(f);
        if (!rec.contains("tokenizer")) continue;
        // the setting as the graph spells it: a quoted string (graph::to_string), which JSON reads back
        const auto tok = nlohmann::json::parse(rec.at("tokenizer").get<std::string>()).get<std::string>();
        if (!tok.empty() && fs::exists(tok, ec)) {
          if (contents) {
            const auto c = rec.find("tokenizer (contents)");
            *contents = c != rec.end() && c->is_string() ? c->get<std::string>() : std::string();
          }
          return tok;
        }
      } catch (const std::exception&) {  // not a record of ours: skipped
      }
    }
  }
  return "";
}

bool is_checkpoint(const std::string& path) {
  std::error_code ec;
  if (!fs::is_directory(path, ec)) return false;
  if (fs::is_regular_file(fs::path(path) / "latest", ec)) return true;
  return !manifest_files(path).empty();
}

// ------------------------------------------------------------------ loading

loaded_checkpoint verify_checkpoint(const std::string& path_in) {
  std::error_code ec;
  fs::path p = fs::path(path_in).lexically_normal();
  if (!p.has_filename() && p.has_parent_path()) p = p.parent_path();  // "DIR/step_X/"
  const std::string path = p.string();
  if (!fs::is_directory(p, ec)) throw checkpoint_error(path_in + ": no such checkpoint folder");
  fs::path folder;
  if (fs::is_regular_file(p / "latest", ec)) {
    folder = latest_checkpoint(path);
  } else if (!manifest_files(p).empty()) {
    folder = p;
  } else {
    throw checkpoint_error(path + ": not a checkpoint (no 'latest' file and no shard_*-of-*.msgpack manifests); "
                           "a run commits 'latest' after its first complete save");
  }
  const std::string fail = cannot_use(folder);

  auto files = manifest_files(folder);
  if (files.empty())
    throw checkpoint_error(folder.string() + " holds no shard manifests (shard_RRRRR-of-NNNNN.msgpack)", fail);
  std::set<int> worlds;
  for (auto& f : files) worlds.insert(f.world);
  if (worlds.size() > 1) {
    std::string list;
    for (int w : worlds) list += (list.empty() ? "" : ", ") + std::to_string(w);
    throw checkpoint_error(folder.string() + " mixes shards of different world sizes (" + list +
                           ") (an interrupted save of another world size)", fail);
  }
  const int N = files.front().world;
  if (N < 1) throw checkpoint_error(files.front().path.string() + " has world size 0 in its name", fail);

  loaded_checkpoint ck;
  ck.folder = folder.string();
  ck.world_size = N;
  const int64_t folder_step = parse_step_name(folder.filename().string());
  for (int r = 0; r < N; ++r) {
    const fs::path mp = folder / (shard_file_stem(r, N) + ".msgpack");
    if (!fs::is_regular_file(mp, ec))
      throw checkpoint_error(mp.string() + " is missing (the manifest of rank " + std::to_string(r) + " of " +
                             std::to_string(N) + ")", fail);
    shard_manifest m;
    try {
      m = read_shard_manifest(mp.string());
    } catch (const checkpoint_error& e) {
      throw checkpoint_error(e.what(), fail);
    }
    const std::string mname = mp.filename().string();
    if (m.world_size != N)
      throw checkpoint_error(mp.string() + " says world_size " + std::to_string(m.world_size) +
                             " but its name and the other manifests say " + std::to_string(N), fail);
    if (m.rank != r)
      throw checkpoint_error(mp.string() + " says rank " + std::to_string(m.rank) + " but its name says " +
                             std::to_string(r), fail);
    if (folder_step >= 0 && m.step != folder_step)
      throw checkpoint_error(mp.string() + " says step " + std::to_string(m.step) + " but its folder is " +
                             folder.filename().string(), fail);
    if (m.tensors_file != shard_file_stem(r, N) + ".safetensors")
      throw checkpoint_error(mp.string() + " names tensors file '" + m.tensors_file + "', expected " +
                             shard_file_stem(r, N) + ".safetensors", fail);
    if (r > 0) {
      const auto& m0 = ck.manifests[0];
      auto disagree = [&](const std::string& what, const std::string& a, const std::string& b) {
        return checkpoint_error(mp.string() + " disagrees with rank 0's manifest on " + what + " (" + a + " vs " + b +
                                ")", fail);
      };
      if (m.step != m0.step) throw disagree("the step", std::to_string(m.step), std::to_string(m0.step));
      if (m.zero_stage != m0.zero_stage)
        throw disagree("the ZeRO stage", std::to_string(m.zero_stage), std::to_string(m0.zero_stage));
      if (m.config_hash != m0.config_hash) throw disagree("config_hash", m.config_hash, m0.config_hash);
      auto gdesc = [](const shard_manifest& x) {
        std::string s;
        for (auto& g : x.groups) {
          s += (s.empty() ? "" : "; ") + g.name + " (" + std::to_string(g.full_numel) + "):";
          for (auto& t : g.tensor_names) s += " " + t;
        }
        return s;
      };
      if (gdesc(m) != gdesc(m0)) throw disagree("the groups", gdesc(m), gdesc(m0));
    }
    ck.manifests.push_back(std::move(m));
  }
  ck.step = ck.manifests[0].step;

  // ranges cover each group exactly once
  for (size_t gi = 0; gi < ck.manifests[0].groups.size(); ++gi) {
    const auto& g0 = ck.manifests[0].groups[gi];
    struct piece {
      int64_t b, e;
      int rank;
    };
    std::vector<piece> ps;
    for (int r = 0; r < N; ++r) {
      const auto& g = ck.manifests[r].groups[gi];
      for (auto& rg : g.ranges) {
        if (rg.begin < 0 || rg.end < rg.begin || rg.end > g.full_numel)
          throw checkpoint_error((folder / (shard_file_stem(r, N) + ".msgpack")).string() + ": group '" + g.name +
                                 "' range [" + std::to_string(rg.begin) + ", " + std::to_string(rg.end) +
                                 ") is reversed or outside [0, " + std::to_string(g.full_numel) + ")", fail);
        if (rg.end > rg.begin) ps.push_back({rg.begin, rg.end, r});
      }
    }
    std::sort(ps.begin(), ps.end(), [](auto& a, auto& b) { return a.b < b.b; });
    int64_t at = 0;
    int prev_rank = -1;
    for (auto& p : ps) {
      if (p.b > at)
        throw checkpoint_error(folder.string() + ": group '" + g0.name + "' elements [" + std::to_string(at) + ", " +
                               std::to_string(p.b) + ") are in no shard's ranges", fail);
      if (p.b < at)
        throw checkpoint_error(folder.string() + ": group '" + g0.name + "' elements [" + std::to_string(p.b) + ", " +
                               std::to_string(std::min(at, p.e)) + ") are in the ranges of both rank " +
                               std::to_string(prev_rank) + " and rank " + std::to_string(p.rank), fail);
      at = p.e;
      prev_rank = p.rank;
    }
    if (at != g0.full_numel)
      throw checkpoint_error(folder.string() + ": group '" + g0.name + "' elements [" + std::to_string(at) + ", " +
                             std::to_string(g0.full_numel) + ") are in no shard's ranges", fail);
  }

  // tensors files: size, checksum, contents
  for (int r = 0; r < N; ++r) {
    const auto& m = ck.manifests[r];
    const fs::path tp = folder / m.tensors_file;
    const std::string mname = shard_file_stem(r, N) + ".msgpack";
    if (!fs::is_regular_file(tp, ec))
      throw checkpoint_error(tp.string() + " is missing (the tensors of rank " + std::to_string(r) + ")", fail);
    const uint64_t sz = fs::file_size(tp, ec);
    if (sz != m.tensors_bytes)
      throw checkpoint_error(tp.string() + " is corrupt (" + std::to_string(sz) + " bytes, but " + mname +
                             " records " + std::to_string(m.tensors_bytes) + (sz < m.tensors_bytes ? ": truncated)" : ")"),
                             fail);
    uint64_t read_bytes = 0;
    const uint32_t crc = file_crc32(tp.string(), read_bytes);
    if (crc != m.tensors_crc32)
      throw checkpoint_error(tp.string() + " is corrupt (CRC-32 " + hex32(crc) + " != " + hex32(m.tensors_crc32) +
                             " recorded in " + mname + ")", fail);
    std::unique_ptr<safetensors_file> sf;
    try {
      sf = std::make_unique<safetensors_file>(tp.string());
    } catch (const std::exception& e) {
      throw checkpoint_error(std::string(e.what()), fail);
    }
    std::set<std::string> want;
    for (auto& g : m.groups) {
      int64_t n = 0;
      for (auto& rg : g.ranges) n += rg.size();
      for (auto& tn : g.tensor_names) {
        const std::string name = g.name + "." + tn;
        want.insert(name);
        const auto* e = sf->find(name);
        if (!e) throw checkpoint_error(tp.string() + " has no tensor '" + name + "' listed in " + mname, fail);
        if (e->dtype != "F32" || shape_numel(e->shape) != n)
          throw checkpoint_error(tp.string() + ": tensor '" + name + "' is " + e->dtype + shape_str(e->shape) +
                                 ", expected F32 with " + std::to_string(n) + " elements (its ranges in " + mname +
                                 ")", fail);
      }
    }
    for (auto& e : sf->entries())
      if (!want.count(e.name))
        throw checkpoint_error(tp.string() + " has tensor '" + e.name + "' that " + mname + " does not list", fail);
  }
  return ck;
}

loaded_checkpoint load_checkpoint(const std::string& path) {
  loaded_checkpoint ck = verify_checkpoint(path);
  const fs::path folder(ck.folder);
  const auto& m0 = ck.manifests[0];
  for (auto& g : m0.groups)
    for (auto& tn : g.tensor_names) ck.full[g.name][tn] = tensor::empty({g.full_numel});
  for (int r = 0; r < ck.world_size; ++r) {
    const auto& m = ck.manifests[r];
    const std::string tp = (folder / m.tensors_file).string();
    try {
      safetensors_file sf(tp);
      for (auto& g : m.groups) {
        int64_t n = 0;
        for (auto& rg : g.ranges) n += rg.size();
        if (n == 0) continue;
        tensor local = tensor::empty({n});
        for (auto& tn : g.tensor_names) {
          sf.read_into(g.name + "." + tn, local);
          float* dst = ck.full[g.name][tn].data<float>();
          const float* src = local.data<float>();
          int64_t at = 0;
          for (auto& rg : g.ranges) {
            std::memcpy(dst + rg.begin, src + at, static_cast<size_t>(rg.size()) * sizeof(float));
            at += rg.size();
          }
        }
      }
    } catch (const checkpoint_error&) {
      throw;
    } catch (const std::runtime_error& e) {
      throw checkpoint_error(std::string(e.what()), cannot_use(folder));
    }
  }
  return ck;
}

// ------------------------------------------------------------------ export

namespace {

const tensor* find_full(const loaded_checkpoint& ck, const std::string& group, const std::string& name) {
  auto g = ck.full.find(group);
  if (g == ck.full.end()) return nullptr;
  auto t = g->second.find(name);
  return t == g->second.end() ? nullptr : &t->second;
}

}  // namespace

void export_consolidated(const loaded_checkpoint& ck, decoder& model, const std::string& out_dir) {
  const tensor* base = find_full(ck, "base", "fp32_master");
  const tensor* adapter = find_full(ck, "adapter", "fp32_master");
  if (!base && !adapter)
    throw checkpoint_error(ck.folder + ": no 'base' or 'adapter' group with fp32_master to export (was it loaded "
                           "with load_checkpoint?)");
  if (base) {
    if (base->numel() != model.num_parameters())
      throw checkpoint_error(ck.folder + ": the base fp32_master has " + std::to_string(base->numel()) +
                             " elements but the model has " + std::to_string(model.num_parameters()) +
                             " parameters: the config does not match the checkpoint");
    model.w().flat.copy_from(base->to(model.w().flat.dev()));
  }
  if (adapter) {
    if (adapter->numel() != model.num_adapter_parameters())
      throw checkpoint_error(ck.folder + ": the adapter fp32_master has " + std::to_string(adapter->numel()) +
                             " elements but the model's adapter has " +
                             std::to_string(model.num_adapter_parameters()) +
                             ": enable the same LoRA settings / value head as the run");
    model.w().adapter_flat.copy_from(adapter->to(model.w().adapter_flat.dev()));
  }
  save_hf(model, out_dir);
  if (model.has_lora()) save_adapter(model, (fs::path(out_dir) / "adapter").string());
}

void export_consolidated(const loaded_checkpoint& ck, const model_config& cfg, const std::string& out_dir) {
  if (!find_full(ck, "base", "fp32_master"))
    throw checkpoint_error(ck.folder + ": no 'base' group with fp32_master to export (was it loaded with "
                           "load_checkpoint?)");
  decoder model(cfg);
  const tensor& base = *find_full(ck, "base", "fp32_master");
  if (base.numel() != model.num_parameters())
    throw checkpoint_error(ck.folder + ": the base fp32_master has " + std::to_string(base.numel()) +
                           " elements but the model config has " + std::to_string(model.num_parameters()) +
                           " parameters: the config does not match the checkpoint");
  model.w().flat.copy_from(base);
  save_hf(model, out_dir);
}

std::string bytes_fingerprint(std::string_view bytes) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 1099511628211ull;
  }
  char b[24];
  std::snprintf(b, sizeof b, "%016" PRIx64, h);
  return b;
}

std::string config_fingerprint(const nlohmann::json& j) { return bytes_fingerprint(j.dump()); }

}  // namespace flowrun
