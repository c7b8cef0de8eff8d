#include "runtime/util/line_process.h"

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "runtime/util/omp_defaults.h"

extern char** environ;

namespace flowrun {

namespace {

std::string status_text(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return std::string("was killed by signal ") + strsignal(WTERMSIG(status));
  return "stopped";
}

// The first 80 bytes of output the child was not asked for, without trailing line ends (for messages).
std::string head_of(const std::string& out) {
  std::string s = out.substr(0, std::min<size_t>(out.size(), 80));
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
  return s;
}

}  // namespace

line_process::~line_process() {
  stop();
  if (err_fd_ >= 0) ::close(err_fd_);
}

std::string line_process::start() {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
    return std::string("socketpair failed: ") + std::strerror(errno);
  if (err_fd_ < 0) {
    // The child's stderr goes to a file that has no name from the start: unlinked here, it lives as
    // long as this descriptor, so nothing is left in the temporary folder by a run that is killed
    // (SIGKILL runs no destructor) or crashes.
    const char* dir = std::getenv("TMPDIR");
    std::string tmpl = std::string(dir && *dir ? dir : "/tmp") + "/flowrun-reward-stderr-XXXXXX";
    const int efd = ::mkostemp(tmpl.data(), O_CLOEXEC);
    if (efd < 0) {
      ::close(sv[0]);
      ::close(sv[1]);
      return "mkostemp in " + tmpl.substr(0, tmpl.rfind('/')) + " failed: " + std::strerror(errno) +
             " (set TMPDIR to a writable folder)";
    }
    ::unlink(tmpl.c_str());
    err_fd_ = efd;
  }
  // each start keeps only this child's stderr: the file emptied, the shared offset back at 0
  if (::ftruncate(err_fd_, 0) != 0 || ::lseek(err_fd_, 0, SEEK_SET) != 0) {
    ::close(sv[0]);
    ::close(sv[1]);
    return std::string("could not empty the stderr file: ") + std::strerror(errno);
  }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, sv[1], 0);
  posix_spawn_file_actions_adddup2(&fa, sv[1], 1);
  posix_spawn_file_actions_adddup2(&fa, err_fd_, 2);
  std::vector<std::string> env_store;
  // The OpenMP wait settings flowrun gave itself (tools/flowrun/omp_defaults.cpp) stay flowrun's: the
  // child gets the user's environment (an active wait would make its own OpenMP threads spin)
  const bool drop_omp = omp_defaults_applied();
  auto is = [](const char* e, const char* name) { return std::strncmp(e, name, std::strlen(name)) == 0; };
  for (char** e = environ; *e; ++e) {
    if (is(*e, "PYTHONUNBUFFERED=")) continue;
    if (drop_omp && (is(*e, "OMP_WAIT_POLICY=") || is(*e, "GOMP_SPINCOUNT=") || is(*e, "FLOWRUN_OMP_DEFAULTS=")))
      continue;
    env_store.emplace_back(*e);
  }
  env_store.emplace_back("PYTHONUNBUFFERED=1");
  std::vector<char*> envp;
  for (auto& s : env_store) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::string sh = "sh", dash_c = "-c", cmd = command_;
  char* argv[] = {sh.data(), dash_c.data(), cmd.data(), nullptr};
  posix_spawnattr_t attr;  // a process group of its own: a kill reaches what the shell started
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attr, 0);
  pid_t pid = -1;
  const int rc = ::posix_spawn(&pid, "/bin/sh", &fa, &attr, argv, envp.data());
  posix_spawnattr_destroy(&attr);
  posix_spawn_file_actions_destroy(&fa);
  ::close(sv[1]);
  if (rc != 0) {
    ::close(sv[0]);
    return std::string("could not be started: ") + std::strerror(rc);
  }
  fd_ = sv[0];
  pid_ = pid;
  pgid_ = pid;
  buffer_.clear();
  start_watchdog();
  return "";
}

// The watchdog: `sh -c 'read -r _; kill -9 -PGID'` in a process group of its own, its standard input
// the read end of a pipe whose only write end (close-on-exec) is ours. When this process dies
// (kill -9 included), the kernel closes that end, the read returns, and the command's whole group
// is killed: a scorer that loaded a model (or holds a GPU) does not outlive the run. On our own
// exit paths kill_child() ends the watchdog first. Without one (it could not be started) nothing
// else changes.
void line_process::start_watchdog() {
  int wp[2];
  if (::pipe2(wp, O_CLOEXEC) != 0) return;
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, wp[0], 0);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);  // a terminal's Ctrl-C does not end it
  posix_spawnattr_setpgroup(&attr, 0);
  std::string sh = "sh", dash_c = "-c", script = "read -r _; kill -9 -\"$1\" 2>/dev/null", name = "flowrun-watchdog",
              group = std::to_string(pgid_);
  char* argv[] = {sh.data(), dash_c.data(), script.data(), name.data(), group.data(), nullptr};
  char* envp[] = {nullptr};
  pid_t w = -1;
  const int rc = ::posix_spawn(&w, "/bin/sh", &fa, &attr, argv, envp);
  posix_spawnattr_destroy(&attr);
  posix_spawn_file_actions_destroy(&fa);
  ::close(wp[0]);
  if (rc != 0) {
    ::close(wp[1]);
    return;
  }
  watch_fd_ = wp[1];
  watch_pid_ = w;
}

void line_process::kill_child() {
  if (watch_pid_ > 0) {  // first, so that it never acts on a group number the system may reuse
    ::kill(watch_pid_, SIGKILL);
    int st;
    ::waitpid(watch_pid_, &st, 0);
    watch_pid_ = -1;
  }
  if (watch_fd_ >= 0) ::close(watch_fd_);
  watch_fd_ = -1;
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  if (pgid_ > 0) ::kill(-pgid_, SIGKILL);  // the group: the shell and whatever it started
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);
    int st;
    ::waitpid(pid_, &st, 0);
  }
  pid_ = -1;
  pgid_ = -1;
}

std::string line_process::stderr_tail() const {
  std::string s;
  if (err_fd_ >= 0) {
    char buf[4096];
    for (off_t at = 0;;) {
      const ssize_t n = ::pread(err_fd_, buf, sizeof buf, at);
      if (n <= 0) break;
      s.append(buf, static_cast<size_t>(n));
      at += n;
    }
  }
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  if (s.size() > 600) {
    s.erase(0, s.size() - 600);
    s.insert(0, "...");
  }
  return s;
}

bool line_process::reaped(answer& a, int tries) {
  for (int i = 0; i < tries && pid_ > 0; ++i) {
    int st;
    if (::waitpid(pid_, &st, WNOHANG) == pid_) {
      pid_ = -1;
      kill_child();  // what the shell left behind
      a.error = status_text(st);
      a.stderr_tail = stderr_tail();
      return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

line_process::answer line_process::ask(const std::string& line, std::chrono::milliseconds timeout,
                                       const std::function<bool()>& cancelled) {
  answer a;
  if (pid_ < 0)
    if (auto why = start(); !why.empty()) {
      a.error = why;
      return a;
    }
  // the child's exit, or our wait running out, ends the exchange as an error
  auto fail = [&](std::string why) {
    int st = 0;
    if (pid_ > 0 && ::waitpid(pid_, &st, WNOHANG) == pid_) {
      pid_ = -1;
      why += "; it " + status_text(st);
    }
    kill_child();
    a.error = std::move(why);
    a.stderr_tail = stderr_tail();
    return a;
  };
  // output nobody asked for since the last answer: the answers would be out of step with the questions
  for (;;) {
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, 0) <= 0) break;
    char buf[4096];
    const ssize_t n = ::recv(fd_, buf, sizeof buf, MSG_DONTWAIT);
    if (n <= 0) break;
    buffer_.append(buf, static_cast<size_t>(n));
  }
  if (!buffer_.empty()) {
    return fail("wrote \"" + head_of(buffer_) + "\" after its previous answer, before being asked (one line per question: "
                "an extra line would shift every later answer)");
  }
  std::string out = line + "\n";
  for (size_t sent = 0; sent < out.size();) {
    const ssize_t n = ::send(fd_, out.data() + sent, out.size() - sent, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (reaped(a, 50)) return a;  // a child that closed its input: its exit status
      return fail(std::string("stopped reading its input (") + std::strerror(errno) + ")");
    }
    sent += static_cast<size_t>(n);
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    if (const auto nl = buffer_.find('\n'); nl != std::string::npos) {
      std::string got = buffer_.substr(0, nl);
      buffer_.erase(0, nl + 1);
      if (!got.empty() && got.back() == '\r') got.pop_back();
      if (!buffer_.empty()) {  // a second line with the first: out of step from here on
        return fail("answered more than one line (\"" + got + "\", then \"" + head_of(buffer_) +
                    "\"): one line per question");
      }
      a.line = std::move(got);
      return a;
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      const double s = static_cast<double>(timeout.count()) / 1000.0;
      std::ostringstream why;
      why << "gave no answer within " << s << " s (killed)";
      return fail(why.str());
    }
    if (cancelled && cancelled()) return fail("was cancelled (the run is stopping)");
    pollfd p{fd_, POLLIN, 0};
    const int r = ::poll(&p, 1, static_cast<int>(std::min<std::int64_t>(left.count(), cancelled ? 100 : left.count())));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) continue;
    char buf[4096];
    const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
    if (n > 0) {
      buffer_.append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (reaped(a, 100)) return a;  // end of file: the child closed its output, most likely by exiting
    return fail("closed its output without answering");
  }
}

std::optional<std::string> line_process::extra_output(std::chrono::milliseconds grace) {
  if (pid_ < 0 && fd_ < 0) return std::nullopt;
  const auto deadline = std::chrono::steady_clock::now() + grace;
  while (buffer_.empty() && fd_ >= 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    pollfd p{fd_, POLLIN, 0};
    const int r = ::poll(&p, 1, static_cast<int>(std::max<std::int64_t>(0, left.count())));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    char buf[4096];
    const ssize_t n = ::recv(fd_, buf, sizeof buf, MSG_DONTWAIT);
    if (n <= 0) break;  // end of file: nothing more was written
    buffer_.append(buf, static_cast<size_t>(n));
  }
  if (buffer_.empty()) return std::nullopt;
  std::string extra = head_of(buffer_);
  buffer_.clear();
  kill_child();
  return extra;
}

void line_process::stop() {
  if (pid_ < 0) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    return;
  }
  ::shutdown(fd_, SHUT_WR);  // end of input: a JSON-lines loop ends
  for (int i = 0; i < 100; ++i) {
    int st;
    if (::waitpid(pid_, &st, WNOHANG) == pid_) {
      pid_ = -1;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  kill_child();
}

}  // namespace flowrun
