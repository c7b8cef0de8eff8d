// `flowrun report METRICS.jsonl [-o DIR] [--signals a,b]`: the run's curves as SVG, one per node,
// and REPORT.md (tools/flowrun/report.h; docs/console.md, "Reports").
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <stdexcept>

#include <spdlog/spdlog.h>

#include "tools/flowrun/commands.h"
#include "tools/flowrun/report.h"

namespace flowrun::cli {

namespace {

struct report_opts {
  std::string input;
  std::string output;                // default: the input's folder
  std::vector<std::string> signals;  // empty: every signal
};

void write_file(const std::filesystem::path& p, const std::string& text) {
  std::ofstream f(p, std::ios::out | std::ios::trunc | std::ios::binary);
  f << text;
  f.close();
  if (!f) throw std::runtime_error("cannot write " + p.string() + " (choose a writable folder with -o DIR)");
}

void run_report(const report_opts& o) {
  namespace fs = std::filesystem;
  if (std::error_code ec; fs::is_directory(o.input, ec))
    throw std::runtime_error("'" + o.input + "' is a folder, not a metrics file: give the file `flowrun run FILE.graph "
                             "--metrics FILE` wrote");
  std::ifstream in(o.input);
  if (!in) throw std::runtime_error("cannot open the metrics file '" + o.input + "' (written by `flowrun run FILE.graph "
                                    "--metrics FILE`)");
  report::metrics_file m = report::parse_metrics(in, o.input);
  if (m.cut_line > 0)  // a run killed while writing its last record: the rest is whole
    spdlog::warn("{}:{}: the last line was cut (no newline, not JSON: a run killed while writing it) and is left out",
                 o.input, m.cut_line);
  if (!o.signals.empty()) {
    std::set<std::string> have;
    for (const auto& s : m.signals) have.insert(s.signal);
    for (const auto& want : o.signals)
      if (!have.count(want)) {
        std::string names;
        for (const auto& h : have) names += (names.empty() ? "" : ", ") + h;
        throw std::runtime_error("--signals: " + o.input + " has no signal '" + want + "'; it has: " +
                                 (names.empty() ? "none" : names));
      }
    std::erase_if(m.signals, [&](const report::series& s) {
      return std::find(o.signals.begin(), o.signals.end(), s.signal) == o.signals.end();
    });
  }
  report::headline_first(m);
  std::vector<std::string> nodes;
  for (const auto& s : m.signals)
    if (std::find(nodes.begin(), nodes.end(), s.node) == nodes.end()) nodes.push_back(s.node);
  const fs::path dir = !o.output.empty() ? fs::path(o.output) : fs::path(o.input).parent_path();
  std::error_code ec;
  if (!dir.empty()) fs::create_directories(dir, ec);
  if (ec) throw std::runtime_error("-o: cannot create the folder " + dir.string() + ": " + ec.message());
  std::size_t nonfinite = 0;
  std::string svgs;
  for (const auto& node : nodes) {
    std::vector<const report::series*> mine;
    for (const auto& s : m.signals)
      if (s.node == node) mine.push_back(&s), nonfinite += s.nonfinite;
    if (!report::has_points(m, node)) continue;  // held-out or non-finite values only: REPORT.md's table
    const fs::path svg = dir / report::svg_file_name(node);
    write_file(svg, report::node_svg(node + " (" + o.input + ")", mine));
    svgs += " " + svg.string();
  }
  write_file(dir / "REPORT.md", report::report_markdown(m, nodes));
  if (nonfinite > 0)
    spdlog::warn("{}: {} non-finite signal values (NaN, ±inf) were skipped; REPORT.md counts them per signal", o.input,
                 nonfinite);
  std::printf("wrote %s%s\n", (dir / "REPORT.md").string().c_str(), svgs.c_str());
}

}  // namespace

void add_report(CLI::App& app) {
  auto o = std::make_shared<report_opts>();
  auto* sub = app.add_subcommand(
      "report", "Plot a run's signals (loss, reward, KL, ...) from a --metrics file: an SVG per node and REPORT.md");
  sub->add_option("METRICS", o->input, "The JSONL file of `flowrun run FILE.graph --metrics FILE`")->required();
  sub->add_option("-o,--output", o->output, "Folder for REPORT.md and the SVGs (default: the metrics file's folder)");
  sub->add_option("--signals", o->signals, "Only these signals (comma-separated names, e.g. reward,kl)")
      ->delimiter(',');
  sub->callback([o] { run_report(*o); });
}

}  // namespace flowrun::cli
