// Layer 5, actor runtime: fresh descriptor numbers for the sockets CAF opens.
//
// Why. CAF 0.17's BASP broker (libcaf_io, Debian's 0.17.6) names a connection
// by its file descriptor number, and forgets a closed connection later than
// the descriptor is closed: the routing table's entry is erased by a message
// the broker sends itself (connection_closed_msg -> delete_atom, queued
// behind the connection's messages still being deserialized). A connection
// accepted in that window, often a few hundred milliseconds, gets the same
// descriptor number; routing_table::add_direct then keeps the old entry
// (std::map::emplace), so the daemon reads every message of the new
// connection as coming from the dead peer, and answers the dead peer. Once
// the old entry is erased, the new peer's node id stays mapped to a
// connection that no longer names it, and that process can never talk to
// that daemon again. This is what made a coordinator re-run started right
// after its predecessor's SIGKILL fail with "did not answer the cluster
// handshake" (issue 17, the chaos soak).
//
// What. flowrun defines accept() and socket(), which libcaf_io imports from
// the C library: the executable's definitions take precedence (ELF symbol
// interposition, the same mechanism as a malloc replacement). Each calls the
// C library's function, then moves the new descriptor to the next number of
// a rotating range, [fresh_fd_floor, fresh_fd_ceiling), with
// fcntl(F_DUPFD[_CLOEXEC]) and closes the original. A number therefore comes
// back only after the range has gone round (768 sockets later), far beyond
// the broker's window. The range stays below FD_SETSIZE (1024) because
// cpp-httplib 0.11 waits with select(). When the range is full or the
// process's descriptor limit is lower, the descriptor keeps its number (the
// old behaviour). Other users of these calls (gloo, the console's HTTP
// server) see only a different descriptor number.
#pragma once

namespace flowrun::actor {

/// The first number of the rotating range of socket descriptors.
inline constexpr int fresh_fd_floor = 256;
/// One past the last number of the range (select()'s FD_SETSIZE).
inline constexpr int fresh_fd_ceiling = 1024;

/// True when this process's accept() and socket() are flowrun's (the
/// interposition above is in effect: the executable links this file, and the
/// C library's functions were found). Called by the cluster code, which also
/// makes the linker keep this file.
bool fresh_socket_numbers_active();

/// Moves descriptor `fd` to the next free number of the rotating range,
/// keeping its close-on-exec flag, and returns the new number; returns `fd`
/// unchanged when no number in the range is free, or `fd` is negative or
/// already past the range. Thread-safe (two threads may race for the same
/// start number; F_DUPFD still gives each a free one).
int move_to_fresh_number(int fd);

}  // namespace flowrun::actor
