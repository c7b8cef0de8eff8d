// runtime/util/line_process.h: a child that answers lines, and every way it can fail
// reported as a value (exit status, timeout, stderr tail), with a restart after it.
#include <doctest/doctest.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

#include "runtime/util/line_process.h"

using namespace flowrun;
using namespace std::chrono_literals;

TEST_CASE("line_process: one answer per line, in order, from a long-lived child") {
  line_process p("while read l; do echo \"got $l\"; done");
  for (const char* x : {"x0", "x1", "x2"}) {
    const auto a = p.ask(x, 5000ms);
    REQUIRE(a.line);
    CHECK(*a.line == std::string("got ") + x);
  }
  p.stop();
}

TEST_CASE("line_process: the child gets the user's OpenMP settings, not those flowrun gave itself") {
  auto ask_env = [] {
    line_process p("while read l; do echo \"${OMP_WAIT_POLICY:-none} ${GOMP_SPINCOUNT:-none} ${FLOWRUN_OMP_DEFAULTS:-none}\"; done");
    const auto a = p.ask("x", 5000ms);
    p.stop();
    return a.line ? *a.line : std::string("(no answer)");
  };
  auto saved = [](const char* n) { const char* v = std::getenv(n); return v ? std::optional<std::string>(v) : std::nullopt; };
  const auto policy = saved("OMP_WAIT_POLICY"), spins = saved("GOMP_SPINCOUNT");  // ctest sets the policy
  setenv("OMP_WAIT_POLICY", "active", 1);
  setenv("GOMP_SPINCOUNT", "300000", 1);
  setenv("FLOWRUN_OMP_DEFAULTS", "1", 1);  // as tools/flowrun/omp_defaults.cpp leaves them
  CHECK(ask_env() == "none none none");
  unsetenv("FLOWRUN_OMP_DEFAULTS");  // the user's own settings pass through
  CHECK(ask_env() == "active 300000 none");
  setenv("OMP_WAIT_POLICY", "passive", 1);  // a hand-exported marker beside the user's own values
  unsetenv("GOMP_SPINCOUNT");
  setenv("FLOWRUN_OMP_DEFAULTS", "1", 1);
  CHECK(ask_env() == "passive none 1");
  unsetenv("FLOWRUN_OMP_DEFAULTS");
  auto restore = [](const char* n, const std::optional<std::string>& v) {
    if (v) setenv(n, v->c_str(), 1);
    else unsetenv(n);
  };
  restore("OMP_WAIT_POLICY", policy);
  restore("GOMP_SPINCOUNT", spins);
}

TEST_CASE("line_process: a child that exits, hangs or writes to stderr is an error value, then restarts") {
  line_process crash("read l; echo 'Traceback: boom' >&2; exit 3");
  auto a = crash.ask("1", 5000ms);
  CHECK(!a.line);
  CHECK(a.error == "exited with status 3");
  CHECK(a.stderr_tail.find("Traceback: boom") != std::string::npos);
  a = crash.ask("2", 5000ms);  // a new child, the same fate
  CHECK(a.error == "exited with status 3");

  line_process slow("read l; sleep 5; echo 1");
  const auto t0 = std::chrono::steady_clock::now();
  a = slow.ask("1", 300ms);
  CHECK(!a.line);
  CHECK(a.error.find("gave no answer within 0.3 s") != std::string::npos);
  CHECK(std::chrono::steady_clock::now() - t0 < 3s);  // killed, not waited for

  line_process missing("exec /nonexistent/scorer");
  a = missing.ask("1", 5000ms);
  CHECK(!a.line);
  CHECK(a.error.find("exited with status 127") != std::string::npos);  // the shell's "not found"
  CHECK(a.stderr_tail.find("nonexistent") != std::string::npos);
}

TEST_CASE("line_process: more than one line per question is an error, never a shifted answer") {
  // The extra line may arrive with the answer (caught at once), before the next question (caught
  // then), or just after it (taken as that answer, and the real one is caught at the question after):
  // a shift is stopped within two questions, never carried on.
  line_process two("while read l; do echo 1; echo 2; done");
  line_process::answer a;
  for (int i = 0; i < 3; ++i) {
    a = two.ask("q", 5000ms);
    if (!a.line) break;
  }
  if (a.line) {  // every extra line came just after the next question: the batch's end check finds the rest
    // (the last question's second line, and on a loaded machine the lines of questions before it that had
    // not arrived when the next was asked: "2\n1\n2")
    const auto extra = two.extra_output(1000ms);
    REQUIRE(extra.has_value());
    CHECK(!extra->empty());
    std::istringstream lines(*extra);
    for (std::string l; std::getline(lines, l);) CHECK_MESSAGE((l == "1" || l == "2"), *extra);
  } else {
    const bool named = a.error.find("answered more than one line") != std::string::npos ||
                       a.error.find("after its previous answer, before being asked") != std::string::npos;
    CHECK_MESSAGE(named, a.error);
  }
  // an honest scorer leaves nothing over
  line_process one("while read l; do echo 1; done");
  REQUIRE(one.ask("q", 5000ms).line);
  CHECK(!one.extra_output(100ms).has_value());
  // a stray line after the first answer, then the same answers: caught at the next question
  line_process stray("read l; echo 0; sleep 0.2; echo 999; while read l; do echo 1; done");
  a = stray.ask("q", 5000ms);
  REQUIRE(a.line);
  CHECK(*a.line == "0");
  std::this_thread::sleep_for(500ms);
  a = stray.ask("q", 5000ms);
  CHECK(!a.line);
  CHECK_MESSAGE(a.error.find("wrote \"999\" after its previous answer") != std::string::npos, a.error);
}

TEST_CASE("line_process: a timeout kills the whole process group, and a cancelled wait ends at once") {
  // the shell starts a child that would outlive it: its pid goes to a file, then both hang
  const std::string pidfile = "/tmp/flowrun_line_process_" + std::to_string(::getpid());
  line_process p("read l; sleep 60 & echo $! > " + pidfile + "; wait");
  const auto a = p.ask("q", 500ms);
  CHECK(!a.line);
  std::ifstream f(pidfile);
  pid_t child = 0;
  f >> child;
  REQUIRE(child > 0);
  bool gone = false;  // killed with the group (or reaped: kill(pid, 0) fails once it is gone)
  for (int i = 0; i < 100 && !gone; ++i) {
    gone = ::kill(child, 0) != 0;
    if (!gone) std::this_thread::sleep_for(20ms);
  }
  CHECK(gone);
  std::remove(pidfile.c_str());

  line_process slow("read l; sleep 30; echo 1");
  int asked = 0;
  const auto t0 = std::chrono::steady_clock::now();
  const auto c = slow.ask("q", 30000ms, [&] { return ++asked > 3; });
  CHECK(!c.line);
  CHECK_MESSAGE(c.error.find("was cancelled") != std::string::npos, c.error);
  CHECK(std::chrono::steady_clock::now() - t0 < 5s);
}

namespace {
// Gone: no such process, or a zombie waiting for init to reap it.
bool process_gone(pid_t pid) {
  if (::kill(pid, 0) != 0) return true;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string pid_s, comm, state;
  stat >> pid_s >> comm >> state;
  return state == "Z";
}
}  // namespace

// The owner killed with SIGKILL (no destructor runs): the watchdog kills the command's whole group,
// so a scorer does not outlive the run that started it (it kept running, holding its model).
TEST_CASE("line_process: the command's group dies with its owner, even by SIGKILL") {
  const std::string pidfile = "/tmp/flowrun_line_process_owner_" + std::to_string(::getpid());
  std::remove(pidfile.c_str());
  const pid_t owner = ::fork();
  REQUIRE(owner >= 0);
  if (owner == 0) {  // the owner: starts the command and waits for an answer that never comes
    line_process p("echo $$ > " + pidfile + ".tmp; sleep 60 & echo $! >> " + pidfile + ".tmp; mv " + pidfile +
                   ".tmp " + pidfile + "; wait");
    (void)p.ask("q", 60000ms);
    std::_Exit(0);
  }
  std::vector<pid_t> pids;
  for (int i = 0; i < 500 && pids.size() < 2; ++i) {
    std::this_thread::sleep_for(10ms);
    std::ifstream f(pidfile);
    pids.clear();
    for (pid_t x; f >> x;) pids.push_back(x);
  }
  REQUIRE(pids.size() == 2);  // the shell and the child it started
  ::kill(owner, SIGKILL);
  int st = 0;
  ::waitpid(owner, &st, 0);
  bool gone = false;
  for (int i = 0; i < 250 && !gone; ++i) {
    gone = process_gone(pids[0]) && process_gone(pids[1]);
    if (!gone) std::this_thread::sleep_for(20ms);
  }
  CHECK(gone);
  for (pid_t x : pids) ::kill(x, SIGKILL);  // whatever the check found, nothing stays behind
  std::remove(pidfile.c_str());
}

// The child's stderr file has no name while the child lives (unlinked at creation): a run killed by
// SIGKILL, whose destructors never run, used to leave one /tmp/flowrun-reward-stderr-* file behind.
TEST_CASE("line_process: the stderr file is unlinked from the start, so a killed run leaves no file") {
  line_process p("while read l; do echo \"got $l\"; echo \"to stderr $l\" >&2; done");
  const auto a = p.ask("x", 5000ms);
  REQUIRE(a.line);
  std::vector<std::string> held;  // what this process's descriptors name
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    const auto target = std::filesystem::read_symlink(e.path(), ec).string();
    if (!ec && target.find("flowrun-reward-stderr-") != std::string::npos) held.push_back(target);
  }
  REQUIRE(held.size() == 1);  // the child's stderr, held open by its owner
  CHECK(held[0].find(" (deleted)") != std::string::npos);
  p.stop();
  // and the stderr still reaches error messages: a child that writes to stderr and exits
  line_process q("read l; echo \"bad input $l\" >&2; exit 3");
  const auto b = q.ask("y", 5000ms);
  CHECK_FALSE(b.line);
  CHECK(b.stderr_tail.find("bad input y") != std::string::npos);
}
