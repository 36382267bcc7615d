// `neshost run`: boot a QEMU microVM with nesinit as PID 1, run one workload in it, show its
// output (the VM console) live and exit with its exit status — `docker run --rm`, behind a VM
// boundary; with -d, in the background (host/monitor/monitor.hpp). This file is the CLI's half:
// flags → plan → detach; the VM is then served by its monitor (monitor::Monitor::run,
// host/monitor/vm_monitor.hpp). Why it works this way: docs/vm.md.
#include <fcntl.h>
#include <signal.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include <fmt/format.h>

#include "host/cli/cli.hpp"
#include "host/cli/image.hpp"
#include "host/cli/plan.hpp"
#include "host/cli/stdio.hpp"
#include "host/cli/terminal.hpp"
#include "host/lib/base.hpp"
#include "host/monitor/monitor.hpp"
#include "host/monitor/reconcile.hpp"
#include "host/monitor/removal.hpp"
#include "host/monitor/say.hpp"
#include "host/monitor/daemons.hpp"
#include "host/monitor/vm_monitor.hpp"
#include "host/lib/state_dir.hpp"
#include "host/cli/snapshot.hpp"
#include "host/vm/accel.hpp"
#include "host/vm/netns.hpp"
#include "host/vm/passt.hpp"
#include "host/vm/block_image.hpp"
#include "host/vm/qemu_argv.hpp"
#include "host/vm/volume.hpp"
#include "protocol/codec.hpp"
#include "protocol/limits.hpp"
#include "protocol/status.hpp"

#ifndef NESHOST_DEFAULT_KERNEL
#define NESHOST_DEFAULT_KERNEL ".cache/kernel/vmlinux"
#endif
#ifndef NESHOST_DEFAULT_INITRD
#define NESHOST_DEFAULT_INITRD "build/host/vm/initrd.cpio"
#endif
#ifndef NESHOST_MKINITRD
#define NESHOST_MKINITRD "scripts/mkinitrd.sh"
#endif
#ifndef NESHOST_DEFAULT_VIRTIOFSD
#define NESHOST_DEFAULT_VIRTIOFSD ".cache/virtiofsd/virtiofsd"
#endif
#ifndef NESHOST_NESINIT
#define NESHOST_NESINIT "build/nesinit/nesinit"
#endif

namespace nes::cli {
namespace {

namespace asio = boost::asio;
namespace fs = std::filesystem;
using namespace std::chrono_literals;

// ---- small helpers ----

fs::path env_or(const char* var, const char* dflt) {
  if (const char* s = std::getenv(var); s && *s) return s;
  return dflt;
}

/// The virtiofsd to run: $NESHOST_VIRTIOFSD, else the one scripts/fetch-virtiofsd.sh provided,
/// else the system's (Debian 13+, Ubuntu: /usr/libexec/virtiofsd).
std::string virtiofsd_program() {
  if (const char* s = std::getenv("NESHOST_VIRTIOFSD"); s && *s) return s;
  std::error_code ec;
  if (fs::exists(NESHOST_DEFAULT_VIRTIOFSD, ec) || !fs::exists("/usr/libexec/virtiofsd", ec))
    return NESHOST_DEFAULT_VIRTIOFSD;
  return "/usr/libexec/virtiofsd";
}


std::string random_vm_id() {
  unsigned char b[4] = {};
  if (::getrandom(b, sizeof b, 0) != sizeof b) {
    auto t = static_cast<std::uint32_t>(::getpid());
    std::memcpy(b, &t, sizeof b);
  }
  return fmt::format("vm-{:02x}{:02x}{:02x}{:02x}", b[0], b[1], b[2], b[3]);
}


using monitor::say;

// ---- the plan's inputs ----

/// --rootfs --rootfs-mode block: its image file probed (vm::probe_block_fs), so a missing,
/// unreadable or unknown one is refused (125) before anything starts; the result in `in`.
void probe_rootfs_file(const RunFlags& o, PlanInputs& in) {
  std::error_code ec;
  if (auto f = vm::probe_block_fs(*o.rootfs); !f) in.rootfs_block_error = f.error().message;
  else if (auto c = fs::canonical(*o.rootfs, ec); ec) in.rootfs_block_error = o.rootfs->string() + ": " + ec.message();
  else in.rootfs_fs = *f, in.rootfs_file = c;
}

/// What check_run() reads, and the VM id and state dir -d needs before the plan exists.
PlanInputs flag_inputs(const RunFlags& o) {
  PlanInputs in;
  in.euid = ::geteuid();
  if (o.rootfs) {
    std::error_code ec;
    if (o.rootfs_block) probe_rootfs_file(o, in);
    else if (fs::is_directory(*o.rootfs, ec)) in.rootfs_dir = fs::canonical(*o.rootfs, ec);
  }
  if (!o.vm) in.vm_id = random_vm_id();
  if (!o.state) in.state_dir = default_state_dir();
  return in;
}

/// The rest of the inputs, in the process that runs the VM (after -d's fork: its own stdio): the
/// defaults' paths, the private dirs (`rt`, `staging`), our terminal, the accelerator's probe.
/// --snapshot: the snapshot opened and checked (`snapshot_files`: its files, for QEMU).
/// Error: a missing kernel, or a dir that cannot be made (said by the caller, exit 125).
host::Status gather_inputs(const RunFlags& o, PlanInputs& in, RuntimeDir& rt, std::optional<RuntimeDir>& staging,
                           std::optional<vm::OpenSnapshot>& snapshot_files) {
  in.default_kernel = env_or("NESHOST_KERNEL", NESHOST_DEFAULT_KERNEL);
  in.default_initrd = env_or("NESHOST_INITRD", NESHOST_DEFAULT_INITRD);
  in.nesinit = env_or("NESHOST_NESINIT", NESHOST_NESINIT);
  in.mkinitrd = env_or("NESHOST_MKINITRD", NESHOST_MKINITRD);
  in.virtiofsd = virtiofsd_program();
  const fs::path kernel = run_kernel(o, in);
  std::error_code ec;
  if (!o.sandbox && !fs::is_regular_file(kernel, ec))
    return host::Error{fmt::format("kernel '{}' not found (scripts/fetch-kernel.sh fetches one, or pass --kernel)",
                                   kernel.string())};
  if (rt.path.empty()) return host::Error{fmt::format("mkdtemp $TMPDIR/neshost-XXXXXX: {}", std::strerror(errno))};
  in.runtime_dir = rt.path;
  // Not in `rt`, which goes at `ready`: the daemon serves the staging directory until the end.
  if (std::any_of(o.volumes.begin(), o.volumes.end(), [](const vm::Volume& v) { return v.file; })) {
    staging.emplace();
    if (staging->path.empty())
      return host::Error{fmt::format("mkdtemp $TMPDIR/neshost-XXXXXX: {}", std::strerror(errno))};
    in.staging_dir = staging->path;
  }
  in.terminal = terminal_size(0);
  if (!in.terminal) in.terminal = terminal_size(1);
  in.stdin_is_tty = ::isatty(0);
  env_inputs(in);
  if (o.snapshot) {
    // --snapshot: it must exist, be whole, and match what this run would boot (the init build,
    // the kernel, the accelerator, --mem, --cpus); the accelerator is the snapshot's (no probe).
    in.snapshot_dir = o.snapshot->find('/') != std::string::npos
                          ? fs::path(*o.snapshot)
                          : snapshot_path(o.state ? *o.state : in.state_dir, *o.snapshot);
    auto opened = vm::open_snapshot(in.snapshot_dir);
    if (!opened) return snapshot_refusal(snapshot_ref(o), opened.error());
    const vm::SnapshotMeta* m = &opened->meta;
    if (o.accel == vm::Accel::auto_probe) in.accel = *vm::accel_from_string(m->accel);
    else in.accel = o.accel;
    vm::RestoreTarget t;
    t.kernel = in.default_kernel;
    t.initrd = in.default_initrd;
    t.accel = std::string(vm::to_string(in.accel));
    if (o.mem_given) t.mem_mib = o.mem;
    if (o.cpus_given) t.cpus = o.cpus;
    if (auto c = vm::check_snapshot(*m, t); !c) return snapshot_refusal(snapshot_ref(o), c.error());
    in.snapshot = opened->meta;
    snapshot_files = std::move(*opened);
    return host::Ok{};
  }
  // The accelerator, decided before anything else runs (the probe boot is bounded).
  std::string why;
  in.accel = o.sandbox ? vm::Accel::tcg : vm::resolve_accel(o.accel, [&] {
    return vm::probe_kvm_boot_cached("qemu-system-x86_64", kernel, vm::default_probe_cache(), ::time(nullptr));
  }, &why);
  if (o.console) say("neshost: accel {} ({})\n", vm::to_string(in.accel), why);
  return host::Ok{};
}

// ---- the network, before anything starts ----

/// Every published host address:port is free now: a socket of its protocol is bound there (no
/// SO_REUSEADDR) and closed at once. Error (exit 125): "--publish 127.0.0.1:8080:80: host port
/// 8080/tcp is already in use" (or the errno's text: EACCES below 1024 without privileges,
/// EADDRNOTAVAIL for an address this host does not have).
host::Status check_ports_free(const host::NetworkSpec& net) {
  // IPv4 only: host::check_network() (run by check_run()) refuses an IPv6 host address.
  for (const auto& p : net.publish) {
    const bool tcp = p.proto == host::IpProto::tcp;
    const std::string what = fmt::format("--publish {}: host port {}/{}", host::publish_text(p), p.host_port, tcp ? "tcp" : "udp");
    host::Fd sock(::socket(AF_INET, (tcp ? SOCK_STREAM : SOCK_DGRAM) | SOCK_CLOEXEC, 0));
    if (!sock) return host::Error{fmt::format("{}: socket: {}", what, std::strerror(errno))};
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(p.host_port);
    std::memcpy(&a.sin_addr, p.host_ip.bytes.data(), 4);
    if (::bind(sock.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0)
      return host::Error{errno == EADDRINUSE ? what + " is already in use"
                                             : fmt::format("{} cannot be bound: {}", what, std::strerror(errno))};
  }
  return host::Ok{};
}

/// --network netns:PATH: the namespace's interface is read and the tap QEMU attaches to is made
/// (host/vm/netns.hpp), filling o.network.link before the plan (the descriptor's interface, QEMU's
/// -netdev) is built; `netns` owns what was made until the VM has ended. The one call point netns
/// mode plugs into (before -d's fork: its errors are the creator's, 125, with nothing started).
/// Other modes: nothing to do.
host::Status attach_netns(RunFlags& o, const std::string& vm_id, std::optional<vm::NetnsAttachment>& netns) {
  if (o.network.mode != host::NetworkMode::netns) return host::Ok{};
  auto a = vm::NetnsAttachment::attach(o.network.netns, vm::netns_tap_name(vm_id), {},
                                       [](std::string_view line) { say("neshost run: {}\n", line); });
  if (!a) return a.error();
  o.network.link = a->link();
  netns.emplace(std::move(*a));
  return host::Ok{};
}

/// What must hold before anything starts (bad network input: exit 125, no VM, nothing left):
/// netns mode's interface, passt installed (passt mode), every published host port free.
host::Status network_preflight(RunFlags& o, const std::string& vm_id, std::optional<vm::NetnsAttachment>& netns) {
  if (auto s = attach_netns(o, vm_id, netns); !s) return s;
  if (!o.sandbox && o.network.mode == host::NetworkMode::passt)
    if (auto c = vm::check_passt(monitor::passt_program()); !c) return c;
  return check_ports_free(o.network);
}

}  // namespace

host::Result<vm::QemuSpec> snapshot_machine(const RunFlags& flags, const fs::path& runtime_dir) {
  RunFlags o = flags;
  o.argv = {"/bin/true"};
  o.network = host::NetworkSpec{};
  o.network.mode = host::NetworkMode::none;  // the NIC is plugged in after each restore
  o.volumes.clear();
  PlanInputs in = flag_inputs(o);
  in.default_kernel = env_or("NESHOST_KERNEL", NESHOST_DEFAULT_KERNEL);
  in.default_initrd = env_or("NESHOST_INITRD", NESHOST_DEFAULT_INITRD);
  in.nesinit = env_or("NESHOST_NESINIT", NESHOST_NESINIT);
  in.runtime_dir = runtime_dir;
  env_inputs(in);
  in.snapshot_machine = true;  // the layout and the modules a restore needs
  const fs::path kernel = run_kernel(o, in);
  std::error_code ec;
  if (!fs::is_regular_file(kernel, ec)) return host::Error{fmt::format("kernel '{}' not found", kernel.string())};
  const fs::path initrd = o.initrd ? *o.initrd : in.default_initrd;
  if (!fs::is_regular_file(initrd, ec)) return host::Error{fmt::format("initramfs '{}' not found", initrd.string())};
  in.accel = vm::resolve_accel(o.accel, [&] {
    return vm::probe_kvm_boot_cached("qemu-system-x86_64", kernel, vm::default_probe_cache(), ::time(nullptr));
  });
  auto plan = plan_run(o, in);
  if (!plan) return plan.error();
  return std::move(*plan->qemu);
}

namespace {

// ---- run ----

/// An image run's VM dir (apply_run_image made it) removed on the way out unless its VM started
/// (a monitor.json): a refusal before that leaves no image.json blocking `rmi`, no layer.
struct ImageRunLeftovers {
  fs::path dir;
  ~ImageRunLeftovers() {
    std::error_code ec;
    if (!dir.empty() && !fs::exists(dir / host::kMonitorFile, ec) && !ec)
      (void)host::remove_vm(dir.parent_path(), dir.filename().string());
  }
};

/// `neshost run`: parse the flags, gather what the plan needs from this host, plan, carry it out.
int run_main(const Args& args) {
  // Every refusal before anything starts (a bad flag or value, flags that exclude each other, what
  // they ask of this host, the network's own checks) exits kExitUsage (125), naming the flag.
  auto refuse = [](const host::Error& e) { return usage_error("run", e.message); };
  auto parsed = parse_run(args);
  if (!parsed) return refuse(parsed.error());
  RunFlags o = std::move(*parsed);
  // --help is help whatever else is given (docker's: `docker run --help -i --rm` prints help).
  if (o.help) {
    fmt::print("{}", run_help());
    return 0;
  }
  PlanInputs in = flag_inputs(o);
  // IMAGE [COMMAND...]: resolved, unpacked and rewritten as a --rootfs run (host/cli/image.hpp)
  auto image = apply_run_image(o, o.state ? *o.state : in.state_dir, o.vm ? *o.vm : in.vm_id, in.rootfs_dir);
  if (!image) {
    fmt::print(stderr, "neshost run: {}\n", image.error().message);
    return proto::kStatusHostFailure;
  }
  if (*image && o.rootfs_block) probe_rootfs_file(o, in);  // the image's block root (apply_run_image)
  if (o.entrypoint && !*image)
    return refuse(host::Error{"--entrypoint: only with an IMAGE (neshost run [OPTIONS] IMAGE [COMMAND...])"});
  // An image run refused before its VM started (no monitor.json) leaves nothing (image.json, its layer).
  ImageRunLeftovers image_leftovers{*image ? (o.state ? *o.state : in.state_dir) / (o.vm ? *o.vm : in.vm_id) : fs::path()};
  if (auto c = check_run(o, in); !c) return refuse(c.error());
  if (auto c = check_run_host(o, real_host_probes()); !c) return refuse(c.error());
  // Before anything starts (and before -d's fork, so the creator says it): the network's own
  // checks, each refused with nothing left behind.
  // netns mode's tap and redirects live until the VM has ended (torn down when this returns).
  std::optional<vm::NetnsAttachment> netns;
  if (auto n = network_preflight(o, o.vm ? *o.vm : in.vm_id, netns); !n) return refuse(n.error());
  // No write of ours to a pipe or terminal may block (a stdout nobody reads must never keep us
  // past a deadline): our own non-blocking descriptions of stdout and stderr (and stdin for -i).
  make_own_nonblocking(1);
  make_own_nonblocking(2);
  if (o.interactive) make_own_nonblocking(0);
  auto fail = [](std::string_view msg) {
    say("neshost run: {}\n", msg);
    return proto::kStatusHostFailure;
  };
  // -d: this process is the creator and returns here; its child is the monitor and runs the VM
  // below, the same way a foreground run does (host/monitor/monitor.hpp).
  host::Fd started_notify;
  if (o.detach) {
    // The monitor bounds each of its own steps; this only guards against a monitor that hangs.
    auto d = detach(o.state ? *o.state : in.state_dir, o.vm ? *o.vm : in.vm_id, o.ready_timeout + 300s);
    if (!d) return fail(d.error().message);
    if (d->creator) {
      if (netns) netns->release();  // the monitor owns the tap now and tears it down
      // A monitor that failed before it recorded anything (no monitor.json: e.g. passt could not
      // start) leaves only its log, whose tail the creator has just printed: nothing for ps to
      // show, so nothing is left.
      const fs::path dir = (o.state ? *o.state : in.state_dir) / (o.vm ? *o.vm : in.vm_id);
      std::error_code ec;
      if (d->exit_status != 0 && !fs::exists(dir / host::kMonitorFile, ec) && !ec)
        (void)host::remove_vm(dir.parent_path(), dir.filename().string());
      return d->exit_status;
    }
    started_notify = std::move(d->notify);
  }
  // A closed stdout must not kill us mid-shutdown (QEMU would die with us, the record unwritten).
  ::signal(SIGPIPE, SIG_IGN);

  RuntimeDir rt;
  std::optional<RuntimeDir> staging;  // file volumes' staging share, kept until the end
  std::optional<vm::OpenSnapshot> snapshot_files;
  if (auto s = gather_inputs(o, in, rt, staging, snapshot_files); !s) return fail(s.error().message);
  auto plan = plan_run(o, in);
  if (!plan) return fail(plan.error().message);
  if (plan->snapshot) {
    // Every restore of one snapshot starts with the same guest CRNG and the saved moment's clock:
    // the descriptor reseeds the one from our getrandom(2) and sets the other (docs/vm.md "Snapshots").
    proto::Entropy e{};
    if (::getrandom(e.data(), e.size(), 0) != static_cast<ssize_t>(e.size()))
      return fail(fmt::format("getrandom: {}", std::strerror(errno)));
    plan->serve.session.descriptor.entropy = e;
    plan->serve.session.descriptor.realtime_ns = 1;  // stamped when `boot` is sent
  }
  plan->monitor_log = o.detach;  // the -d monitor's stderr is monitor.log
  return monitor::Monitor::run(*plan, rt, {netns ? netns->netns_fd() : -1, std::move(snapshot_files),
                                           std::move(started_notify), o.detach});
}

const Registrar run_reg{{"run", "boot a QEMU microVM, run ARGV in it, exit with its status", run_main}};

}  // namespace
}  // namespace nes::cli
