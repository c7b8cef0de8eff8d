#include "actors/node_models.h"

#include <chrono>
#include <ctime>
#include <filesystem>

#include <fmt/format.h>

#include "models/checkpoint.h"

namespace flowrun::actors {

std::string describe_model_file(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::file_time_type t = fs::last_write_time(path, ec);
  if (ec) return path;
  if (fs::is_directory(path, ec)) {  // its newest file: the folder's own time moves when anything is renamed in it
    t = fs::file_time_type::min();
    for (const auto& e : fs::directory_iterator(path, ec))
      if (e.is_regular_file(ec)) t = std::max(t, e.last_write_time(ec));
    if (t == fs::file_time_type::min()) return path;
  }
  // (GCC 12 has no clock_cast: carry the offset between the two clocks' "now")
  const auto sys = std::chrono::system_clock::now() +
                   std::chrono::duration_cast<std::chrono::system_clock::duration>(t - fs::file_time_type::clock::now());
  const std::time_t tt = std::chrono::system_clock::to_time_t(sys);
  std::tm tm{};
  gmtime_r(&tt, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm);
  return fmt::format("{} (modified {} UTC)", path, buf);
}

decoder load_node_model(actor::node_context& ctx, const std::string& path) {
  ctx.log().info("loading model {}", describe_model_file(path));
  return load_model(path);
}

}  // namespace flowrun::actors
