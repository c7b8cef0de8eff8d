// A clean OpenSSL error queue before each TLS I/O call: why and how in tls_error_queue.h.
#include "runtime/actor/tls_error_queue.h"

#include <dlfcn.h>
#include <openssl/err.h>
#include <openssl/ssl.h>

namespace flowrun::actor {
namespace {

using io_fn = int (*)(SSL*, void*, int);
using write_fn = int (*)(SSL*, const void*, int);

// libssl's functions, looked up once (RTLD_NEXT: the next definition after this executable's).
template <class Fn>
Fn next_definition(const char* name) {
  return reinterpret_cast<Fn>(::dlsym(RTLD_NEXT, name));
}
io_fn real_read() {
  static const auto fn = next_definition<io_fn>("SSL_read");
  return fn;
}
write_fn real_write() {
  static const auto fn = next_definition<write_fn>("SSL_write");
  return fn;
}

// What a missing libssl function returns: a fatal error, as SSL_get_error reports it.
int unavailable() {
  ERR_raise(ERR_LIB_SSL, ERR_R_INTERNAL_ERROR);
  return -1;
}

}  // namespace

bool tls_error_queue_cleared() {
  return real_read() != nullptr && real_write() != nullptr;
}

}  // namespace flowrun::actor

// The interposed functions (C linkage, libssl's signatures).
extern "C" int SSL_read(SSL* ssl, void* buf, int num) {
  const auto fn = flowrun::actor::real_read();
  if (!fn) return flowrun::actor::unavailable();
  ERR_clear_error();
  return fn(ssl, buf, num);
}

extern "C" int SSL_write(SSL* ssl, const void* buf, int num) {
  const auto fn = flowrun::actor::real_write();
  if (!fn) return flowrun::actor::unavailable();
  ERR_clear_error();
  return fn(ssl, buf, num);
}
