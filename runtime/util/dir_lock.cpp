// One run at a time writes checkpoints into a folder: why and how in dir_lock.h.
#include "runtime/util/dir_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <map>
#include <mutex>
#include <stdexcept>
#include <thread>

namespace flowrun {
namespace {

std::string errno_text(int e) { return std::error_code(e, std::generic_category()).message(); }

// The lock files this process holds now, by (device, inode), with how many dir_lock objects hold each: another
// holder of one of them is this process (a run of its own before: `flowrun train` runs step after step, and a
// finished job's plan may outlive it a moment). Not the pid in the file: two containers' flowrun are both pid 1.
std::mutex held_mutex;
std::map<std::pair<dev_t, ino_t>, int> held_here;

std::pair<dev_t, ino_t> file_id(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return {0, 0};
  return {st.st_dev, st.st_ino};
}

void note_held(int fd, int delta) {
  const auto id = file_id(fd);
  std::lock_guard<std::mutex> lock(held_mutex);
  if ((held_here[id] += delta) <= 0) held_here.erase(id);
}

bool held_by_this_process(int fd) {
  const auto id = file_id(fd);
  std::lock_guard<std::mutex> lock(held_mutex);
  const auto it = held_here.find(id);
  return it != held_here.end() && it->second > 0;
}

// The whole lock file (its first line: "RUN_ID pid P host H started T").
std::string read_all(int fd) {
  std::string s;
  char buf[512];
  for (off_t at = 0;;) {
    const ssize_t n = ::pread(fd, buf, sizeof buf, at);
    if (n <= 0) break;
    s.append(buf, static_cast<size_t>(n));
    at += n;
  }
  return s;
}

std::string holder_line(const std::string& run_id) {
  char host[256] = {0};
  ::gethostname(host, sizeof host - 1);
  const std::time_t now = std::time(nullptr);
  char when[32] = {0};
  std::strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S UTC", std::gmtime(&now));
  return run_id + " pid " + std::to_string(::getpid()) + " host " + host + " started " + when + "\n";
}

}  // namespace

dir_lock& dir_lock::operator=(dir_lock&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) {
      note_held(fd_, -1);
      ::close(fd_);
    }
    fd_ = o.fd_;
    path_ = std::move(o.path_);
    o.fd_ = -1;
  }
  return *this;
}

dir_lock::~dir_lock() {
  if (fd_ >= 0) {
    note_held(fd_, -1);
    ::close(fd_);
  }
}

dir_lock dir_lock::acquire(const std::string& dir, const std::string& given_run_id, const std::string& what) {
  if (given_run_id.find_first_of(" \n") != std::string::npos)
    throw std::invalid_argument("dir_lock: the run id must be one word, not '" + given_run_id + "'");
  const std::string run_id = given_run_id.empty() ? "pid" + std::to_string(::getpid()) : given_run_id;
  // processes started by hand (FLOWRUN_NPROC > 1, no FLOWRUN_RUN_ID): process 0 holds the lock for the run, and
  // the others, whose work waits on process 0 at the rendezvous, take none (an id they could all work out from
  // their environment would let a requeued copy of the run in beside the first)
  const char* nproc = std::getenv("FLOWRUN_NPROC");
  const char* index = std::getenv("FLOWRUN_PROCESS_INDEX");
  const char* shared_id = std::getenv("FLOWRUN_RUN_ID");
  if (nproc && std::atoi(nproc) > 1 && index && std::atoi(index) > 0 && !(shared_id && *shared_id)) return dir_lock{};
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  dir_lock l;
  l.path_ = (std::filesystem::path(dir) / ".flowrun.lock").string();
  l.fd_ = ::open(l.path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  // a folder this process cannot create or write (a cluster node that writes no checkpoint, a read-only
  // copy): no lock, and whatever writes there fails on its own, naming the file
  if (l.fd_ < 0) return l;
  // A holder converting its exclusive lock to a shared one holds neither for a moment: retry briefly.
  for (int attempt = 0; attempt < 200; ++attempt) {
    if (::flock(l.fd_, LOCK_EX | LOCK_NB) == 0) {  // free: name this run, then share
      const std::string line = holder_line(run_id);
      if (::ftruncate(l.fd_, 0) != 0 || ::pwrite(l.fd_, line.data(), line.size(), 0) != static_cast<ssize_t>(line.size()))
        throw std::runtime_error(what + " '" + dir + "': cannot write its lock file " + l.path_ + ": " +
                                 errno_text(errno));
      ::flock(l.fd_, LOCK_SH);  // blocks only while another takes it exclusively, as this run just did
    } else if (::flock(l.fd_, LOCK_SH | LOCK_NB) != 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      continue;
    }
    // shared now: the file names the run the holders belong to
    const std::string text = read_all(l.fd_);
    const std::string holder = text.substr(0, text.find('\n'));
    // the same run, or this very process (held_here)
    if (holder.substr(0, holder.find(' ')) == run_id || held_by_this_process(l.fd_)) {
      note_held(l.fd_, +1);
      return l;
    }
    ::close(l.fd_);
    l.fd_ = -1;
    // "R pid P host H started T" reads "run id R, pid P on host H, started T"
    std::string who = "run id " + holder;
    for (const auto& [from, to] : {std::pair<std::string, std::string>{" pid ", ", pid "}, {" host ", " on host "},
                                   {" started ", ", started "}})
      if (const auto at = who.find(from); at != std::string::npos) who.replace(at, from.size(), to);
    throw std::runtime_error(
        what + " '" + dir + "' is in use by another flowrun run (" + who +
        "): two runs writing one checkpoint folder overwrite each other's files; wait for that run to end or stop "
        "it, or give this run another folder");
  }
  throw std::runtime_error(what + " '" + dir + "': its lock " + l.path_ + " stayed busy; try again");
}

}  // namespace flowrun
