// scan_pointers_into: see holder_scan.h.
#include "runtime/actor/holder_scan.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <fstream>
#include <sstream>

#if defined(__linux__)
#include <cxxabi.h>
#include <dlfcn.h>
#include <sys/uio.h>
#include <unistd.h>
#endif

namespace flowrun::actor {

namespace {

#if defined(__linux__)
// "vtable for caf::mailbox_element_vals<...>+16" for a word dladdr resolves; "" otherwise.
std::string symbol_of(std::uintptr_t value) {
  Dl_info info{};
  if (value < 4096 || dladdr(reinterpret_cast<void*>(value), &info) == 0 || info.dli_sname == nullptr) return {};
  int status = 0;
  char* demangled = abi::__cxa_demangle(info.dli_sname, nullptr, nullptr, &status);
  std::string name = status == 0 && demangled ? demangled : info.dli_sname;
  std::free(demangled);
  const auto offset = value - reinterpret_cast<std::uintptr_t>(info.dli_saddr);
  if (offset != 0) name += "+" + std::to_string(offset);
  return name;
}

std::string hex(std::uintptr_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%zx", static_cast<std::size_t>(v));
  return buf;
}

// Copies [p, p + n) of this process into `to` through process_vm_readv, so that a mapping
// another thread unmaps meanwhile (a stack, a trimmed arena) fails the read instead of the process.
bool read_own(std::uintptr_t p, void* to, std::size_t n) {
  iovec local{to, n}, remote{reinterpret_cast<void*>(p), n};
  return process_vm_readv(getpid(), &local, 1, &remote, 1, 0) == static_cast<ssize_t>(n);
}

struct mapping {
  std::uintptr_t begin = 0, end = 0;
  std::string name;
};

std::vector<mapping> writable_mappings() {
  std::vector<mapping> out;
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    std::istringstream in(line);
    std::string range, perms, offset, dev, inode, name;
    in >> range >> perms >> offset >> dev >> inode;
    std::getline(in >> std::ws, name);
    if (perms.size() < 2 || perms[0] != 'r' || perms[1] != 'w') continue;
    if (name == "[vvar]" || name == "[vsyscall]" || name.rfind("/dev/", 0) == 0) continue;
    const auto dash = range.find('-');
    if (dash == std::string::npos) continue;
    mapping m;
    m.begin = std::stoull(range.substr(0, dash), nullptr, 16);
    m.end = std::stoull(range.substr(dash + 1), nullptr, 16);
    m.name = name.empty() ? "[anonymous]" : name;
    out.push_back(std::move(m));
  }
  return out;
}
#endif

}  // namespace

std::vector<std::string> scan_pointers_into(const void* lo, const void* hi,
                                            const std::vector<std::pair<const void*, const void*>>& skip,
                                            std::size_t max_hits) {
  std::vector<std::string> out;
#if defined(__linux__)
  const auto a = reinterpret_cast<std::uintptr_t>(lo), b = reinterpret_cast<std::uintptr_t>(hi);
  // the scan's own lines and maps are on the heap too: their words are strings, never pointers into [lo, hi)
  constexpr std::size_t chunk_words = 8192;
  std::vector<std::uintptr_t> words(chunk_words + 18);
  const auto own_lo = reinterpret_cast<std::uintptr_t>(words.data());
  const auto own_hi = own_lo + words.size() * sizeof(std::uintptr_t);
  for (const auto& m : writable_mappings()) {
    for (std::uintptr_t c = m.begin; c < m.end; c += chunk_words * sizeof(std::uintptr_t)) {
      // the chunk with 16 words of context before it and 2 after, where the mapping has them
      const std::uintptr_t from = c - m.begin >= 16 * sizeof(std::uintptr_t) ? c - 16 * sizeof(std::uintptr_t) : m.begin;
      const std::uintptr_t to = std::min<std::uintptr_t>(m.end, c + (chunk_words + 2) * sizeof(std::uintptr_t));
      const std::size_t n = (to - from) / sizeof(std::uintptr_t);
      if (!read_own(from, words.data(), n * sizeof(std::uintptr_t))) break;  // gone meanwhile
      const std::size_t first = (c - from) / sizeof(std::uintptr_t);
      const std::size_t last = std::min(n, first + chunk_words);
      for (std::size_t i = first; i < last; ++i) {
        const std::uintptr_t p = from + i * sizeof(std::uintptr_t), v = words[i];
        if ((p >= a && p < b) || v < a || v >= b) continue;
        if (p >= own_lo && p < own_hi) continue;  // the scan's own copy of what it read
        bool skipped = false;
        for (const auto& [s_lo, s_hi] : skip)
          skipped = skipped || (p >= reinterpret_cast<std::uintptr_t>(s_lo) && p < reinterpret_cast<std::uintptr_t>(s_hi));
        if (skipped) continue;
        if (out.size() == max_hits) {
          out.push_back("... (more hits not shown)");
          return out;
        }
        std::string hit = hex(p) + " (in " + m.name + ") = " + hex(v) + " (+" + std::to_string(v - a) + ")";
        for (std::size_t j = i >= 16 ? i - 16 : 0; j < std::min(n, i + 3); ++j) {
          if (j == i) continue;
          if (auto s = symbol_of(words[j]); !s.empty())
            hit += "; word " + std::to_string(static_cast<long>(j) - static_cast<long>(i)) + ": " + s;
        }
        out.push_back(std::move(hit));
      }
    }
  }
  if (out.empty()) out.push_back("no word in this process's writable memory points into it");
#else
  (void)lo;
  (void)hi;
  (void)skip;
  (void)max_hits;
  out.push_back("the pointer scan runs on Linux only");
#endif
  return out;
}

}  // namespace flowrun::actor
