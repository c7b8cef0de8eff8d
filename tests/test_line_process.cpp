// runtime/util/line_process.h: a child that answers lines, and every way it can fail
// reported as a value (exit status, timeout, stderr tail), with a restart after it.
#include <doctest/doctest.h>

#include <chrono>

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
