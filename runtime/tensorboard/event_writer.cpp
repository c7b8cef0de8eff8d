#include "runtime/tensorboard/event_writer.h"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <system_error>

#include "runtime/tensorboard/tfrecord.h"
#include "tensorboard_event.pb.h"

namespace flowrun::tensorboard {

namespace {

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0 || buf[0] == '\0') return "localhost";
  return buf;
}

}  // namespace

double wall_time_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

actor::expected<event_writer> event_writer::open(const std::filesystem::path& dir, double wall_time) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return actor::error_text{"cannot create the folder " + dir.string() + ": " + ec.message()};
  bool earlier = false;  // event files of an earlier run in this folder
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec))
    if (entry.path().filename().string().rfind("events.out.tfevents.", 0) == 0) earlier = true;
  char stamp[32];
  std::snprintf(stamp, sizeof stamp, "%010lld", static_cast<long long>(wall_time));
  const std::string base = "events.out.tfevents." + std::string(stamp) + "." + host_name() + "." +
                           std::to_string(static_cast<long long>(getpid()));
  for (int n = 0;; ++n) {
    const std::filesystem::path p = dir / (n == 0 ? base : base + "." + std::to_string(n));
    std::FILE* f = std::fopen(p.c_str(), "wbx");  // x: never reuse an existing file
    if (!f && errno == EEXIST && n < 1000) continue;
    if (!f) return actor::error_text{"cannot create " + p.string() + ": " + std::strerror(errno)};
    event_writer w(p, f);
    w.purge_pending_ = earlier;
    proto::Event e;
    e.set_wall_time(wall_time);
    e.set_step(0);
    e.set_file_version(std::string(file_version));
    if (auto err = w.write(e.SerializeAsString())) return actor::error_text{*err};
    return w;
  }
}

std::optional<std::string> event_writer::scalar(std::string_view tag, double value, std::int64_t step,
                                                double wall_time) {
  if (purge_pending_) {
    proto::Event start;
    start.set_wall_time(wall_time);
    start.set_step(step);
    start.mutable_session_log()->set_status(proto::SessionLog::START);
    if (auto err = write(start.SerializeAsString())) return err;
    purge_pending_ = false;
    purged_ = true;
  }
  proto::Event e;
  e.set_wall_time(wall_time);
  e.set_step(step);
  proto::SummaryValue* v = e.mutable_summary()->add_value();
  v->set_tag(std::string(tag));
  v->set_simple_value(static_cast<float>(value));
  return write(e.SerializeAsString());
}

std::optional<std::string> event_writer::write(const std::string& event_bytes) {
  const std::string rec = frame_record(event_bytes);
  if (std::fwrite(rec.data(), 1, rec.size(), file_.get()) != rec.size() || std::fflush(file_.get()) != 0)
    return "cannot write " + path_.string() + ": " + std::strerror(errno);
  return std::nullopt;
}

}  // namespace flowrun::tensorboard
