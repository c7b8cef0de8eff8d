// Layer 5, actor runtime: a clean OpenSSL error queue before each TLS read
// and write of CAF's TLS connections.
//
// Why. OpenSSL keeps one error queue per thread, and SSL_get_error() reads
// it: "The current thread's error queue must be empty before the TLS/SSL I/O
// operation is attempted, or SSL_get_error() will not work reliably"
// (OpenSSL's SSL_get_error(3)). CAF 0.17's caf_openssl (Debian's 0.17.6,
// libcaf_openssl/src/openssl/session.cpp) runs every TLS connection of a
// process on the middleman's one thread and never clears the queue: when a
// peer's connection is reset, SSL_read fails with SSL_ERROR_SYSCALL and its
// entry stays in the queue (session::handle_ssl_result returns without
// reading it). The next SSL_read on *another* connection that merely has no
// data yet (SSL_ERROR_WANT_READ) is then reported as SSL_ERROR_SSL, and CAF
// closes that healthy connection. In a cluster run over TLS, killing one
// node made the coordinator declare a second, healthy node lost
// (remote_link_unreachable), or left the survivor's connection unable to
// carry the restart's handshake ("did not answer the cluster handshake"
// after connect_timeout_ms); 3 runs of 3 on 2026-12-05 (docs/reliability.md).
//
// What. flowrun defines SSL_read and SSL_write, which libcaf_openssl imports
// from libssl: the executable's definitions take precedence (ELF symbol
// interposition, as in socket_numbers.h). Each clears the calling thread's
// error queue (ERR_clear_error) and calls libssl's function, found with
// dlsym(RTLD_NEXT). Every other caller of these functions in the process gets
// the same, documented-correct, behaviour. The handshake calls (SSL_connect,
// SSL_accept) need nothing: OpenSSL's handshake state machine clears the
// queue itself when it starts.
#pragma once

namespace flowrun::actor {

/// True when this process's SSL_read and SSL_write are the ones above
/// (libssl's were found behind them). Called by the
/// cluster code, which also makes the linker keep this file.
bool tls_error_queue_cleared();

}  // namespace flowrun::actor
