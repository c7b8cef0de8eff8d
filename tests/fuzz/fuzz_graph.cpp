// Fuzz target: the graph reader (runtime/graph): TOML, edge strings, includes,
// `--set` overrides, [cluster] tables and cluster files, then placement and
// validation against the example kinds.
//
// Input: parts separated by a line "%%" (fuzz_util.h split_parts):
//   0  main.graph     (may `include = ["inc.graph"]`)
//   1  inc.graph
//   2  overrides, one `PATH=VALUE` per line (as `flowrun run --set`)
//   3  cluster.toml   (as `flowrun run --cluster FILE`)
// Checks beyond "no crash": a graph that reads without errors serialises
// (to_toml) to text that reads again without errors and serialises the same.
#include <cstdint>
#include <cstdio>
#include <string>

#include "runtime/graph/node_kind.h"
#include "runtime/graph/parse.h"
#include "runtime/graph/validate.h"
#include "tests/fuzz/fuzz_util.h"

using namespace flowrun;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const graph::node_kind_registry kinds = [] {
    graph::node_kind_registry k;
    graph::register_example_kinds(k);
    return k;
  }();
  const auto& dir = fuzz::scratch_dir("graph");
  const auto parts = fuzz::split_parts(fuzz::as_text(data, size), "%%");
  fuzz::write_file(dir / "main.graph", parts[0]);
  fuzz::write_file(dir / "inc.graph", parts.size() > 1 ? parts[1] : std::string_view{});

  graph::parse_result r = graph::parse_graph_file(dir / "main.graph");
  if (parts.size() > 2) {
    std::string_view sets = parts[2];
    while (!sets.empty()) {
      const auto nl = sets.find('\n');
      const std::string_view line = sets.substr(0, nl);
      (void)graph::apply_override(r.spec, line, &kinds);
      if (nl == std::string_view::npos) break;
      sets.remove_prefix(nl + 1);
    }
  }
  if (!r.fatal) {
    (void)graph::check_placement(r.spec);
    graph::graph_spec placed = r.spec;
    (void)graph::assign_placement(placed);
    graph::validate_options vo;
    vo.check_files = false;
    (void)graph::validate(r.spec, kinds, vo);
  }
  if (r.ok()) {
    const std::string text = graph::to_toml(r.spec);
    const graph::parse_result again = graph::parse_graph_string(text, dir / "roundtrip.graph");
    if (!again.ok()) {
      std::fprintf(stderr, "to_toml wrote a graph that does not read back:\n%s\n---\n%s\n", text.c_str(),
                   graph::format_errors(again.errors).c_str());
      __builtin_trap();
    }
    const std::string text2 = graph::to_toml(again.spec);
    if (text2 != text) {
      std::fprintf(stderr, "to_toml is not stable over a read:\n%s\n---\n%s\n", text.c_str(), text2.c_str());
      __builtin_trap();
    }
  }
  if (parts.size() > 3) {
    fuzz::write_file(dir / "cluster.toml", parts[3]);
    (void)graph::parse_cluster_file(dir / "cluster.toml");
  }
  return 0;
}
