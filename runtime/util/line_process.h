// A child process that answers one line for each line it is sent: how a user's own
// scorer (a Python function behind a JSON-lines loop) plugs into a graph (the
// reward_function node kind, actors/reward_function.cpp).
//
// The child runs `/bin/sh -c COMMAND` with its standard input and output on one end of a
// socket pair (so a child that dies turns our writes into an error, never a SIGPIPE) and its
// standard error in an unlinked temporary file (in $TMPDIR, else /tmp; nothing is left there,
// even by kill -9) whose tail goes into error messages. PYTHONUNBUFFERED=1
// is set, so a Python `print(...)` reaches us without an explicit flush.
//
// The child leads a process group of its own, and a kill ends the whole group (the shell and
// what it started), so no scorer is left running; a watchdog process (start_watchdog) kills that
// group when this process dies without doing so itself (kill -9).
//
// Errors are values: ask() returns the answer line or what went wrong (the child exited, with
// its status; it did not answer in time; it answered more than one line, or wrote a line
// nobody asked for; it could not be started; the caller cancelled), and the stderr tail. After
// an error the child is gone (killed if it was still running); the next ask() starts a new one.
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <string>

#include <sys/types.h>

namespace flowrun {

class line_process {
 public:
  /// `command` runs under /bin/sh -c, in the current directory, started on the first ask().
  explicit line_process(std::string command) : command_(std::move(command)) {}
  ~line_process();
  line_process(const line_process&) = delete;
  line_process& operator=(const line_process&) = delete;

  struct answer {
    std::optional<std::string> line;  ///< the answer, without its newline; empty on error
    std::string error;                ///< what went wrong: "exited with status 1", "gave no answer within 10 s", ...
    std::string stderr_tail;          ///< the last lines the child wrote to its standard error (on error)
  };

  /// Sends `line` (a newline is appended; it must not contain one) and waits up to `timeout`
  /// for one line back. `cancelled`, when given, is asked every 100 ms while waiting; when it
  /// says true the child is killed and the answer is the error "was cancelled".
  answer ask(const std::string& line, std::chrono::milliseconds timeout,
             const std::function<bool()>& cancelled = {});

  /// Output the child wrote that no question asked for, waiting up to `grace` for it to come;
  /// nullopt when there is none. When there is, the child is killed (its answers are out of
  /// step with the questions) and the next ask() starts a new one. Asking checks this without
  /// waiting, so a stray line is caught at the next question or, for the last one of a batch,
  /// by the caller's call here.
  std::optional<std::string> extra_output(std::chrono::milliseconds grace);

  /// Closes the child's input and waits briefly for it to exit (then kills it).
  void stop();

  const std::string& command() const { return command_; }
  /// Whether the child is running: false before the first ask() and after an error or stop(),
  /// when the next ask() starts one (and its answer includes the child's start-up).
  bool running() const { return pid_ > 0; }

 private:
  std::string start();  // "" or why it could not start
  void start_watchdog();  // after start(): see line_process.cpp
  void kill_child();
  // Waits up to tries x 10 ms for the child to exit; when it did, `a` gets its status and stderr.
  bool reaped(answer& a, int tries);
  std::string stderr_tail() const;

  std::string command_;
  int fd_ = -1;       // our end of the socket pair
  pid_t pid_ = -1;
  pid_t pgid_ = -1;  // the child's process group (its pid), killed whole
  int watch_fd_ = -1;     // the write end of the watchdog's pipe (closed by our death)
  pid_t watch_pid_ = -1;  // the watchdog
  int err_fd_ = -1;       // the child's stderr: an unlinked temporary file (see start())
  std::string buffer_;  // bytes read past the last answer line
};

}  // namespace flowrun
