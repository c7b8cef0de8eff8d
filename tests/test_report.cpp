// `flowrun report` (tools/flowrun/report.h): Heckbert's nice numbers and axes, the statistics of
// a series, the polyline's coordinates in the plot box and the metrics file's reading, each
// worked by hand below. tests/report_small.sh runs it on a real run's metrics file.
#include <doctest/doctest.h>

#include <cmath>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "tools/flowrun/report.h"

namespace rp = flowrun::report;

namespace {

std::vector<double> ticks(const rp::axis& a) { return a.ticks; }

std::size_t count(const std::string& s, const std::string& what) {
  std::size_t n = 0;
  for (auto at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

std::string error_of(const std::string& text, const std::string& name = "m.jsonl") {
  std::istringstream in(text);
  try {
    rp::parse_metrics(in, name);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

// Heckbert, "Nice numbers for graph labels", Graphics Gems (1990): x = f * 10^e, f in [1, 10);
// rounded: f < 1.5 -> 1, < 3 -> 2, < 7 -> 5, else 10; not rounded: the smallest of 1, 2, 5, 10 >= f.
TEST_CASE("report: nice numbers") {
  CHECK(rp::nice_number(0.73, true) == doctest::Approx(1.0));    // f = 7.3 >= 7
  CHECK(rp::nice_number(0.73, false) == doctest::Approx(1.0));   // 7.3 > 5
  CHECK(rp::nice_number(2.9, true) == doctest::Approx(2.0));     // 2.9 < 3
  CHECK(rp::nice_number(2.9, false) == doctest::Approx(5.0));    // 2 < 2.9 <= 5
  CHECK(rp::nice_number(120, false) == doctest::Approx(200.0));  // f = 1.2 <= 2
  CHECK(rp::nice_number(0.0012, true) == doctest::Approx(0.001));
  CHECK_THROWS_AS(rp::nice_number(0, true), std::invalid_argument);
}

TEST_CASE("report: axes cover the data with nice ticks") {
  // [-1.23, 0.41], 5 ticks: range nice(1.64) = 2, step nice(2 / 4 = 0.5) = 0.5,
  // lo = floor(-2.46) * 0.5 = -1.5, hi = ceil(0.82) * 0.5 = 0.5; one decimal
  const rp::axis a = rp::nice_axis(-1.23, 0.41, 5);
  CHECK(a.step == doctest::Approx(0.5));
  CHECK(a.lo == doctest::Approx(-1.5));
  CHECK(a.hi == doctest::Approx(0.5));
  REQUIRE(a.ticks.size() == 5);
  const double want[] = {-1.5, -1.0, -0.5, 0.0, 0.5};
  for (std::size_t i = 0; i < 5; ++i) CHECK(a.ticks[i] == doctest::Approx(want[i]));
  CHECK(a.decimals == 1);
  CHECK(rp::tick_label(a.ticks[0], a.decimals) == "-1.5");
  CHECK(rp::tick_label(a.ticks[3], a.decimals) == "0.0");

  // steps 0..39 with 6 ticks: range nice(39) = 50, step nice(10) = 10, 0..40
  const rp::axis x = rp::nice_axis(0, 39, 6, true);
  CHECK(ticks(x) == std::vector<double>{0, 10, 20, 30, 40});
  CHECK(x.decimals == 0);
  CHECK(rp::tick_label(30, x.decimals) == "30");

  // a single step: widened to 2..4; the step is at least 1 on an integer axis (nice(0.4) = 0.5)
  CHECK(ticks(rp::nice_axis(3, 3, 6, true)) == std::vector<double>{2, 3, 4});
  // a flat value 5: widened by 10% to [4.5, 5.5]: step nice(nice(1) / 4 = 0.25) = 0.2, 4.4 .. 5.6
  const rp::axis f = rp::nice_axis(5, 5, 5);
  CHECK(f.lo == doctest::Approx(4.4));
  CHECK(f.hi == doctest::Approx(5.6));
  CHECK(f.ticks.size() == 7);
  // a flat 0: [-1, 1] by 0.5
  const rp::axis z = rp::nice_axis(0, 0, 5);
  CHECK(z.lo == doctest::Approx(-1));
  CHECK(z.hi == doctest::Approx(1));
  CHECK(z.ticks.size() == 5);
  CHECK_THROWS_AS(rp::nice_axis(1, 0), std::invalid_argument);
  CHECK_THROWS_AS(rp::nice_axis(0, std::nan("")), std::invalid_argument);
}

TEST_CASE("report: first, last, min, max and mean of a series") {
  // 2, -1, 4, 3: first 2, last 3, min -1, max 4, mean 8 / 4 = 2
  const rp::stats s = rp::summarize({{0, 2}, {1, -1}, {2, 4}, {3, 3}});
  CHECK(s.n == 4);
  CHECK(s.first == 2);
  CHECK(s.last == 3);
  CHECK(s.min == -1);
  CHECK(s.max == 4);
  CHECK(s.mean == 2);
  CHECK(rp::summarize({}).n == 0);
}

TEST_CASE("report: the polyline's points scale to the plot box exactly") {
  // x: steps 0..20, 6 ticks: range nice(20) = 20, step nice(4) = 5, axis 0..20;
  // y: -1..0.5, 5 ticks: range nice(1.5) = 2, step nice(0.5) = 0.5, axis -1..0.5.
  // Box (64, 30) 360 x 208: X = 64 + step / 20 * 360; Y = 30 + 208 - (v + 1) / 1.5 * 208:
  // (0, -1) -> (64, 238); (10, 0) -> (244, 238 - 138.666..) = (244, 99.33); (20, 0.5) -> (424, 30).
  const std::vector<rp::point> pts = {{0, -1.0}, {10, 0.0}, {20, 0.5}};
  const rp::axis xa = rp::nice_axis(0, 20, 6, true), ya = rp::nice_axis(-1.0, 0.5, 5);
  CHECK(xa.lo == 0);
  CHECK(xa.hi == 20);
  CHECK(ya.lo == doctest::Approx(-1));
  CHECK(ya.hi == doctest::Approx(0.5));
  CHECK(rp::polyline_points(pts, xa, ya, rp::box{64, 30, 360, 208}) == "64.00,238.00 244.00,99.33 424.00,30.00");
}

TEST_CASE("report: a metrics file's signal records, held-out points, non-finite values and snapshots") {
  std::istringstream in(
      R"({"t":0.5,"final":false,"steps":0,"tokens":0,"produced":0,"nodes":{},"edges":{}})"
      "\n"
      R"({"signal":"reward","node":"ppo","replica":0,"step":-1,"value":0.5,"t":1.0})"
      "\n\n"
      R"({"signal":"reward","node":"ppo","replica":0,"step":0,"value":2,"t":1.1})"
      "\n"
      R"({"signal":"reward","node":"ppo","replica":0,"step":1,"value":null,"nonfinite":"nan","t":1.2})"
      "\n"
      R"({"signal":"kl","node":"ppo","replica":0,"step":1,"value":0.25,"t":1.2})"
      "\n"
      R"({"signal":"reward","node":"ppo","replica":0,"step":2,"value":-1,"t":1.3})"
      "\n"
      R"({"signal":"reward","node":"ppo","replica":0,"step":3,"value":4,"t":1.4})"
      "\n"
      R"({"signal":"reward","node":"ppo","replica":0,"step":-1,"value":0.875,"t":1.5})"
      "\n"
      R"({"signal":"loss","node":"sft","step":7,"value":3.5,"t":0.2})"
      "\n"
      R"({"t":2.0,"final":true,"steps":4,"tokens":1234,"produced":9,"nodes":{},"edges":{}})"
      "\n");
  const rp::metrics_file m = rp::parse_metrics(in, "m.jsonl");
  CHECK(m.records == 8);
  CHECK(m.snapshots == 2);
  CHECK(m.final);
  CHECK(m.steps == 4);
  CHECK(m.tokens == 1234);
  CHECK(m.t_s == 2.0);
  REQUIRE(m.signals.size() == 3);
  const rp::series& r = m.signals[0];
  CHECK(r.node == "ppo");
  CHECK(r.signal == "reward");
  REQUIRE(r.points.size() == 3);
  CHECK(r.points[1].step == 2);
  CHECK(r.points[1].value == -1);
  CHECK(r.held_out == std::vector<double>{0.5, 0.875});
  CHECK(r.nonfinite == 1);
  CHECK(m.signals[1].signal == "kl");
  CHECK(m.signals[2].node == "sft");
  CHECK(m.signals[2].replica == 0);  // no "replica": 0

  // the table: 3 points 2, -1, 4: first 2, last 4, min -1, max 4, mean 5 / 3 = 1.66667
  const std::string md = rp::report_markdown(m, {"ppo", "sft"});
  CHECK_MESSAGE(md.find("| reward | 3 | 2 | 4 | -1 | 4 | 1.66667 | 0.5 → 0.875 | 1 |") != std::string::npos, md);
  CHECK_MESSAGE(md.find("| kl | 1 | 0.25 | 0.25 | 0.25 | 0.25 | 0.25 |  | 0 |") != std::string::npos, md);
  CHECK(md.find("![ppo](ppo.svg)") != std::string::npos);
  CHECK(md.find("1 non-finite values") != std::string::npos);
  CHECK(md.find("4 steps, 1234 tokens") != std::string::npos);

  // the SVG: a polyline per signal with a point per record, a dot for the single point
  const std::string svg = rp::node_svg("ppo", {&m.signals[0], &m.signals[1]});
  CHECK(count(svg, "<polyline") == 2);
  CHECK(count(svg, "<circle") == 1);
  CHECK(svg.find("data-signal=\"reward\"") != std::string::npos);
  CHECK(svg.find("2 held-out (step -1) in REPORT.md, 1 non-finite skipped") != std::string::npos);
  // a signal with held-out values only has no panel; a node with nothing to plot has no SVG
  rp::series held_only;
  held_only.node = "ppo";
  held_only.signal = "held_out/reward";
  held_only.held_out = {0.5, 0.875};
  CHECK(count(rp::node_svg("ppo", {&m.signals[0], &held_only}), "data-panel=") == 1);
  rp::metrics_file h;
  h.signals = {held_only};
  CHECK_FALSE(rp::has_points(h, "ppo"));
  CHECK(rp::has_points(m, "ppo"));
  CHECK(rp::report_markdown(h, {"ppo"}).find("![ppo]") == std::string::npos);

  // the headline signals first (loss, reward, kl, ...), the rest in order of appearance
  rp::metrics_file o = m;
  rp::headline_first(o);
  CHECK(o.signals[0].signal == "loss");
  CHECK(o.signals[1].signal == "reward");
  CHECK(o.signals[2].signal == "kl");
}

TEST_CASE("report: bad lines name the file and the line") {
  CHECK(error_of("").find("m.jsonl is empty") == 0);
  CHECK(error_of("\n\n").find("m.jsonl is empty") == 0);
  const std::string good = R"({"signal":"loss","node":"sft","step":1,"value":2.0})";
  CHECK(error_of(good + "\n" + good + "\nnot json\n").find("m.jsonl:3: not a JSON line") == 0);
  // a last line cut without its newline (a run killed while writing it) is left out, not an error; one
  // with its newline, or one not last, is
  {
    std::istringstream in(good + "\n" + good + "\n{\"signal\":\"lo");
    const rp::metrics_file m = rp::parse_metrics(in, "m.jsonl");
    CHECK(m.cut_line == 3);
    CHECK(m.records == 2);
  }
  CHECK(error_of(good + "\n{\"signal\":\"lo\n" + good).find("m.jsonl:2: not a JSON line") == 0);
  CHECK(error_of("{\"signal\":\"lo").find("m.jsonl is empty") == 0);  // nothing whole: no report
  CHECK(error_of("[1, 2]\n").find("m.jsonl:1: not a JSON object") == 0);
  CHECK(error_of("{\"x\": 1}\n").find("m.jsonl:1: neither a signal record") == 0);
  CHECK(error_of(R"({"signal":"loss","node":"sft","value":2.0})").find("m.jsonl:1: signal record without \"step\"") ==
        0);
  CHECK(error_of(R"({"signal":"loss","node":"sft","step":1.5,"value":2.0})").find("\"step\" must be an integer") !=
        std::string::npos);
  CHECK(error_of(R"({"signal":"loss","node":"sft","step":1,"value":"2"})").find("\"value\" must be a number") !=
        std::string::npos);
  // a number past a double is the file's fault at its line, like the others
  CHECK(error_of(good + "\n" + R"({"signal":"loss","node":"sft","step":2,"value":1e400})" "\n").find("m.jsonl:2: ") == 0);
}

TEST_CASE("report: SVG file names keep to safe characters") {
  CHECK(rp::svg_file_name("ppo_controller") == "ppo_controller.svg");
  CHECK(rp::svg_file_name("a/b c") == "a_b_c.svg");
  CHECK(rp::svg_file_name("..") == "_...svg");
}

TEST_CASE("report: a resumed run appended to the file replaces the steps it did again") {
  // the first run reached step 3 and was killed; the resumed one (from a checkpoint after step 1)
  // reports steps 2 and 3 again, then 4: the curve is 0, 1 (first run), 2, 3, 4 (resumed run).
  // "loss" has two points per step; its resumed run starts at the first run's last step, 3.
  std::istringstream in(
      R"({"signal":"reward","node":"ppo","step":0,"value":10,"t":1.0})"
      "\n"
      R"({"signal":"reward","node":"ppo","step":1,"value":11,"t":1.1})"
      "\n"
      R"({"signal":"reward","node":"ppo","step":2,"value":12,"t":1.2})"
      "\n"
      R"({"signal":"reward","node":"ppo","step":3,"value":13,"t":1.3})"
      "\n"
      R"({"signal":"loss","node":"ppo","step":3,"value":1,"t":1.3})"
      "\n"
      R"({"signal":"loss","node":"ppo","step":3,"value":2,"t":1.3})"
      "\n"
      R"({"t":1.5,"final":false,"steps":0,"tokens":0,"produced":0,"nodes":{},"edges":{}})"
      "\n"
      R"({"signal":"reward","node":"ppo","step":-1,"value":0.5,"t":1.4})"
      "\n"
      R"({"resumed":true})"
      "\n"
      R"({"signal":"reward","node":"ppo","step":-1,"value":0.5,"t":0.1})"
      "\n"
      R"({"signal":"loss","node":"ppo","step":3,"value":5,"t":0.5})"
      "\n"
      R"({"signal":"loss","node":"ppo","step":3,"value":6,"t":0.5})"
      "\n"
      R"({"signal":"reward","node":"ppo","step":2,"value":22,"t":0.6})"
      "\n"
      R"({"signal":"reward","node":"ppo","step":3,"value":23,"t":0.7})"
      "\n"
      R"({"signal":"reward","node":"ppo","step":4,"value":24,"t":0.8})"
      "\n");
  const rp::metrics_file m = rp::parse_metrics(in, "m.jsonl");
  CHECK(m.records == 13);
  CHECK(m.resumes == 1);
  // the held-out figure the resumed run reported again is one figure
  CHECK(m.signals[0].held_out == std::vector<double>{0.5});
  CHECK(rp::report_markdown(m, {"ppo"}).find("this file holds 2 runs") != std::string::npos);
  REQUIRE(m.signals.size() == 2);
  const auto& loss = m.signals[1].points;
  REQUIRE(loss.size() == 2);
  CHECK(loss[0].value == 5);
  CHECK(loss[1].value == 6);
  const auto& p = m.signals[0].points;
  REQUIRE(p.size() == 5);
  for (std::size_t i = 0; i < p.size(); ++i) CHECK(p[i].step == static_cast<std::int64_t>(i));
  CHECK(p[1].value == 11);
  CHECK(p[2].value == 22);
  CHECK(p[4].value == 24);
}
