// The flowrun program as a user runs it.
#include <doctest/doctest.h>

#include <array>
#include <cstdio>
#include <string>

#include "test_util.h"

namespace {

// Run a command; return its standard output and set *rc to its exit status.
std::string run(const std::string& cmd, int* rc) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  int st = pclose(p);
  *rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return out;
}

}  // namespace

TEST_CASE("flowrun generate with temperature 0 prints greedy_from_bos_text") {
  auto ref = flowrun::test::load_json_asset("ref/stories260K_forward_reference.json");
  auto want = ref["greedy_from_bos_text"].get<std::string>();
  int rc = -1;
  auto out = run(std::string(FLOWRUN_BIN) + " generate --temperature 0 --max_new_tokens 200 2>/dev/null", &rc);
  CHECK(rc == 0);
  CHECK(out == want + "\n");
}

TEST_CASE("a missing model file is named, with exit code 2") {
  int rc = -1;
  auto out = run(std::string(FLOWRUN_BIN) + " generate --model no/such/model.bin 2>&1", &rc);
  CHECK(rc == 2);
  CHECK(out.find("no/such/model.bin") != std::string::npos);
}

TEST_CASE("usage errors exit with code 2 and say what is wrong; --help exits 0") {
  int rc = -1;
  auto out = run(std::string(FLOWRUN_BIN) + " generate --no-such-option 2>&1", &rc);
  CHECK(rc == 2);
  CHECK(out.find("--no-such-option") != std::string::npos);
  out = run(std::string(FLOWRUN_BIN) + " generate --temperature notanumber 2>&1", &rc);
  CHECK(rc == 2);
  out = run(std::string(FLOWRUN_BIN) + " generate --help 2>&1", &rc);
  CHECK(rc == 0);
  CHECK(out.find("--temperature") != std::string::npos);
}

TEST_CASE("flowrun train refuses a missing GPU and multi_node with what to change") {
  int rc = -1;
  auto out = run(std::string(FLOWRUN_BIN) + " train --step 1 --deployment-type multi_node 2>&1", &rc);
  CHECK(rc == 2);
  CHECK(out.find("use --deployment-type single_node") != std::string::npos);
}

TEST_CASE("a training plan that cannot fit in memory is refused with what to change") {
  int rc = -1;
  auto out = run(std::string(FLOWRUN_BIN) + " " + FLOWRUN_SOURCE_DIR +
                     "/graphs/sft.graph --no-progress --set node.sft.per_device_train_batch_size=100000000 2>&1",
                 &rc);
  CHECK(rc == 1);
  CHECK(out.find("node 'sft'") != std::string::npos);
  CHECK(out.find("lower per_device_train_batch_size or max_seq_len") != std::string::npos);
}

TEST_CASE("flowrun launch refuses a rendezvous it cannot use, naming it") {
  int rc = -1;
  const std::string bin = FLOWRUN_BIN;
  auto out = run(bin + " launch --nproc 2 --rendezvous caf --store /tmp/x no_such.graph 2>&1", &rc);
  CHECK(rc == 1);
  CHECK(out.find("--store is a folder for --rendezvous file") != std::string::npos);
  // 203.0.113.1 (TEST-NET-3) is no address of this host: the CAF store cannot be published there
  out = run(bin + " launch --nproc 2 --rendezvous-host 203.0.113.1 no_such.graph 2>&1", &rc);
  CHECK(rc == 1);
  CHECK(out.find("cannot publish the store on 203.0.113.1:0") != std::string::npos);
  out = run(bin + " launch --nproc 2 --rendezvous tcp no_such.graph 2>&1", &rc);
  CHECK(rc != 0);
  CHECK(out.find("--rendezvous") != std::string::npos);
}
