// ZeRO sharded checkpoints (models/train/shard_checkpoint.h) with the real stories260K
// weights: the flat parameter buffer is split as a ZeRO engine splits it (blocks:
// the embedding, each decoder layer, the rest; every block padded to a multiple of
// N, rank r owning piece r), saved by N = 1, 2, 4 "ranks", committed and loaded
// back bit for bit; the consolidated HF export loads to the same weights; damaged,
// truncated, missing and inconsistent files are refused naming the file; an
// uncommitted save leaves the previous commit in place.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include "models/adapter.h"
#include "models/hf.h"
#include "models/llama2c.h"
#include "models/safetensors.h"
#include "models/train/shard_checkpoint.h"
#include "runtime/util/dir_lock.h"
#include "runtime/util/same_path.h"
#include "test_util.h"

using namespace flowrun;
namespace fs = std::filesystem;

namespace {

struct temp_dir {
  fs::path path;
  explicit temp_dir(const std::string& name) {
    path = fs::temp_directory_path() / ("flowrun_test_shard_ckpt_" + std::to_string(::getpid())) / name;
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~temp_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
    fs::remove(path.parent_path(), ec);  // only when empty
  }
  std::string str() const { return path.string(); }
};

const decoder& stories() {
  static decoder m = load_llama2c(test::model_path());
  return m;
}

/// The engine's blocks of a decoder's flat buffer: the embedding, each layer, the rest.
std::vector<flat_range> model_blocks(const decoder& m) {
  auto ps = m.params();
  std::sort(ps.begin(), ps.end(), [](auto& a, auto& b) { return a.offset < b.offset; });
  std::vector<std::pair<std::string, flat_range>> bl;
  for (auto& e : ps) {
    std::string key;
    if (e.name.rfind("model.layers.", 0) == 0) key = e.name.substr(0, e.name.find('.', 13));
    else if (e.name.rfind("model.embed", 0) == 0) key = "embed";
    else key = "rest";
    if (!bl.empty() && bl.back().first == key && bl.back().second.end == e.offset)
      bl.back().second.end += e.numel;
    else
      bl.push_back({key, {e.offset, e.offset + e.numel}});
  }
  std::vector<flat_range> out;
  int64_t at = 0;
  for (auto& [k, r] : bl) {
    REQUIRE(r.begin == at);
    at = r.end;
    out.push_back(r);
  }
  REQUIRE(at == m.num_parameters());
  return out;
}

/// Rank r's pieces: each block padded to a multiple of N, piece r of each.
std::vector<flat_range> rank_ranges(const std::vector<flat_range>& blocks, int N, int r) {
  std::vector<flat_range> out;
  for (auto& b : blocks) {
    const int64_t p = (b.size() + N - 1) / N;
    const int64_t lo = b.begin + r * p, hi = std::min(b.begin + (r + 1) * p, b.end);
    if (lo < hi) out.push_back({lo, hi});
  }
  return out;
}

tensor gather(const tensor& full, const std::vector<flat_range>& ranges) {
  int64_t n = 0;
  for (auto& r : ranges) n += r.size();
  auto t = tensor::empty({n});
  int64_t at = 0;
  for (auto& r : ranges) {
    std::memcpy(t.data<float>() + at, full.data<float>() + r.begin, static_cast<size_t>(r.size()) * 4);
    at += r.size();
  }
  return t;
}

bool same_bits(const tensor& a, const tensor& b) {
  return a.numel() == b.numel() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

/// A flat buffer's fp32 master and fake AdamW moments (m = 0.5 p, v = p²).
struct flat_state {
  tensor p, m, v;
  explicit flat_state(const tensor& params) : p(params.clone()) {
    m = tensor::empty({p.numel()});
    v = tensor::empty({p.numel()});
    for (int64_t i = 0; i < p.numel(); ++i) {
      const float x = p.data<float>()[i];
      m.data<float>()[i] = 0.5f * x;
      v.data<float>()[i] = x * x;
    }
  }
};

/// A fake LoRA adapter buffer (the values only matter for the bit comparisons).
tensor fake_adapter(int64_t n) {
  auto t = tensor::empty({n});
  for (int64_t i = 0; i < n; ++i) t.data<float>()[i] = std::sin(0.37f * static_cast<float>(i)) * 0.01f;
  return t;
}

shard_manifest make_manifest(int64_t step, int N, int r) {
  shard_manifest m;
  m.step = step;
  m.world_size = N;
  m.rank = r;
  m.zero_stage = 2;
  m.config_hash = config_fingerprint(nlohmann::json{{"dim", 64}, {"lr", 3e-4}});
  m.data_epoch = 3;
  m.data_cursor = 4567 + r;
  m.rng_state = {0, 1, 2, 255, static_cast<uint8_t>(r), 0, 7};
  m.loss_scale = 65536.0 / (r + 1) + 0.25;
  m.loss_scale_good_steps = 17 + r;
  m.extra = {{"scheduler", {{"last_lr", 1.5e-4}, {"warmup", 100}}}, {"rank_note", "r" + std::to_string(r)}};
  return m;
}

shard_group make_group(const std::string& name, const flat_state& s, const std::vector<flat_range>& ranges) {
  shard_group g;
  g.name = name;
  g.full_numel = s.p.numel();
  g.ranges = ranges;
  g.tensors["fp32_master"] = gather(s.p, ranges);
  g.tensors["exp_avg"] = gather(s.m, ranges);
  g.tensors["exp_avg_sq"] = gather(s.v, ranges);
  return g;
}

/// Everything one ZeRO run of N ranks saves.
struct run_state {
  flat_state base, adapter;
  std::vector<flat_range> blocks, adapter_blocks;
  run_state(const tensor& params, const tensor& adapter_params)
      : base(params), adapter(adapter_params), blocks(model_blocks(stories())),
        adapter_blocks{{0, adapter_params.numel() / 3}, {adapter_params.numel() / 3, adapter_params.numel()}} {}
  std::vector<shard_group> groups(int N, int r) const {
    return {make_group("base", base, rank_ranges(blocks, N, r)),
            make_group("adapter", adapter, rank_ranges(adapter_blocks, N, r))};
  }
  void save(const std::string& dir, int64_t step, int N, bool commit = true, int keep = 2) const {
    for (int r = 0; r < N; ++r) {
      auto folder = save_shard(dir, make_manifest(step, N, r), groups(N, r));
      CHECK(folder == (fs::path(dir) / step_folder_name(step)).string());
    }
    if (commit) commit_checkpoint(dir, step, N, keep);
  }
};

const run_state& state() {
  static run_state s(stories().w().flat, fake_adapter(1001));
  return s;
}

std::vector<fs::path> tmp_files(const fs::path& dir) {
  std::vector<fs::path> out;
  for (auto& e : fs::recursive_directory_iterator(dir))
    if (e.path().extension() == ".tmp") out.push_back(e.path());
  return out;
}

std::string shard(const fs::path& dir, int64_t step, int r, int N, const std::string& ext) {
  return (dir / step_folder_name(step) / (shard_file_stem(r, N) + ext)).string();
}

void flip_byte(const std::string& path, uint64_t at) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  REQUIRE(f.good());
  f.seekg(static_cast<std::streamoff>(at));
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x10);
  f.seekp(static_cast<std::streamoff>(at));
  f.write(&c, 1);
}

std::string load_error(const std::string& path) {
  try {
    load_checkpoint(path);
  } catch (const checkpoint_error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("test_shard_checkpoint: N = 1, 2, 4 shards of stories260K reassemble bit for bit, manifests round-trip") {
  const auto& s = state();
  REQUIRE(stories().num_parameters() > 200000);
  REQUIRE(s.blocks.size() == static_cast<size_t>(stories().config().n_layers) + 2);
  for (int N : {1, 2, 4}) {
    CAPTURE(N);
    temp_dir tmp("roundtrip_" + std::to_string(N));
    CHECK(latest_checkpoint(tmp.str()).empty());
    CHECK_FALSE(is_checkpoint(tmp.str()));
    s.save(tmp.str(), 1234, N);
    CHECK(tmp_files(tmp.path).empty());
    CHECK(is_checkpoint(tmp.str()));
    CHECK(latest_checkpoint(tmp.str()) == (tmp.path / "step_00001234").string());
    {
      std::ifstream f(tmp.path / "latest");
      std::string line;
      std::getline(f, line);
      CHECK(line == "step_00001234");
    }

    auto ck = load_checkpoint(tmp.str());
    CHECK(ck.folder == (tmp.path / "step_00001234").string());
    CHECK(ck.step == 1234);
    CHECK(ck.world_size == N);
    REQUIRE(ck.full.size() == 2);
    auto& b = ck.full.at("base");
    auto& a = ck.full.at("adapter");
    REQUIRE(b.size() == 3);
    REQUIRE(a.size() == 3);
    CHECK(same_bits(b.at("fp32_master"), stories().w().flat));
    CHECK(same_bits(b.at("exp_avg"), s.base.m));
    CHECK(same_bits(b.at("exp_avg_sq"), s.base.v));
    CHECK(same_bits(a.at("fp32_master"), s.adapter.p));
    CHECK(same_bits(a.at("exp_avg"), s.adapter.m));
    CHECK(same_bits(a.at("exp_avg_sq"), s.adapter.v));

    REQUIRE(ck.manifests.size() == static_cast<size_t>(N));
    for (int r = 0; r < N; ++r) {
      CAPTURE(r);
      const auto& got = ck.manifests[r];
      const auto want = make_manifest(1234, N, r);
      CHECK(got.step == want.step);
      CHECK(got.world_size == N);
      CHECK(got.rank == r);
      CHECK(got.zero_stage == want.zero_stage);
      CHECK(got.config_hash == want.config_hash);
      CHECK(got.data_epoch == want.data_epoch);
      CHECK(got.data_cursor == want.data_cursor);
      CHECK(got.rng_state == want.rng_state);
      CHECK(got.loss_scale == want.loss_scale);
      CHECK(got.loss_scale_good_steps == want.loss_scale_good_steps);
      CHECK(got.extra == want.extra);
      CHECK(got.tensors_file == shard_file_stem(r, N) + ".safetensors");
      CHECK(got.tensors_bytes == fs::file_size(shard(tmp.path, 1234, r, N, ".safetensors")));
      REQUIRE(got.groups.size() == 2);
      CHECK(got.groups[0].name == "adapter");
      CHECK(got.groups[1].name == "base");
      CHECK(got.groups[0].full_numel == 1001);
      CHECK(got.groups[1].full_numel == stories().num_parameters());
      CHECK(got.groups[0].ranges == rank_ranges(s.adapter_blocks, N, r));
      CHECK(got.groups[1].ranges == rank_ranges(s.blocks, N, r));
      CHECK(got.groups[1].tensor_names == std::vector<std::string>{"exp_avg", "exp_avg_sq", "fp32_master"});
      // the same manifest read on its own
      auto one = read_shard_manifest(shard(tmp.path, 1234, r, N, ".msgpack"));
      CHECK(one.tensors_crc32 == got.tensors_crc32);
      CHECK(one.extra == want.extra);
    }
    // the shard's tensors are plain safetensors: "<group>.<tensor>", (local numel,) F32
    safetensors_file sf(shard(tmp.path, 1234, N - 1, N, ".safetensors"));
    auto* e = sf.find("base.exp_avg_sq");
    REQUIRE(e);
    CHECK(e->dtype == "F32");
    int64_t n = 0;
    for (auto& r : rank_ranges(s.blocks, N, N - 1)) n += r.size();
    CHECK(e->shape == shape_t{n});
    CHECK(sf.metadata().at("world_size") == std::to_string(N));
  }
}

TEST_CASE("test_shard_checkpoint: the consolidated HF export loads to the original weights (1, 2, 4 shards)") {
  const auto& s = state();
  for (int N : {1, 2, 4}) {
    CAPTURE(N);
    temp_dir tmp("export_" + std::to_string(N));
    s.save((tmp.path / "ckpt").string(), 40, N);
    auto ck = load_checkpoint((tmp.path / "ckpt").string());
    const std::string out = (tmp.path / "hf").string();
    export_consolidated(ck, stories().config(), out);
    CHECK(fs::exists(tmp.path / "hf" / "config.json"));
    CHECK(fs::exists(tmp.path / "hf" / "model.safetensors"));
    // HF uses the half RoPE layout: back to llama2.c's adjacent one for the comparison
    auto back = to_adjacent_rope(load_hf(out));
    REQUIRE(back.num_parameters() == stories().num_parameters());
    CHECK(same_bits(back.w().flat, stories().w().flat));
    CHECK(tmp_files(tmp.path).empty());
  }
}

TEST_CASE("test_shard_checkpoint: a LoRA run's base and adapter export as HF + PEFT folders") {
  // the run's model: stories260K with LoRA; adapter weights made non-trivial
  lora_config lc;
  lc.lora_r = 4;
  lc.target_modules = {"q_proj", "v_proj"};
  auto run = clone_decoder(stories());
  run.enable_lora(lc);
  auto& af = run.w().adapter_flat;
  af.copy_from(fake_adapter(af.numel()));
  const flat_state base(run.w().flat), adapter(af);
  temp_dir tmp("lora");
  const int N = 2;
  const auto blocks = model_blocks(run);
  for (int r = 0; r < N; ++r)
    save_shard(tmp.str(), make_manifest(7, N, r),
               {make_group("base", base, rank_ranges(blocks, N, r)),
                make_group("adapter", adapter, rank_ranges({{0, af.numel()}}, N, r))});
  commit_checkpoint(tmp.str(), 7, N);
  auto ck = load_checkpoint(tmp.str());
  auto target = clone_decoder(stories());
  target.enable_lora(lc);
  const std::string out = (tmp.path / "export").string();
  export_consolidated(ck, target, out);
  auto back = to_adjacent_rope(load_hf(out));
  load_adapter(back, (tmp.path / "export" / "adapter").string());
  CHECK(same_bits(back.w().flat, stories().w().flat));
  CHECK(same_bits(back.w().adapter_flat, af));
  // a model without the adapter's layout is refused
  auto plain = clone_decoder(stories());
  CHECK_THROWS_WITH_AS(export_consolidated(ck, plain, (tmp.path / "bad").string()),
                       doctest::Contains("enable the same LoRA settings"), checkpoint_error);
}

TEST_CASE("test_shard_checkpoint: damaged, missing and inconsistent files are refused, naming the file") {
  const auto& s = state();
  temp_dir tmp("corrupt");
  const std::string dir = tmp.str();
  s.save(dir, 10, 2);
  s.save(dir, 20, 2);
  const std::string st1 = shard(tmp.path, 20, 1, 2, ".safetensors");
  const std::string mf1 = shard(tmp.path, 20, 1, 2, ".msgpack");
  const std::string step10 = (tmp.path / "step_00000010").string();
  REQUIRE(load_checkpoint(dir).step == 20);

  SUBCASE("one flipped byte in the middle of a shard's tensors") {
    flip_byte(st1, fs::file_size(st1) / 2);
    auto msg = load_error(dir);
    CHECK_MESSAGE(msg.find(st1 + " is corrupt (CRC-32 ") != std::string::npos, msg);
    CHECK_MESSAGE(msg.find("recorded in shard_00001-of-00002.msgpack") != std::string::npos, msg);
    CHECK_MESSAGE(msg.find("use the older step folder " + step10 + " (write step_00000010 into") != std::string::npos, msg);
    CHECK_THROWS_AS(verify_checkpoint(dir), checkpoint_error);
    // the older step folder is still good
    CHECK(load_checkpoint(step10).step == 10);
  }
  SUBCASE("a truncated tensors file") {
    fs::resize_file(st1, fs::file_size(st1) - 100);
    auto msg = load_error(dir);
    CHECK_MESSAGE(msg.find(st1 + " is corrupt (") != std::string::npos, msg);
    CHECK_MESSAGE(msg.find("truncated") != std::string::npos, msg);
  }
  SUBCASE("a missing tensors file") {
    fs::remove(st1);
    auto msg = load_error(dir);
    CHECK_MESSAGE(msg.find(st1 + " is missing") != std::string::npos, msg);
  }
  SUBCASE("a deleted manifest") {
    fs::remove(mf1);
    auto msg = load_error(dir);
    CHECK_MESSAGE(msg.find(mf1 + " is missing") != std::string::npos, msg);
  }
  SUBCASE("rank 0's manifest deleted") {
    const std::string mf0 = shard(tmp.path, 20, 0, 2, ".msgpack");
    fs::remove(mf0);
    auto msg = load_error(dir);
    CHECK_MESSAGE(msg.find(mf0 + " is missing") != std::string::npos, msg);
  }
  SUBCASE("a flipped byte in a manifest") {
    flip_byte(mf1, 40);
    auto msg = load_error(dir);
    CHECK_MESSAGE(msg.find(mf1 + " is corrupt") != std::string::npos, msg);
  }
  SUBCASE("a truncated manifest") {
    fs::resize_file(mf1, fs::file_size(mf1) - 3);
    auto msg = load_error(dir);
    CHECK_MESSAGE(msg.find(mf1 + " is corrupt") != std::string::npos, msg);
  }
  SUBCASE("a manifest disagreeing on the world size") {
    // rank 1 of a 3-rank save of the same step, put in place of rank 1 of 2
    temp_dir other("corrupt_other");
    save_shard(other.str(), make_manifest(20, 3, 1), s.groups(3, 1));
    fs::copy_file(shard(other.path, 20, 1, 3, ".msgpack"), mf1, fs::copy_options::overwrite_existing);
    auto msg = load_error(dir);
    CHECK_MESSAGE(msg.find(mf1 + " says world_size 3 but its name and the other manifests say 2") != std::string::npos,
                  msg);
    // and shards of two world sizes side by side
    fs::copy_file(shard(other.path, 20, 1, 3, ".msgpack"), shard(tmp.path, 20, 1, 3, ".msgpack"));
    msg = load_error(dir);
    CHECK_MESSAGE(msg.find("mixes shards of different world sizes (2, 3)") != std::string::npos, msg);
  }
  SUBCASE("manifests disagreeing on the config hash") {
    auto m = make_manifest(20, 2, 1);
    m.config_hash = "0123456789abcdef";
    save_shard(dir, m, s.groups(2, 1));
    auto msg = load_error(dir);
    CHECK_MESSAGE(msg.find(mf1 + " disagrees with rank 0's manifest on config_hash") != std::string::npos, msg);
  }
  SUBCASE("ranges that overlap or leave a gap") {
    auto g = s.groups(2, 1);
    g[1].ranges[0].begin -= 1;  // adapter group: one element also held by rank 0
    g[1].tensors["fp32_master"] = gather(s.adapter.p, g[1].ranges);
    g[1].tensors["exp_avg"] = gather(s.adapter.m, g[1].ranges);
    g[1].tensors["exp_avg_sq"] = gather(s.adapter.v, g[1].ranges);
    save_shard(dir, make_manifest(20, 2, 1), g);
    auto msg = load_error(dir);
    CHECK_MESSAGE(msg.find("group 'adapter' elements [") != std::string::npos, msg);
    CHECK_MESSAGE(msg.find("are in the ranges of both rank 0 and rank 1") != std::string::npos, msg);
    g = s.groups(2, 1);
    g[0].ranges.pop_back();  // base group: the last piece of the last block is in no shard
    g[0].tensors["fp32_master"] = gather(s.base.p, g[0].ranges);
    g[0].tensors["exp_avg"] = gather(s.base.m, g[0].ranges);
    g[0].tensors["exp_avg_sq"] = gather(s.base.v, g[0].ranges);
    save_shard(dir, make_manifest(20, 2, 1), g);
    msg = load_error(dir);
    CHECK_MESSAGE(msg.find("group 'base' elements [") != std::string::npos, msg);
    CHECK_MESSAGE(msg.find("are in no shard's ranges") != std::string::npos, msg);
  }
  SUBCASE("latest naming a missing folder, or missing itself: the newest folder that verifies, said") {
    // `latest` deleted: complete checkpoints were discarded without a word (the run started afresh)
    fs::remove(tmp.path / "latest");
    std::string note;
    CHECK(latest_checkpoint(dir, &note) == (tmp.path / "step_00000020").string());
    CHECK(note == (tmp.path / "latest").string() + " is missing: taking " + (tmp.path / "step_00000020").string() +
                      ", the step folder there saved last that verifies (write another's name into " +
                      (tmp.path / "latest").string() + " to resume there instead)");
    // the newest damaged: the older one
    flip_byte(st1, fs::file_size(st1) / 2);
    CHECK(latest_checkpoint(dir) == step10);
    // `latest` naming a folder that is gone: the newest that verifies
    std::ofstream((tmp.path / "latest").string()) << "step_00000030\n";
    note.clear();
    CHECK(latest_checkpoint(dir, &note) == step10);
    CHECK(note.find("names " + (tmp.path / "step_00000030").string() + ", which does not exist: taking " + step10) !=
          std::string::npos);
    // none verifies: refused, or (without `latest`: a crash during the first save) nothing to resume
    fs::remove_all(step10);
    CHECK_THROWS_WITH_AS(latest_checkpoint(dir), doctest::Contains("which does not exist, and no other step folder up to "
                                                                   "that step verifies: start fresh"),
                         checkpoint_error);
    fs::remove(tmp.path / "latest");
    note.clear();
    CHECK(latest_checkpoint(dir, &note).empty());
    CHECK(note.empty());
  }
}

TEST_CASE("test_shard_checkpoint: where `latest` cannot say, an earlier run's higher step folder is not taken") {
  // a `resume = false` run into a folder that held an earlier run's step_50 wrote steps 10 and 20 below it; with its
  // `latest` gone, the highest folder that verified was taken: the earlier run's weights, resumed without a word
  const auto& s = state();
  temp_dir tmp("abandoned");
  const std::string dir = tmp.str();
  s.save(dir, 50, 2, /*commit=*/false);  // the earlier run's (not committed here: retention would remove 10 and 20)
  s.save(dir, 10, 2);
  s.save(dir, 20, 2);
  const std::string step20 = (tmp.path / "step_00000020").string();
  REQUIRE(load_checkpoint(dir).step == 20);
  REQUIRE_NOTHROW(verify_checkpoint((tmp.path / "step_00000050").string()));
  CHECK(read_shard_manifest(shard(tmp.path, 50, 0, 2, ".msgpack")).saved_at_ns <
        read_shard_manifest(shard(tmp.path, 10, 0, 2, ".msgpack")).saved_at_ns);
  fs::remove(tmp.path / "latest");
  std::string note;
  CHECK(latest_checkpoint(dir, &note) == step20);
  CHECK(note == (tmp.path / "latest").string() + " is missing: taking " + step20 +
                    ", the step folder there saved last that verifies (write another's name into " +
                    (tmp.path / "latest").string() + " to resume there instead); step_00000050, of a higher step but "
                    "saved before it, is an earlier run's (write its name into " + (tmp.path / "latest").string() +
                    " to resume there)");
  // a copy (cp -r: new file times, in the copy's order) keeps the save times: the same folder
  const fs::path copy = tmp.path.string() + "_copy";
  fs::remove_all(copy);
  fs::copy(tmp.path, copy, fs::copy_options::recursive);
  for (const auto& e : fs::directory_iterator(copy / "step_00000050"))  // the earlier run's files now the newest
    fs::last_write_time(e.path(), fs::file_time_type::clock::now() + std::chrono::hours(1));
  CHECK(latest_checkpoint(copy.string()) == (copy / "step_00000020").string());
  fs::remove_all(copy);
  // `latest` naming step 30, gone: the folders up to it, never the one above
  std::ofstream((tmp.path / "latest").string()) << "step_00000030\n";
  note.clear();
  CHECK(latest_checkpoint(dir, &note) == step20);
  CHECK(note.find("which does not exist: taking " + step20 + ", the step folder up to that step saved last") !=
        std::string::npos);
  fs::remove_all(tmp.path / "step_00000010");
  fs::remove_all(step20);
  CHECK_THROWS_WITH_AS(latest_checkpoint(dir), doctest::Contains("no other step folder up to that step verifies (not "
                                                                 "counted: step_00000050, above the step it names, "
                                                                 "which its run did not commit;"),
                       checkpoint_error);
  // one run's own folders: saved in step order, the highest is the last saved (as before)
  fs::remove(tmp.path / "latest");
  s.save(dir, 60, 2, /*commit=*/false);
  CHECK(latest_checkpoint(dir) == (tmp.path / "step_00000060").string());
}

TEST_CASE("test_shard_checkpoint: a crash before the commit leaves the previous checkpoint, retention") {
  const auto& s = state();
  temp_dir tmp("commit");
  const std::string dir = tmp.str();
  s.save(dir, 10, 2);
  s.save(dir, 20, 2);
  // every rank saved step 30, but the run died before rank 0 committed
  s.save(dir, 30, 2, /*commit=*/false);
  CHECK(latest_checkpoint(dir) == (tmp.path / "step_00000020").string());
  CHECK(load_checkpoint(dir).step == 20);
  // the complete but uncommitted folder can still be named explicitly
  CHECK(load_checkpoint((tmp.path / "step_00000030").string()).step == 30);
  // only rank 0 saved step 40: the commit is refused and names the missing manifest
  save_shard(dir, make_manifest(40, 2, 0), s.groups(2, 0));
  const std::string missing = shard(tmp.path, 40, 1, 2, ".msgpack") + " is missing";
  CHECK_THROWS_WITH_AS(commit_checkpoint(dir, 40, 2), doctest::Contains(missing.c_str()), checkpoint_error);
  CHECK(latest_checkpoint(dir) == (tmp.path / "step_00000020").string());
  // keep = 2: committing step 30 keeps 20 and 30, removes 10, leaves the newer 40 alone
  commit_checkpoint(dir, 30, 2, 2);
  CHECK(latest_checkpoint(dir) == (tmp.path / "step_00000030").string());
  CHECK_FALSE(fs::exists(tmp.path / "step_00000010"));
  CHECK(fs::exists(tmp.path / "step_00000020"));
  CHECK(fs::exists(tmp.path / "step_00000040"));
  CHECK(load_checkpoint(dir).step == 30);
  // a re-save of step 30 at another world size: the commit drops the old world size's files
  s.save(dir, 30, 4);
  CHECK_FALSE(fs::exists(shard(tmp.path, 30, 0, 2, ".msgpack")));
  auto ck = load_checkpoint(dir);
  CHECK(ck.world_size == 4);
  CHECK(same_bits(ck.full.at("base").at("fp32_master"), stories().w().flat));
  CHECK(tmp_files(tmp.path).empty());
}

TEST_CASE("test_shard_checkpoint: replicated state stored by one rank, bad input is refused") {
  const auto& s = state();
  temp_dir tmp("stage0");
  const std::string dir = tmp.str();
  const std::vector<flat_range> all{{0, stories().num_parameters()}};
  save_shard(dir, make_manifest(5, 2, 0), {make_group("base", s.base, all)});
  save_shard(dir, make_manifest(5, 2, 1), {make_group("base", s.base, {})});
  commit_checkpoint(dir, 5, 2);
  auto ck = load_checkpoint(dir);
  CHECK(same_bits(ck.full.at("base").at("exp_avg"), s.base.m));

  auto g = make_group("base", s.base, all);
  g.tensors["exp_avg"] = tensor::zeros({3});
  CHECK_THROWS_AS(save_shard(dir, make_manifest(6, 1, 0), {g}), std::invalid_argument);
  g = make_group("base.x", s.base, all);
  CHECK_THROWS_AS(save_shard(dir, make_manifest(6, 1, 0), {g}), std::invalid_argument);
  CHECK_THROWS_AS(save_shard(dir, make_manifest(6, 2, 2), {}), std::invalid_argument);
  CHECK_THROWS_WITH_AS(load_checkpoint((tmp.path / "nothing").string()), doctest::Contains("no such checkpoint folder"),
                       checkpoint_error);
  fs::create_directories(tmp.path / "empty");
  CHECK_THROWS_WITH_AS(load_checkpoint((tmp.path / "empty").string()), doctest::Contains("not a checkpoint"),
                       checkpoint_error);
  CHECK(config_fingerprint(nlohmann::json{{"a", 1}, {"b", 2}}) == config_fingerprint(nlohmann::json{{"b", 2}, {"a", 1}}));
  CHECK(config_fingerprint(nlohmann::json{{"a", 1}}) != config_fingerprint(nlohmann::json{{"a", 2}}));
}

// runtime/util/dir_lock.h: two runs on one checkpoint folder renamed each other's .tmp files (one died at a
// random step, `latest` could name the other's step). A child process holds the lock as a run does
// (exclusive while it writes its line, then shared), with raw system calls only (it is forked from a
// process that may run threads); then: another run is refused, naming the holder's line; the same run
// shares it; the lock is free once the holder is gone, and the next run's line replaces the stale one.
TEST_CASE("dir lock: one run at a time writes a checkpoint folder, and the same run's ranks share it") {
  temp_dir d("dir_lock");
  const std::string lock_file = (d.path / ".flowrun.lock").string();
  // the holder's line names this process's pid: in another PID namespace (a container sharing the folder) it
  // can, and two containers' flowrun (both pid 1) both got in when the pid decided "this process"
  const std::string pid = std::to_string(::getpid());
  const std::string line = "run-a pid " + pid + " host elsewhere started 2026-12-05 00:00:00 UTC\n";
  int ready[2];
  REQUIRE(::pipe(ready) == 0);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    const int fd = ::open(lock_file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0 || ::flock(fd, LOCK_EX) != 0 || ::ftruncate(fd, 0) != 0 ||
        ::pwrite(fd, line.data(), line.size(), 0) != static_cast<ssize_t>(line.size()) || ::flock(fd, LOCK_SH) != 0)
      ::_exit(1);
    char c = 'x';
    if (::write(ready[1], &c, 1) != 1) ::_exit(1);
    ::pause();
    ::_exit(0);
  }
  ::close(ready[1]);
  char c = 0;
  REQUIRE(::read(ready[0], &c, 1) == 1);
  ::close(ready[0]);
  // another run: refused, naming the holder
  const std::string refusal = "node 'ranks' output_dir '" + d.str() +
                              "' is in use by another flowrun run (run id run-a, pid " + pid +
                              " on host elsewhere, started 2026-12-05 00:00:00 UTC): two runs";
  CHECK_THROWS_WITH_AS(dir_lock::acquire(d.str(), "run-b", "node 'ranks' output_dir"),
                       doctest::Contains(refusal.c_str()), std::runtime_error);
  {
    // the same run (another rank, another process of flowrun launch): shares it
    dir_lock same = dir_lock::acquire(d.str(), "run-a", "x");
    CHECK(same.held());
    CHECK(same.path() == lock_file);
  }
  // the holder ends (however: the kernel drops a killed process's flock): the lock is free again
  ::kill(child, SIGKILL);
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  dir_lock mine = dir_lock::acquire(d.str(), "run-b", "x");
  CHECK(mine.held());
  std::ifstream f(lock_file);
  std::string now;
  std::getline(f, now);
  CHECK(now.rfind("run-b pid " + std::to_string(::getpid()) + " host ", 0) == 0);
  // this process again under another run id (flowrun train runs step after step in one process): shares it
  dir_lock again = dir_lock::acquire(d.str(), "run-c", "x");
  CHECK(again.held());
  CHECK_THROWS_AS(dir_lock::acquire(d.str(), "two words", "x"), std::invalid_argument);
  // a folder that cannot be made (here below a file; a cluster node's missing folder): no lock, no error
  std::ofstream(d.path / "a_file") << "x";
  CHECK_FALSE(dir_lock::acquire((d.path / "a_file" / "ckpt").string(), "run-d", "x").held());
}

TEST_CASE("same_path: one key for every spelling of a folder, and none shared by two folders") {
  temp_dir d("same_path");
  fs::create_directories(d.path / "run");
  fs::create_directory_symlink(d.path / "run", d.path / "link");
  const std::string run = fs::canonical(d.path / "run").string();  // TMPDIR may itself be a link
  CHECK(same_path_key(run) == run);
  CHECK(same_path_key(run + "/") == run);
  CHECK(same_path_key((d.path / "x" / ".." / "run").string()) == run);
  CHECK(same_path_key((d.path / "link").string()) == run);       // a symbolic link resolves
  CHECK(same_path_key((d.path / "link" / "new").string()) == run + "/new");  // not made yet: its tail kept
  CHECK(same_path((d.path / "link/").string(), run));
  CHECK_FALSE(same_path((d.path / "run2").string(), run));
  CHECK_FALSE(same_path("", run));
  CHECK(same_path("", ""));
  CHECK(same_path_key("/") == "/");
  // relative: from the current directory
  const fs::path cwd = fs::current_path();
  fs::current_path(d.path);
  const std::string rel = same_path_key("run/"), rel_link = same_path_key("./link");
  fs::current_path(cwd);
  CHECK(rel == run);
  CHECK(rel_link == run);
}
