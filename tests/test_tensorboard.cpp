// TensorBoard event files (runtime/tensorboard): the CRC32C check values, TFRecord framing
// and the Event bytes, worked by hand. tests/tensorboard_small.sh reads whole runs' files back
// with the tensorboard Python package.
#include <doctest/doctest.h>

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "runtime/tensorboard/event_writer.h"
#include "runtime/tensorboard/tfrecord.h"

namespace tb = flowrun::tensorboard;
namespace fs = std::filesystem;

namespace {

std::string bytes(std::initializer_list<unsigned> b) {
  std::string s;
  for (unsigned x : b) s.push_back(static_cast<char>(x));
  return s;
}

std::uint64_t le(const std::string& s, std::size_t at, int n) {
  std::uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = v << 8 | static_cast<unsigned char>(s[at + i]);
  return v;
}

std::string read_all(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

// The records of a TFRecord file, each one's two CRCs checked.
std::vector<std::string> records(const std::string& file) {
  std::vector<std::string> out;
  std::size_t at = 0;
  while (at < file.size()) {
    REQUIRE(at + 12 <= file.size());
    const std::uint64_t n = le(file, at, 8);
    CHECK(le(file, at + 8, 4) == tb::masked_crc32c(file.substr(at, 8)));
    REQUIRE(at + 12 + n + 4 <= file.size());
    out.push_back(file.substr(at + 12, n));
    CHECK(le(file, at + 12 + n, 4) == tb::masked_crc32c(out.back()));
    at += 12 + n + 4;
  }
  return out;
}

struct temp_dir {
  fs::path p = fs::temp_directory_path() / ("flowrun_test_tb_" + std::to_string(getpid()));
  temp_dir() { fs::remove_all(p); }
  ~temp_dir() { fs::remove_all(p); }
};

}  // namespace

TEST_CASE("tensorboard: CRC32C check values") {
  // The catalogue's check value of CRC-32C ("CRC-32/ISCSI": crc32c of "123456789"), and
  // RFC 3720 appendix B.4's three 32-byte vectors.
  CHECK(tb::crc32c("123456789") == 0xE3069283u);
  CHECK(tb::crc32c(std::string(32, '\0')) == 0x8A9136AAu);
  CHECK(tb::crc32c(std::string(32, '\xff')) == 0x62A8AB43u);
  std::string inc;
  for (int i = 0; i < 32; ++i) inc.push_back(static_cast<char>(i));
  CHECK(tb::crc32c(inc) == 0x46DD794Eu);
  CHECK(tb::crc32c("") == 0u);
}

TEST_CASE("tensorboard: masked CRCs and TFRecord framing") {
  // Masked values from the tensorboard package's own reader (2.21.0,
  // tensorboard/compat/tensorflow_stub/pywrap_tensorflow.py masked_crc32c).
  CHECK(tb::masked_crc32c("123456789") == 0xC78AB0E5u);
  const std::string data = "hello tfrecord";  // 14 bytes
  const std::string rec = tb::frame_record(data);
  REQUIRE(rec.size() == 14 + 16);
  CHECK(rec.substr(0, 8) == bytes({14, 0, 0, 0, 0, 0, 0, 0}));  // uint64 length, little-endian
  CHECK(le(rec, 8, 4) == 0x3F69E5C5u);                          // masked_crc32c of those 8 bytes
  CHECK(rec.substr(12, 14) == data);
  CHECK(le(rec, 26, 4) == 0x22765B9Fu);  // masked_crc32c of the data
}

TEST_CASE("tensorboard: an event file holds the file_version event, then the scalars, byte for byte") {
  temp_dir t;
  auto w = tb::event_writer::open(t.p / "run", 1.5);
  REQUIRE_MESSAGE(w.has_value(), w.error());
  const std::string name = w->path().filename().string();
  CHECK(name.rfind("events.out.tfevents.0000000001.", 0) == 0);  // TensorBoard's name: time, host, pid
  CHECK(name.size() > std::string("events.out.tfevents.0000000001.").size());
  // the first record is on disk before anything else is written (flushed)
  auto recs = records(read_all(w->path()));
  REQUIRE(recs.size() == 1);
  // Event{wall_time (1, fixed64) = 1.5, file_version (3, bytes) = "brain.Event:2"}; step 0 is
  // proto3's default and not written. 1.5 = 0x3FF8000000000000.
  const std::string time15 = bytes({0x09, 0, 0, 0, 0, 0, 0, 0xF8, 0x3F});
  CHECK(recs[0] == time15 + bytes({0x1A, 13}) + "brain.Event:2");

  REQUIRE_FALSE(w->scalar("loss", 0.25, 7, 1.5).has_value());
  REQUIRE_FALSE(w->scalar("kl", -2.0, 300, 1.5).has_value());
  recs = records(read_all(w->path()));
  REQUIRE(recs.size() == 3);
  // Event{wall_time, step (2, varint) = 7, summary (5) = Summary{value (1) = Value{tag (1) = "loss",
  // simple_value (2, fixed32) = 0.25f = 0x3E800000}}}
  CHECK(recs[1] == time15 + bytes({0x10, 7, 0x2A, 13, 0x0A, 11, 0x0A, 4}) + "loss" + bytes({0x15, 0, 0, 0x80, 0x3E}));
  // step 300 = varint AC 02; -2.0f = 0xC0000000
  CHECK(recs[2] == time15 + bytes({0x10, 0xAC, 0x02, 0x2A, 11, 0x0A, 9, 0x0A, 2}) + "kl" +
                       bytes({0x15, 0, 0, 0, 0xC0}));

  // a second writer into the same folder in the same second gets a file of its own
  auto w2 = tb::event_writer::open(t.p / "run", 1.5);
  REQUIRE(w2.has_value());
  CHECK(w2->path() != w->path());
  CHECK(w2->path().filename().string() == name + ".1");
}

TEST_CASE("tensorboard: a file that joins an earlier run's starts its scalars with SessionLog START at the first step") {
  temp_dir t;
  auto first = tb::event_writer::open(t.p / "run", 1.5);
  REQUIRE(first.has_value());
  CHECK_FALSE(first->follows_earlier_run());  // an empty folder: nothing to purge
  REQUIRE_FALSE(first->scalar("loss", 0.25, 7, 1.5).has_value());
  CHECK(records(read_all(first->path())).size() == 2);

  // the resumed job: its first scalar is at step 5, so the first file's steps >= 5 are orphaned
  auto second = tb::event_writer::open(t.p / "run", 1.5);
  REQUIRE(second.has_value());
  CHECK(second->follows_earlier_run());
  CHECK(records(read_all(second->path())).size() == 1);  // the START waits for the first step
  REQUIRE_FALSE(second->scalar("loss", 0.25, 5, 1.5).has_value());
  REQUIRE_FALSE(second->scalar("loss", 0.25, 6, 1.5).has_value());
  const auto recs = records(read_all(second->path()));
  REQUIRE(recs.size() == 4);
  const std::string time15 = bytes({0x09, 0, 0, 0, 0, 0, 0, 0xF8, 0x3F});
  // Event{wall_time, step (2) = 5, session_log (7, bytes) = SessionLog{status (1, enum) = START = 1}}
  CHECK(recs[1] == time15 + bytes({0x10, 5, 0x3A, 2, 0x08, 1}));
  CHECK(recs[2] == time15 + bytes({0x10, 5, 0x2A, 13, 0x0A, 11, 0x0A, 4}) + "loss" + bytes({0x15, 0, 0, 0x80, 0x3E}));
  CHECK(recs[3].substr(0, 11) == time15 + bytes({0x10, 6}));  // once: no START before later scalars
}

TEST_CASE("tensorboard: a folder that cannot be made is an error naming it") {
  temp_dir t;
  fs::create_directories(t.p);
  std::ofstream(t.p / "a_file") << "x";
  auto w = tb::event_writer::open(t.p / "a_file" / "tb");
  REQUIRE_FALSE(w.has_value());
  CHECK(w.error().find((t.p / "a_file" / "tb").string()) != std::string::npos);
  CHECK(w.error().find("Not a directory") != std::string::npos);
}
