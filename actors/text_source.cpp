// text_source: emits the lines of a text file, one "text" message each.
#include <fstream>
#include <stdexcept>

#include "actors/message_types.h"
#include "actors/register.h"
#include "runtime/util/assets.h"

namespace flowrun::actors {

namespace {

bool blank(const std::string& s) { return s.find_first_not_of(" \t\r\n") == std::string::npos; }

/// Reads `path` (resolved with flowrun::resolve_user_path: as given, else
/// under the asset root) and emits each non-blank line, without its line
/// end. With several replicas, replica r takes lines r, r + R, r + 2R, ...
/// of the non-blank lines, so together they emit the file once. `max_lines`
/// (> 0) caps the lines emitted by the node as a whole. A restarted replica
/// starts again from the top of the file.
class text_source final : public actor::node {
 public:
  void start(actor::node_context& ctx) override {
    const auto path = resolve_user_path(ctx.spec().get_string("path"), "text file");
    in_.open(path);
    if (!in_) throw std::runtime_error("cannot open '" + path.string() + "' for reading");
    max_lines_ = ctx.spec().get_int("max_lines");
    stride_ = ctx.replicas();
    skip_ = ctx.replica();
  }

  bool produce(actor::node_context& ctx) override {
    std::string line;
    while (std::getline(in_, line)) {
      if (blank(line)) continue;
      const std::int64_t index = line_index_++;
      if (max_lines_ > 0 && index >= max_lines_) return false;
      if (static_cast<std::size_t>(index) % stride_ != skip_) continue;
      if (!line.empty() && line.back() == '\r') line.pop_back();
      ctx.metric("lines");
      ctx.emit("lines", actor::payload::make(text_type, std::move(line)));
      return true;
    }
    if (in_.bad()) throw std::runtime_error("read error in " + ctx.spec().get_string("path"));
    return false;
  }

 private:
  std::ifstream in_;
  std::int64_t max_lines_ = 0;
  std::int64_t line_index_ = 0;  // among the non-blank lines of the file
  std::size_t stride_ = 1, skip_ = 0;
};

}  // namespace

std::unique_ptr<actor::node> make_text_source() { return std::make_unique<text_source>(); }

}  // namespace flowrun::actors
