// containerd-shim-nesinit-v2: containerd's runtime-v2 shim binary protocol (runtime type
// io.containerd.nesinit.v2). containerd runs it with cwd = the task's bundle and Go-style flags:
//   -namespace NS -address CONTAINERD_SOCK -publish-binary CONTAINERD [-id ID] [-bundle DIR]
//   [-debug] [-socket PATH] ACTION
// ACTION `start`: spawn the long-lived shim (this program without an action, the listening
//   socket as fd 3, its own session), write its address to `<bundle>/address`, print
//   "unix://PATH" on stdout (containerd reads stdout and stderr together: nothing else may be
//   printed) and exit 0. A pod's container (CRI's annotations, host/shim/pod.hpp) spawns none:
//   its sandbox's shim's address is answered.
// ACTION `delete`: clean up after a shim that died (host/shim/task_service.hpp cleanup_task) and
//   print a serialized containerd.task.v2.DeleteResponse on stdout.
// No action: serve containerd.task.v2.Task on fd 3 until Shutdown. Env: TTRPC_ADDRESS
// (containerd's ttrpc socket, for events), NESHOST (the `neshost` program; default: beside this
// one). Logs go to the bundle's `log` FIFO, which containerd copies to its own log.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <fmt/format.h>

#include "base/small_file.hpp"
#include "containerd_pb.h"
#include "host/monitor/reconcile.hpp"
#include "host/shim/identity.hpp"
#include "host/shim/log.hpp"
#include "host/shim/pod.hpp"
#include "host/shim/runtime_info.hpp"
#include "host/shim/task_service.hpp"
#include "host/shim/ttrpc.hpp"

extern char** environ;

namespace {
namespace fs = std::filesystem;
namespace asio = boost::asio;
using namespace nes;

/// The flags containerd passes (runtime/v2/shim/shim.go), Go's flag syntax: -name VALUE,
/// -name=VALUE, --name likewise; booleans take no value.
struct Flags {
  std::string ns, address, publish_binary, id, bundle, socket, action;
  bool debug = false, version = false, info = false;
};

int bail(std::string_view msg) {
  shim::log("{}", msg);
  return 1;
}

host::Result<Flags> parse(int argc, char** argv) {
  Flags f;
  std::map<std::string, std::string*> values = {{"namespace", &f.ns},  {"address", &f.address},
                                                {"publish-binary", &f.publish_binary},
                                                {"id", &f.id},         {"bundle", &f.bundle},
                                                {"socket", &f.socket}};
  std::map<std::string, bool*> bools = {{"debug", &f.debug}, {"v", &f.version}, {"info", &f.info}};
  int i = 1;
  for (; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--") { ++i; break; }
    if (a.size() < 2 || a[0] != '-') break;
    a.erase(0, a[1] == '-' ? 2 : 1);
    std::optional<std::string> val;
    if (auto eq = a.find('='); eq != std::string::npos) {
      val = a.substr(eq + 1);
      a.resize(eq);
    }
    if (auto b = bools.find(a); b != bools.end()) {
      *b->second = !val || *val == "true" || *val == "1";
      continue;
    }
    auto v = values.find(a);
    if (v == values.end()) return host::Error{fmt::format("flag provided but not defined: -{}", a)};
    if (!val) {
      if (i + 1 >= argc) return host::Error{fmt::format("flag needs an argument: -{}", a)};
      val = argv[++i];
    }
    *v->second = *val;
  }
  if (i < argc) f.action = argv[i];
  return f;
}

fs::path self_dir() {
  std::error_code ec;
  auto p = fs::read_symlink("/proc/self/exe", ec);
  return ec ? fs::path() : p.parent_path();
}

fs::path neshost_program() {
  if (const char* e = std::getenv("NESHOST"); e && *e) return e;
  std::error_code ec;
  if (auto beside = self_dir() / "neshost"; fs::exists(beside, ec)) return beside;
  return "neshost";  // looked up on PATH
}

// `start`: the listening socket, the long-lived shim on it, the address printed.
int do_start(const Flags& f, char** argv) {
  // containerd may write runtime options on stdin; the shim has none to honour. Read and drop (bounded).
  {
    int fl = ::fcntl(0, F_GETFL);
    if (fl >= 0 && !::isatty(0)) {
      ::fcntl(0, F_SETFL, fl | O_NONBLOCK);
      char buf[4096];
      for (int n = 0; n < 256 && ::read(0, buf, sizeof buf) > 0; ++n) {}
      ::fcntl(0, F_SETFL, fl);
    }
  }
  // The task's place in its pod (CRI's annotations in config.json): a pod's container is served
  // by its sandbox's shim (host/shim/pod.hpp). No config.json yet: a task of its own (Create
  // reports the missing file).
  const fs::path bundle = f.bundle.empty() ? fs::current_path() : fs::path(f.bundle);
  shim::PodPlacement placement;
  if (auto text = base::read_small_file((bundle / "config.json").c_str(), 4u << 20); text) {
    auto p = shim::parse_pod_placement(*text, f.id);
    if (!p) return bail(p.error().message);
    placement = *p;
  }
  const fs::path key_sock = shim::socket_path(f.address, f.ns, shim::shim_key(placement, f.id));
  const bool alive =
      static_cast<bool>(ttrpc::call(key_sock, {"containerd.task.v2.Task", "Connect", {}, 0, {}}, std::chrono::seconds(2)));
  auto plan = shim::plan_start(placement, f.id, f.address, f.ns, alive);
  if (!plan) return bail(plan.error().message);
  const fs::path sock = plan->socket;
  if (!plan->spawn) {
    // A live shim serves it: this task asked twice (containerd's retry), or a pod's container
    // joining its sandbox's shim, whose address containerd also finds in this bundle on restart.
    const std::string address = "unix://" + sock.string();
    if (placement.role == shim::PodRole::container)
      if (auto w = host::write_durable(bundle, "address", address); !w) return bail(w.error().message);
    fmt::print("{}", address);
    return 0;
  }
  auto l = ttrpc::listen_unix(sock);
  if (!l) return bail(l.error().message);
  std::vector<std::string> args = {argv[0], "-namespace", f.ns, "-id", f.id, "-address", f.address,
                                   "-publish-binary", f.publish_binary};
  if (f.debug) args.push_back("-debug");
  std::vector<char*> cargv;
  for (auto& a : args) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, l->get(), 3);
  // Not containerd's pipes: it waits for their EOF before it reads the address.
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addclosefrom_np(&fa, 4);
  posix_spawnattr_t at;
  posix_spawnattr_init(&at);
  posix_spawnattr_setflags(&at, POSIX_SPAWN_SETSID);
  pid_t pid = 0;
  std::error_code exe_ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", exe_ec);
  if (exe_ec) return bail(fmt::format("/proc/self/exe: {}", exe_ec.message()));
  int rc = ::posix_spawn(&pid, exe.c_str(), &fa, &at, cargv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&at);
  if (rc != 0) return bail(fmt::format("spawn the shim: {}", std::strerror(rc)));
  const std::string address = "unix://" + sock.string();
  if (auto w = host::write_durable(bundle, "address", address); !w) {
    ::kill(pid, SIGKILL);
    return bail(w.error().message);
  }
  fmt::print("{}", address);
  return 0;
}

// `delete`: containerd's cleanup after a dead shim.
int do_delete(const Flags& f) {
  fs::path bundle = f.bundle.empty() ? fs::current_path() : fs::path(f.bundle);
  auto c = shim::cleanup_task(bundle);
  std::error_code ec;
  fs::remove(shim::socket_path(f.address, f.ns, f.id), ec);  // the dead shim's
  containerd::task::v2::DeleteResponse r;
  r.set_pid(static_cast<std::uint32_t>(c.pid));
  r.set_exit_status(c.exit_status);
  r.mutable_exited_at()->set_seconds(c.exited_at_ns / 1000000000);
  r.mutable_exited_at()->set_nanos(static_cast<std::int32_t>(c.exited_at_ns % 1000000000));
  std::string out = r.SerializeAsString();
  return ::write(1, out.data(), out.size()) == static_cast<ssize_t>(out.size()) ? 0 : 1;
}

// The long-lived shim.
int do_serve(const Flags& f) {
  // Logs: containerd opened the bundle's `log` FIFO for reading before `start`.
  if (int lf = ::open("log", O_WRONLY | O_NONBLOCK | O_CLOEXEC); lf >= 0) {
    ::fcntl(lf, F_SETFL, ::fcntl(lf, F_GETFL) & ~O_NONBLOCK);
    ::dup2(lf, 2);
    ::close(lf);
  }
  ::signal(SIGPIPE, SIG_IGN);
  if (::fcntl(3, F_GETFD) < 0) return bail("no listening socket on fd 3 (run by containerd with `start`)");
  ::fcntl(3, F_SETFD, FD_CLOEXEC);
  asio::io_context io;
  const char* ta = std::getenv("TTRPC_ADDRESS");
  shim::Publisher events(ta ? ta : "", f.ns);
  ttrpc::Server server(io);
  shim::ServiceConfig cfg;
  cfg.ns = f.ns;
  cfg.id = f.id;
  cfg.bundle = fs::current_path();
  cfg.neshost = neshost_program();
  // Shutdown: stop accepting, let containerd take the last reply and hang up (at most 2 s), exit.
  asio::steady_timer drain(io);
  int drain_ticks = 0;
  std::function<void()> wait_idle = [&] {
    if (server.connections() == 0 || ++drain_ticks > 100) return io.stop();
    drain.expires_after(std::chrono::milliseconds(20));
    drain.async_wait([&](boost::system::error_code) { wait_idle(); });
  };
  cfg.shutdown = [&] {
    server.stop_accepting();
    wait_idle();
  };
  shim::TaskService task(io, cfg, events);
  // A shim started again on its bundle (the one before was SIGKILLed) serves the task it finds.
  if (auto r = task.restore()) shim::log("task {}: {}", f.id, *r);
  task.register_on(server);
  server.serve(host::Fd(3));
  // SIGTERM/SIGINT: containerd is gone for good or an operator asks; the VM keeps running until
  // `shim delete` (containerd's cleanup) ends it, as with containerd's own shims.
  asio::signal_set sigs(io, SIGTERM, SIGINT);
  sigs.async_wait([&](boost::system::error_code ec, int) {
    if (!ec) cfg.shutdown();
  });
  io.run();
  server.close();
  std::error_code ec;
  fs::remove(shim::socket_path(f.address, f.ns, f.id), ec);
  if (f.debug) shim::log("{} exits ({} events dropped, {} log lines lost)", f.id, events.dropped(), shim::log_lines_lost());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  auto f = parse(argc, argv);
  if (!f) return bail(f.error().message);
  if (f->version) {
    fmt::print("{}", shim::version_text(NESINIT_SHIM_VERSION));
    return 0;
  }
  if (f->info) {  // containerd 2.x: RuntimeInfo on stdout, binary (host/shim/runtime_info.hpp)
    const std::string b = shim::runtime_info(NESINIT_SHIM_VERSION);
    return ::fwrite(b.data(), 1, b.size(), stdout) == b.size() && ::fflush(stdout) == 0 ? 0 : 1;
  }
  if (f->ns.empty()) return bail("shim namespace cannot be empty");
  if (f->action == "start") {
    if (f->id.empty()) return bail("-id is required");
    return do_start(*f, argv);
  }
  if (f->action == "delete") return do_delete(*f);
  if (!f->action.empty()) return bail(fmt::format("unknown action '{}' (start, delete)", f->action));
  if (f->id.empty()) return bail("-id is required");
  return do_serve(*f);
}
