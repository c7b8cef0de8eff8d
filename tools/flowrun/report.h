// `flowrun report METRICS.jsonl`: a run's training curves as SVG and a Markdown summary.
//
// The metrics file (`flowrun run FILE.graph --metrics FILE`, runtime/actor/metrics.h) holds two
// kinds of JSON lines: snapshots of the counters ({"t":..,"final":..,"nodes":{..},..}) and signal
// records, one per point a node reported with node_context::signal
// ({"signal":"reward","node":"ppo_controller","replica":0,"step":12,"value":-1.2,"t":3.4}).
// This file reads them, groups the points by (node, signal, replica), and writes one SVG per
// node (a panel per signal: the value against the step) and REPORT.md (a table per node).
// No JavaScript, no plotting library: the SVG is text written here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <istream>
#include <string>
#include <vector>

namespace flowrun::report {

/// One plotted point: a finite value reported at step >= 0.
struct point {
  std::int64_t step = 0;
  double value = 0;
};

/// Every record of one (node, signal, replica), in file order, except that after a resume mark
/// ({"resumed":true}: a resumed run appends to the file of the run it continues, and does the
/// steps after its checkpoint again) the series' first point drops the earlier points from its
/// step on: the curve is the later run's there.
struct series {
  std::string node, signal;
  std::int64_t replica = 0;
  std::vector<point> points;     ///< finite values with step >= 0: the curve
  std::vector<double> held_out;  ///< finite values with step < 0 (held-out passes: before, after), in order
  std::size_t nonfinite = 0;     ///< records whose value was NaN or ±inf ("value":null), skipped
  std::size_t run = 0;           ///< the resume marks before this series' last point
  std::size_t held_run = 0;      ///< ... and before its last held-out value (one equal to the one
                                 ///< before it, first after a mark, is a rerun reporting it again)
};

/// What a metrics file holds.
struct metrics_file {
  std::string name;             ///< the file, as named in errors
  std::vector<series> signals;  ///< in the order each (node, signal, replica) first appears
  std::size_t records = 0;      ///< signal records read (all of them, non-finite included)
  std::size_t snapshots = 0;    ///< snapshot lines read
  std::size_t resumes = 0;      ///< resume marks read (runs appended to the first)
  /// The last snapshot line's elapsed seconds, "steps" and "tokens" (when snapshots > 0), and its "final".
  double t_s = 0;
  std::int64_t steps = 0, tokens = 0;
  bool final = false;
  /// The file's last line had no newline and was not JSON: a record a kill cut while it was written,
  /// left out (its line number; 0: none). The report says so.
  std::size_t cut_line = 0;
};

/// Reads a metrics JSONL stream; `name` names it in errors. Blank lines are skipped. Throws
/// std::runtime_error "NAME:LINE: WHAT" for a line that is not JSON, not an object, neither a
/// snapshot ("nodes") nor a signal record ("signal"), or a signal record with a field missing
/// or of the wrong type ("node", "signal": strings; "step", "replica": integers; "value": a
/// number or null). A file without a single line is an error too ("NAME is empty ..."). The one exception:
/// a last line without its newline that is not JSON (a run killed while writing it) is left out, its
/// number in cut_line.
metrics_file parse_metrics(std::istream& in, const std::string& name);

/// first / last (file order), min, max and mean of a series' points (n = 0: all zero).
struct stats {
  std::size_t n = 0;
  double first = 0, last = 0, min = 0, max = 0, mean = 0;
};
stats summarize(const std::vector<point>& points);

/// Heckbert's "nice number" (Graphics Gems, 1990, "Nice numbers for graph labels"): a number
/// of the form {1, 2, 5, 10} x 10^k near x > 0: with `round`, the nearest (cut-offs 1.5, 3, 7);
/// else the smallest such number >= x.
double nice_number(double x, bool round);

/// An axis: the plotted range [lo, hi] and the ticks from lo to hi every `step`.
struct axis {
  double lo = 0, hi = 1, step = 1;
  std::vector<double> ticks;
  int decimals = 0;  ///< digits after the point in the tick labels: max(0, -floor(log10(step)))
};

/// Heckbert's loose labelling of [min, max] with about `ticks` ticks: step = nice_number(
/// nice_number(max - min, false) / (ticks - 1), true), lo = floor(min / step) * step, hi =
/// ceil(max / step) * step, so the data lie inside the ticks' range. With `integer`, step >= 1
/// (steps on the x axis). min == max (a single point, a flat curve) is widened first to
/// min - 1 .. min + 1 for integers, else by 10% of |min| each side (1 when min is 0).
/// Throws std::invalid_argument for non-finite bounds, max < min or ticks < 2.
axis nice_axis(double min, double max, int ticks = 5, bool integer = false);

/// The plot area of a panel, in SVG user units (y grows downwards).
struct box {
  double x = 0, y = 0, w = 0, h = 0;
};

/// The SVG polyline "points" attribute of `points` in box `b`: "X,Y X,Y ..." with
/// X = b.x + (step - xa.lo) / (xa.hi - xa.lo) * b.w and Y = b.y + b.h - (value - ya.lo) /
/// (ya.hi - ya.lo) * b.h, each printed with 2 decimals.
std::string polyline_points(const std::vector<point>& points, const axis& xa, const axis& ya, const box& b);

/// A tick label: `v` with `decimals` digits ("%.*f"), or "%g" when |v| >= 1e6 or decimals > 6.
std::string tick_label(double v, int decimals);

/// A value in the summary table: 6 significant digits ("%.6g").
std::string format_value(double v);

/// True when some signal of `node` has a point to plot (then it gets an SVG).
bool has_points(const metrics_file& m, const std::string& node);

/// Puts the headline signals first, in this order: loss, reward, kl, answer_len, accuracy; the
/// others keep their order of first appearance (stable). The SVG panels and the tables follow.
void headline_first(metrics_file& m);

/// The SVG of one node: a panel per signal (its series of every replica, one polyline each,
/// with data-node, data-signal and data-replica attributes), 2 panels a row, each with its
/// axes, ticks, grid, labels and "step" on x, and a note of its points, held-out and non-finite
/// values. A series with one point also gets a dot; a signal with no point to plot (held-out or
/// non-finite values only) gets no panel. `title` heads the picture.
std::string node_svg(const std::string& title, const std::vector<const series*>& node_series);

/// A file name for node `node`'s SVG: the name with every character outside [A-Za-z0-9._-]
/// replaced by '_', and ".svg".
std::string svg_file_name(const std::string& node);

/// REPORT.md: the run's last snapshot, then per node a link to its SVG (`svg_file_name`; when
/// has_points) and a
/// table of its signals: points, first, last, min, max, mean, the held-out values (step -1; in
/// order, "before → after" for two) and the non-finite values skipped.
std::string report_markdown(const metrics_file& m, const std::vector<std::string>& nodes);

}  // namespace flowrun::report
