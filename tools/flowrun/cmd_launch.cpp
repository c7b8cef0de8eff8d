// `flowrun launch --nproc P FILE.graph ...`: the same graph in P processes on
// this host, as DeepSpeed's launcher / torchrun start one process per rank
// group. Each child runs `flowrun run FILE.graph ...` with
//   FLOWRUN_PROCESS_INDEX = 0 .. P-1, FLOWRUN_NPROC = P, and the rendezvous of
//   the gloo/nccl communicators (their addresses, NCCL's unique id):
//   --rendezvous caf (the default): the launcher hosts a CAF store actor
//     (runtime/comm/caf_store.h) on --rendezvous-host:--rendezvous-port
//     (127.0.0.1, any free port) for as long as the children run, and sets
//     FLOWRUN_RENDEZVOUS = caf://HOST:PORT;
//   --rendezvous file (the default when --store is given): a folder,
//     FLOWRUN_STORE_DIR = --store or a fresh temporary folder.
// Node kinds that span processes (zero_rank) read them; the others run as usual
// in every process. If a child fails, the others are stopped (SIGTERM twice: no draining, as their
// collectives wait on the failed peer; a third SIGTERM, exit at once, for those still running 15 s later;
// SIGKILL 5 s after that) and launch exits with the failed child's code. SIGINT/SIGTERM are passed on.
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include "runtime/comm/caf_store.h"
#include "tools/flowrun/commands.h"

extern char** environ;

namespace flowrun::cli {

namespace {

std::vector<pid_t> children;
// seconds the other processes get to stop after one failed, before the third signal (exit at once)
constexpr int k_stop_grace_s = 15;

void forward_signal(int sig) {
  for (pid_t p : children)
    if (p > 0) ::kill(p, sig);
}

volatile std::sig_atomic_t user_signal = 0;  // the SIGINT/SIGTERM the user sent launch, passed on

void on_user_signal(int sig) {
  user_signal = sig;
  forward_signal(sig);
}

}  // namespace

void add_launch(CLI::App& app) {
  struct launch_opts {
    int nproc = 2;
    std::string rendezvous;
    std::string rendezvous_host = "127.0.0.1";
    uint16_t rendezvous_port = 0;
    std::string store;
    std::string file;
    std::vector<std::string> overrides;
    std::vector<std::string> extra;
  };
  auto o = std::make_shared<launch_opts>();
  auto* sub = app.add_subcommand("launch", "Run a graph in several processes of this host (ranks over gloo)");
  sub->add_option("--nproc", o->nproc, "Processes to start")
      ->capture_default_str()
      ->check(CLI::Validator(
          [](std::string& v) -> std::string {
            int n = 0;
            try {
              n = std::stoi(v);
            } catch (const std::exception&) {
              return "--nproc takes a whole number of processes, got '" + v + "'";
            }
            return n >= 1 ? std::string() : "--nproc must be at least 1, got " + v;
          },
          "N >= 1"));
  sub->add_option("--rendezvous", o->rendezvous,
                  "How ranks rendezvous: caf (a CAF store actor hosted by this launcher; the default) or file "
                  "(a folder; the default with --store)")
      ->check(CLI::IsMember({"caf", "file"}));
  sub->add_option("--rendezvous-host", o->rendezvous_host,
                  "caf: the address the store listens on and the children connect to")
      ->capture_default_str();
  sub->add_option("--rendezvous-port", o->rendezvous_port, "caf: the store's port (0: any free port)")
      ->capture_default_str();
  sub->add_option("--store", o->store, "file: the rendezvous folder (default: a fresh temporary folder)");
  sub->add_option("file", o->file, "The .graph file")->required();
  sub->add_option("--set", o->overrides, "Overrides passed to every process (see flowrun run --set)");
  sub->add_option("--run-arg", o->extra, "More options for each process's `flowrun run` (repeatable)");
  sub->callback([o] {
    const std::string mode = !o->rendezvous.empty() ? o->rendezvous : (o->store.empty() ? "caf" : "file");
    if (mode == "caf" && !o->store.empty())
      throw std::runtime_error("launch: --store is a folder for --rendezvous file, not for --rendezvous caf");
    if (mode == "file" && o->rendezvous_port != 0)
      throw std::runtime_error("launch: --rendezvous-port is for --rendezvous caf; --rendezvous file uses a folder "
                               "(--store DIR)");
    // caf: the store actor lives in this process until every child has exited.
    std::unique_ptr<comm::caf_store_host> caf_host;
    std::string rendezvous;
    if (mode == "caf") {
      caf_host = comm::host_caf_store(o->rendezvous_host, o->rendezvous_port);
      rendezvous = caf_host->address().str();
      spdlog::debug("launch: rendezvous store at {}", rendezvous);
    }
    std::string store = o->store;
    bool temp = false;
    if (mode == "file" && store.empty()) {
      std::string tmpl = (std::filesystem::temp_directory_path() / "flowrun-launch-XXXXXX").string();
      if (!::mkdtemp(tmpl.data())) throw std::runtime_error("launch: cannot make a temporary rendezvous folder");
      store = tmpl;
      temp = true;
    }
    if (mode == "file") std::filesystem::create_directories(store);
    const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
    std::signal(SIGINT, on_user_signal);
    std::signal(SIGTERM, on_user_signal);
    // the processes' shared run id (FLOWRUN_RUN_ID): unique to this launch
    const std::string run_id =
        "launch-" + std::to_string(::getpid()) + "-" +
        std::to_string(std::chrono::system_clock::now().time_since_epoch() / std::chrono::microseconds(1));
    children.assign(o->nproc, -1);
    for (int p = 0; p < o->nproc; ++p) {
      std::vector<std::string> args = {self, "run", o->file};
      for (auto& s : o->overrides) args.insert(args.end(), {"--set", s});
      for (auto& e : o->extra) args.push_back(e);
      if (p > 0) args.insert(args.end(), {"--no-progress", "--quiet"});
      std::vector<std::string> env_s;
      for (char** e = environ; *e; ++e) {
        std::string kv = *e;
        if (kv.rfind("FLOWRUN_PROCESS_INDEX=", 0) == 0 || kv.rfind("FLOWRUN_NPROC=", 0) == 0 ||
            kv.rfind("FLOWRUN_STORE_DIR=", 0) == 0 || kv.rfind("FLOWRUN_RENDEZVOUS=", 0) == 0 ||
            kv.rfind("FLOWRUN_LAUNCHER_PID=", 0) == 0 || kv.rfind("FLOWRUN_RUN_ID=", 0) == 0)
          continue;
        env_s.push_back(kv);
      }
      env_s.push_back("FLOWRUN_PROCESS_INDEX=" + std::to_string(p));
      env_s.push_back("FLOWRUN_RUN_ID=" + run_id);  // one run: they share its checkpoint folders' lock
      env_s.push_back("FLOWRUN_LAUNCHER_PID=" + std::to_string(::getpid()));  // see watch_launcher in main.cpp
      env_s.push_back("FLOWRUN_NPROC=" + std::to_string(o->nproc));
      if (mode == "caf")
        env_s.push_back("FLOWRUN_RENDEZVOUS=" + rendezvous);
      else
        env_s.push_back("FLOWRUN_STORE_DIR=" + store);
      std::vector<char*> argv, envp;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      for (auto& e : env_s) envp.push_back(e.data());
      envp.push_back(nullptr);
      pid_t pid = -1;
      if (int rc = ::posix_spawn(&pid, self.c_str(), nullptr, nullptr, argv.data(), envp.data()); rc != 0)
        throw std::runtime_error("launch: cannot start process " + std::to_string(p) + ": " + std::strerror(rc));
      children[p] = pid;
    }
    int result = 0;
    int left = o->nproc;
    // after a child failed: when the others are killed if they still run (their collectives wait on the dead peer)
    std::chrono::steady_clock::time_point kill_at{};
    bool killing = false, third_sent = false;
    while (left > 0) {
      int status = 0;
      pid_t pid = ::waitpid(-1, &status, killing ? WNOHANG : 0);
      if (pid == 0) {  // children still running after a failure: wait a little, then end them
        if (std::chrono::steady_clock::now() >= kill_at && !third_sent) {
          spdlog::error("launch: {} process(es) still running {} s after the failure: a third signal ends them", left,
                        k_stop_grace_s);
          forward_signal(SIGTERM);  // flowrun's third signal: exit at once
          third_sent = true;
          kill_at = std::chrono::steady_clock::now() + std::chrono::seconds(5);
        } else if (std::chrono::steady_clock::now() >= kill_at) {
          spdlog::error("launch: {} process(es) still running: killed", left);
          forward_signal(SIGKILL);
          killing = false;  // waitpid blocks again: SIGKILL ends them
        } else {
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
        continue;
      }
      if (pid < 0) {
        if (errno == EINTR) continue;
        break;
      }
      int idx = -1;
      for (int p = 0; p < o->nproc; ++p)
        if (children[p] == pid) idx = p;
      if (idx < 0) continue;
      children[idx] = -1;
      --left;
      int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      if (code != 0 && result == 0) {
        result = code;
        if (user_signal != 0 && (code == 128 + SIGINT || code == 128 + SIGTERM))  // the user's stop, not a failure
          spdlog::info("launch: process {} stopped on the signal passed on ({}: exit {})", idx, strsignal(user_signal),
                       code);
        else if (WIFSIGNALED(status))
          spdlog::error("launch: process {} was killed by signal {} ({}); stopping the others", idx, WTERMSIG(status),
                        strsignal(WTERMSIG(status)));
        else
          spdlog::error("launch: process {} exited with {}; stopping the others", idx, code);
        forward_signal(SIGTERM);
        if (user_signal == 0) {
          // a failure, not the user's stop: no draining (a rank whose peer died waits in its collectives, and a
          // drain waited with it until comm_timeout_s or for ever): the second signal stops without draining,
          // and what still runs k_stop_grace_s later is killed
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
          forward_signal(SIGTERM);
          kill_at = std::chrono::steady_clock::now() + std::chrono::seconds(k_stop_grace_s);
          killing = true;
        }
      }
    }
    if (temp) {
      std::error_code ec;
      std::filesystem::remove_all(store, ec);
    }
    caf_host.reset();
    if (result != 0) throw exit_request{result};
  });
}

}  // namespace flowrun::cli
