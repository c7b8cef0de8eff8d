// The console page's graph drawing (runtime/console/hub.cpp layout_graph): the shipped graphs fit
// a 1600-pixel-wide window (issue 22: the PPO nodes fell off-screen), with the columns the longest
// paths give; hand-worked widths for a chain that fits, one that shrinks and one that wraps.
#include <doctest/doctest.h>

#include <string>

#include "actors/register.h"
#include "runtime/actor/console_bridge.h"
#include "runtime/console/hub.h"
#include "runtime/graph/parse.h"
#include "runtime/graph/validate.h"

using namespace flowrun;
namespace fc = flowrun::console;

namespace {

fc::graph_info shipped(const std::string& name) {
  static graph::node_kind_registry kinds;
  static actor::node_factory_registry factories;
  static const bool once = (actors::register_builtin_nodes(kinds, factories), true);
  (void)once;
  auto parsed = graph::parse_graph_file(std::string(FLOWRUN_SOURCE_DIR) + "/graphs/" + name);
  INFO(graph::format_errors(parsed.errors));
  REQUIRE(parsed.ok());
  graph::validate_options vo;
  vo.check_files = false;
  auto v = graph::validate(parsed.spec, kinds, vo);
  INFO(graph::format_errors(v.errors));
  REQUIRE(v.ok());
  return actor::describe_graph(v.spec, 4);
}

const fc::node_box& box_of(const fc::graph_layout& l, const std::string& name) {
  for (const auto& b : l.boxes)
    if (b.name == name) return b;
  FAIL("no box for " << name);
  throw 0;
}

// Every box inside [0, max_width] x [0, height], none overlapping another.
void check_fits(const fc::graph_info& g, const fc::graph_layout& l) {
  REQUIRE(l.boxes.size() == g.nodes.size());
  CHECK(l.width <= fc::layout_max_width);
  for (std::size_t i = 0; i < l.boxes.size(); ++i) {
    const auto& a = l.boxes[i];
    INFO(g.name << ": " << a.name << " at x " << a.x << " w " << a.w);
    CHECK(a.name == g.nodes[i].name);
    CHECK(a.x >= 0);
    CHECK(a.y >= 0);
    CHECK(a.x + a.w <= l.width);
    CHECK(a.y + a.h <= l.height);
    CHECK(a.w >= 150);
    for (std::size_t j = 0; j < i; ++j) {
      const auto& b = l.boxes[j];
      const bool apart = a.x + a.w <= b.x || b.x + b.w <= a.x || a.y + a.h <= b.y || b.y + b.h <= a.y;
      INFO(a.name << " and " << b.name);
      CHECK(apart);
    }
  }
}

fc::graph_info chain(int n) {
  fc::graph_info g;
  g.name = "chain";
  for (int i = 0; i < n; ++i) {
    g.nodes.push_back(fc::node_info{"n" + std::to_string(i), "k"});
    if (i > 0) {
      fc::edge_info e;
      e.from = "n" + std::to_string(i - 1), e.to = "n" + std::to_string(i);
      g.edges.push_back(e);
    }
  }
  return g;
}

}  // namespace

TEST_CASE("console layout: rlhf.graph, grpo.graph and pretrain.graph fit a 1600-pixel window") {
  // the panel's inner width in a 1600 px window (console.css): 1600 - 28 - 12 - 400 - 22 - 18
  CHECK(fc::layout_max_width == 1600 - 28 - 12 - 400 - 22 - 18);
  const auto rlhf = shipped("rlhf.graph");
  const auto l = fc::layout_graph(rlhf);
  check_fits(rlhf, l);
  // the longest paths of rlhf.graph, feedback edges (prompts.next, generator.weights, policy/critic.train,
  // ppo_controller.summary/actor_stats/critic_stats) left out: five columns
  CHECK(box_of(l, "sft").column == 0);
  CHECK(box_of(l, "rm").column == 0);
  CHECK(box_of(l, "prompts").column == 0);
  CHECK(box_of(l, "ppo_controller").column == 1);
  CHECK(box_of(l, "generator").column == 2);
  for (const char* n : {"policy", "reference", "reward", "critic"}) CHECK(box_of(l, n).column == 3);
  CHECK(box_of(l, "experience").column == 4);
  for (const auto& b : l.boxes) CHECK(b.band == 0);  // five columns fit without wrapping
  // five columns: 70 px gaps and (1072 - 4 x 70) / 5 = 158.4 px boxes; the last ends at 24 + 4 x 228.4 + 158.4
  CHECK(box_of(l, "experience").w == doctest::Approx(158.4));
  CHECK(box_of(l, "experience").x == doctest::Approx(24 + 4 * 228.4));
  CHECK(l.width == doctest::Approx(24 + 4 * 228.4 + 158.4 + 24));
  for (const char* name : {"grpo.graph", "pretrain.graph", "ppo.graph", "sft.graph", "dpo.graph"}) {
    const auto g = shipped(name);
    check_fits(g, fc::layout_graph(g));
  }
}

TEST_CASE("console layout: full size when it fits, then narrower gaps and boxes, then bands") {
  // three columns: 3 x 200 + 2 x 170 = 940 <= 1120 - 2 x 24: full size
  auto three = fc::layout_graph(chain(3));
  check_fits(chain(3), three);
  CHECK(box_of(three, "n1").x == doctest::Approx(24 + 370));
  CHECK(box_of(three, "n2").x == doctest::Approx(24 + 740));
  CHECK(three.width == doctest::Approx(24 + 740 + 200 + 24));
  // eight columns: 150 px boxes and 70 px gaps give floor((1072 + 70) / 220) = 5 columns a band
  auto eight = fc::layout_graph(chain(8));
  check_fits(chain(8), eight);
  CHECK(box_of(eight, "n4").band == 0);
  CHECK(box_of(eight, "n5").band == 1);
  CHECK(box_of(eight, "n5").x == doctest::Approx(24));
  CHECK(box_of(eight, "n7").x == doctest::Approx(24 + 2 * 220));
  CHECK(box_of(eight, "n5").y == doctest::Approx(24 + 76 + 68));  // below band 0's box and a 68 px gap
  CHECK(box_of(eight, "n0").w == doctest::Approx(150));
  // a cycle no feedback edge closes still gets every node a box (broken at n0, first in graph order)
  auto ring = chain(3);
  fc::edge_info back;
  back.from = "n2", back.to = "n0";
  ring.edges.push_back(back);
  auto lr = fc::layout_graph(ring);
  check_fits(ring, lr);
  CHECK(box_of(lr, "n0").column == 0);
  CHECK(box_of(lr, "n2").column == 2);
}
