// flowctl: a terminal client of flowrun's live console (docs/console.md).
//
//   flowctl --port 8080 status
//   flowctl --port 8080 top                 refreshing like top (Ctrl-C to quit)
//   flowctl --port 8080 graph --dot | dot -Tsvg > run.svg
//   flowctl --port 8080 inspect ranks
//   flowctl --port 8080 --token T pause|resume|stop|checkpoint
//
// The console is found by --url URL or --port PORT (host 127.0.0.1), else by
// $FLOWRUN_CONSOLE_URL or $FLOWRUN_CONSOLE_PORT. The token (needed by pause,
// resume, stop and checkpoint, and by everything when the console is not on
// loopback) comes from --token, --token-file, $FLOWRUN_CONSOLE_TOKEN or
// $FLOWRUN_CONSOLE_TOKEN_FILE.
//
// Exit codes: 0 ok; 1 the console refused or failed the request; 2 usage;
// 3 no console answers at the address.
#include <httplib.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

using json = nlohmann::json;

namespace {

struct failure {
  int code;
  std::string message;
};

struct options {
  std::string url;
  int port = 0;
  std::string host = "127.0.0.1";
  std::string token;
  std::string token_file;
  double timeout_s = 10;
};

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

std::string trim(std::string s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  std::size_t b = 0;
  while (b < s.size() && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  return s.substr(b);
}

class console_client {
 public:
  explicit console_client(const options& o) {
    std::string url = o.url;
    if (url.empty() && o.port > 0) url = "http://" + o.host + ":" + std::to_string(o.port);
    if (url.empty()) url = env("FLOWRUN_CONSOLE_URL");
    if (url.empty() && !env("FLOWRUN_CONSOLE_PORT").empty())
      url = "http://" + o.host + ":" + env("FLOWRUN_CONSOLE_PORT");
    if (url.empty())
      throw failure{2,
                    "which console? give --port PORT or --url URL (flowrun prints \"console: http://127.0.0.1:PORT/\" "
                    "at start), or set FLOWRUN_CONSOLE_URL / FLOWRUN_CONSOLE_PORT"};
    while (url.size() > 1 && url.back() == '/') url.pop_back();
    if (url.find("://") == std::string::npos) url = "http://" + url;
    if (url.rfind("http://", 0) != 0)
      throw failure{2, "--url " + url + ": flowrun's console speaks plain http:// (it listens on loopback by default)"};
    url_ = url;
    token_ = o.token;
    std::string tf = o.token_file.empty() ? env("FLOWRUN_CONSOLE_TOKEN_FILE") : o.token_file;
    if (token_.empty() && !tf.empty()) {
      std::ifstream f(tf);
      if (!f) throw failure{2, "cannot read the token file '" + tf + "'"};
      std::getline(f, token_);
      token_ = trim(token_);
    }
    if (token_.empty()) token_ = env("FLOWRUN_CONSOLE_TOKEN");
    cli_ = std::make_unique<httplib::Client>(url_);
    cli_->set_connection_timeout(2, 0);
    const auto secs = static_cast<time_t>(o.timeout_s);
    cli_->set_read_timeout(secs, static_cast<time_t>((o.timeout_s - static_cast<double>(secs)) * 1e6));
    cli_->set_keep_alive(true);
  }

  const std::string& url() const { return url_; }

  json get(const std::string& path) { return request("GET", path); }
  json post(const std::string& path) { return request("POST", path); }

 private:
  json request(const std::string& method, const std::string& path) {
    httplib::Headers h;
    if (!token_.empty()) h.emplace("Authorization", "Bearer " + token_);
    httplib::Result res = method == "GET" ? cli_->Get(path.c_str(), h) : cli_->Post(path.c_str(), h, "", "text/plain");
    if (!res)
      throw failure{3, "no console answers at " + url_ + " (" + httplib::to_string(res.error()) +
                           "): is flowrun running with --console PORT (or console_port in the graph)? The run may "
                           "also have ended"};
    json body;
    try {
      body = json::parse(res->body);
    } catch (const std::exception&) {
      throw failure{1, method + " " + path + ": HTTP " + std::to_string(res->status) + " with a body that is not JSON"};
    }
    if (res->status >= 400) {
      std::string msg = body.value("error", std::string("HTTP ") + std::to_string(res->status));
      if (res->status == 401 && token_.empty())
        msg += "\n(give the token with --token, --token-file or FLOWRUN_CONSOLE_TOKEN)";
      throw failure{1, method + " " + path + " refused (HTTP " + std::to_string(res->status) + "): " + msg};
    }
    return body;
  }

  std::string url_, token_;
  std::unique_ptr<httplib::Client> cli_;
};

// -- formatting ----------------------------------------------------------------------------

double d(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : 0.0;
}

// A training signal (loss, lr, kl): 5 significant digits, so that lr 9.65e-06 does not print as 0.0000
std::string signal_num(double x) {
  char buf[64];
  if (!std::isfinite(x)) return "-";
  std::snprintf(buf, sizeof buf, "%.5g", x);
  return buf;
}

std::string num(double x, int prec = 1) {
  char buf[64];
  if (!std::isfinite(x)) return "-";
  if (std::fabs(x) >= 1e6)
    std::snprintf(buf, sizeof buf, "%.2fM", x / 1e6);
  else if (std::fabs(x) >= 1e4)
    std::snprintf(buf, sizeof buf, "%.1fk", x / 1e3);
  else
    std::snprintf(buf, sizeof buf, "%.*f", prec, x);
  return buf;
}

std::string bytes(double b) {
  char buf[64];
  if (b >= 1073741824.0)
    std::snprintf(buf, sizeof buf, "%.2f GiB", b / 1073741824.0);
  else if (b >= 1048576.0)
    std::snprintf(buf, sizeof buf, "%.1f MiB", b / 1048576.0);
  else if (b >= 1024.0)
    std::snprintf(buf, sizeof buf, "%.1f KiB", b / 1024.0);
  else
    std::snprintf(buf, sizeof buf, "%.0f B", b);
  return buf;
}

std::string pad(std::string s, std::size_t w, bool right = false) {
  if (s.size() > w) s = s.substr(0, w - 1) + "~";
  std::string sp(w - s.size(), ' ');
  return right ? sp + s : s + sp;
}

std::string status_line(const json& s) {
  std::ostringstream o;
  o << "flowrun " << s.value("graph", "") << " · " << s.value("run_state", "");
  if (!s.value("phase", "").empty()) o << " · phase " << s.value("phase", "");
  o << " · " << num(d(s, "elapsed_s")) << " s · ";
  if (!s.value("progress_text", "").empty()) {
    o << s.value("progress_text", "");  // the phases under way: step k/N with an ETA
  } else {
    o << "step " << s.value("steps", 0);
    if (s.value("total_steps", 0) > 0) o << "/" << s.value("total_steps", 0);
  }
  o << " · " << num(d(s, "tokens_per_s")) << " tok/s";
  if (s.value("finished", false)) o << " · exit code " << s.value("exit_code", 0);
  return o.str();
}

void print_status(const json& s) {
  std::cout << status_line(s) << "\n";
  std::cout << "file " << s.value("file", "") << "\n";
  std::cout << "nodes " << s.value("nodes", 0) << " (" << s.value("replicas", 0) << " replicas):";
  for (const auto& [k, v] : s["nodes_by_state"].items()) std::cout << " " << k << " " << v.get<int>();
  std::cout << "\n";
  if (!s["signals"].empty()) {
    std::cout << "signals:";
    for (const auto& [k, v] : s["signals"].items())
      std::cout << " " << k << " " << (v.is_number() ? signal_num(v.get<double>()) : "-");
    std::cout << "\n";
  }
  if (d(s, "memory_reported_bytes") > 0)
    std::cout << "memory reported by nodes " << bytes(d(s, "memory_reported_bytes")) << "\n";
  std::cout << "process RSS " << bytes(d(s, "rss_bytes")) << "\n";
  if (!s.value("error", "").empty()) std::cout << "error: " << s.value("error", "") << "\n";
}

/// `flowctl cluster`: GET /api/cluster as a table, main first, then each
/// cluster node (address, cores, GPUs, TLS, state, heartbeat age in ms,
/// replicas); a lost node's reason follows its row.
std::string cluster_table(const json& c) {
  std::ostringstream o;
  o << pad("NODE", 10) << pad("ADDRESS", 22) << pad("CPUS", 6, true) << pad("GPUS", 6, true) << "  " << pad("TLS", 5)
    << pad("STATE", 11) << pad("HEARTBEAT", 13, true) << "  REPLICAS\n";
  auto row = [&](const json& n, bool main) {
    std::string hb = "-";
    if (!main) hb = n.contains("heartbeat_age_ms") && n["heartbeat_age_ms"].is_number()
                        ? std::to_string(n["heartbeat_age_ms"].get<std::int64_t>()) + " ms"
                        : std::string("none yet");
    std::string reps;
    for (const auto& r : n.value("replicas", json::array())) reps += (reps.empty() ? "" : " ") + r.get<std::string>();
    o << pad(n.value("name", ""), 10) << pad(main ? "-" : n.value("address", ""), 22)
      << pad(std::to_string(n.value("cpus", 0)), 6, true) << pad(std::to_string(n.value("gpus", 0)), 6, true) << "  "
      << pad(main ? "-" : (n.value("tls", false) ? "on" : "off"), 5) << pad(main ? "local" : n.value("state", ""), 11)
      << pad(hb, 13, true) << "  " << (reps.empty() ? "-" : reps) << "\n";
    if (!main && !n.value("lost_reason", "").empty()) o << "          lost: " << n.value("lost_reason", "") << "\n";
  };
  row(c.value("main", json::object()), true);
  for (const auto& n : c.value("nodes", json::array())) row(n, false);
  if (c.value("clustered", false))
    o << "heartbeat every " << c.value("heartbeat_ms", 0) << " ms, lost after " << c.value("lost_after_ms", 0)
      << " ms\n";
  else
    o << "one process: every replica runs in main\n";
  return o.str();
}

std::string top_frame(const json& s, const json& nodes, const json& edges) {
  std::ostringstream o;
  o << status_line(s) << " · rates over " << num(d(nodes, "window_s"), 2) << " s\n\n";
  o << pad("NODE", 16) << pad("STATE", 16) << pad("REPL", 5, true) << pad("IN/s", 9, true) << pad("OUT/s", 9, true)
    << pad("HANDLED/s", 10, true) << pad("BYTES IN/s", 12, true) << pad("BUSY", 7, true) << pad("IDLE", 7, true)
    << pad("BLOCK", 7, true) << pad("DEPTH", 6, true) << pad("OUTST", 6, true) << pad("OLDEST", 8, true) << "\n";
  std::vector<json> ns(nodes["nodes"].begin(), nodes["nodes"].end());
  std::stable_sort(ns.begin(), ns.end(), [](const json& a, const json& b) {
    return d(a["load"], "busy_ms_per_s") > d(b["load"], "busy_ms_per_s");
  });
  for (const auto& n : ns) {
    const json& r = n["rates"];
    const json& l = n["load"];
    o << pad(n.value("name", ""), 16) << pad(n.value("state", ""), 16)
      << pad(std::to_string(n.value("replicas", 1)), 5, true) << pad(num(d(r, "msgs_in_per_s")), 9, true)
      << pad(num(d(r, "msgs_out_per_s")), 9, true) << pad(num(d(r, "handled_per_s")), 10, true)
      << pad(bytes(d(r, "bytes_in_per_s")), 12, true) << pad(num(d(l, "busy_ms_per_s"), 0), 7, true)
      << pad(num(d(l, "idle_ms_per_s"), 0), 7, true) << pad(num(d(l, "blocked_ms_per_s"), 0), 7, true)
      << pad(std::to_string(l.value("mailbox_depth", 0)), 6, true)
      << pad(std::to_string(l.value("outstanding", 0)), 6, true)
      << pad(l.value("outstanding", 0) > 0 ? num(d(l, "oldest_outstanding_s"), 2) + "s" : "-", 8, true) << "\n";
  }
  o << "\n"
    << pad("EDGE", 36) << pad("MSG/s", 9, true) << pad("BYTES/s", 12, true) << pad("IN FLIGHT", 11, true)
    << pad("BLOCK ms/s", 11, true) << "\n";
  for (const auto& e : edges["edges"]) {
    o << pad(e.value("name", "") + (e.value("feedback", false) ? " (fb)" : ""), 36)
      << pad(num(d(e, "msgs_per_s")), 9, true) << pad(bytes(d(e, "bytes_per_s")), 12, true)
      << pad(std::to_string(e.value("in_flight", 0)) + "/" +
                 std::to_string(e.value("credit", 0) * std::max(1, e.value("links", 1))),
             11, true)
      << pad(num(d(e, "blocked_ms_per_s"), 0), 11, true) << "\n";
  }
  o << "(BUSY/IDLE/BLOCK: milliseconds per second, summed over replicas (edges: over links); IN FLIGHT: of credit x "
       "links; OUTST: messages sent and not yet acknowledged)\n";
  return o.str();
}

std::string dot_quote(const std::string& s) {
  std::string o = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    if (c == '\n') {
      o += "\\n";
      continue;
    }
    o += c;
  }
  return o + "\"";
}

std::string state_colour(const std::string& s) {
  if (s == "busy") return "#2e7d32";
  if (s == "idle") return "#8d99a6";
  if (s == "waiting_credit") return "#e65100";
  if (s == "waiting_request") return "#1565c0";
  if (s == "restarting") return "#f9a825";
  if (s == "paused") return "#6a1b9a";
  if (s == "failed") return "#c62828";
  if (s == "done") return "#455a64";
  if (s == "stopped") return "#37474f";
  if (s == "remote") return "#00838f";
  return "#78909c";  // initializing
}

std::string to_dot(const json& graph, const json& nodes, const json& edges) {
  std::ostringstream o;
  o << "digraph " << dot_quote(graph.value("name", "flowrun")) << " {\n";
  o << "  rankdir=LR;\n  node [shape=box, style=\"rounded,filled\", fontname=\"Helvetica\", fontcolor=white];\n";
  o << "  edge [fontname=\"Helvetica\", fontsize=10];\n";
  for (const auto& n : nodes["nodes"]) {
    const std::string name = n.value("name", "");
    const int reps = n.value("replicas", 1);
    std::string label = name + "\n" + n.value("kind", "") + (reps > 1 ? " x" + std::to_string(reps) : "") + "\n" +
                        n.value("state", "") + "\n" +
                        (n.value("source", false) ? num(d(n["rates"], "msgs_out_per_s")) + " msg/s out"
                                                  : num(d(n["rates"], "handled_per_s")) + " msg/s handled") +
                        ", busy " + num(d(n["load"], "utilization") * 100, 0) + "%";
    o << "  " << dot_quote(name) << " [label=" << dot_quote(label)
      << ", fillcolor=" << dot_quote(state_colour(n.value("state", ""))) << (reps > 1 ? ", peripheries=2" : "")
      << ", tooltip=" << dot_quote(n.value("state", "")) << "];\n";
  }
  for (const auto& e : edges["edges"]) {
    std::string label = num(d(e, "msgs_per_s")) + " msg/s\n" + bytes(d(e, "bytes_per_s")) + "/s";
    o << "  " << dot_quote(e.value("from", "")) << " -> " << dot_quote(e.value("to", ""))
      << " [label=" << dot_quote(label) << ", tooltip="
      << dot_quote(e.value("name", "") + " (" + e.value("dispatch", "") + ", credit " +
                   std::to_string(e.value("credit", 0)) + ", " + e.value("transport", "") + ")")
      << (e.value("feedback", false) ? ", style=dashed, constraint=false" : "") << "];\n";
  }
  o << "}\n";
  return o.str();
}

void print_graph(const json& graph, const json& nodes, const json& edges) {
  std::cout << "graph " << graph.value("name", "") << " (" << graph.value("file", "") << ")\n";
  for (const auto& n : nodes["nodes"])
    std::cout << "  node " << pad(n.value("name", ""), 16) << pad(n.value("kind", ""), 18) << " x"
              << n.value("replicas", 1) << "  " << pad(n.value("state", ""), 16) << num(d(n["rates"], "handled_per_s"))
              << " handled/s, " << num(d(n["rates"], "msgs_out_per_s")) << " out/s\n";
  for (const auto& e : edges["edges"])
    std::cout << "  edge " << pad(e.value("name", ""), 40) << pad(e.value("dispatch", ""), 12) << " credit "
              << e.value("credit", 0) << (e.value("feedback", false) ? " feedback" : "") << "  "
              << num(d(e, "msgs_per_s")) << " msg/s " << bytes(d(e, "bytes_per_s")) << "/s\n";
}

void print_inspect(const json& n) {
  std::cout << "node " << n.value("name", "") << " (kind " << n.value("kind", "") << ", " << n.value("replicas", 1)
            << " replica" << (n.value("replicas", 1) > 1 ? "s" : "") << ")\n";
  std::cout << "state " << n.value("state", "") << " for " << num(d(n, "state_for_s"), 2) << " s";
  if (!n.value("phase", "").empty()) std::cout << ", phase " << n.value("phase", "");
  std::cout << "\n";
  if (!n.value("reason", "").empty()) std::cout << "failed: " << n.value("reason", "") << "\n";
  const json& r = n["rates"];
  const json& l = n["load"];
  std::cout << "\nrates: in " << num(d(r, "msgs_in_per_s")) << " msg/s (" << bytes(d(r, "bytes_in_per_s"))
            << "/s), handled " << num(d(r, "handled_per_s")) << "/s, out " << num(d(r, "msgs_out_per_s")) << " msg/s ("
            << bytes(d(r, "bytes_out_per_s")) << "/s), tokens " << num(d(r, "tokens_per_s")) << "/s\n";
  std::cout << "load: busy " << num(d(l, "busy_ms_per_s"), 0) << " / idle " << num(d(l, "idle_ms_per_s"), 0)
            << " / blocked " << num(d(l, "blocked_ms_per_s"), 0) << " ms per s, mailbox " << l.value("mailbox_depth", 0)
            << ", outstanding " << l.value("outstanding", 0) << " (oldest " << num(d(l, "oldest_outstanding_s"), 2)
            << " s)\n";
  std::cout << "\nsettings:\n";
  std::size_t key_w = 0;  // the longest name and two spaces: a name is never cut or run into its value
  for (const auto& s : n["settings"]) key_w = std::max(key_w, s.value("key", "").size());
  for (const auto& s : n["settings"]) {
    const std::string key = s.value("key", "");
    std::cout << "  " << key << std::string(key_w + 2 - key.size(), ' ') << s.value("value", "")
              << (s.value("from_default", false) ? "  (default)" : "") << "\n";
  }
  std::cout << "\ncounters:\n";
  const json& t = n["totals"];
  for (const char* k : {"msgs_in", "msgs_out", "handled", "produced", "bytes_in", "bytes_out", "restarts", "dropped"})
    std::cout << "  " << pad(k, 28) << t.value(k, 0) << "\n";
  std::cout << "  " << pad("busy_s", 28) << num(d(t, "busy_s"), 3) << "\n  " << pad("blocked_s", 28)
            << num(d(t, "blocked_s"), 3) << "\n";
  for (const auto& [k, v] : n["counters"].items()) std::cout << "  " << pad(k, 28) << v.dump() << "\n";
  for (const auto& [k, v] : n["signals"].items()) std::cout << "  " << pad("signal " + k, 28) << v.dump() << "\n";
  std::cout << "\nreplicas:\n";
  for (const auto& x : n["replicas_detail"]) {
    std::cout << "  [" << x.value("replica", 0) << "] " << pad(x.value("state", ""), 16) << " in "
              << x.value("msgs_in", 0) << ", out " << x.value("msgs_out", 0) << ", busy "
              << num(d(x, "busy_ms_per_s"), 0) << " ms/s, restarts " << x.value("restarts", 0);
    if (!x["memory_bytes"].empty()) {
      std::cout << ", memory";
      for (const auto& [k, v] : x["memory_bytes"].items()) std::cout << " " << k << " " << bytes(v.get<double>());
    }
    std::cout << "\n";
  }
  std::cout << "\nrecent errors:" << (n["recent_errors"].empty() ? " none" : "") << "\n";
  for (const auto& e : n["recent_errors"])
    std::cout << "  " << num(d(e, "t_s"), 2) << " s [" << e.value("replica", 0) << "] " << e.value("text", "") << "\n";
  std::cout << "\nedges in:";
  for (const auto& e : n["edges_in"]) std::cout << " " << e.get<std::string>() << ";";
  std::cout << "\nedges out:";
  for (const auto& e : n["edges_out"]) std::cout << " " << e.get<std::string>() << ";";
  std::cout << "\n";
  if (!n["events"].empty()) {
    std::cout << "\nevents:\n";
    for (const auto& e : n["events"])
      std::cout << "  " << num(d(e, "t_s"), 2) << " s " << e.value("kind", "") << ": " << e.value("text", "") << "\n";
  }
}

volatile std::sig_atomic_t g_quit = 0;
extern "C" void on_sigint(int) { g_quit = 1; }

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"flowctl: a terminal client of flowrun's live console (docs/console.md)"};
  app.require_subcommand(1);
  app.fallthrough();
  options o;
  app.add_option("--url", o.url, "The console's address, e.g. http://127.0.0.1:8080 (or $FLOWRUN_CONSOLE_URL)");
  app.add_option("--port,-p", o.port, "The console's port on --host (or $FLOWRUN_CONSOLE_PORT)")
      ->check(CLI::Range(1, 65535));
  app.add_option("--host", o.host, "Host for --port")->capture_default_str();
  app.add_option("--token", o.token, "The console's token (or $FLOWRUN_CONSOLE_TOKEN)");
  app.add_option("--token-file", o.token_file,
                 "A file holding the token (flowrun --console-token-file; or $FLOWRUN_CONSOLE_TOKEN_FILE)");
  // a number of seconds > 0 and finite (--timeout 0 reported "no console answers" of a console that was there;
  // top -d nan or -1 were taken)
  const CLI::Validator seconds(
      [](std::string& v) {
        double x = 0;
        try {
          x = std::stod(v);
        } catch (const std::exception&) {
          return std::string("must be a number of seconds, got ") + v;
        }
        return std::isfinite(x) && x > 0 ? std::string() : "must be > 0 seconds, got " + v;
      },
      "SECONDS > 0");
  app.add_option("--timeout", o.timeout_s, "Seconds to wait for an answer")->capture_default_str()->check(seconds);

  auto* status = app.add_subcommand("status", "The run: state, phase, progress, tokens/s, nodes by state, signals");
  auto* top = app.add_subcommand("top", "Nodes and edges with rates and load, refreshed like top");
  int iterations = 0;
  double interval = 1.0;
  top->add_option("-n,--iterations", iterations, "Frames to show (0: until the run ends or Ctrl-C)")
      ->capture_default_str();
  top->add_option("-d,--interval", interval, "Seconds between frames")->capture_default_str()->check(seconds);
  auto* graph = app.add_subcommand("graph", "The graph with states and rates (text, or Graphviz DOT with --dot)");
  bool dot = false;
  graph->add_flag("--dot", dot, "Print Graphviz DOT (nodes coloured by state, edges labelled with rates)");
  auto* inspect = app.add_subcommand("inspect", "One node: settings, counters, replicas, memory, recent errors");
  std::string node_name;
  bool raw = false;
  inspect->add_option("node", node_name, "The node's name")->required();
  inspect->add_flag("--json", raw, "Print the API's JSON");
  auto* events = app.add_subcommand("events", "The event log (spawn, start, restart, failed, down, ...)");
  std::uint64_t since = 0;
  events->add_option("--since", since, "Only events after this sequence number")
      ->check(CLI::Validator(  // -1 became 18446744073709551615, which the console refused as out of its range
          [](std::string& v) {
            return !v.empty() && v.find_first_not_of("0123456789") == std::string::npos
                       ? std::string()
                       : "must be a whole number >= 0 (an event's seq), got " + v;
          },
          "SEQ >= 0"));
  auto* cluster = app.add_subcommand("cluster", "The processes: main and each cluster node, heartbeat ages, replicas");
  bool cluster_json = false;
  cluster->add_flag("--json", cluster_json, "Print the API's JSON");
  std::vector<std::pair<CLI::App*, std::string>> actions;
  for (const char* a : {"pause", "resume", "stop", "checkpoint"}) {
    const char* what = std::string(a) == "pause"    ? "Pause the run: nothing is handled or produced until resume"
                       : std::string(a) == "resume" ? "Resume a paused run"
                       : std::string(a) == "stop"
                           ? "Stop the run: drain and stop as on SIGINT (exit code 130)"
                           : "Ask the nodes that can (zero_rank) to checkpoint at their next step";
    actions.push_back({app.add_subcommand(a, what), a});
  }

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // a misspelt subcommand (`flowctl stauts`): CLI11 says only "A subcommand is required"
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "--url" || a == "--port" || a == "-p" || a == "--host" || a == "--token" || a == "--token-file" ||
          a == "--timeout") {
        ++i;  // its value
        continue;
      }
      if (a.empty() || a[0] == '-') continue;
      std::string names;
      bool known = false;
      for (const auto* sub : app.get_subcommands([](CLI::App*) { return true; })) {
        names += (names.empty() ? "" : ", ") + sub->get_name();
        known |= sub->get_name() == a;
      }
      if (known) break;
      std::cerr << "flowctl: unknown subcommand '" << a << "': use one of " << names << " (flowctl --help)\n";
      return 2;
    }
    // --help and --version exit 0; a usage error (unknown option, missing or bad value) exits 2,
    // not CLI11's own codes (105 and so on), like every other refused input
    return app.exit(e) == 0 ? 0 : 2;
  }

  try {
    console_client c(o);
    if (status->parsed()) {
      print_status(c.get("/api/status"));
    } else if (top->parsed()) {
      std::signal(SIGINT, on_sigint);
      const bool tty = isatty(STDOUT_FILENO) == 1;
      bool seen = false;
      for (int i = 0; iterations <= 0 || i < iterations; ++i) {
        if (g_quit) break;
        if (i > 0) {
          auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(std::max(0.05, interval));
          while (!g_quit && std::chrono::steady_clock::now() < until)
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
          if (g_quit) break;
        }
        json s, n, e;
        try {
          s = c.get("/api/status");
          n = c.get("/api/nodes");
          e = c.get("/api/edges");
        } catch (const failure& f) {
          if (seen && f.code == 3) {
            std::cout << "flowctl top: the console closed (the run ended)\n";
            return 0;
          }
          throw;
        }
        seen = true;
        std::string frame = top_frame(s, n, e);
        if (tty)
          std::cout << "\x1b[H\x1b[2J" << frame << std::flush;
        else
          std::cout << "--- frame " << (i + 1) << " ---\n" << frame << std::flush;
        if (s.value("finished", false)) break;
      }
    } else if (graph->parsed()) {
      json g = c.get("/api/graph"), n = c.get("/api/nodes"), e = c.get("/api/edges");
      if (dot)
        std::cout << to_dot(g, n, e);
      else
        print_graph(g, n, e);
    } else if (inspect->parsed()) {
      json n = c.get("/api/nodes/" + node_name);
      if (raw)
        std::cout << n.dump(2) << "\n";
      else
        print_inspect(n);
    } else if (cluster->parsed()) {
      json cl = c.get("/api/cluster");
      if (cluster_json)
        std::cout << cl.dump(2) << "\n";
      else
        std::cout << cluster_table(cl);
    } else if (events->parsed()) {
      json ev = c.get("/api/events?since=" + std::to_string(since));
      for (const auto& x : ev["events"]) {
        std::string who = x.value("node", "");
        if (!who.empty() && x.value("replica", -1) >= 0) who += "[" + std::to_string(x.value("replica", -1)) + "]";
        std::cout << pad(std::to_string(x.value("seq", 0)), 6) << pad(num(d(x, "t_s"), 3) + " s", 11)
                  << pad(x.value("kind", ""), 11) << (who.empty() ? "" : who + " ") << x.value("text", "") << "\n";
      }
    } else {
      for (auto& [sub, name] : actions)
        if (sub->parsed()) {
          json r = c.post("/api/" + name);
          std::cout << name << ": " << r.value("message", std::string("ok")) << "\n";
        }
    }
  } catch (const failure& f) {
    std::cerr << "flowctl: " << f.message << "\n";
    return f.code;
  }
  return 0;
}
