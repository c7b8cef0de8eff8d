// Which memory still points at an object: a diagnostic for the teardown watchdog (teardown.h).
#pragma once

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace flowrun::actor {

/// Scans this process's writable memory (/proc/self/maps: every mapping with `rw` permissions,
/// heap, anonymous mappings, thread stacks and the binaries' data segments) for 8-byte-aligned
/// words whose value lies in [lo, hi), the words inside [lo, hi) itself excepted. Each hit
/// becomes one line: its address, the mapping it lies in, and every word of the 16 before it
/// and the 2 after it that dladdr resolves to a symbol (a vtable or a function names the object
/// or closure that holds the pointer; a binary linked with -rdynamic resolves its own too).
///
/// For the watchdog of a hung CAF teardown: CAF 0.17 keeps no record of who holds a strong
/// reference to an actor, so the scan looks for the pointers themselves (a strong_actor_ptr, a
/// caf::actor, a raw actor pointer). Other threads keep running while it reads, so a line may
/// name a word that changed meanwhile; nothing is written. The scan cannot tell live memory
/// from freed heap chunks, so stale words of freed objects are listed too (a destroyed
/// behaviour's closures, say): a hit is a candidate holder, not a proof. At most `max_hits` lines.
/// Words inside any range of `skip` are not reported (the caller's own weak handles, say).
/// Linux only (elsewhere: one line saying so).
std::vector<std::string> scan_pointers_into(const void* lo, const void* hi,
                                            const std::vector<std::pair<const void*, const void*>>& skip = {},
                                            std::size_t max_hits = 32);

}  // namespace flowrun::actor
