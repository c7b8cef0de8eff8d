#include "tools/flowrun/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iterator>
#include <map>
#include <stdexcept>
#include <tuple>

#include <nlohmann/json.hpp>

namespace flowrun::report {

namespace {

std::runtime_error line_error(const std::string& name, std::size_t line, const std::string& what) {
  return std::runtime_error(name + ":" + std::to_string(line) + ": " + what);
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string xml_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default: out += c;
    }
  }
  return out;
}

// A Markdown table cell: '|' would end the cell.
std::string md_cell(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '|') out += "\\|";
    else out += c;
  }
  return out;
}

// Line colours of replicas 0, 1, ... (matplotlib's first four).
const char* colour(std::int64_t replica) {
  static const char* c[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728"};
  return c[static_cast<std::size_t>(std::max<std::int64_t>(0, replica)) % 4];
}

}  // namespace

metrics_file parse_metrics(std::istream& in, const std::string& name) {
  metrics_file m;
  m.name = name;
  std::map<std::tuple<std::string, std::string, std::int64_t>, std::size_t> index;
  std::string text;
  std::size_t line = 0, nonblank = 0;
  while (std::getline(in, text)) {
    ++line;
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    ++nonblank;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(text);
    } catch (const nlohmann::json::parse_error& e) {
      if (in.eof()) {  // no newline after it: the last record of a run killed while writing it
        m.cut_line = line;
        --nonblank;
        break;
      }
      throw line_error(name, line, std::string("not a JSON line (") + e.what() + ")");
    } catch (const nlohmann::json::exception& e) {  // e.g. out_of_range: a number past a double (1e400)
      throw line_error(name, line, std::string("a value JSON cannot hold here (") + e.what() + ")");
    }
    if (!j.is_object()) throw line_error(name, line, "not a JSON object");
    if (j.contains("signal")) {
      auto field = [&](const char* key) -> const nlohmann::json& {
        if (!j.contains(key)) throw line_error(name, line, std::string("signal record without \"") + key + "\"");
        return j.at(key);
      };
      const auto& sig = field("signal");
      const auto& node = field("node");
      const auto& step = field("step");
      const auto& value = field("value");
      if (!sig.is_string() || !node.is_string())
        throw line_error(name, line, "\"signal\" and \"node\" must be strings");
      if (!step.is_number_integer()) throw line_error(name, line, "\"step\" must be an integer");
      std::int64_t replica = 0;
      if (j.contains("replica")) {
        if (!j.at("replica").is_number_integer()) throw line_error(name, line, "\"replica\" must be an integer");
        replica = j.at("replica").get<std::int64_t>();
      }
      if (!value.is_number() && !value.is_null())
        throw line_error(name, line, "\"value\" must be a number or null (a non-finite value)");
      auto key = std::make_tuple(node.get<std::string>(), sig.get<std::string>(), replica);
      auto it = index.find(key);
      if (it == index.end()) {
        it = index.emplace(key, m.signals.size()).first;
        series s;
        s.node = std::get<0>(key);
        s.signal = std::get<1>(key);
        s.replica = replica;
        m.signals.push_back(std::move(s));
      }
      series& s = m.signals[it->second];
      ++m.records;
      const double v = value.is_null() ? std::nan("") : value.get<double>();
      const std::int64_t st = step.get<std::int64_t>();
      if (!std::isfinite(v)) ++s.nonfinite;
      else if (st < 0) {
        // a resumed run that only reports again an evaluation it restored (a rerun of a finished run
        // prints the held-out figures again): the same value right after a resume mark is one figure
        if (!(s.held_run < m.resumes && !s.held_out.empty() && s.held_out.back() == v)) s.held_out.push_back(v);
        s.held_run = m.resumes;
      } else {
        // the series' first point after a {"resumed":true} line: the resumed run does again the steps
        // after its checkpoint, and its values replace the earlier run's from that step on
        if (s.run < m.resumes) {
          s.points.erase(std::find_if(s.points.begin(), s.points.end(), [st](const point& p) { return p.step >= st; }),
                         s.points.end());
          s.run = m.resumes;
        }
        s.points.push_back(point{st, v});
      }
    } else if (j.contains("resumed")) {  // a resumed run appends from here (runtime/actor/runtime.cpp)
      ++m.resumes;
    } else if (j.contains("nodes")) {
      ++m.snapshots;
      m.t_s = j.value("t", 0.0);
      m.steps = j.value("steps", std::int64_t{0});
      m.tokens = j.value("tokens", std::int64_t{0});
      m.final = j.value("final", false);
    } else {
      throw line_error(name, line,
                       "neither a signal record (\"signal\"), a snapshot (\"nodes\") nor a resume mark: not a `flowrun run "
                       "--metrics` file?");
    }
  }
  if (nonblank == 0)
    throw std::runtime_error(name + " is empty: the run wrote no metrics (`flowrun run FILE.graph --metrics " + name +
                             "` writes them)");
  return m;
}

stats summarize(const std::vector<point>& points) {
  stats s;
  s.n = points.size();
  if (points.empty()) return s;
  s.first = points.front().value;
  s.last = points.back().value;
  s.min = s.max = s.first;
  double sum = 0;
  for (const auto& p : points) {
    s.min = std::min(s.min, p.value);
    s.max = std::max(s.max, p.value);
    sum += p.value;
  }
  s.mean = sum / static_cast<double>(points.size());
  return s;
}

double nice_number(double x, bool round) {
  if (!(x > 0) || !std::isfinite(x)) throw std::invalid_argument("nice_number: x must be finite and > 0");
  const double e = std::floor(std::log10(x));
  const double p = std::pow(10.0, e);
  const double f = x / p;
  double nf;
  if (round) nf = f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10;
  else nf = f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10;
  return nf * p;
}

axis nice_axis(double min, double max, int ticks, bool integer) {
  if (!std::isfinite(min) || !std::isfinite(max) || max < min || ticks < 2)
    throw std::invalid_argument("nice_axis: needs finite min <= max and ticks >= 2");
  if (max == min) {
    const double pad = integer ? 1.0 : (min == 0 ? 1.0 : std::fabs(min) * 0.1);
    min -= pad;
    max += pad;
  }
  axis a;
  a.step = nice_number(nice_number(max - min, false) / (ticks - 1), true);
  if (integer) a.step = std::max(1.0, a.step);
  // a tiny tolerance so that 0.30000000000000004 / 0.1 does not add a tick
  const double k_lo = std::floor(min / a.step + 1e-9), k_hi = std::ceil(max / a.step - 1e-9);
  a.lo = k_lo * a.step;
  a.hi = k_hi * a.step;
  for (double k = k_lo; k <= k_hi + 0.5; k += 1) a.ticks.push_back(k * a.step);
  a.decimals = static_cast<int>(std::max(0.0, -std::floor(std::log10(a.step))));
  return a;
}

std::string polyline_points(const std::vector<point>& points, const axis& xa, const axis& ya, const box& b) {
  std::string out;
  char buf[64];
  for (const auto& p : points) {
    const double x = b.x + (static_cast<double>(p.step) - xa.lo) / (xa.hi - xa.lo) * b.w;
    const double y = b.y + b.h - (p.value - ya.lo) / (ya.hi - ya.lo) * b.h;
    std::snprintf(buf, sizeof buf, "%s%.2f,%.2f", out.empty() ? "" : " ", x, y);
    out += buf;
  }
  return out;
}

std::string tick_label(double v, int decimals) {
  if (v == 0) v = 0;  // no "-0"
  char buf[64];
  if (std::fabs(v) >= 1e6 || decimals > 6) std::snprintf(buf, sizeof buf, "%g", v);
  else std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

std::string format_value(double v) { return fmt("%.6g", v); }

std::string svg_file_name(const std::string& node) {
  std::string out;
  for (char c : node) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
                    c == '_' || c == '-';
    out += ok ? c : '_';
  }
  if (out.empty() || out[0] == '.') out.insert(out.begin(), '_');
  return out + ".svg";
}

std::string node_svg(const std::string& title, const std::vector<const series*>& node_series) {
  // the panels: one per signal (its replicas together), in order of first appearance
  std::vector<std::pair<std::string, std::vector<const series*>>> panels;
  for (const series* s : node_series) {
    if (s->points.empty()) continue;  // held-out or non-finite values only: the table has them
    auto it = std::find_if(panels.begin(), panels.end(), [&](const auto& p) { return p.first == s->signal; });
    if (it == panels.end()) panels.push_back({s->signal, {s}});
    else it->second.push_back(s);
  }
  constexpr double panel_w = 440, panel_h = 280, head = 36;
  constexpr double left = 64, right = 16, top = 40, bottom = 42;  // the plot box inside a panel
  const int cols = panels.size() > 1 ? 2 : 1;
  const int rows = static_cast<int>((panels.size() + cols - 1) / cols);
  const double width = cols * panel_w, height = head + std::max(1, rows) * panel_h;
  std::string o;
  o += "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  o += "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + fmt("%.0f", width) + "\" height=\"" +
       fmt("%.0f", height) + "\" viewBox=\"0 0 " + fmt("%.0f", width) + " " + fmt("%.0f", height) +
       "\" font-family=\"sans-serif\" font-size=\"11\">\n";
  o += "<rect x=\"0\" y=\"0\" width=\"" + fmt("%.0f", width) + "\" height=\"" + fmt("%.0f", height) +
       "\" fill=\"white\"/>\n";
  o += "<text x=\"12\" y=\"24\" font-size=\"16\" font-weight=\"bold\">" + xml_escape(title) + "</text>\n";
  for (std::size_t i = 0; i < panels.size(); ++i) {
    const auto& [name, group] = panels[i];
    const double px = static_cast<double>(i % cols) * panel_w, py = head + static_cast<double>(i / cols) * panel_h;
    const box b{px + left, py + top, panel_w - left - right, panel_h - top - bottom};
    std::size_t n = 0, held = 0, nonfinite = 0;
    double xmin = 0, xmax = 0, ymin = 0, ymax = 0;
    for (const series* s : group) {
      held += s->held_out.size();
      nonfinite += s->nonfinite;
      for (const auto& p : s->points) {
        const double x = static_cast<double>(p.step);
        if (n == 0) xmin = xmax = x, ymin = ymax = p.value;
        xmin = std::min(xmin, x), xmax = std::max(xmax, x), ymin = std::min(ymin, p.value),
        ymax = std::max(ymax, p.value);
        ++n;
      }
    }
    std::string note = std::to_string(n) + (n == 1 ? " point" : " points");
    if (held) note += ", " + std::to_string(held) + " held-out (step -1) in REPORT.md";
    if (nonfinite) note += ", " + std::to_string(nonfinite) + " non-finite skipped";
    o += "<g data-panel=\"" + xml_escape(name) + "\">\n";
    o += "<text x=\"" + fmt("%.2f", b.x) + "\" y=\"" + fmt("%.2f", py + 14) + "\" font-size=\"13\" font-weight=\"bold\">" +
         xml_escape(name) + "</text>\n";
    o += "<text x=\"" + fmt("%.2f", b.x) + "\" y=\"" + fmt("%.2f", py + 29) + "\" fill=\"#666\">" + xml_escape(note) +
         "</text>\n";
    o += "<rect x=\"" + fmt("%.2f", b.x) + "\" y=\"" + fmt("%.2f", b.y) + "\" width=\"" + fmt("%.2f", b.w) +
         "\" height=\"" + fmt("%.2f", b.h) + "\" fill=\"none\" stroke=\"#333\"/>\n";
    const axis xa = nice_axis(xmin, xmax, 6, true), ya = nice_axis(ymin, ymax, 5, false);
    for (double t : xa.ticks) {
      const double x = b.x + (t - xa.lo) / (xa.hi - xa.lo) * b.w;
      o += "<line x1=\"" + fmt("%.2f", x) + "\" y1=\"" + fmt("%.2f", b.y) + "\" x2=\"" + fmt("%.2f", x) + "\" y2=\"" +
           fmt("%.2f", b.y + b.h + 4) + "\" stroke=\"#ddd\"/>\n";
      o += "<text x=\"" + fmt("%.2f", x) + "\" y=\"" + fmt("%.2f", b.y + b.h + 16) + "\" text-anchor=\"middle\">" +
           tick_label(t, xa.decimals) + "</text>\n";
    }
    for (double t : ya.ticks) {
      const double y = b.y + b.h - (t - ya.lo) / (ya.hi - ya.lo) * b.h;
      o += "<line x1=\"" + fmt("%.2f", b.x - 4) + "\" y1=\"" + fmt("%.2f", y) + "\" x2=\"" + fmt("%.2f", b.x + b.w) +
           "\" y2=\"" + fmt("%.2f", y) + "\" stroke=\"#ddd\"/>\n";
      o += "<text x=\"" + fmt("%.2f", b.x - 7) + "\" y=\"" + fmt("%.2f", y + 4) + "\" text-anchor=\"end\">" +
           tick_label(t, ya.decimals) + "</text>\n";
    }
    o += "<text x=\"" + fmt("%.2f", b.x + b.w / 2) + "\" y=\"" + fmt("%.2f", b.y + b.h + 32) +
         "\" text-anchor=\"middle\" fill=\"#333\">step</text>\n";
    for (const series* s : group) {
      if (s->points.empty()) continue;
      o += "<polyline data-node=\"" + xml_escape(s->node) + "\" data-signal=\"" + xml_escape(s->signal) +
           "\" data-replica=\"" + std::to_string(s->replica) + "\" fill=\"none\" stroke=\"" + colour(s->replica) +
           "\" stroke-width=\"1.5\" points=\"" + polyline_points(s->points, xa, ya, b) + "\"/>\n";
      if (s->points.size() == 1) {
        const std::string xy = polyline_points(s->points, xa, ya, b);
        const auto comma = xy.find(',');
        o += "<circle cx=\"" + xy.substr(0, comma) + "\" cy=\"" + xy.substr(comma + 1) + "\" r=\"3\" fill=\"" +
             colour(s->replica) + "\"/>\n";
      }
    }
    if (group.size() > 1) {  // a legend: the replicas' colours
      double ly = b.y + 12;
      for (const series* s : group) {
        o += "<text x=\"" + fmt("%.2f", b.x + b.w - 6) + "\" y=\"" + fmt("%.2f", ly) + "\" text-anchor=\"end\" fill=\"" +
             colour(s->replica) + "\">replica " + std::to_string(s->replica) + "</text>\n";
        ly += 13;
      }
    }
    o += "</g>\n";
  }
  o += "</svg>\n";
  return o;
}

bool has_points(const metrics_file& m, const std::string& node) {
  return std::any_of(m.signals.begin(), m.signals.end(),
                     [&](const series& s) { return s.node == node && !s.points.empty(); });
}

void headline_first(metrics_file& m) {
  static const char* headline[] = {"loss", "reward", "kl", "answer_len", "accuracy"};
  auto rank = [](const std::string& name) {
    for (std::size_t i = 0; i < std::size(headline); ++i)
      if (name == headline[i]) return i;
    return std::size(headline);
  };
  std::stable_sort(m.signals.begin(), m.signals.end(),
                   [&](const series& a, const series& b) { return rank(a.signal) < rank(b.signal); });
}

std::string report_markdown(const metrics_file& m, const std::vector<std::string>& nodes) {
  std::string o = "# Run report: " + m.name + "\n\n";
  if (m.snapshots > 0) {
    o += "Last snapshot" + std::string(m.final ? " (final)" : " (not final: the run did not finish?)") + ": " +
         fmt("%.1f", m.t_s) + " s, " + std::to_string(m.steps) + " steps, " + std::to_string(m.tokens) +
         " tokens" +
         (m.resumes > 0 ? " (the last run's own: this file holds " + std::to_string(m.resumes + 1) +
                              " runs, each resumed from the one before; the curves join them)"
                        : std::string()) +
         ". ";
  }
  std::size_t nonfinite = 0;
  for (const auto& s : m.signals) nonfinite += s.nonfinite;
  o += std::to_string(m.records) + " signal records from " + std::to_string(nodes.size()) +
       (nodes.size() == 1 ? " node" : " nodes");
  o += nonfinite ? "; " + std::to_string(nonfinite) + " non-finite values (NaN, ±inf) were skipped.\n" : ".\n";
  if (nodes.empty()) o += "\nNo node reported a signal (node_context::signal), so there is nothing to plot.\n";
  o += "\nCurves: points with a step (the x axis). Held-out: values reported without one (step -1; for\n"
       "PPO the held-out passes before and after training), in order.\n";
  for (const auto& node : nodes) {
    bool multi = false;
    for (const auto& s : m.signals)
      if (s.node == node && s.replica != 0) multi = true;
    o += "\n## " + node + "\n\n";
    if (has_points(m, node)) o += "![" + node + "](" + svg_file_name(node) + ")\n\n";
    o += "| signal | points | first | last | min | max | mean | held-out | non-finite |\n";
    o += "|---|---:|---:|---:|---:|---:|---:|---|---:|\n";
    for (const auto& s : m.signals) {
      if (s.node != node) continue;
      const stats st = summarize(s.points);
      std::string held;
      for (double v : s.held_out) held += (held.empty() ? "" : " → ") + format_value(v);
      o += "| " + md_cell(s.signal) + (multi ? " [" + std::to_string(s.replica) + "]" : "") + " | " +
           std::to_string(st.n) + " | ";
      if (st.n > 0)
        o += format_value(st.first) + " | " + format_value(st.last) + " | " + format_value(st.min) + " | " +
             format_value(st.max) + " | " + format_value(st.mean) + " | ";
      else
        o += " |  |  |  |  | ";
      o += held + " | " + std::to_string(s.nonfinite) + " |\n";
    }
  }
  return o;
}

}  // namespace flowrun::report
