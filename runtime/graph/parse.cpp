#include "runtime/graph/parse.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <toml++/toml.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>
#include <system_error>

#include "runtime/util/same_path.h"
#include "runtime/util/utf8.h"

namespace flowrun::graph {

namespace fs = std::filesystem;

namespace {

// ---------------------------------------------------------------- helpers

source_pos pos_of(const toml::source_region& r) {
  return {r.path ? std::string(*r.path) : std::string(), static_cast<int>(r.begin.line),
          static_cast<int>(r.begin.column)};
}
source_pos pos_of(const toml::node& n) { return pos_of(n.source()); }
source_pos pos_of(const toml::key& k) { return pos_of(k.source()); }

std::string join(const std::vector<std::string>& v, std::string_view sep = ", ") {
  std::string s;
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? std::string(sep) : std::string()) + v[i];
  return s;
}

// "did you mean 'x'?" when a near name exists, else "valid names: a, b, c".
std::string suggest(std::string_view name, const std::vector<std::string>& valid, std::string_view what) {
  std::string near = nearest_name(name, valid);
  if (!near.empty()) return "did you mean '" + near + "'?";
  if (valid.empty()) return "there are no " + std::string(what);
  return "valid " + std::string(what) + ": " + join(valid);
}

// True when the characters of a string value map 1:1 onto source columns:
// one line, no escapes, ASCII only (then the region is the text plus quotes).
bool exact_columns(const toml::node& n, std::string_view text) {
  const auto& r = n.source();
  if (r.begin.line == 0 || r.begin.line != r.end.line) return false;
  if (r.end.column < r.begin.column || r.end.column - r.begin.column != text.size() + 2) return false;
  return std::all_of(text.begin(), text.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; });
}

// Converts a TOML value to a setting value; nullopt (and sets `why`) if its
// type is not one a setting may have.
std::optional<setting_value> to_setting_value(const toml::node& n, std::string& why) {
  if (auto v = n.as_integer()) return setting_value{v->get()};
  if (auto v = n.as_floating_point()) return setting_value{v->get()};
  if (auto v = n.as_boolean()) return setting_value{v->get()};
  if (auto v = n.as_string()) return setting_value{v->get()};
  if (auto a = n.as_array()) {
    std::vector<std::string> out;
    for (const auto& e : *a) {
      if (!e.is_string()) {
        why = "an array of settings may only hold strings";
        return std::nullopt;
      }
      out.push_back(e.as_string()->get());
    }
    return setting_value{std::move(out)};
  }
  if (n.is_table())
    why = "a table";
  else
    why = "a date or time";
  return std::nullopt;
}

std::string toml_type_name(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::string:
      return "a string";
    case toml::node_type::integer:
      return "an integer";
    case toml::node_type::floating_point:
      return "a float";
    case toml::node_type::boolean:
      return "a bool";
    case toml::node_type::array:
      return "an array";
    case toml::node_type::table:
      return "a table";
    default:
      return "a date or time";
  }
}

// ------------------------------------------------------------ edge parser

struct edge_cursor {
  std::string_view s;
  std::size_t i = 0;
  source_pos pos;
  bool exact = false;
  std::vector<graph_error>* errors;

  source_pos at(std::size_t k) const { return exact ? pos.shifted(static_cast<int>(k) + 1) : pos; }
  void skip_ws() {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\t')) ++i;
  }
  bool eof() const { return i >= s.size(); }
  std::string_view ident() {
    std::size_t b = i;
    auto alpha = [](char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; };
    if (i < s.size() && alpha(s[i])) {
      ++i;
      while (i < s.size() && (alpha(s[i]) || std::isdigit(static_cast<unsigned char>(s[i])))) ++i;
    }
    return s.substr(b, i - b);
  }
  void error(std::size_t k, std::string message, std::string hint) {
    errors->push_back(graph_error::at(at(k), std::move(message), std::move(hint)));
  }
  std::string what_is_at(std::size_t k) const {
    if (k >= s.size()) return "the end of the edge";
    return "'" + std::string(1, s[k]) + "'";
  }
};

constexpr std::string_view edge_syntax_hint =
    "edges are written \"node.port -> node.port\" (ports optional, several targets separated by commas, "
    "options last in brackets: [credit=N, dispatch=split, feedback])";

struct endpoint {
  std::string node, port;
  std::size_t offset = 0;
};

// Parses `node` or `node.port` at the cursor; nullopt after reporting an error.
std::optional<endpoint> parse_endpoint(edge_cursor& c, std::string_view role) {
  c.skip_ws();
  endpoint e;
  e.offset = c.i;
  std::string_view node = c.ident();
  if (node.empty()) {
    c.error(c.i, "malformed edge: expected a " + std::string(role) + " node name, found " + c.what_is_at(c.i),
            std::string(edge_syntax_hint));
    return std::nullopt;
  }
  e.node = node;
  if (!c.eof() && c.s[c.i] == '.') {
    ++c.i;
    std::string_view port = c.ident();
    if (port.empty()) {
      c.error(c.i, "malformed edge: expected a port name after '" + e.node + ".', found " + c.what_is_at(c.i),
              std::string(edge_syntax_hint));
      return std::nullopt;
    }
    e.port = port;
  }
  return e;
}

struct edge_options {
  std::int64_t credit = 0;
  dispatch_mode dispatch = dispatch_mode::broadcast;
  bool feedback = false;
};

// Parses `[opt, opt=value, ...]` starting at '['; reports errors and keeps going.
// Returns false if the bracket is not closed (the rest of the string is then unusable).
bool parse_options(edge_cursor& c, edge_options& opts) {
  const std::vector<std::string> names = {"credit", "dispatch", "feedback"};
  std::set<std::string> seen;
  std::size_t open = c.i;
  ++c.i;  // '['
  c.skip_ws();
  if (!c.eof() && c.s[c.i] == ']') {
    ++c.i;
    return true;
  }
  while (true) {
    c.skip_ws();
    std::size_t name_at = c.i;
    std::string name(c.ident());
    c.skip_ws();
    std::string value;
    std::size_t value_at = c.i;
    bool has_value = false;
    if (!c.eof() && c.s[c.i] == '=') {
      has_value = true;
      ++c.i;
      c.skip_ws();
      value_at = c.i;
      while (!c.eof() && c.s[c.i] != ',' && c.s[c.i] != ']') ++c.i;
      value = std::string(c.s.substr(value_at, c.i - value_at));
      while (!value.empty() && (value.back() == ' ' || value.back() == '\t')) value.pop_back();
    }
    if (name.empty()) {
      c.error(name_at, "malformed edge option: expected an option name, found " + c.what_is_at(name_at),
              "edge options are credit=N, dispatch=broadcast|split|round_robin and feedback");
      while (!c.eof() && c.s[c.i] != ',' && c.s[c.i] != ']') ++c.i;
    } else if (!seen.insert(name).second && std::find(names.begin(), names.end(), name) != names.end()) {
      c.error(name_at, "edge option '" + name + "' is given twice", "give each option once");
    } else if (name == "credit") {
      std::int64_t n = 0;
      bool ok = has_value && !value.empty() && value.size() <= 18 &&
                std::all_of(value.begin(), value.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
      if (ok) n = std::stoll(value);
      if (!ok || n < 1)
        c.error(has_value ? value_at : name_at, "edge option credit must be a positive integer, got '" + value + "'",
                "credit is how many messages may be in flight on the edge, e.g. [credit=4]");
      else
        opts.credit = n;
    } else if (name == "dispatch") {
      auto d = parse_dispatch(value);
      if (!d) {
        std::string near = nearest_name(value, {"broadcast", "split", "round_robin"});
        c.error(has_value ? value_at : name_at, "unknown dispatch mode '" + value + "'",
                (near.empty() ? std::string() : "did you mean '" + near + "'? ") +
                    "dispatch is one of broadcast, split, round_robin");
      } else {
        opts.dispatch = *d;
      }
    } else if (name == "feedback") {
      if (has_value && value != "true" && value != "false")
        c.error(value_at, "edge option feedback takes no value (or true/false), got '" + value + "'",
                "write [feedback] to mark the edge as closing a cycle");
      else
        opts.feedback = !has_value || value == "true";
    } else {
      c.error(name_at, "unknown edge option '" + name + "'", suggest(name, names, "edge options"));
    }
    if (c.eof()) {
      c.error(open, "malformed edge: '[' is not closed", "end the options with ']'");
      return false;
    }
    if (c.s[c.i] == ']') {
      ++c.i;
      return true;
    }
    if (c.s[c.i] == ',') {
      ++c.i;
      continue;
    }
    c.error(c.i, "malformed edge option: expected ',' or ']', found " + c.what_is_at(c.i),
            "edge options are separated by commas: [credit=4, dispatch=split]");
    while (!c.eof() && c.s[c.i] != ',' && c.s[c.i] != ']') ++c.i;
    if (c.eof()) return false;
    if (c.s[c.i++] == ']') return true;
  }
}

}  // namespace

edge_parse_result parse_edge(std::string_view text, const source_pos& pos, bool exact) {
  edge_parse_result out;
  edge_cursor c{text, 0, pos, exact, &out.errors};
  c.skip_ws();
  if (c.eof()) {
    c.error(0, "malformed edge: the edge string is empty", std::string(edge_syntax_hint));
    return out;
  }
  auto from = parse_endpoint(c, "source");
  if (!from) return out;
  const std::size_t from_end = c.i;
  c.skip_ws();
  if (c.s.substr(c.i, 2) != "->") {
    c.error(c.i,
            "malformed edge: expected '->' after '" + std::string(text.substr(from->offset, from_end - from->offset)) +
                "', found " + c.what_is_at(c.i),
            std::string(edge_syntax_hint));
    return out;
  }
  c.i += 2;
  std::vector<endpoint> targets;
  while (true) {
    auto to = parse_endpoint(c, "target");
    if (!to) return out;
    targets.push_back(*to);
    c.skip_ws();
    if (!c.eof() && c.s[c.i] == ',') {
      ++c.i;
      continue;
    }
    break;
  }
  edge_options opts;
  if (!c.eof() && c.s[c.i] == '[') {
    if (!parse_options(c, opts)) c.i = c.s.size();
    c.skip_ws();
  }
  if (!c.eof()) {
    c.error(c.i, "malformed edge: unexpected " + c.what_is_at(c.i) + " after the last target",
            std::string(edge_syntax_hint));
    return out;
  }
  for (const auto& t : targets) {
    edge_spec e;
    e.from_node = from->node;
    e.from_port = from->port;
    e.to_node = t.node;
    e.to_port = t.port;
    e.credit = opts.credit;
    e.dispatch = opts.dispatch;
    e.feedback = opts.feedback;
    e.pos = pos;
    e.from_pos = c.at(from->offset);
    e.to_pos = c.at(t.offset);
    out.edges.push_back(std::move(e));
  }
  return out;
}

namespace {

// ------------------------------------------------------------ file loader

const std::vector<std::string> top_level_keys = {"include", "edges", "graph", "node", "cluster"};
const std::vector<std::string> cluster_keys = {"heartbeat_ms", "lost_after_ms", "connect_timeout_ms", "on_node_lost",
                                               "max_restarts", "rejoin_wait_ms", "main_address", "nodes"};
const std::vector<std::string> cluster_node_keys = {"address", "cpus", "gpus"};

bool is_cluster_node_name(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-')) return false;
  return true;
}
const std::vector<std::string> graph_keys = {"name", "seed", "steps", "console_port", "checkpoint_dir"};

void add_error(std::vector<graph_error>& errors, const source_pos& p, std::string message, std::string hint) {
  errors.push_back(graph_error::at(p, std::move(message), std::move(hint)));
}

// Reads a [cluster] table into `c` (keys written here replace earlier ones;
// nodes are replaced by name).
void read_cluster(const toml::node& value, cluster_spec& c, std::vector<graph_error>& errors) {
  const auto* t = value.as_table();
  if (!t) {
    add_error(errors, pos_of(value), "'cluster' must be a table, got " + toml_type_name(value),
              "write [cluster] with heartbeat_ms etc., and one [cluster.nodes.NAME] table per machine");
    return;
  }
  c.pos = pos_of(value);
  auto positive_ms = [&](const toml::node& v, const std::string& k, std::int64_t& out) {
    if (!v.is_integer() || v.as_integer()->get() < 1) {
      add_error(errors, pos_of(v),
                "cluster " + k + " must be an integer >= 1 (milliseconds), got " +
                    (v.is_integer() ? std::to_string(v.as_integer()->get()) : toml_type_name(v)),
                "write " + k + " = " +
                    (k == "heartbeat_ms" ? "500" : k == "connect_timeout_ms" ? "10000" : "3000"));
      return false;
    }
    out = v.as_integer()->get();
    return true;
  };
  source_pos heartbeat_pos, lost_after_pos;  // where this table sets them
  for (const auto& [key, v] : *t) {
    std::string k(key.str());
    if (k == "heartbeat_ms") {
      if (positive_ms(v, k, c.heartbeat_ms)) heartbeat_pos = pos_of(v);
    } else if (k == "lost_after_ms") {
      if (positive_ms(v, k, c.lost_after_ms)) lost_after_pos = pos_of(v);
    } else if (k == "connect_timeout_ms") {
      positive_ms(v, k, c.connect_timeout_ms);
    } else if (k == "on_node_lost") {
      if (!v.is_string() || (v.as_string()->get() != "stop" && v.as_string()->get() != "restart"))
        add_error(errors, pos_of(v),
                  "cluster on_node_lost must be \"stop\" or \"restart\"" +
                      (v.is_string() ? ", got \"" + v.as_string()->get() + "\"" : ", got " + toml_type_name(v)),
                  "\"stop\" stops the run and names the lost node and its actors; \"restart\" then starts the run "
                  "again from its checkpoints, the lost node's actors on main unless the node is back");
      else
        c.on_node_lost = v.as_string()->get();
    } else if (k == "rejoin_wait_ms") {
      if (!v.is_integer() || v.as_integer()->get() < 0)
        add_error(errors, pos_of(v),
                  "cluster rejoin_wait_ms must be an integer >= 0 (milliseconds), got " +
                      (v.is_integer() ? std::to_string(v.as_integer()->get()) : toml_type_name(v)),
                  "write rejoin_wait_ms = 10000: how long a restart waits for a lost node to answer again");
      else
        c.rejoin_wait_ms = v.as_integer()->get();
    } else if (k == "max_restarts") {
      if (!v.is_integer() || v.as_integer()->get() < 0)
        add_error(errors, pos_of(v),
                  "cluster max_restarts must be an integer >= 0, got " +
                      (v.is_integer() ? std::to_string(v.as_integer()->get()) : toml_type_name(v)),
                  "write max_restarts = 3: how often on_node_lost = \"restart\" may start the run again");
      else
        c.max_restarts = v.as_integer()->get();
    } else if (k == "main_address") {
      // a host name, an IPv4 address, or an IPv6 address bare or in brackets as URLs write it; no port (a
      // host:port has one colon, an IPv6 address two or more)
      std::string host = v.is_string() ? v.as_string()->get() : std::string();
      const bool bracketed = host.size() > 2 && host.front() == '[' && host.back() == ']';
      if (bracketed) host = host.substr(1, host.size() - 2);
      in6_addr v6{};
      const bool is_v6 = std::count(host.begin(), host.end(), ':') >= 2 && ::inet_pton(AF_INET6, host.c_str(), &v6) == 1;
      const bool ok = v.is_string() && !host.empty() && host.find_first_of(" /[]") == std::string::npos &&
                      (is_v6 || (!bracketed && host.find(':') == std::string::npos));
      // addresses gloo cannot listen on for the nodes (each failed only at the bulk plane, after the nodes were
      // set up): no address at all, IPv4 written as IPv6, link-local (gloo takes no interface for it)
      const std::string unusable =
          !ok ? std::string()
          : host == "0.0.0.0" || (is_v6 && IN6_IS_ADDR_UNSPECIFIED(&v6))
              ? "is no address the nodes can reach (it means every interface)"
          : is_v6 && IN6_IS_ADDR_V4MAPPED(&v6) ? "is an IPv4 address written as IPv6: write it as IPv4"
          : is_v6 && IN6_IS_ADDR_LINKLOCAL(&v6)
              ? "is link-local (fe80::/10), which gloo cannot listen on without an interface: give a global or "
                "unique-local (fd00::/8) address"
              : std::string();
      if (!unusable.empty())
        add_error(errors, pos_of(v), "cluster main_address = \"" + v.as_string()->get() + "\" " + unusable,
                  "write main_address = \"10.0.0.1\" (or \"fd00::1\"): the address of this machine that the cluster "
                  "nodes reach");
      else if (!ok)
        add_error(errors, pos_of(v),
                  "cluster main_address must be a host name, an IPv4 address or an IPv6 address (no port), got " +
                      (v.is_string() ? "\"" + v.as_string()->get() + "\"" : toml_type_name(v)),
                  "write main_address = \"10.0.0.1\" (or \"fd00::1\"): the address of this machine that the cluster "
                  "nodes reach");
      else
      {
        c.main_address = host;
        c.main_address_pos = pos_of(v);
      }
    } else if (k == "nodes") {
      const auto* nt = v.as_table();
      if (!nt) {
        add_error(errors, pos_of(v), "cluster nodes must be a table of tables, got " + toml_type_name(v),
                  "write one [cluster.nodes.NAME] table per machine, with address = \"HOST:PORT\"");
        continue;
      }
      std::vector<std::pair<const toml::key*, const toml::node*>> in_order;
      for (const auto& [nk, nv] : *nt) in_order.emplace_back(&nk, &nv);
      std::stable_sort(in_order.begin(), in_order.end(), [](const auto& a, const auto& b) {
        const auto &pa = a.second->source().begin, &pb = b.second->source().begin;
        return pa.line != pb.line ? pa.line < pb.line : pa.column < pb.column;
      });
      for (const auto& [nk, nv] : in_order) {
        std::string name(nk->str());
        if (!is_cluster_node_name(name) || name == main_process_name || name == any_process_name) {
          add_error(errors, pos_of(*nk), "invalid cluster node name '" + name + "'",
                    name == main_process_name
                        ? "'main' names the `flowrun run` process itself; give the machine another name"
                    : name == any_process_name
                        ? "on = \"any\" asks the planner to choose a node by resources; give the machine another name"
                        : "cluster node names are letters, digits, '_' and '-'");
          continue;
        }
        const auto* node_t = nv->as_table();
        if (!node_t) {
          add_error(errors, pos_of(*nv), "cluster node '" + name + "' must be a table, got " + toml_type_name(*nv),
                    "write [cluster.nodes." + name + "] with address = \"HOST:PORT\"");
          continue;
        }
        cluster_node_spec n;
        n.name = name;
        n.pos = pos_of(*nv);
        bool have_address = false;
        for (const auto& [ak, av] : *node_t) {
          std::string a(ak.str());
          if (a == "address") {
            n.address_pos = pos_of(av);
            const std::string text = av.is_string() ? av.as_string()->get() : std::string();
            const auto hp = util::split_host_port(text);
            const int port = hp ? hp->port : 0;
            if (!av.is_string() || !hp || port < 1 || port > 65535) {
              add_error(errors, pos_of(av),
                        "cluster node '" + name + "': address must be \"HOST:PORT\" with a port 1..65535, got " +
                            (av.is_string() ? "\"" + text + "\"" : toml_type_name(av)),
                        "write address = \"127.0.0.1:7001\" (where `flowrun node --listen` listens)");
              continue;
            }
            n.host = hp->host;  // an IPv6 address without the brackets URLs write it in
            n.port = port;
            have_address = true;
          } else if (a == "cpus" || a == "gpus") {
            if (!av.is_integer() || av.as_integer()->get() < 0)
              add_error(errors, pos_of(av),
                        "cluster node '" + name + "': " + a + " must be an integer >= 0, got " +
                            (av.is_integer() ? std::to_string(av.as_integer()->get()) : toml_type_name(av)),
                        "write " + a + " = 2");
            else
              (a == "cpus" ? n.cpus : n.gpus) = av.as_integer()->get();
          } else {
            add_error(errors, pos_of(ak), "unknown key '" + a + "' in [cluster.nodes." + name + "]",
                      suggest(a, cluster_node_keys, "cluster node keys"));
          }
        }
        if (!have_address) {
          if (!n.address_pos.known())
            add_error(errors, n.pos, "cluster node '" + name + "' has no address",
                      "write address = \"HOST:PORT\" (where its `flowrun node --listen` listens)");
          continue;
        }
        // one daemon runs one job at a time: two names for one address would make it refuse the second
        auto twin = std::find_if(c.nodes.begin(), c.nodes.end(), [&](const auto& x) {
          return x.name != name && x.host == n.host && x.port == n.port;
        });
        if (twin != c.nodes.end()) {
          add_error(errors, n.address_pos,
                    "cluster nodes '" + twin->name + "' and '" + name + "' have the same address " + n.host + ":" +
                        std::to_string(n.port),
                    "each cluster node is one `flowrun node` daemon (one job at a time): start another daemon on "
                    "another port, or place both nodes' replicas on '" + twin->name + "'");
          continue;
        }
        auto same = std::find_if(c.nodes.begin(), c.nodes.end(), [&](const auto& x) { return x.name == name; });
        if (same != c.nodes.end())
          *same = std::move(n);
        else
          c.nodes.push_back(std::move(n));
      }
    } else {
      add_error(errors, pos_of(key), "unknown key '" + k + "' in [cluster]", suggest(k, cluster_keys, "[cluster] keys"));
    }
  }
  // A node is lost after lost_after_ms without a heartbeat reply: fewer than
  // two heartbeats in that time and one late reply loses a healthy node.
  if ((heartbeat_pos.known() || lost_after_pos.known()) && c.lost_after_ms < 2 * c.heartbeat_ms)
    add_error(errors, lost_after_pos.known() ? lost_after_pos : heartbeat_pos,
              "cluster lost_after_ms (" + std::to_string(c.lost_after_ms) + ") must be at least 2 x heartbeat_ms (" +
                  std::to_string(c.heartbeat_ms) + "), else one late heartbeat loses a healthy node",
              "at least 6 heartbeats are recommended: write lost_after_ms = " + std::to_string(6 * c.heartbeat_ms) +
                  " (or a smaller heartbeat_ms)");
}

struct loader {
  parse_result result;
  std::vector<fs::path> stack;              // canonical paths of the files being loaded
  std::set<fs::path> loaded;                // canonical paths of the files loaded already
  std::vector<std::string> names_in_stack;  // for cycle messages
  bool have_name = false;
  // Node name -> index in result.spec.nodes, so reading N nodes is N log N, not N^2.
  std::map<std::string, std::size_t, std::less<>> node_index;

  void error(const source_pos& p, std::string message, std::string hint) {
    result.errors.push_back(graph_error::at(p, std::move(message), std::move(hint)));
  }

  static fs::path canonical_of(const fs::path& p) { return fs::path(same_path_key(p.string())); }

  // Loads `path`; `from` is where it was included (unknown for the top file).
  void load_file(const fs::path& path, const source_pos& from) {
    fs::path canon = canonical_of(path);
    if (std::find(stack.begin(), stack.end(), canon) != stack.end()) {
      std::vector<std::string> chain;
      auto it = std::find(stack.begin(), stack.end(), canon);
      for (auto i = it - stack.begin(); i < static_cast<std::ptrdiff_t>(stack.size()); ++i)
        chain.push_back(names_in_stack[i]);
      chain.push_back(path.lexically_normal().string());
      error(from, "include cycle: " + join(chain, " -> "),
            "a file may not include itself, directly or through other files: remove one of these includes");
      result.fatal = true;
      return;
    }
    if (loaded.count(canon)) return;  // diamond: loaded once
    std::error_code ec;
    std::ifstream in;
    if (fs::is_regular_file(path, ec)) in.open(path, std::ios::binary);
    if (!in.is_open()) {
      if (from.known())
        error(from, "included file not found: '" + path.string() + "'",
              "include paths are relative to the including file's folder");
      else
        error({path.string(), 1, 1}, "cannot open graph file '" + path.string() + "'",
              "check the path (relative paths are relative to the working directory)");
      result.fatal = true;
      return;
    }
    std::stringstream ss;
    ss << in.rdbuf();
    std::string name = path.lexically_normal().string();
    if (!from.known())
      result.spec.source_file = path;
    else
      result.spec.included_files.push_back(path.lexically_normal());
    loaded.insert(canon);
    stack.push_back(canon);
    names_in_stack.push_back(name);
    load_text(ss.str(), name, path.parent_path());
    stack.pop_back();
    names_in_stack.pop_back();
  }

  void load_text(const std::string& text, const std::string& name, const fs::path& dir) {
    toml::table table;
    try {
      table = toml::parse(std::string_view(text), std::string_view(name));
    } catch (const toml::parse_error& e) {
      report_toml_error(e, name);
      result.fatal = true;
      return;
    }
    // Includes first: what this file says wins over them.
    if (const toml::node* inc = table.get("include")) {
      auto include_one = [&](const toml::node& n) {
        if (!n.is_string()) {
          error(pos_of(n), "include entries must be strings, got " + toml_type_name(n),
                "write include = [\"other.graph\"]");
          return;
        }
        fs::path p = n.as_string()->get();
        if (p.is_relative()) p = dir / p;
        load_file(p, pos_of(n));
      };
      if (const auto* arr = inc->as_array()) {
        for (const auto& n : *arr) include_one(n);
      } else if (inc->is_string()) {
        include_one(*inc);
      } else {
        error(pos_of(*inc), "include must be an array of file names, got " + toml_type_name(*inc),
              "write include = [\"other.graph\"]");
      }
    }
    for (const auto& [key, value] : table) {
      std::string k(key.str());
      if (k == "include") continue;
      if (k == "graph")
        read_graph_table(value);
      else if (k == "node")
        read_nodes(value);
      else if (k == "edges")
        read_edges(value);
      else if (k == "cluster")
        read_cluster(value, result.spec.cluster, result.errors);
      else {
        result.spec.incomplete = true;  // it may have been meant to hold edges or nodes
        error(pos_of(key), "unknown top-level key '" + k + "'",
              suggest(k, top_level_keys, "top-level keys") +
                  (std::find(graph_keys.begin(), graph_keys.end(), k) != graph_keys.end()
                       ? " ('" + k + "' belongs in the [graph] table)"
                       : std::string()));
      }
    }
  }

  void report_toml_error(const toml::parse_error& e, const std::string& name) {
    source_pos p{name, static_cast<int>(e.source().begin.line), static_cast<int>(e.source().begin.column)};
    std::string d(e.description());
    constexpr std::string_view redefine = "cannot redefine existing table 'node.";
    if (auto at = d.find(redefine); at != std::string::npos) {
      std::string node = d.substr(at + redefine.size());
      if (auto q = node.find('\''); q != std::string::npos) node.resize(q);
      if (node.find('.') == std::string::npos) {
        error(p, "duplicate node name '" + node + "'",
              "each [node.NAME] table may appear once in a file: rename one of the nodes or merge the tables");
        return;
      }
    }
    // toml++ says "Error while parsing WHAT: WHY"; keep it short.
    constexpr std::string_view prefix = "Error while parsing ";
    if (d.rfind(prefix, 0) == 0) {
      if (auto colon = d.find(": ", prefix.size()); colon != std::string::npos)
        d = d.substr(colon + 2) + " (in a " + d.substr(prefix.size(), colon - prefix.size()) + ")";
    }
    error(p, "TOML syntax error: " + d, "the file must be valid TOML (https://toml.io/en/v1.0.0)");
  }

  void read_graph_table(const toml::node& value) {
    const auto* t = value.as_table();
    if (!t) {
      error(pos_of(value), "'graph' must be a table, got " + toml_type_name(value),
            "write [graph] with name, seed and steps under it");
      return;
    }
    graph_spec& spec = result.spec;
    for (const auto& [key, v] : *t) {
      std::string k(key.str());
      if (k == "name") {
        if (!v.is_string())
          error(pos_of(v), "graph name must be a string, got " + toml_type_name(v), "write name = \"my_graph\"");
        else {
          spec.name = v.as_string()->get();
          have_name = true;
        }
      } else if (k == "seed") {
        if (!v.is_integer())
          error(pos_of(v), "graph seed must be an integer, got " + toml_type_name(v), "write seed = 1234");
        else if (v.as_integer()->get() < 0)
          error(pos_of(v), "graph seed must be >= 0, got " + std::to_string(v.as_integer()->get()),
                "write seed = 1234");
        else {
          spec.seed = static_cast<std::uint64_t>(v.as_integer()->get());
          spec.seed_pos = pos_of(v);
        }
      } else if (k == "steps") {
        if (!v.is_integer())
          error(pos_of(v), "graph steps must be an integer, got " + toml_type_name(v), "write steps = 100");
        else {
          spec.steps = v.as_integer()->get();
          spec.steps_pos = pos_of(v);
        }
      } else if (k == "console_port") {
        if (!v.is_integer() || v.as_integer()->get() < 0 || v.as_integer()->get() > 65535)
          error(pos_of(v),
                "graph console_port must be a TCP port (0 to 65535; 0: a free one), got " + toml_type_name(v) +
                    (v.is_integer() ? " " + std::to_string(v.as_integer()->get()) : std::string()),
                "write console_port = 8080, or leave it out for no console (flowrun run --console PORT turns it on)");
        else {
          spec.console_port = v.as_integer()->get();
          spec.console_port_pos = pos_of(v);
        }
      } else if (k == "checkpoint_dir") {
        if (!v.is_string())
          error(pos_of(v), "graph checkpoint_dir must be a folder name (a string), got " + toml_type_name(v),
                "write checkpoint_dir = \"out/run/checkpoints\"");
        else {
          spec.checkpoint_dir = v.as_string()->get();
          spec.checkpoint_dir_pos = pos_of(v);
        }
      } else if (k == "edges") {
        result.spec.incomplete = true;
        error(pos_of(key), "unknown key 'edges' in [graph]",
              "edges is a top-level key: put edges = [...] at the top of the file, before the first [table]");
      } else {
        error(pos_of(key), "unknown key '" + k + "' in [graph]", suggest(k, graph_keys, "[graph] keys"));
      }
    }
  }

  void read_nodes(const toml::node& value) {
    const auto* t = value.as_table();
    if (!t) {
      error(pos_of(value), "'node' must be a table of node tables, got " + toml_type_name(value),
            "write one [node.NAME] table per node");
      return;
    }
    // toml++ tables iterate in key order; nodes keep the order they are written in.
    std::vector<std::pair<const toml::key*, const toml::node*>> in_order;
    for (const auto& [key, v] : *t) in_order.emplace_back(&key, &v);
    std::stable_sort(in_order.begin(), in_order.end(), [](const auto& a, const auto& b) {
      const auto &pa = a.second->source().begin, &pb = b.second->source().begin;
      return pa.line != pb.line ? pa.line < pb.line : pa.column < pb.column;
    });
    for (const auto& [key_ptr, v_ptr] : in_order) {
      const toml::key& key = *key_ptr;
      const toml::node& v = *v_ptr;
      std::string name(key.str());
      if (!is_identifier(name)) {
        error(pos_of(key), "invalid node name '" + name + "'",
              "node names are identifiers: letters, digits and '_', not starting with a digit");
        result.spec.incomplete = true;
        continue;
      }
      const auto* nt = v.as_table();
      if (!nt) {
        error(pos_of(v), "node '" + name + "' must be a table, got " + toml_type_name(v),
              "write [node." + name + "] with kind = \"...\" and its settings under it");
        result.spec.incomplete = true;
        continue;
      }
      read_node(name, *nt);
    }
  }

  void read_node(const std::string& name, const toml::table& t) {
    graph_spec& spec = result.spec;
    node_spec* node = nullptr;
    if (auto it = node_index.find(name); it != node_index.end()) {
      node = &spec.nodes[it->second];
    } else {
      node_spec fresh;
      fresh.name = name;
      fresh.pos = pos_of(t);
      node_index.emplace(name, spec.nodes.size());
      spec.nodes.push_back(std::move(fresh));
      node = &spec.nodes.back();
    }
    for (const auto& [key, v] : t) {
      std::string k(key.str());
      if (k == "kind") {
        if (!v.is_string()) {
          error(pos_of(v), "node kind must be a string, got " + toml_type_name(v), "write kind = \"generator\"");
          result.spec.incomplete = true;
        } else {
          node->kind = v.as_string()->get();
          node->kind_pos = pos_of(v);
        }
      } else if (k == "replicas") {
        if (!v.is_integer())
          error(pos_of(v), "replicas must be an integer, got " + toml_type_name(v), "write replicas = 2");
        else {
          node->replicas = v.as_integer()->get();
          node->replicas_pos = pos_of(v);
        }
      } else if (k == "on") {
        const auto* arr = v.as_array();
        bool ok = v.is_string() || (arr && !arr->empty());
        if (arr)
          for (const auto& e : *arr) ok = ok && e.is_string();
        if (!ok) {
          error(pos_of(v), "placement 'on' must be a string or a non-empty array of strings, got " + toml_type_name(v),
                "write on = \"node-2\" (every replica) or on = [\"node-1\", \"node-2\"] (one per replica)");
        } else if (arr) {
          node->on_replicas.clear();
          node->on.clear();
          for (const auto& e : *arr) {
            node->on_replicas.push_back(e.as_string()->get());
            node->on += (node->on.empty() ? "" : ",") + node->on_replicas.back();
          }
          node->on_pos = pos_of(v);
        } else {
          node->on = v.as_string()->get();
          node->on_replicas.clear();
          node->on_pos = pos_of(v);
        }
      } else if (k == "threads") {
        if (!v.is_integer())
          error(pos_of(v), "threads must be an integer, got " + toml_type_name(v), "write threads = 1");
        else {
          node->threads = v.as_integer()->get();
          node->threads_pos = pos_of(v);
        }
      } else if (k == "resources") {
        read_resources(v, *node);
      } else {
        std::string why;
        auto sv = to_setting_value(v, why);
        if (!sv) {
          error(pos_of(v), "setting '" + k + "' of node '" + name + "' has an unsupported value: " + why,
                "settings are integers, floats, bools, strings or arrays of strings");
          continue;
        }
        node->settings[k] = setting{std::move(*sv), pos_of(key), pos_of(v), false};
      }
    }
  }

  // resources = { cpus = N, gpus = M }: what each replica placed by resources needs.
  void read_resources(const toml::node& v, node_spec& node) {
    const auto* t = v.as_table();
    const std::string example = "write resources = { cpus = 2, gpus = 1 } (integers >= 0; defaults cpus = 1, gpus = 0)";
    if (!t) {
      error(pos_of(v), "resources of node '" + node.name + "' must be a table, got " + toml_type_name(v), example);
      return;
    }
    node.resources = resource_needs{};
    node.resources_pos = pos_of(v);
    for (const auto& [rk, rv] : *t) {
      const std::string key(rk.str());
      if (key != "cpus" && key != "gpus") {
        error(pos_of(rk), "unknown key '" + key + "' in resources of node '" + node.name + "'",
              suggest(key, {"cpus", "gpus"}, "resources keys"));
        continue;
      }
      if (!rv.is_integer() || rv.as_integer()->get() < 0) {
        error(pos_of(rv),
              "resources." + key + " of node '" + node.name + "' must be an integer >= 0, got " +
                  (rv.is_integer() ? std::to_string(rv.as_integer()->get()) : toml_type_name(rv)),
              example);
        continue;
      }
      (key == "cpus" ? node.resources.cpus : node.resources.gpus) = rv.as_integer()->get();
    }
  }

  void read_edges(const toml::node& value) {
    const auto* arr = value.as_array();
    if (!arr) {
      error(pos_of(value), "edges must be an array of strings, got " + toml_type_name(value),
            "write edges = [\"a.out -> b.in\", ...]");
      result.spec.incomplete = true;
      return;
    }
    for (const auto& n : *arr) {
      if (!n.is_string()) {
        error(pos_of(n), "each edge must be a string, got " + toml_type_name(n),
              "write edges as strings: \"a.out -> b.in\"");
        result.spec.incomplete = true;
        continue;
      }
      const std::string& text = n.as_string()->get();
      auto parsed = parse_edge(text, pos_of(n), exact_columns(n, text));
      if (parsed.edges.empty()) result.spec.incomplete = true;
      for (auto& e : parsed.errors) result.errors.push_back(std::move(e));
      for (auto& e : parsed.edges) result.spec.edges.push_back(std::move(e));
    }
  }

  void finish(const fs::path& top) {
    if (!have_name) {
      std::string stem = top.stem().string();
      result.spec.name = stem.empty() || stem.front() == '<' ? "graph" : stem;
    }
    sort_errors(result.errors);
  }
};

}  // namespace

parse_result parse_graph_file(const fs::path& file) {
  loader l;
  l.load_file(file, {});
  l.finish(file);
  return std::move(l.result);
}

parse_result parse_graph_string(std::string_view text, const fs::path& source_name) {
  loader l;
  std::string name = source_name.string();
  fs::path canon = loader::canonical_of(source_name);
  l.stack.push_back(canon);
  l.names_in_stack.push_back(name);
  l.loaded.insert(canon);
  l.result.spec.source_file = source_name;
  l.load_text(std::string(text), name, source_name.parent_path());
  l.finish(source_name);
  return std::move(l.result);
}

// ---------------------------------------------------------------- overrides

namespace {

// The offset of the first byte of `s` that is not part of well-formed UTF-8 (runtime/util/utf8.h), or npos.
std::size_t first_non_utf8(std::string_view s) {
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t n = utf8_sequence_length(s, i);
    if (n == 0) return i;
    i += n;
  }
  return std::string_view::npos;
}

}  // namespace

setting_value override_value(std::string_view raw) {
  try {
    toml::table t = toml::parse("v = " + std::string(raw));
    std::string why;
    if (const toml::node* n = t.get("v"))
      if (auto v = to_setting_value(*n, why)) return *v;
  } catch (const toml::parse_error&) {
  }
  return std::string(raw);
}

std::optional<graph_error> apply_override(graph_spec& spec, std::string_view assignment,
                                          const node_kind_registry* kinds, setting_value* stored) {
  const std::string file = "--set " + std::string(assignment);
  auto err = [&](std::size_t offset, std::string message, std::string hint) {
    return graph_error{file, 1, static_cast<int>(offset) + 1, std::move(message), std::move(hint)};
  };
  auto eq = assignment.find('=');
  if (eq == std::string_view::npos)
    return err(0, "override '" + std::string(assignment) + "' has no '='",
               "write --set node.NAME.SETTING=VALUE, e.g. --set node.gen.temperature=0.8");
  std::string_view path = assignment.substr(0, eq);
  std::string raw(assignment.substr(eq + 1));
  const std::size_t value_offset = eq + 1;
  // A graph file is UTF-8 (TOML); so is an override, or a bare-string value would not survive to_toml (the
  // graph a cluster node receives): its bytes came back as other characters (tests/fuzz/fuzz_graph).
  if (const auto bad = first_non_utf8(raw); bad != std::string_view::npos) {
    char byte[8];
    std::snprintf(byte, sizeof byte, "0x%02x", static_cast<unsigned char>(raw[bad]));
    return err(value_offset + bad, "override value is not UTF-8 text (byte " + std::string(byte) + ")",
               "graph files and --set values are UTF-8: convert the value (e.g. iconv -f latin1 -t utf-8)");
  }
  source_pos vpos{file, 1, static_cast<int>(value_offset) + 1};
  source_pos kpos{file, 1, 1};

  // Split the path at dots, remembering offsets.
  std::vector<std::pair<std::string, std::size_t>> parts;
  for (std::size_t b = 0;;) {
    auto d = path.find('.', b);
    parts.emplace_back(std::string(path.substr(b, d == std::string_view::npos ? d : d - b)), b);
    if (d == std::string_view::npos) break;
    b = d + 1;
  }

  setting_value value = override_value(raw);
  if (stored) *stored = value;  // graph.*, replicas, on, kind: as read; a node setting's below

  if (parts[0].first == "graph") {
    if (parts.size() != 2)
      return err(0, "unknown override path '" + std::string(path) + "'",
                 "graph overrides are graph.name, graph.seed, graph.steps, graph.console_port and graph.checkpoint_dir");
    const auto& [key, off] = parts[1];
    if (key == "name") {
      spec.name = std::holds_alternative<std::string>(value) ? std::get<std::string>(value) : raw;
    } else if (key == "checkpoint_dir") {
      spec.checkpoint_dir = std::holds_alternative<std::string>(value) ? std::get<std::string>(value) : raw;
      spec.checkpoint_dir_pos = vpos;
    } else if (key == "console_port") {
      const auto* i = std::get_if<std::int64_t>(&value);
      if (!i || *i < 0 || *i > 65535)
        return err(value_offset, "graph console_port must be a TCP port (0 to 65535; 0: a free one), got '" + raw + "'",
                   "write --set graph.console_port=8080");
      spec.console_port = *i;
      spec.console_port_pos = vpos;
    } else if (key == "seed" || key == "steps") {
      const auto* i = std::get_if<std::int64_t>(&value);
      if (!i || (key == "seed" && *i < 0))
        return err(value_offset,
                   "graph " + key + " must be " + (key == "seed" ? "a non-negative integer" : "an integer") +
                       ", got '" + raw + "'",
                   "write --set graph." + key + "=100");
      if (key == "seed") {
        spec.seed = static_cast<std::uint64_t>(*i);
        spec.seed_pos = vpos;
      } else {
        spec.steps = *i;
        spec.steps_pos = vpos;
      }
    } else {
      return err(off, "unknown graph key '" + key + "'", suggest(key, graph_keys, "graph keys"));
    }
    return std::nullopt;
  }
  if (parts[0].first != "node" || parts.size() != 3) {
    return err(0, "unknown override path '" + std::string(path) + "'",
               "overrides are node.NAME.SETTING=VALUE, node.NAME.replicas=N, node.NAME.threads=N, node.NAME.on=PLACE (or PLACE,PLACE,... "
               "per replica) or graph.KEY=VALUE");
  }
  const auto& [node_name, node_off] = parts[1];
  const auto& [key, key_off] = parts[2];
  node_spec* node = spec.find_node(node_name);
  if (!node) {
    std::vector<std::string> names;
    for (const auto& n : spec.nodes) names.push_back(n.name);
    return err(node_off, "override names unknown node '" + node_name + "'", suggest(node_name, names, "nodes"));
  }
  kpos.col = static_cast<int>(key_off) + 1;
  if (key == "replicas" || key == "threads") {  // the integer keys of a node table
    const bool rep = key == "replicas";
    const auto* i = std::get_if<std::int64_t>(&value);
    if (!i)
      return err(value_offset, std::string(key) + " must be an integer, got '" + raw + "'",
                 "write --set node." + node_name + "." + std::string(key) + (rep ? "=2" : "=1"));
    (rep ? node->replicas : node->threads) = *i;
    (rep ? node->replicas_pos : node->threads_pos) = vpos;
    return std::nullopt;
  }
  if (key == "on" || key == "kind") {
    std::string s = std::holds_alternative<std::string>(value) ? std::get<std::string>(value) : raw;
    (key == "on" ? node->on : node->kind) = s;
    if (key == "on") {
      node->on_replicas.clear();
      // node.NAME.on=w1,w2: one place per replica (node names have no commas)
      if (s.find(',') != std::string::npos) {
        std::size_t at = 0;
        for (;;) {
          const auto comma = s.find(',', at);
          node->on_replicas.push_back(s.substr(at, comma == std::string::npos ? std::string::npos : comma - at));
          if (comma == std::string::npos) break;
          at = comma + 1;
        }
        node->on.clear();
      }
    }
    (key == "on" ? node->on_pos : node->kind_pos) = vpos;
    return std::nullopt;
  }
  const node_kind* kind = kinds ? kinds->lookup(node->kind) : nullptr;
  const setting* current = node->find_setting(key);
  const setting_decl* decl = kind ? kind->find_setting(key) : nullptr;
  // a node whose kind is unknown (a typo in the file or in another override) gets its own error from the
  // validator; "unknown setting ... there are no settings" before it only confused. A key that is no
  // identifier is no setting of any kind (node_kind's rule): refused here as before (tests/fuzz/fuzz_graph:
  // such a key with bytes that are not UTF-8 did not survive to_toml and back)
  if (!current && !decl && (kind || !kinds || !is_identifier(key))) {
    std::vector<std::string> names;
    for (const auto& [n, s] : node->settings) names.push_back(n);
    if (kind)
      for (const auto& n : kind->setting_names())
        if (std::find(names.begin(), names.end(), n) == names.end()) names.push_back(n);
    const std::string hint = kind ? unknown_setting_hint(spec, *kinds, *kind, key, node_name, names) : "";
    return err(key_off, "override names unknown setting '" + key + "' of node '" + node_name + "'",
               hint.empty() ? suggest(key, names, "settings") : hint);
  }
  // A string setting takes the text as is (unless it was written as a TOML string).
  bool wants_string = decl ? (decl->type == setting_type::string || decl->type == setting_type::path ||
                                    decl->type == setting_type::output)
                           : current ? std::holds_alternative<std::string>(current->value)
                                     : std::holds_alternative<std::string>(value);  // an unknown kind's: as given
  if (wants_string && !std::holds_alternative<std::string>(value)) value = raw;
  if (stored) *stored = value;
  node->settings[key] = setting{std::move(value), kpos, vpos, false};
  return std::nullopt;
}

// ---------------------------------------------------------------- clusters

cluster_parse_result parse_cluster_file(const fs::path& file) {
  cluster_parse_result r;
  std::error_code ec;
  std::ifstream in;
  if (fs::is_regular_file(file, ec)) in.open(file, std::ios::binary);
  if (!in.is_open()) {
    add_error(r.errors, {file.string(), 1, 1}, "cannot open cluster file '" + file.string() + "'",
              "check the path (relative paths are relative to the working directory)");
    return r;
  }
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string name = file.lexically_normal().string();
  toml::table table;
  try {
    table = toml::parse(ss.str(), std::string_view(name));
  } catch (const toml::parse_error& e) {
    add_error(r.errors, {name, static_cast<int>(e.source().begin.line), static_cast<int>(e.source().begin.column)},
              "TOML syntax error: " + std::string(e.description()), "the file must be valid TOML (https://toml.io/en/v1.0.0)");
    return r;
  }
  bool found = false;
  for (const auto& [key, value] : table) {
    if (key.str() == "cluster") {
      found = true;
      read_cluster(value, r.cluster, r.errors);
    } else {
      add_error(r.errors, pos_of(key), "unknown top-level key '" + std::string(key.str()) + "' in a cluster file",
                "a cluster file holds one [cluster] table and its [cluster.nodes.NAME] tables");
    }
  }
  if (!found && r.errors.empty())
    add_error(r.errors, {name, 1, 1}, "cluster file '" + name + "' has no [cluster] table",
              "write [cluster] and one [cluster.nodes.NAME] table with address = \"HOST:PORT\" per machine");
  sort_errors(r.errors);
  return r;
}

std::vector<graph_error> check_placement(const graph_spec& spec) {
  std::vector<graph_error> errors;
  // Without a [cluster] table `on` is not interpreted; a table without nodes is a mistake worth naming.
  if (spec.cluster.empty() && !spec.cluster.pos.known()) return errors;
  std::vector<std::string> names{std::string(main_process_name)};
  for (const auto& n : spec.cluster.nodes) names.push_back(n.name);
  const source_pos file_pos{spec.source_file.string(), 0, 0};
  for (const auto& n : spec.nodes) {
    const source_pos& at = n.on_pos.known() ? n.on_pos : (n.pos.known() ? n.pos : file_pos);
    if (!n.on_replicas.empty() && static_cast<std::int64_t>(n.on_replicas.size()) != n.replicas)
      add_error(errors, at,
                "node '" + n.name + "' places " + std::to_string(n.on_replicas.size()) + " replicas with on = [...] but has replicas = " +
                    std::to_string(n.replicas),
                "give one cluster node per replica, or one string for all of them");
    std::vector<std::string> wanted = n.on_replicas;
    if (wanted.empty() && !n.on.empty()) wanted.push_back(n.on);
    for (const auto& w : wanted) {
      if (w == main_process_name || w == any_process_name || spec.cluster.find(w)) continue;
      add_error(errors, at, "node '" + n.name + "': on = \"" + w + "\" names no node of the cluster",
                spec.cluster.empty()
                    ? std::string("the [cluster] table declares no nodes: add a [cluster.nodes.") + w +
                          "] table with address = \"HOST:PORT\" (where its `flowrun node --listen` runs)"
                    : suggest(w, names, "cluster nodes ('main' is the flowrun run process)"));
    }
  }
  sort_errors(errors);
  return errors;
}

std::vector<graph_error> assign_placement(graph_spec& spec) {
  std::vector<graph_error> errors;
  if (spec.cluster.empty()) return errors;
  const auto& cn = spec.cluster.nodes;
  std::vector<std::int64_t> free_cpus, free_gpus;
  for (const auto& c : cn) {
    free_cpus.push_back(c.cpus);
    free_gpus.push_back(c.gpus);
  }
  const source_pos file_pos{spec.source_file.string(), 0, 0};
  for (auto& n : spec.nodes) {
    bool any = false;
    for (std::int64_t r = 0; r < n.replicas; ++r) any = any || placement_of(n, r) == any_process_name;
    if (!any) continue;
    std::vector<std::string> where;
    for (std::int64_t r = 0; r < n.replicas; ++r) where.push_back(placement_of(n, r));
    const auto need = n.resources;
    for (std::int64_t r = 0; r < n.replicas; ++r) {
      if (where[r] != any_process_name) continue;
      std::size_t best = cn.size();
      for (std::size_t i = 0; i < cn.size(); ++i) {
        if (free_cpus[i] < need.cpus || free_gpus[i] < need.gpus) continue;
        if (best == cn.size() || free_cpus[i] - need.cpus > free_cpus[best] - need.cpus) best = i;
      }
      if (best == cn.size()) {
        std::string left;
        for (std::size_t i = 0; i < cn.size(); ++i)
          left += (left.empty() ? "" : ", ") + cn[i].name + " has " + std::to_string(free_cpus[i]) + " of " +
                  std::to_string(cn[i].cpus) + " cpus and " + std::to_string(free_gpus[i]) + " of " +
                  std::to_string(cn[i].gpus) + " gpus free";
        const source_pos& at = n.resources_pos.known() ? n.resources_pos
                               : n.on_pos.known()      ? n.on_pos
                               : n.pos.known()         ? n.pos
                                                       : file_pos;
        add_error(errors, at,
                  "node '" + n.name + "'" +
                      (n.replicas > 1 ? ": replica " + std::to_string(r) + " of " + std::to_string(n.replicas) : "") +
                      " is placed by resources (on = \"any\") and needs " + std::to_string(need.cpus) + " cpus and " +
                      std::to_string(need.gpus) + " gpus, but no cluster node has that much free (" + left + ")",
                  "declare more capacity (cpus = N, gpus = M in [cluster.nodes.NAME]; both default to 0), lower "
                  "resources = { cpus = ..., gpus = ... }, or place it by name with on = \"NAME\"");
        break;
      }
      free_cpus[best] -= need.cpus;
      free_gpus[best] -= need.gpus;
      where[r] = cn[best].name;
    }
    n.on_replicas = where;
    n.on.clear();
    for (const auto& w : where) n.on += (n.on.empty() ? "" : ",") + w;
  }
  sort_errors(errors);
  return errors;
}

std::string placement_of(const node_spec& n, std::int64_t replica) {
  if (!n.on_replicas.empty() && replica >= 0 && replica < static_cast<std::int64_t>(n.on_replicas.size()))
    return n.on_replicas[static_cast<std::size_t>(replica)];
  if (!n.on_replicas.empty() || n.on.empty()) return std::string(main_process_name);
  return n.on;
}

// ---------------------------------------------------------------- writing

std::string to_toml(const graph_spec& spec) {
  toml::table root;
  toml::array edges;
  for (const auto& e : spec.edges) {
    std::string s = e.to_string();
    std::vector<std::string> opts;
    if (e.credit > 0) opts.push_back("credit=" + std::to_string(e.credit));
    if (e.dispatch != dispatch_mode::broadcast) opts.push_back("dispatch=" + std::string(to_string(e.dispatch)));
    if (e.feedback) opts.push_back("feedback");
    if (!opts.empty()) s += " [" + join(opts) + "]";
    edges.push_back(s);
  }
  root.insert("edges", std::move(edges));
  toml::table g;
  g.insert("name", spec.name);
  g.insert("seed", static_cast<std::int64_t>(spec.seed));
  g.insert("steps", spec.steps);
  if (spec.console_port >= 0) g.insert("console_port", spec.console_port);
  if (!spec.checkpoint_dir.empty()) g.insert("checkpoint_dir", spec.checkpoint_dir);
  root.insert("graph", std::move(g));
  std::ostringstream os;
  os << root << "\n";
  for (const auto& n : spec.nodes) {
    toml::table t;
    t.insert("kind", n.kind);
    if (n.replicas != 1) t.insert("replicas", n.replicas);
    if (n.threads_pos.known()) t.insert("threads", n.threads);
    if (!n.on_replicas.empty()) {
      toml::array a;
      for (const auto& x : n.on_replicas) a.push_back(x);
      t.insert("on", std::move(a));
    } else if (!n.on.empty()) {
      t.insert("on", n.on);
    }

    for (const auto& [k, s] : n.settings) {
      // a kind's default stays unwritten: validating the text fills it in again, marked from_default, so a
      // check that tells the user's settings from the defaults (LoRA settings without use_lora) reads the same
      // on a cluster node as here
      if (s.from_default) continue;
      std::visit(
          [&](const auto& v) {
            using V = std::decay_t<decltype(v)>;
            if constexpr (std::is_same_v<V, std::vector<std::string>>) {
              toml::array a;
              for (const auto& x : v) a.push_back(x);
              t.insert(k, std::move(a));
            } else if constexpr (!std::is_same_v<V, std::monostate>) {
              t.insert(k, v);
            }
          },
          s.value);
    }
    os << "\n[node." << n.name << "]\n" << t << "\n";
    if (n.resources_pos.known() || n.resources.cpus != 1 || n.resources.gpus != 0)
      os << "resources = { cpus = " << n.resources.cpus << ", gpus = " << n.resources.gpus << " }\n";
  }
  return os.str();
}

}  // namespace flowrun::graph
