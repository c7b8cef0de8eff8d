// Fresh descriptor numbers for CAF's sockets: why and how in socket_numbers.h.
#include "runtime/actor/socket_numbers.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>

namespace flowrun::actor {
namespace {

using accept_fn = int (*)(int, sockaddr*, socklen_t*);
using socket_fn = int (*)(int, int, int);

// The C library's functions, looked up once (RTLD_NEXT: the next definition
// after this executable's).
accept_fn real_accept() {
  static const auto fn = reinterpret_cast<accept_fn>(::dlsym(RTLD_NEXT, "accept"));
  return fn;
}
socket_fn real_socket() {
  static const auto fn = reinterpret_cast<socket_fn>(::dlsym(RTLD_NEXT, "socket"));
  return fn;
}

std::atomic<int> next_number{fresh_fd_floor};

}  // namespace

int move_to_fresh_number(int fd) {
  if (fd < 0 || fd >= fresh_fd_ceiling) return fd;
  const int saved_errno = errno;
  const int flags = ::fcntl(fd, F_GETFD);
  if (flags < 0) {
    errno = saved_errno;
    return fd;
  }
  const int dup_cmd = (flags & FD_CLOEXEC) ? F_DUPFD_CLOEXEC : F_DUPFD;
  // From the rotation's next number (F_DUPFD takes the lowest free number at
  // or above it); a result past the ceiling goes round once from the floor.
  int moved = ::fcntl(fd, dup_cmd, next_number.load(std::memory_order_relaxed));
  if (moved >= fresh_fd_ceiling) {
    ::close(moved);
    moved = ::fcntl(fd, dup_cmd, fresh_fd_floor);
  }
  if (moved < 0 || moved >= fresh_fd_ceiling) {  // the range is full, or the descriptor limit is below it
    if (moved >= 0) ::close(moved);
    errno = saved_errno;
    return fd;
  }
  next_number.store(moved + 1 >= fresh_fd_ceiling ? fresh_fd_floor : moved + 1, std::memory_order_relaxed);
  ::close(fd);
  errno = saved_errno;
  return moved;
}

bool fresh_socket_numbers_active() { return real_accept() != nullptr && real_socket() != nullptr; }

}  // namespace flowrun::actor

// The interposed functions (C linkage, the C library's signatures). They keep
// errno as the C library set it.
extern "C" int accept(int fd, sockaddr* addr, socklen_t* len) {
  const auto fn = flowrun::actor::real_accept();
  if (!fn) {
    errno = ENOSYS;
    return -1;
  }
  return flowrun::actor::move_to_fresh_number(fn(fd, addr, len));
}

extern "C" int socket(int domain, int type, int protocol) {
  const auto fn = flowrun::actor::real_socket();
  if (!fn) {
    errno = ENOSYS;
    return -1;
  }
  return flowrun::actor::move_to_fresh_number(fn(domain, type, protocol));
}
