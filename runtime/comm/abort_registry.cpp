#include "runtime/comm/abort_registry.h"

#include <map>
#include <mutex>
#include <utility>

namespace flowrun::comm {

namespace {

struct entry {
  communicator* comm;
  std::string scope;
  std::set<std::string> places;
};

struct registry {
  std::mutex mutex;  // held while aborting, so an entry's communicator outlives the call
  std::uint64_t next = 1;
  std::map<std::uint64_t, entry> entries;
};

registry& the_registry() {
  static registry r;
  return r;
}

void unregister(std::uint64_t id) {
  if (id == 0) return;
  auto& r = the_registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.entries.erase(id);
}

}  // namespace

abort_registration& abort_registration::operator=(abort_registration&& o) noexcept {
  if (this != &o) {
    unregister(id_);
    id_ = o.id_;
    o.id_ = 0;
  }
  return *this;
}

abort_registration::~abort_registration() { unregister(id_); }

abort_registration register_abortable(communicator& c, std::string scope, std::set<std::string> places) {
  auto& r = the_registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  const std::uint64_t id = r.next++;
  r.entries.emplace(id, entry{&c, std::move(scope), std::move(places)});
  return abort_registration(id);
}

namespace {

// Aborts the entries of `scope` that `pick` selects.
template <class Pick>
int abort_where(const std::string& scope, const std::string& why, Pick&& pick) noexcept {
  auto& r = the_registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  int n = 0;
  for (auto& [id, e] : r.entries)
    if (e.scope == scope && pick(e)) {
      e.comm->abort(why);
      ++n;
    }
  return n;
}

}  // namespace

int abort_spanning(const std::string& scope, const std::string& place, const std::string& why) noexcept {
  return abort_where(scope, why, [&](const entry& e) { return e.places.count(place) > 0; });
}

int abort_scope(const std::string& scope, const std::string& why) noexcept {
  return abort_where(scope, why, [](const entry&) { return true; });
}

}  // namespace flowrun::comm
