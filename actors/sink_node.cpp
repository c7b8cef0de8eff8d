// sink: writes each "text" it receives as a line, to standard output or a file.
#include <fstream>
#include <stdexcept>

#include "actors/message_types.h"
#include "actors/register.h"

namespace flowrun::actors {

namespace {

/// path = "": each item goes to standard output (node_context::print, so the
/// progress line stays intact). Otherwise to the file `path`, truncated at
/// start (replica r > 0 writes PATH.r); it is flushed and closed in stop().
/// Metric: "items".
class sink_node final : public actor::node {
 public:
  void start(actor::node_context& ctx) override {
    std::string path = ctx.spec().get_string("path");
    if (path.empty()) return;
    if (ctx.replica() > 0) path.append(".").append(std::to_string(ctx.replica()));
    out_.open(path, std::ios::out | std::ios::trunc);
    if (!out_) throw std::runtime_error("cannot open '" + path + "' for writing");
  }

  void on_message(actor::node_context& ctx, std::string_view, actor::payload msg) override {
    const auto& text = msg.as<std::string>();
    if (out_.is_open()) {
      out_ << text << '\n';
      if (!out_) throw std::runtime_error("write error in " + ctx.spec().get_string("path"));
    } else {
      ctx.print(text);
    }
    ctx.metric("items");
  }

  void stop(actor::node_context&) override {
    if (out_.is_open()) out_.close();
  }

 private:
  std::ofstream out_;
};

}  // namespace

std::unique_ptr<actor::node> make_sink() { return std::make_unique<sink_node>(); }

}  // namespace flowrun::actors
