// `neshost run`: boot a QEMU microVM with nesinit as PID 1, run one workload in it, show its
// output (the VM console) live and exit with its exit status — `docker run --rm`, behind a VM
// boundary; with -d, in the background (host/monitor/monitor.hpp). Built on serve_vm()
// (host/cli/cli.hpp) and the launcher in host/vm/. Why it works this way: docs/vm.md.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/random.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <sys/stat.h>
#include <sys/file.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/signal_set.hpp>
#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include <fmt/format.h>

#include "host/cli/cli.hpp"
#include "host/cli/image.hpp"
#include "host/cli/exec.hpp"
#include "host/cli/plan.hpp"
#include "host/cli/stdio.hpp"
#include "host/cli/terminal.hpp"
#include "host/lib/base.hpp"
#include "host/monitor/daemon_watch.hpp"
#include "host/monitor/duties.hpp"
#include "host/monitor/monitor.hpp"
#include "host/monitor/reconcile.hpp"
#include "host/monitor/removal.hpp"
#include "host/monitor/vmm_record.hpp"
#include "host/cli/vm_pause.hpp"
#include "host/lib/record.hpp"
#include "host/lib/state_dir.hpp"
#include "host/cli/snapshot.hpp"
#include "host/vm/accel.hpp"
#include "host/vm/console.hpp"
#include "host/vm/netns.hpp"
#include "host/vm/passt.hpp"
#include "host/vm/process.hpp"
#include "host/vm/qemu_argv.hpp"
#include "host/vm/virtiofsd.hpp"
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

constexpr std::string_view kRunHelp = R"(usage: neshost run [OPTIONS] [--] ARGV...
       neshost run [OPTIONS] IMAGE [COMMAND [ARG...]]   (an image of the store: docs/images.md)

Boot a QEMU microVM (q35) with nesinit as PID 1, run ARGV in it and exit with its exit status:
the workload's code, 128+N if killed by signal N, 127/126 if it could not start, 124 on
--timeout, 125 for host-side failures (QEMU or the kernel missing, no `ready` in time, ...)
and whenever workload output was lost (one line on stderr names each stream and its bytes;
it overrides the workload's own status, not 124). A slow reader of our stdout only slows the VM down (the
guest holds the workload's output, and its power-off, until we have read it): nothing is lost
unless the VM is ended on purpose while its output is still owed (SIGINT/SIGTERM, neshost stop).
The workload's stdout and stderr are neshost's stdout and stderr, byte-exact (a data channel of
their own, never the serial console), and are also logged to STATE/VM/workload.log (CRI format,
see `neshost logs`). Its stdin is /dev/null unless -i. The outcome record is written to
STATE/VM/outcome.json (see `neshost inspect`); the kernel's and the init's own messages go to
STATE/VM/console.log.

  -i, --interactive    forward neshost's stdin to the workload (and its EOF)
  -t, --tty            give the workload a pseudo-terminal sized like ours (SIGWINCH resizes
                       it); with -i and a terminal on stdin, that terminal is in raw mode until
                       neshost exits (^C then goes to the workload)
  --log-max-size SIZE  rotate workload.log at SIZE bytes (k, m, g suffixes; default 10m, min 64k)
  --log-max-files N    rotated files kept, the live one included (default 5; 1: truncate)

  --kernel PATH        guest kernel (default: $NESHOST_KERNEL, else the one scripts/fetch-kernel.sh
                       fetched)
  --initrd PATH        initramfs with nesinit as /init (default: $NESHOST_INITRD, else the build's)
  --snapshot NAME|DIR  restore the VM from a snapshot (neshost snapshot create NAME; a value with a
                       '/' is a snapshot's directory) instead of booting it: its kernel, initramfs,
                       command line, grace, accelerator, RAM and vCPUs (--mem, --cpus, --accel may
                       be left out; if given they must match). Shares (at most 8; 7 with a NIC)
                       and the NIC are plugged in after the restore. Refused (125) when missing,
                       corrupt, made by another init build, kernel or QEMU, or another --mem,
                       --cpus, --accel; --kernel, --initrd, --console, --grace, --sandbox and
                       --rootfs-mode initramfs cannot be used with it, nor more shares (2)
  --rootfs DIR         DIR is the guest's root: the workload sees it as / (with /proc, /sys, /dev,
                       /run and a private /tmp), served over virtiofs, writes go to DIR
  --rootfs-mode MODE   virtiofs (default) or initramfs: copy DIR into an initramfs instead
                       (with nesinit and the kernel's modules; scripts/mkinitrd.sh), RAM-backed
  -v, --volume HOST:GUEST[:ro]
                       share host directory HOST at GUEST over virtiofs (repeatable); :ro makes
                       it read-only on both sides (EROFS in the guest). A regular file HOST is
                       bound at GUEST (as docker's file binds, e.g. /etc/hosts; needs root)
  --mem MiB            guest RAM (default 256)
  --cpus N             vCPUs (default 1)
  --accel tcg|kvm|auto auto (default): KVM only if a short probe boot under KVM works, else TCG
  -e, --env K=V|K      workload environment (repeatable; K alone: its value here, if set;
                       PATH defaults to the usual one)
  -w, --workdir DIR    workload working directory (default /)
  -u, --user UID[:GID] workload uid and gid, numeric (default 0:0; GID alone defaults to UID);
                       with an IMAGE also names, USER[:GROUP] in its /etc/passwd, /etc/group
  --group-add GID      a supplementary group of the workload (repeatable; default none)
  --read-only          --rootfs DIR is read-only for the guest (EROFS), as docker's --read-only
  --entrypoint CMD     IMAGE only: replaces the image's Entrypoint (and drops its Cmd), as docker's
  -h, --hostname NAME  guest hostname (default: the VM id, as docker run; --help for this text)
  --on-exit POLICY     stop (default): power off, wait for QEMU; remove: also delete the VM's
                       scratch files (console log); keep: leave the VM up after the workload
                       exits until `neshost stop --state DIR VM` (or SIGTERM)
  --state DIR          state directory (default: $NESHOST_STATE, else /var/lib/neshost as root,
                       else ~/.local/state/neshost)
  --vm ID              VM id, [A-Za-z0-9._-] (default: vm-<random>)
  --timeout S          workload wall limit in seconds: `stop`, grace, shutdown; exit 124
  --ready-timeout S    seconds from QEMU's start to the guest's `ready` (default 30)
  --grace S            seconds between the workload's SIGTERM and SIGKILL in an ordered shutdown
                       (default 10; the init's grace_ms); QEMU is killed if the guest has not
                       powered off S+5 seconds after `shutdown`
  --console            show every kernel and init message (the console), and neshost's events, on
                       stderr
  -d, --detach         run in the background: print the VM id once the workload started and
                       exit 0; a monitor process (its own session) serves the VM from then on
                       and logs to STATE/VM/monitor.log (see ps, inspect, wait, stop, kill, rm)
  --sandbox            no VM: run the init as PID 1 of a fresh pid + mount namespace on this
                       host (unshare; needs root), the workload in the host's filesystem. For
                       development and tests of everything around the VM; no isolation
  --name NAME          assign a name to the VM: its id (the same as --vm)
  --rm                 automatically remove the VM's state (records, logs) when it exits
                       (with -d: once its outcome is recorded)
  --vmm-outlives       the VMM outlives this process (as with -d: recorded in STATE/VM/vmm.json,
                       its channels redial) and a neshost command adopts it if this process dies
                       (for a supervisor running `run` in the foreground: the containerd shim)
  --stdin-hold         with -i and a FIFO on stdin: hold the FIFO open for writing until the
                       control request close-stdin (the shim's CloseIO), so its writers going
                       (a client detached, a supervisor SIGKILLed) is not the workload's EOF

Network (bad values exit 125, nothing started):
  --network MODE       connect the VM to a network: user (default; also passt, pasta: passt's
                       user-mode network: outbound NAT, the host's loopback closed), slirp
                       (also slirp4netns: QEMU's user-mode network; the guest *can* reach the
                       host's loopback at 10.0.2.2), none (loopback only), netns:PATH (take
                       over that network namespace's interface). Default: $NESHOST_NETWORK if
                       set, else user (none with --sandbox)
  -p, --publish [IP:]HOST:GUEST[/tcp|/udp]
                       publish a guest port to the host (repeatable; user and slirp modes; IP
                       defaults to 0.0.0.0, as docker's). The host port must be free
  --dns IP             set a custom DNS server (repeatable, at most 3; user modes default to
                       10.0.2.3, which forwards to the host's resolver)
  --dns-search DOMAIN  set a custom DNS search domain (repeatable)
  --dns-option OPT     set a DNS option (repeatable; resolv.conf's `options`)
  --add-host NAME:IP   add a custom host-to-IP mapping to /etc/hosts (repeatable);
                       NAME:host-gateway maps NAME to the host, and opens the host's loopback
                       to this VM at that address (user and slirp modes)
  See `neshost port VM` for a VM's published ports.
SIGINT/SIGTERM: ordered shutdown of the guest; QEMU is killed after a deadline (a second signal:
at once). Once the workload has ended, a signal ends the wait for the output still owed (what
it cuts is counted and reported, exit 125); the last writes to our stdout/stderr wait for
their readers however slow, until a signal (then the bytes left are counted, exit 125) or, after
--timeout, for --grace at most (counted too; the exit stays 124).
Environment: NESHOST_APPEND (extra kernel command-line words, appended last, e.g. nesinit.log=debug);
NESHOST_TCG_BOOT_WORDS=0 (a 1-vCPU TCG guest boots without `nolapic_timer noreplace-smp`, which
spare it ~0.18 s: docs/vm.md "Boot time"; any other value keeps them); NESHOST_TCG_TB_MIB (TCG's
translation buffer in MiB, default 16, 0: QEMU's 1 GiB; not digits or over 5 of them: ignored).
)";

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

/// The passt to run (`--network user`): $NESHOST_PASST, else the one scripts/fetch-passt.sh
/// provided when there is one (a source build), else `passt` in PATH.
std::string passt_program() {
  if (const char* s = std::getenv("NESHOST_PASST"); s && *s) return s;
  std::error_code ec;
  if (std::string_view(NESHOST_DEFAULT_PASST) != "passt" && fs::exists(NESHOST_DEFAULT_PASST, ec))
    return NESHOST_DEFAULT_PASST;
  return "passt";
}

std::string random_vm_id() {
  unsigned char b[4] = {};
  if (::getrandom(b, sizeof b, 0) != sizeof b) {
    auto t = static_cast<std::uint32_t>(::getpid());
    std::memcpy(b, &t, sizeof b);
  }
  return fmt::format("vm-{:02x}{:02x}{:02x}{:02x}", b[0], b[1], b[2], b[3]);
}


/// One line on stderr, never blocking for long (stderr is our own non-blocking description,
/// make_own_nonblocking): a stderr nobody reads loses the line, it never holds up neshost.
template <class... A>
void say(fmt::format_string<A...> f, A&&... a) {
  put_bounded(2, fmt::format(f, std::forward<A>(a)...), 200ms);
}

/// The VM console: the kernel's and the init's own messages (the workload's output has a channel
/// of its own), kept (bounded) in STATE/VM/console.log and with --console shown on stderr. The
/// serial line's CRLF becomes LF (the tty's ONLCR). Called on the launcher's drain thread only;
/// no write here can block it for long (a full stderr pipe drops console lines).
class ConsoleOut {
 public:
  bool show = false;
  static constexpr std::size_t kLogCap = 4u << 20;  // bytes of console.log
  /// Log to `f` (console.log, opened by host::open_vm_file); an empty Fd: no log.
  void open_log(host::Fd f) { log_ = std::move(f); }
  void write(std::string_view b) { emit(crlf_.feed(b)); }
  /// At the end of the console stream (QEMU has exited and its output is drained).
  void finish() { emit(crlf_.finish()); }

 private:
  void emit(const std::string& out) {
    if (out.empty()) return;
    if (show) put_bounded(2, out, 100ms);
    if (log_ && logged_ < kLogCap) {
      std::string_view part(out.data(), std::min(out.size(), kLogCap - logged_));
      bool ok = true;
      put(log_.get(), part, ok);
      logged_ += part.size();
    }
  }
  static void put(int fd, std::string_view s, bool& ok) {
    while (ok && !s.empty()) {
      ssize_t n = ::write(fd, s.data(), s.size());
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        ok = false;  // EPIPE (SIGPIPE is ignored) etc.: stop writing there, keep draining
        return;
      }
      s.remove_prefix(static_cast<std::size_t>(n));
    }
  }
  vm::CrlfToLf crlf_;
  host::Fd log_;
  std::size_t logged_ = 0;
};

/// Runs scripts/mkinitrd.sh for --rootfs DIR --rootfs-mode initramfs: `rootfs` into plan.initrd,
/// with plan.nesinit as /init and the modules matching plan.kernel; its output goes to stderr.
/// Bounded (120 s).
host::Status build_initrd(const RunPlan& plan, const fs::path& rootfs) {
  const fs::path& kernel = plan.kernel;
  std::vector<std::string> argv{plan.mkinitrd.string(), "--rootfs", rootfs.string(), "--init",
                                plan.nesinit.string(), "-o", plan.initrd.string()};
  // Modules must match the kernel: Debian layout <root>/boot/vmlinuz-REL and <root>/lib/modules/REL
  // (or boot/vmlinux-REL, the decompressed kernel scripts/fetch-kernel.sh writes beside it).
  std::error_code ec;
  fs::path k = fs::canonical(kernel, ec);
  if (!ec) {
    std::string name = k.filename().string();
    if (name.starts_with("vmlinuz-") || name.starts_with("vmlinux-")) {
      fs::path mods = k.parent_path().parent_path() / "lib/modules" / name.substr(8);
      if (fs::is_directory(mods, ec)) argv.insert(argv.end(), {"--modules-dir", mods.string()});
    }
  }
  auto err = [](std::string_view b) { put_bounded(2, b, 1s); };
  vm::LaunchOptions lo;
  lo.argv = argv;
  lo.console = err;
  lo.diagnostics = err;
  auto p = vm::VmProcess::launch(std::move(lo));
  if (!p) return host::Error{"--rootfs: " + p.error().message};
  auto e = (*p)->wait_for(120s);
  if (!e) e = (*p)->terminate(1s);
  (*p)->finish_output(2s);
  if (e->code != 0) return host::Error{fmt::format("--rootfs: {} {}", argv[0], vm::describe(*e))};
  return host::Ok{};
}

// ---- the plan's inputs ----

/// What check_run() reads, and the VM id and state dir -d needs before the plan exists.
PlanInputs flag_inputs(const RunFlags& o) {
  PlanInputs in;
  in.euid = ::geteuid();
  if (o.rootfs) {
    std::error_code ec;
    if (fs::is_directory(*o.rootfs, ec)) in.rootfs_dir = fs::canonical(*o.rootfs, ec);
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
    if (auto c = vm::check_passt(passt_program()); !c) return c;
  return check_ports_free(o.network);
}

// ---- carrying the plan out ----

/// The boot's files: the initramfs built from --rootfs (or checked to exist), and the empty files
/// file volumes are bound onto in the staging share.
host::Status prepare_boot_files(const RunPlan& plan) {
  std::error_code ec;
  if (plan.initrd_from) {
    if (auto s = build_initrd(plan, *plan.initrd_from); !s) return s;
  } else if (!plan.sandbox && !fs::is_regular_file(plan.initrd, ec)) {
    return host::Error{fmt::format(
        "initramfs '{}' not found (scripts/mkinitrd.sh builds one, or pass --initrd/--rootfs)", plan.initrd.string())};
  }
  for (const auto& d : plan.daemons)
    for (const auto& b : d.binds) {
      host::Fd f{::open(b.target.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600)};
      if (!f) return host::Error{fmt::format("--volume {}: staging {}: {}", b.source.string(), b.target.string(),
                                             std::strerror(errno))};
    }
  return host::Ok{};
}

/// What the run keeps in STATE/VM/ and the processes beside QEMU, for serve_run().
struct Running {
  /// A VMM that outlives us (RunPlan::vmm_survives): vmm.json as written so far; each spawn's
  /// gate (vm::LaunchOptions::before_exec) adds the new process and writes it durably.
  std::optional<host::VmmInfo> vmm_info;
  /// A replacement monitor (`neshost monitor`): the VMM it took over, and the daemons recorded
  /// beside it (reaped by identity at the end).
  std::unique_ptr<vm::VmProcess> adopted;
  std::vector<host::VmmDaemon> adopted_daemons;
  std::shared_ptr<ConsoleOut> console;
  fs::path console_log;
  std::vector<std::unique_ptr<vm::Virtiofsd>> daemons;
  std::unique_ptr<vm::Passt> passt;  // --network passt
  /// --snapshot: the RAM QEMU maps (the snapshot's file, or with shares a private copy of it:
  /// vm::copy_ram) and the device state it loads, both as checked (vm::open_snapshot).
  host::Fd snapshot_ram, snapshot_state;
  fs::path passt_log;
  int netns_fd = -1;  // --network netns: the namespace QEMU runs in (owned by run_main's attachment)
  /// -i with a FIFO stdin and a VMM that outlives us: the bytes taken from it, in stdin.spool.
  std::optional<host::StdinSpool> stdin_spool;
  /// A replacement monitor of a workload with stdin attached: it reopens `stdin_source` (when
  /// the original recorded one) once the guest said its stdin position, else ends stdin (EOF).
  bool adopt_stdin = false;
  std::optional<host::VmmStdin> stdin_source;
};

/// `fd` as a stdin source another process can open again (host::VmmStdin): a FIFO or a regular
/// file whose /proc/self/fd link names a path that is still the same inode; nullopt for a
/// terminal, an anonymous pipe ("pipe:[N]"), a socket, /dev/null, a deleted or renamed file.
std::optional<host::VmmStdin> stdin_source_of(int fd) {
  struct stat st{};
  if (::fstat(fd, &st) != 0 || !(S_ISFIFO(st.st_mode) || S_ISREG(st.st_mode))) return std::nullopt;
  char link[4096];
  const ssize_t n = ::readlink(fmt::format("/proc/self/fd/{}", fd).c_str(), link, sizeof link - 1);
  if (n <= 0 || link[0] != '/') return std::nullopt;
  const std::string path(link, static_cast<std::size_t>(n));
  struct stat ps{};
  if (::stat(path.c_str(), &ps) != 0 || ps.st_dev != st.st_dev || ps.st_ino != st.st_ino) return std::nullopt;
  host::VmmStdin src;
  src.path = path;
  if (S_ISREG(st.st_mode)) {
    src.kind = host::VmmStdin::Kind::file;
    const off_t off = ::lseek(fd, 0, SEEK_CUR);
    src.offset = off > 0 ? static_cast<std::uint64_t>(off) : 0;
  }
  return src;
}

/// The spawner's gate for a process that outlives us: its identity added to vmm.json (as the
/// daemon `name`, or as the VMM when `name` is empty) and written durably before it may exec.
std::function<host::Status(pid_t)> record_gate(const RunPlan& plan, Running& run, std::string name) {
  if (!run.vmm_info) return {};
  return [&plan, &run, name = std::move(name)](pid_t pid) -> host::Status {
    auto id = host::identity_of(pid);
    if (!id) return host::Error{fmt::format("/proc/{}/stat: cannot read the new process's identity", pid)};
    host::VmmInfo v = *run.vmm_info;
    if (name.empty()) v.vmm = *id;
    else v.daemons.push_back({name, *id});
    if (auto s = host::write_vmm(plan.state_dir, v); !s) return s;
    run.vmm_info = std::move(v);
    return host::Ok{};
  };
}

/// STATE/VM/: the record (the library), monitor.json (this run's identity, for `neshost stop`),
/// the console log, passt's log.
/// Begins this run's generation (into plan.serve.session.generation).
host::Status open_vm_state(RunPlan& plan, Running& run) {
  ServeConfig& cfg = plan.serve;
  const std::string& vmid = plan.vm;
  // 0700 like serve's (records and console logs are private), and never through a symlink.
  if (auto d = host::open_vm_dir(cfg.state_dir, vmid, true); !d)
    return host::Error{fmt::format("--state: {}", d.error().message)};
  // This process is the VM's monitor for a new generation (host/monitor/reconcile.hpp): reusing a VM id
  // starts a newer one, which nothing of an older one can change. monitor.json names this process
  // for good (pid, start time, boot id): what `neshost stop` and `kill` find it by.
  const host::ProcessIdentity self = host::self_identity().value_or(host::ProcessIdentity{::getpid(), 0, {}});
  {
    host::MonitorInfo mi;
    mi.vm = vmid;
    mi.monitor = self;
    mi.created_at = host::wall_now();
    mi.command = plan.command;
    mi.ports = plan.ports;
    auto gen = host::begin_generation(cfg.state_dir, mi);
    if (!gen) return gen.error();
    cfg.session.generation = *gen;
  }
  auto console = std::make_shared<ConsoleOut>();
  const fs::path console_log = host::vm_path(cfg.state_dir, vmid, host::kConsoleLog);
  if (auto f = host::open_vm_file(cfg.state_dir, vmid, host::kConsoleLog, O_WRONLY | O_CREAT | O_TRUNC))
    console->open_log(std::move(*f));
  console->show = plan.console;
  run.console = std::move(console);
  run.console_log = console_log;
  if (plan.vmm_survives) {
    // vmm.json (and boot.json, the descriptor) before anything that outlives us starts.
    host::VmmInfo v;
    v.vm = vmid;
    v.generation = cfg.session.generation;
    v.runtime_dir = plan.runtime_dir;
    v.channel_socket = plan.channel_socket;
    v.data_socket = plan.data_socket;
    v.sandbox = plan.sandbox;
    v.on_exit = cfg.session.on_exit;
    v.stop_timeout = cfg.session.stop_timeout;
    v.grace = cfg.session.grace;
    v.reconnect = cfg.session.reconnect;
    v.log_max_size = plan.workload_log.max_size;
    v.log_max_files = plan.workload_log.max_files;
    v.rm = plan.rm;
    if (plan.interactive) {
      // -i: a replacement monitor goes on feeding the workload's stdin from where it comes.
      v.stdin_source = stdin_source_of(0);
      if (v.stdin_source && v.stdin_source->kind == host::VmmStdin::Kind::fifo) {
        auto sp = host::StdinSpool::open(cfg.state_dir, vmid, true);
        if (!sp) {
          // Unbounded or unwritable: no replacement feeds it; it ends with this monitor, said.
          say("neshost run: {} (a replacement monitor gives the workload's stdin its EOF)\n", sp.error().message);
          v.stdin_source.reset();
        } else {
          run.stdin_spool = std::move(*sp);
        }
      }
    }
    // netns mode: the tap and redirects, so that whoever ends the VM tears them down.
    if (plan.network.mode == host::NetworkMode::netns && plan.network.link)
      v.netns = host::VmmNetns{plan.network.netns, plan.network.link->tap, plan.network.link->name};
    // passt started before the state dir existed; it exits by itself while QEMU never held its
    // socket's other end (ours closes with us), so it is recorded only now.
    if (run.passt)
      if (auto id = host::identity_of(run.passt->pid())) v.daemons.push_back({"passt", *id});
    if (auto s = host::write_boot(cfg.state_dir, vmid, cfg.session.descriptor); !s) return s;
    if (auto s = host::write_vmm(cfg.state_dir, v); !s) return s;
    run.vmm_info = std::move(v);
  }
  if (run.passt) {
    run.passt_log = host::vm_path(cfg.state_dir, vmid, host::kPasstLog);
    if (auto f = host::open_vm_file(cfg.state_dir, vmid, host::kPasstLog, O_WRONLY | O_CREAT | O_TRUNC))
      run.passt->log_to(std::move(*f));
    else  // its output stays in memory (bounded), where an early exit's message is read from
      say("neshost run: {}: {} (passt's output is not kept)\n", run.passt_log.string(), f.error().message);
  }
  return host::Ok{};
}

/// The daemons first: each creates the socket its QEMU device connects to. Their logs sit next to
/// console.log; they die with us (PR_SET_PDEATHSIG) and exit by themselves once QEMU has gone.
host::Status start_daemons(const RunPlan& plan, Running& run) {
  const ServeConfig& cfg = plan.serve;
  const std::string& vmid = plan.vm;
  for (vm::VirtiofsdOptions vo : plan.daemons) {
    const auto& sh = vo.share;
    vo.log = host::vm_path(cfg.state_dir, vmid, host::virtiofsd_log_name(sh.tag));
    vo.outlive = plan.vmm_survives;
    vo.before_exec = record_gate(plan, run, "virtiofsd " + sh.tag);
    auto d = vm::Virtiofsd::start(vo, 10s);
    if (!d) return d.error();
    if (plan.console)
      say("neshost: virtiofsd pid {} serves {} as {}{}\n", (*d)->pid(), sh.dir.string(), sh.tag,
          sh.ro ? " (ro)" : "");
    run.daemons.push_back(std::move(*d));
  }
  return host::Ok{};
}

/// --network passt: passt, first of all (before the state dir: one that cannot start, e.g. a port
/// taken since we checked it, leaves nothing behind) and so before QEMU, which gets its socket's
/// other end. Its output is kept until open_vm_state() gives it its log next to console.log; it
/// dies with us and exits by itself once QEMU has gone.
host::Status start_passt(const RunPlan& plan, Running& run) {
  if (!plan.passt) return host::Ok{};
  vm::PasstOptions po;
  po.program = passt_program();
  po.network = plan.network;
  // As root, passt drops to `nobody`, which must reach its PID file's directory: /tmp (a private
  // $TMPDIR such as the tests' is not searchable by others). Otherwise it runs as us.
  const char* t = std::getenv("TMPDIR");
  po.tmp_dir = ::geteuid() != 0 && t && *t == '/' ? t : "/tmp";
  po.outlive = plan.vmm_survives;
  auto p = vm::Passt::start(po, 10s);
  if (!p) return host::Error{"--network passt: " + p.error().message};
  if (plan.console) say("neshost: passt pid {} serves the VM's network\n", (*p)->pid());
  run.passt = std::move(*p);
  return host::Ok{};
}

/// The command to start: QEMU's (its spec checked here) or --sandbox's; said with --console.
host::Result<std::vector<std::string>> launch_argv(const RunPlan& plan) {
  host::Result<std::vector<std::string>> argv = plan.qemu ? vm::qemu_argv(*plan.qemu) : plan.sandbox_argv;
  if (argv && plan.console) {
    std::string line = "neshost:";
    for (const auto& a : *argv) line += " " + a;
    say("{}\n", line);
  }
  return argv;
}

/// `neshost exec` clients still taking their output once the VM is gone: the loop goes on until
/// each has it all and its final reply (a slow client costs time, never bytes), or until a signal
/// (`stop_fd`, a signalfd, readable); what is then left is said on stderr.
void drain_exec_clients(asio::io_context& io, ExecAttachments& execs, int stop_fd) {
  if (execs.idle()) return;
  io.restart();
  bool stop = false;
  asio::posix::stream_descriptor sig(io, ::fcntl(stop_fd, F_DUPFD_CLOEXEC, 3));
  sig.async_wait(asio::posix::stream_descriptor::wait_read, [&](boost::system::error_code ec) { stop = !ec; });
  while (!execs.idle() && !stop && io.run_one()) {
  }
  if (!execs.idle())
    say("neshost run: {} bytes of `neshost exec` output not delivered: interrupted while its readers were still "
        "taking them\n", execs.queued());
}

/// The workload's output our readers have not taken yet: written for as long as they live,
/// however slowly they read, until a signal (`stop_fd` readable) says to give up (counted and said,
/// exit 125). An end the user asked for up front, --timeout, bounds this too (by `grace`), keeping
/// its 124. Then the record's own losses, said. Returns `status`, or 125 if output was lost.
int deliver_owed_output(FdWriter& out, FdWriter& errw, int stop_fd, const std::optional<host::Record>& final_record,
                        std::chrono::milliseconds grace, int status) {
  const bool timed_out = final_record && final_record->outcome == proto::Outcome::timeout;
  const auto limit = timed_out ? std::optional(grace) : std::nullopt;
  for (auto [w, name] : {std::pair{&out, "stdout"}, std::pair{&errw, "stderr"}}) {
    auto f = w->flush(stop_fd, limit);
    if (!f.left) continue;
    if (f.interrupted) {
      say("neshost run: {} bytes of {} lost: {} while its reader was still taking them\n", f.left, name,
          timed_out ? fmt::format("the --timeout ended neshost {} ms later", grace.count()) : "interrupted");
      // As host::reported_status(): it overrides the workload's own status, not a host verdict.
      if (!final_record || final_record->outcome == proto::Outcome::exited ||
          final_record->outcome == proto::Outcome::signalled)
        status = host::kStatusOutputLost;
    } else {
      if (f.stalled)
        say("neshost run: {} bytes of {} not delivered: left in its FIFO, which no one read for 2 s\n", f.left, name);
      else
        say("neshost run: {} bytes of {} not delivered: its reader went away\n", f.left, name);
    }
  }
  if (final_record)
    for (const auto& line : host::describe_loss(*final_record)) say("neshost run: {}\n", line);
  return status;
}

/// QEMU is gone, so each virtiofsd (and passt) has lost its client and is exiting; reap it (bounded).
void reap_daemons(const RunPlan& plan, Running& run) {
  if (run.passt) {
    auto e = run.passt->stop(2s);
    if (plan.console) say("neshost: passt {}\n", vm::describe(e));
    run.passt.reset();
  }
  for (auto& d : run.daemons) {
    auto e = d->stop(2s);
    if (plan.console) say("neshost: virtiofsd {} {}\n", d->share().tag, vm::describe(e));
  }
  run.daemons.clear();
  // A replacement monitor's: the dead monitor's children, ended by identity (no exit status to
  // read: they are not ours). Each exits by itself once QEMU has gone.
  for (const auto& d : run.adopted_daemons) {
    host::Fd pidfd = host::pin_process(d.id);
    if (!pidfd) continue;
    pollfd pf{pidfd.get(), POLLIN, 0};
    if (::poll(&pf, 1, 2000) == 0) {
      ::syscall(SYS_pidfd_send_signal, pidfd.get(), SIGTERM, nullptr, 0);
      if (::poll(&pf, 1, 1000) == 0) ::syscall(SYS_pidfd_send_signal, pidfd.get(), SIGKILL, nullptr, 0);
    }
    if (plan.console) say("neshost: {} (pid {}) ended\n", d.name, d.id.pid);
  }
  run.adopted_daemons.clear();
}

/// --snapshot: QEMU has started paused; load the snapshot's state, plug in the shares (their
/// virtiofsds run already) and the NIC (its backend is on QEMU's command line), then run the guest.
/// Each QMP step bounded; the whole load by kSnapshotLoadWait. Error: another QEMU or a state it
/// cannot load, as snapshot_refusal() says them (with how to make the snapshot again); QMP's.
constexpr std::chrono::milliseconds kSnapshotLoadWait{60000};
host::Status restore_snapshot(const RunPlan& plan, const host::Fd& state) {
  const auto& m = *plan.snapshot;
  auto q = vm::Qmp::connect(*plan.qemu->qmp_socket, 5s);
  if (!q) return q.error();
  if (q->qemu_version() != m.qemu_version)
    return snapshot_refusal(plan.snapshot_ref, host::Error{fmt::format("made with QEMU {}; this QEMU is {}",
                                                                       m.qemu_version, q->qemu_version())});
  if (auto r = vm::load_vm_state(*q, state, kSnapshotLoadWait); !r) return snapshot_refusal(plan.snapshot_ref, r.error());
  for (std::size_t i = 0; i < plan.hotplug_shares.size(); ++i)
    if (auto r = vm::hotplug_share(*q, i, i, plan.hotplug_shares[i], 5s); !r) return r;
  if (plan.hotplug_nic)
    if (auto r = vm::hotplug_nic(*q, *plan.hotplug_nic, 5s); !r) return r;
  if (auto r = q->execute("cont", "", 5s); !r) return r.error();
  return host::Ok{};
}

/// The VMM side of a run: QEMU (or --sandbox's unshare) as our child, watched on the run's
/// io_context together with the share daemons; its exit is the Host's vm_exited.
class VmmProcess {
 public:
  explicit VmmProcess(asio::io_context& io) : io_(io) {}

  /// Starts `argv` (its output to `console`) and tells the Host vm_started. If it cannot start:
  /// says why and ends the session (vm_started, vm_exited: no `ready`, 125). Then watches its exit
  /// (reap, drain the console, vm_exited; `show`: said on stderr) and each daemon's: a virtiofsd
  /// that dies while QEMU runs leaves the guest's requests on that share unanswered (QEMU's
  /// vhost-user-fs does not reconnect), so the VM is shut down in order, the outcome recorded.
  void start(host::Host& h, const std::string& id, const std::vector<std::string>& argv,
             std::shared_ptr<ConsoleOut> console, std::vector<std::unique_ptr<vm::Virtiofsd>>& daemons,
             vm::Passt* passt, int netns_fd, bool show, std::function<host::Status(pid_t)> gate) {
    vm::LaunchOptions lo;
    // -d: QEMU outlives us (recorded in vmm.json by the gate before it runs); else it dies with us.
    if (gate) {
      lo.death_signal = 0;
      lo.before_exec = std::move(gate);
    }
    lo.netns_fd = netns_fd;  // --network netns: QEMU runs in the namespace, opens its tap there
    lo.argv = argv;
    lo.console = [console](std::string_view b) { console->write(b); };
    lo.diagnostics = [](std::string_view b) { put_bounded(2, b, 1s); };
    if (restore_) {
      // A restore's NIC backend waits on the command line for its device (plugged in after the
      // load): QEMU's startup warning about it says nothing to our user. Read line by line (QEMU
      // writes its program name and the message apart), that one line dropped.
      lo.diagnostics = [pending = std::make_shared<std::string>()](std::string_view b) {
        pending->append(b);
        for (std::size_t nl; (nl = pending->find('\n')) != std::string::npos;) {
          std::string_view line(pending->data(), nl + 1);
          if (line.find("warning: netdev net0 has no peer") == std::string_view::npos) put_bounded(2, line, 1s);
          pending->erase(0, nl + 1);
        }
        if (pending->size() > 8192) {
          put_bounded(2, *pending, 1s);
          pending->clear();
        }
      };
    }
    // --network passt: QEMU's end of passt's socket, at the number its -netdev names.
    if (passt) lo.fds = {{passt->qemu_fd(), vm::kPasstChildFd}};
    lo.fds.insert(lo.fds.end(), extra_fds_.begin(), extra_fds_.end());
    auto p = vm::VmProcess::launch(std::move(lo));
    if (passt) passt->close_qemu_fd();  // QEMU holds it now: passt sees QEMU go
    if (!p) {
      say("neshost run: cannot start QEMU: {}\n", p.error().message);
      (void)h.vm_started(id);  // the session then ends as no_ready (125) through vm_exited
      (void)h.vm_exited(id);
      return;
    }
    qemu_ = std::move(*p);
    if (restore_) {
      // --snapshot: the saved state loaded, the shares and the NIC plugged in, then `cont`. A
      // restore that fails ends QEMU before the Host takes its channel (the saved `ready` is
      // never taken): the session ends without one, 125.
      if (auto r = restore_(); !r) {
        // A refusal of the snapshot itself names it (snapshot_refusal(): "--snapshot GIVEN: ...").
        const std::string& msg = r.error().message;
        say("neshost run: {}{}\n", msg.starts_with("--snapshot ") ? "" : "--snapshot: ", msg);
        qemu_->terminate(200ms);
        qemu_->finish_output(2s);
        console->finish();
        (void)h.vm_started(id);
        (void)h.vm_exited(id);
        return;
      }
    }
    (void)h.vm_started(id);
    watch_daemons(h, id, daemons, passt);
    watch_exit(h, id, console, show);
  }

  /// --snapshot: run right after QEMU started (paused, `-incoming defer`) and before the Host
  /// hears of it; an error kills QEMU.
  void set_restore(std::function<host::Status()> r) { restore_ = std::move(r); }
  /// A descriptor QEMU inherits at number `child` (as LaunchOptions::fds; ours stays open).
  void add_fd(int fd, int child) { extra_fds_.emplace_back(fd, child); }

  /// A replacement monitor: `qemu` is the VMM it took over (VmProcess::adopt); watched as one we
  /// started, and so are its helper `daemons` (the dead monitor's children, by identity:
  /// host/monitor/daemon_watch.hpp), whose death ends the VM as the first monitor's would.
  void adopt(host::Host& h, const std::string& id, std::unique_ptr<vm::VmProcess> qemu,
             std::shared_ptr<ConsoleOut> console, const std::vector<host::VmmDaemon>& daemons) {
    qemu_ = std::move(qemu);
    (void)h.vm_started(id);
    for (const auto& d : daemons)
      adopted_watch_.watch(d, [this, &h, id](const host::VmmDaemon& gone, bool already) {
        const std::string tag = monitor::share_tag_of(gone);
        end_for_daemon(h, id,
                       tag.empty() ? fmt::format("{} (pid {}) {} while the guest ran: the VM lost its network",
                                                 gone.name, gone.id.pid, already ? "was gone at the takeover" : "exited")
                                   : fmt::format("share '{}': virtiofsd (pid {}) {} while the guest ran", tag,
                                                 gone.id.pid, already ? "was gone at the takeover" : "exited"));
      });
    watch_exit(h, id, console, false);
  }
  /// Where a daemon's death is recorded (stop.json's reason: host::persist_stop): the state dir
  /// and the generation. Unset: only said.
  void set_record(fs::path state, std::uint64_t generation) {
    state_ = std::move(state);
    generation_ = generation;
  }

 private:
  /// A helper daemon the guest needs died while it runs (and before its outcome): the VM is ended
  /// in order (the workload's stop, grace, shutdown), the cause recorded first in stop.json, so
  /// the VM reconciles as "stopped by its monitor: CAUSE" (docs/host.md "Re-adoption": why a dead
  /// virtiofsd or passt is not restarted).
  void end_for_daemon(host::Host& h, const std::string& id, const std::string& why) {
    // Its exit after QEMU's is the normal end. QEMU's fds (the daemon's socket) close a moment
    // before its pidfd turns readable, so a daemon that exits on that EOF can be seen first: a
    // QEMU that is ending is given a bounded moment, never recorded as "stopped by its monitor".
    if (!qemu_ || qemu_->wait_for(kDaemonVsQemuExit)) return;
    if (auto* sess = h.session(id); !sess || sess->outcome()) return;
    if (!state_.empty())
      if (auto r = host::persist_stop(state_, id, generation_, why); !r)
        say("neshost monitor: VM {}: recording why it ends: {}\n", id, r.error().message);
    say("neshost run: {}; shutting the VM down\n", why);
    (void)h.shutdown(id);
  }

  void watch_daemons(host::Host& h, const std::string& id, std::vector<std::unique_ptr<vm::Virtiofsd>>& daemons,
                     vm::Passt* passt) {
    for (auto& d : daemons) {
      auto& w = daemon_watch_.emplace_back(io_, ::fcntl(d->pidfd(), F_DUPFD_CLOEXEC, 3));
      w.async_wait(asio::posix::stream_descriptor::wait_read,
                   [this, &h, id, dp = d.get()](boost::system::error_code ec) {
                     // Its exit after QEMU's, or once the outcome is in, is the normal end.
                     if (ec) return;
                     auto e = dp->exited();
                     end_for_daemon(h, id, fmt::format("share '{}' ({}): virtiofsd {} while the guest ran",
                                                       dp->share().tag, dp->share().dir.string(),
                                                       e ? vm::describe(*e) : "exited"));
                   });
    }
    // passt gone while QEMU runs: the guest has lost its network (outbound and published ports),
    // for good (QEMU holds passt's socket as an inherited fd: no redial), so the VM is ended in
    // order, the cause (with passt's last words) recorded.
    if (passt) {
      auto& w = daemon_watch_.emplace_back(io_, ::fcntl(passt->pidfd(), F_DUPFD_CLOEXEC, 3));
      w.async_wait(asio::posix::stream_descriptor::wait_read, [this, &h, id, passt](boost::system::error_code ec) {
        if (ec) return;
        auto e = passt->exited();
        std::string why = passt->last_words();
        end_for_daemon(h, id, fmt::format("passt {} while the guest ran: the VM lost its network{}{}",
                                          e ? vm::describe(*e) : "exited", why.empty() ? "" : ": ", why));
      });
    }
  }

  void watch_exit(host::Host& h, const std::string& id, std::shared_ptr<ConsoleOut> console, bool show) {
    // QEMU's exit, seen through its pidfd on this io_context: reap, drain the console to EOF
    // (so every line precedes our exit), then tell the library.
    exit_watch_.emplace(io_, ::fcntl(qemu_->pidfd(), F_DUPFD_CLOEXEC, 3));
    exit_watch_->async_wait(asio::posix::stream_descriptor::wait_read,
                            [this, &h, id, console, show](boost::system::error_code) {
                              if (!qemu_) return;
                              if (auto e = qemu_->wait_for(0ms); e && show)
                                say("neshost: qemu {}\n", vm::describe(*e));
                              qemu_->finish_output(2s);
                              console->finish();
                              (void)h.vm_exited(id);
                            });
  }

 public:
  /// SIGKILL (the library's destroy hook); the exit watch reaps it and reports vm_exited.
  void kill() {
    if (qemu_) qemu_->signal(SIGKILL);
  }
  /// Whatever happened (a second signal, a library error): QEMU is gone (terminated if it still
  /// runs) and its console drained.
  void stop() {
    if (!qemu_) return;
    if (!qemu_->exit_status()) qemu_->terminate(1s);
    qemu_->finish_output(2s);
  }
  /// Drops the watches and the process (after stop()).
  void reset() {
    exit_watch_.reset();
    daemon_watch_.clear();
    adopted_watch_.clear();
    qemu_.reset();
  }

 private:
  asio::io_context& io_;
  std::unique_ptr<vm::VmProcess> qemu_;
  std::optional<asio::posix::stream_descriptor> exit_watch_;
  std::list<asio::posix::stream_descriptor> daemon_watch_;  // one per virtiofsd (stable addresses)
  monitor::DaemonWatch adopted_watch_{io_};                  // a replacement's: the recorded daemons
  /// How long end_for_daemon() waits for a QEMU whose helper daemon just exited (taken from the
  /// loop only then, when the VM is being ended anyway): covers QEMU's last steps after its
  /// sockets close (its own cleanup on a power-off, exit_files()..exit_notify() on a SIGKILL),
  /// which a loaded 2-core host can stretch well past 200 ms.
  static constexpr std::chrono::milliseconds kDaemonVsQemuExit{1000};
  fs::path state_;
  std::uint64_t generation_ = 0;
  std::function<host::Status()> restore_;
  std::vector<std::pair<int, int>> extra_fds_;
};

/// Serves the VM until its session is over (serve_vm() with QEMU as the VMM, the workload's
/// stdio on ours, the control socket), then delivers the output still owed and cleans up.
/// Returns the exit status.
int serve_run(const RunPlan& plan, RuntimeDir& rt, Running& run, host::Fd& started_notify,
              const std::vector<std::string>& argv, const std::function<void()>& on_resumed = {}) {
  const ServeConfig& cfg = plan.serve;
  const std::string& vmid = plan.vm;
  const fs::path& data_sock = plan.data_socket;
  const fs::path& channel = plan.channel_socket;
  const auto& console = run.console;
  auto& daemons = run.daemons;
  asio::io_context io;
  VmmProcess vmm(io);
  bool remove_scratch = false;

  // Workload output to our stdout/stderr through bounded, never-blocking writers: while either is
  // over 1 MiB behind, the data channel is not read (the guest then holds the workload back).
  host::Host* hostp = nullptr;
  FdWriter out(io, 1, kOutputQueueCap), errw(io, 2, kOutputQueueCap);
  bool paused = false;
  std::function<void()> update_pause;
  // `neshost exec`: processes beside the workload, their streams on the fds their clients passed.
  ExecAttachments execs(io, vmid, [&] { if (update_pause) update_pause(); });
  update_pause = [&] {
    bool want = out.full() || errw.full() || execs.any_full();
    if (want == paused || !hostp) return;
    paused = want;
    (void)hostp->pause_output(vmid, want);
  };
  out.on_drained = update_pause;
  errw.on_drained = update_pause;
  std::unique_ptr<StdinPump> pump;
  auto make_pump = [&](int fd, std::uint64_t from) {
    pump = std::make_unique<StdinPump>(
        io, fd, [&](std::string_view b) { return hostp && hostp->send_stdin(vmid, b).ok(); },
        [&] { if (hostp) (void)hostp->send_stdin_eof(vmid); });
    if (run.stdin_spool)
      pump->through(*run.stdin_spool, from, [&](std::string why) { say("neshost monitor: VM {}: {}\n", vmid, why); });
  };
  if (plan.interactive) make_pump(0, 0);
  // --stdin-hold: a writer of our own on the stdin FIFO (a new open of it; non-blocking succeeds,
  // our fd 0 being a reader), closed by `close-stdin`: until then no EOF reaches the workload.
  host::Fd stdin_hold;
  if (plan.stdin_hold) {
    struct stat st{};
    if (::fstat(0, &st) != 0 || !S_ISFIFO(st.st_mode))
      say("neshost run: --stdin-hold: stdin is not a FIFO: nothing to hold\n");
    else if (stdin_hold.reset(::open("/proc/self/fd/0", O_WRONLY | O_NONBLOCK | O_CLOEXEC)); !stdin_hold)
      say("neshost run: --stdin-hold: open /proc/self/fd/0: {}\n", std::strerror(errno));
  }
  // A replacement monitor: the workload's stdin source reopened at the guest's stdin position.
  host::Fd adopted_in;
  bool stdin_adopted = false;
  auto adopt_stdin = [&](std::uint64_t guest_pos) {
    using Kind = host::VmmStdin::Kind;
    const auto& src = run.stdin_source;
    auto end_stdin = [&](std::string why) {
      say("neshost monitor: VM {}: the workload's stdin ends here (EOF): {}\n", vmid, why);
      if (hostp) (void)hostp->send_stdin_eof(vmid);
    };
    if (!src) return end_stdin("its source (a terminal, an anonymous pipe) cannot be reopened by another process");
    adopted_in.reset(::open(src->path.c_str(), O_RDONLY | O_CLOEXEC | (src->kind == Kind::fifo ? O_NONBLOCK : 0)));
    if (!adopted_in) return end_stdin(fmt::format("open {}: {}", src->path.string(), std::strerror(errno)));
    if (src->kind == Kind::file) {
      // A file is read again from the guest's position: nothing twice, nothing lost.
      if (::lseek(adopted_in.get(), static_cast<off_t>(src->offset + guest_pos), SEEK_SET) < 0)
        return end_stdin(fmt::format("seek {}: {}", src->path.string(), std::strerror(errno)));
    } else {
      // A FIFO: what the monitor gone took from it and the guest never received is in
      // stdin.spool; it goes again from the guest's position, then the FIFO where it stopped.
      auto sp = host::StdinSpool::open(plan.state_dir, vmid, false);
      if (!sp) return end_stdin(sp.error().message);
      run.stdin_spool = std::move(*sp);
      const auto& p = *run.stdin_spool;
      if (guest_pos > p.size())
        return end_stdin(fmt::format("{} holds {} bytes, fewer than the {} the guest received: its offsets are not "
                                     "the guest's", host::kStdinSpoolFile, p.size(), guest_pos));
      const std::uint64_t from = std::max(guest_pos, p.held_from());
      const std::uint64_t lost = from - std::min(guest_pos, from);
      say("neshost monitor: VM {}: stdin continues at byte {}: {} bytes the monitor gone took from {} and the guest "
          "never received go again from {}; {} bytes lost\n",
          vmid, guest_pos, p.size() - from, src->path.string(), host::kStdinSpoolFile, lost);
      make_pump(adopted_in.get(), from);
      pump->start();
      return;
    }
    make_pump(adopted_in.get(), 0);
    pump->start();
  };
  // -t: SIGWINCH becomes a resize of the workload's terminal.
  asio::signal_set winch(io);
  std::function<void()> arm_winch = [&] {
    winch.async_wait([&](boost::system::error_code ec, int) {
      if (ec) return;
      auto sz = terminal_size(0);
      if (!sz) sz = terminal_size(1);
      if (sz && hostp) (void)hostp->send_resize(vmid, sz->rows, sz->cols);
      arm_winch();
    });
  };
  if (plan.tty) {
    winch.add(SIGWINCH);
    arm_winch();
  }
  // -it on a terminal: raw mode, restored when this scope ends (every return below).
  std::unique_ptr<RawMode> raw;
  if (plan.raw_terminal) {
    auto r = RawMode::enter(0);
    if (r) raw = std::move(*r);
  }

  ServeEmbedder emb;
  emb.io = &io;
  emb.on_host = [&](host::Host& h) {
    hostp = &h;
    execs.set_host(&h);
  };
  emb.stdio.data = [&](const std::string&, proto::Stream st, std::string_view b) {
    (st == proto::Stream::err ? errw : out).write(b);
    update_pause();
  };
  emb.stdio.stdin_writable = [&](const std::string&) {
    if (pump) pump->resume();
    execs.resume_stdin();
  };
  emb.workload_log = plan.workload_log;
  emb.print_events = false;
  emb.channel_is_vm = false;
  std::unique_ptr<ControlServer> control;
  // pause/unpause: QMP on the runtime dir's socket; a replacement finds the VM as the dead
  // monitor's marker says (QEMU stays paused across it).
  VmPause vm_pause(plan.sandbox ? fs::path() : plan.runtime_dir / "qmp.sock", cfg.state_dir, vmid,
                   cfg.session.generation, host::paused_generation(cfg.state_dir, vmid) == cfg.session.generation);
  bool guest_ready = false;  // pause only a guest that runs (its ready, or a replacement's resumed session)
  bool stopping = false;     // nor one that is stopping
  emb.before_shutdown = [&] {
    stopping = true;
    if (auto r = vm_pause.resume(); !r) say("neshost monitor: VM {}: resume before shutting down: {}\n", vmid, r.error().message);
  };
  std::optional<host::Record> final_record;
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  emb.on_listening = [&](host::Host& h, const std::string& id) {
    host::UnixListenOptions dl;
    dl.path = data_sock.string();
    if (auto s = h.listen_data_unix(id, dl); !s) {
      say("neshost run: data channel: {}\n", s.error().message);
      (void)h.vm_started(id);
      (void)h.vm_exited(id);
      return;
    }
    // `neshost stop`/`kill`/`top`/`exec` and the shim reach this VM through its control socket
    // (host/monitor/control.hpp): each request on this VM's Host.
    ControlHandlers ch;
    ch.generation = cfg.session.generation;  // requests aimed at another generation are refused
    // A paused VM: stop and SIGKILL resume it first (docker's); other signals wait in the
    // channel for unpause (as a frozen cgroup's do); exec is refused (runc's).
    ch.stop = [&h, id, &vm_pause, &stopping]() -> host::Status {
      if (auto r = vm_pause.resume(); !r) return r;
      auto r = h.shutdown(id);  // what SIGTERM to this process does
      if (r) stopping = true;
      return r;
    };
    ch.kill = [&h, id, &vm_pause, &vmm](const control::Kill& k) -> host::Status {
      if (k.signal == SIGKILL && !k.proc && vm_pause.paused()) {
        if (auto r = vm_pause.resume(); !r) {
          // SIGKILL is never refused: a VM that cannot be resumed is ended by its VMM's death.
          say("neshost monitor: VM {}: SIGKILL to a paused VM that cannot be resumed ({}): killing its VMM\n", id,
              r.error().message);
          vmm.kill();
          return host::Ok{};
        }
        say("neshost monitor: VM {}: resumed for SIGKILL\n", id);
      }
      return k.proc ? h.kill_exec(id, *k.proc, k.signal) : h.kill(id, k.signal);
    };
    ch.pause = [&vm_pause, id, &guest_ready, &stopping]() -> host::Status {
      if (!guest_ready) return host::Error{"the guest is not ready yet: pause it once it runs"};
      if (stopping) return host::Error{"the VM is stopping"};
      auto r = vm_pause.pause();
      if (r) say("neshost monitor: VM {}: paused\n", id);
      return r;
    };
    ch.resume = [&vm_pause, id] {
      const bool was = vm_pause.paused();
      auto r = vm_pause.resume();
      if (r && was) say("neshost monitor: VM {}: resumed\n", id);
      return r;
    };
    ch.resize = [&h, id](const control::Resize& r) { return h.send_resize(id, r.rows, r.cols, r.proc.value_or(0)); };
    ch.ps = [&h, id](auto done) { h.async_list_processes(id, std::move(done)); };
    ch.exec = [&execs, &vm_pause](control::Exec x, std::vector<host::Fd> fds, ControlRespond respond) {
      if (vm_pause.paused()) return respond(control::Error{"cannot exec in a paused VM (unpause it first)"});
      execs.start(std::move(x), std::move(fds), std::move(respond));
    };
    ch.wait = [&execs](const control::Wait& w, ControlRespond respond) { execs.wait(w.proc, std::move(respond)); };
    ch.close_stdin = [&stdin_hold]() -> host::Status {
      stdin_hold.reset();  // the workload's EOF once the FIFO's other writers are gone too
      return host::Ok{};
    };
    auto cs = ControlServer::start(io, host::control_path(cfg.state_dir, id), control_handler(std::move(ch)));
    if (cs) control = std::move(*cs);
    else fmt::print(stderr, "neshost run: control socket: {}\n", cs.error().message);
    vmm.set_record(cfg.state_dir, cfg.session.generation);
    if (plan.snapshot) vmm.set_restore([&plan, &run] { return restore_snapshot(plan, run.snapshot_state); });
    if (run.snapshot_ram) vmm.add_fd(run.snapshot_ram.get(), kRamChildFd);
    if (run.adopted) {
      vmm.adopt(h, id, std::move(run.adopted), console, run.adopted_daemons);
    } else {
      vmm.start(h, id, argv, console, daemons, run.passt.get(), run.netns_fd, plan.console,
                record_gate(plan, run, ""));
      // The VM's start and its --timeout deadline, for a replacement (host/monitor/duties.hpp).
      if (auto* sess = h.session(id); run.vmm_info && sess && sess->started_at())
        if (auto r = monitor::record_started(cfg.state_dir, *run.vmm_info, *sess->started_at(),
                                             cfg.session.wall_timeout);
            !r)
          say("neshost monitor: VM {}: {} (a replacement would not know the VM's start or deadline)\n", id,
              r.error().message);
    }
  };
  emb.hooks.destroy = [&](const std::string&, std::uint64_t) {
    vmm.kill();  // the exit watch reaps it and reports vm_exited
  };
  emb.hooks.remove = [&](const std::string&, std::uint64_t) { remove_scratch = true; };
  emb.on_event = [&](host::Host&, const host::Event& ev) {
    // QEMU has dialled the socket: its path is needed no more, so even a SIGKILLed neshost leaves
    // no socket behind. Once the guest said `ready` it is running, so QEMU has also read the
    // initramfs (QEMU connects chardevs before it loads the initramfs): the whole dir can go.
    std::error_code rm_ec;
    using host::act::Milestone;
    const auto m = ev.milestone;
    if (m == Milestone::connected) fs::remove(channel, rm_ec);
    if (m == Milestone::data_connected) {
      fs::remove(data_sock, rm_ec);
      if (pump) pump->start();
    }
    if (m == Milestone::data_error && !plan.console) say("neshost run: data channel: {}\n", ev.detail);
    // What becomes of the data channel across a loss, once per event (rare: a loss, a resume),
    // in monitor.log for a detached VM: where its output went is never a guess.
    if (!plan.console && plan.monitor_log &&
        (ev.kind == "data_refused" || ev.kind == "data_lost" || ev.kind == "data_resumed" ||
         ev.kind == "output_dropped" || ev.kind == "output_lost"))
      say("neshost monitor: VM {}: {} {}\n", vmid, ev.kind, ev.detail);
    // QEMU connects both chardev sockets at its start; in --sandbox the init dials the data
    // channel only after `boot`, so the runtime dir stays until then.
    // A VMM that outlives us redials these sockets' paths (a replacement monitor binds them
    // again): the directory stays until the VM is over; only a generated initramfs goes.
    if (m == Milestone::ready || ev.kind == "resumed") guest_ready = true;
    if (m == Milestone::ready && !plan.sandbox && !vm_pause.paused()) {
      // QMP now, while its socket's path exists (the runtime dir may go next).
      if (auto c = vm_pause.connect(); !c) say("neshost monitor: VM {}: QMP (pause): {}\n", vmid, c.error().message);
    }
    if (m == (plan.sandbox ? Milestone::data_connected : Milestone::ready)) {
      if (!plan.vmm_survives) rt.remove_now();
      else if (plan.initrd_from) fs::remove(plan.initrd, rm_ec);
    }
    if (m == Milestone::started) {
      if (run.vmm_info)  // where the session arms its --timeout again: the deadline a replacement re-arms
        if (auto r = monitor::record_wall_deadline(cfg.state_dir, *run.vmm_info); !r)
          say("neshost monitor: VM {}: {} (a replacement would end it at the earlier deadline)\n", vmid,
              r.error().message);
      notify_started(started_notify);
      execs.workload_started();
    }
    if (m == Milestone::outcome) execs.workload_ended();
    if (ev.kind == "stdin_position" && run.adopt_stdin && !std::exchange(stdin_adopted, true))
      adopt_stdin(std::strtoull(ev.detail.c_str(), nullptr, 10));  // once: later ones follow redials
    if (ev.kind == "resumed") {
      // A replacement monitor has the lifecycle channel back (the guest redialled us).
      say("neshost monitor: VM {}: the guest resumed its session ({})\n", vmid, ev.detail);
      if (ev.detail.find("started=true") != std::string::npos) execs.workload_started();
      if (on_resumed) on_resumed();
    }
    if (m == Milestone::finished) {
      vm_pause.ended();
      // The record as it ends (with what was lost of the output), for our last words; and from
      // here on SIGINT/SIGTERM are read from a signalfd by the last writes below.
      if (auto* sess = hostp ? hostp->session(vmid) : nullptr; sess && sess->outcome()) final_record = *sess->outcome();
      ::sigprocmask(SIG_BLOCK, &stop_signals, nullptr);
    }
    if (plan.console)
      say("neshost: {} {}{}{}\n", ev.vm, ev.kind, ev.detail.empty() ? "" : " ", ev.detail);
    // A workload that ran speaks for itself; anything else gets one line saying why.
    if (m == Milestone::outcome && !plan.console && ev.outcome &&
        *ev.outcome != proto::Outcome::exited && *ev.outcome != proto::Outcome::signalled)
      say("neshost run: {}\n", ev.detail);
    if (m == Milestone::recorded && cfg.session.on_exit == host::OnExitPolicy::keep)
      say("neshost run: VM {} kept running; stop it with: neshost stop --state {} {}\n",
                 vmid, cfg.state_dir.string(), vmid);
    std::fflush(stderr);
  };

  int status = serve_vm(cfg, std::move(emb));
  // The Host is gone with serve_vm(): nothing may reach it any more.
  hostp = nullptr;
  execs.host_gone();
  // SIGINT/SIGTERM end the waits below (blocked at `finished`; here too after a give-up).
  ::sigprocmask(SIG_BLOCK, &stop_signals, nullptr);
  host::Fd stop_fd{::signalfd(-1, &stop_signals, SFD_CLOEXEC | SFD_NONBLOCK)};

  // Whatever happened (a second signal, a library error): QEMU is gone before we return, and its
  // console drained.
  vmm.stop();
  if (control) control->stop_accepting();  // its handler needs the Host; replies still go out
  vmm.reset();
  if (pump) pump->stop();
  {
    boost::system::error_code bec;
    winch.clear(bec);
  }
  raw.reset();  // the terminal as it was (^C is a signal again), before the last writes
  drain_exec_clients(io, execs, stop_fd.get());
  control.reset();
  status = deliver_owed_output(out, errw, stop_fd.get(), final_record, plan.grace, status);
  reap_daemons(plan, run);
  // --on-exit remove: its intent first, so a crash mid-removal is finished by the next command
  // (host/monitor/removal.hpp).
  if (remove_scratch)
    if (auto r = host::remove_scratch(plan.state_dir, vmid, cfg.session.generation); !r)
      say("neshost monitor: VM {}: --on-exit remove: {}\n", vmid, r.error().message);
  return status;
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

/// `neshost run`: parse the flags, gather what the plan needs from this host, plan, carry it out.
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

int run_main(const Args& args) {
  // Usage errors exit 2 with a hint; bad network input 125 (RunError::status).
  auto refuse = [](const RunError& e) {
    if (e.status == kExitUsage) return usage_error("run", e.message);
    fmt::print(stderr, "neshost run: {}\n", e.message);
    return e.status;
  };
  auto parsed = parse_run(args);
  if (!parsed) return refuse(parsed.error());
  RunFlags o = std::move(*parsed);
  // --help is help whatever else is given (docker's: `docker run --help -i --rm` prints help).
  if (o.help) {
    fmt::print("{}", kRunHelp);
    return 0;
  }
  PlanInputs in = flag_inputs(o);
  // IMAGE [COMMAND...]: resolved, unpacked and rewritten as a --rootfs run (host/cli/image.hpp)
  auto image = apply_run_image(o, o.state ? *o.state : in.state_dir, o.vm ? *o.vm : in.vm_id, in.rootfs_dir);
  if (!image) return refuse(RunError{image.error().message, proto::kStatusHostFailure});
  if (o.entrypoint && !*image) return refuse(RunError{"--entrypoint: only with an IMAGE (neshost run [OPTIONS] IMAGE [COMMAND...])"});
  // An image run refused before its VM started (no monitor.json) leaves nothing (image.json, its layer).
  ImageRunLeftovers image_leftovers{*image ? (o.state ? *o.state : in.state_dir) / (o.vm ? *o.vm : in.vm_id) : fs::path()};
  if (auto c = check_run(o, in); !c) return refuse(c.error());
  // Before anything starts (and before -d's fork, so the creator says it): the network's own
  // checks, each a 125 with nothing left behind.
  // netns mode's tap and redirects live until the VM has ended (torn down when this returns).
  std::optional<vm::NetnsAttachment> netns;
  if (auto n = network_preflight(o, o.vm ? *o.vm : in.vm_id, netns); !n)
    return refuse(RunError{n.error().message, kExitNetwork});
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
  if (auto s = prepare_boot_files(*plan); !s) return fail(s.error().message);
  Running run;
  if (netns) run.netns_fd = netns->netns_fd();
  if (auto s = start_passt(*plan, run); !s) return fail(s.error().message);
  if (auto s = open_vm_state(*plan, run); !s) return fail(s.error().message);
  // --rm: however the run ends from here, the VM's state goes with it (`neshost rm`'s removal, by
  // its own monitor). A detached VM whose workload never started is kept: its creator reads why
  // from it (then `neshost rm` it).
  const auto self = host::self_identity().value_or(host::ProcessIdentity{::getpid(), 0, {}});
  const bool detached_unstarted_keep = o.detach;
  auto end = [&](int status) {
    if (plan->rm && !(detached_unstarted_keep && started_notify))
      if (auto r = host::remove_vm(plan->state_dir, plan->vm, self); !r) say("neshost run: --rm: {}\n", r.error().message);
    return status;
  };
  if (auto s = start_daemons(*plan, run); !s) return end(fail(s.error().message));
  if (snapshot_files) {
    // QEMU maps the RAM we checked: the snapshot's file itself (copy-on-write), or with shares a
    // private copy of it (shared with their daemons); it loads the state we checked.
    if (plan->hotplug_shares.empty()) {
      run.snapshot_ram = std::move(snapshot_files->ram);
    } else {
      auto copy = vm::copy_ram(snapshot_files->ram);
      if (!copy) return end(fail(fmt::format("--snapshot: {}", copy.error().message)));
      run.snapshot_ram = std::move(*copy);
    }
    run.snapshot_state = std::move(snapshot_files->state);
  }
  auto argv = launch_argv(*plan);
  if (!argv) return end(fail(argv.error().message));
  return end(serve_run(*plan, rt, run, started_notify, *argv));
}

// ---- monitor: a replacement for a detached VM's dead monitor ----

constexpr std::string_view kMonitorHelp = R"(usage: neshost monitor [--state DIR] [--notify-fd N] VM

Take over a detached VM whose monitor is gone while its QEMU (or sandbox) runs on: neshost itself
starts this (host/monitor/adopt.hpp) when any command (ps, inspect, wait, logs, exec, stop, kill,
top, rm) finds the VM so; there is no need to run it by hand. It takes the generation over
(monitor.json names it from then on), listens where the VM's chardevs redial, resumes the
lifecycle session (the guest's resumed `ready`: docs/protocol.md "Channel survival"), serves the
control socket, records the outcome once, applies on_exit and powers the VM down in order, as the
monitor it replaces would have. Its messages go to STATE/VM/monitor.log.
Exit 0 without doing anything when there is nothing to take over (another replacement won the
race, the VM has ended, its VMM is gone); else the outcome's exit status, as `neshost run`.
  --notify-fd N   write one line to fd N once the VM is taken over (or why not), then close it
)";

int monitor_main(const Args& args) {
  static constexpr FlagSpec kFlags[] = {{"state"}, {"notify-fd"}};
  auto p = parse_flags(kFlags, args);
  if (!p) return usage_error("monitor", p.error().message);
  if (p->help) {
    fmt::print("{}", kMonitorHelp);
    return 0;
  }
  if (p->positional.size() != 1) return usage_error("monitor", "exactly one VM is required");
  const std::string vm = p->positional[0];
  if (auto id = host::check_vm_id(vm); !id) return usage_error("monitor", "VM: " + id.error().message);
  const fs::path state = p->has("state") ? fs::path(*p->get("state")) : default_state_dir();
  host::Fd notify;
  if (auto n = p->get("notify-fd")) {
    auto fd = parse_uint("notify-fd", *n, 3, 1023);
    if (!fd) return usage_error("monitor", fd.error().message);
    if (::fcntl(static_cast<int>(*fd), F_SETFD, FD_CLOEXEC) == 0) notify.reset(static_cast<int>(*fd));
  }
  auto tell = [&](std::string_view line) {
    if (!notify) return;
    std::string l = std::string(line) + "\n";
    [[maybe_unused]] auto n = ::write(notify.get(), l.data(), l.size());
    notify.reset();
  };
  make_own_nonblocking(1);
  make_own_nonblocking(2);
  ::signal(SIGPIPE, SIG_IGN);
  auto nothing = [&](std::string why) {
    say("neshost monitor: VM {}: {}\n", vm, why);
    tell(why);
    return 0;
  };
  // One replacement per VM at a time: the loser of a race leaves it to the winner.
  auto lock = host::open_vm_file(state, vm, host::kAdoptLock, O_RDWR | O_CREAT);
  if (!lock) return nothing(fmt::format("not taken over: {}", lock.error().message));
  if (::flock(lock->get(), LOCK_EX | LOCK_NB) != 0) {
    // Held by a replacement that won (it rewrites monitor.json at once: we stand down), or by a
    // monitor being killed whose other threads have not exited yet (its leader is already a
    // zombie, so the VM looks orphaned, but its fds, the lock among them, live on for a moment):
    // wait for the lock, looking again every 10 ms, at most 5 s.
    const auto until = std::chrono::steady_clock::now() + 5s;
    for (;;) {
      if (auto st = host::reconcile(state, vm); st && *st && (*st)->monitor_alive)
        return nothing("another replacement monitor took it over");
      if (std::chrono::steady_clock::now() >= until) return nothing("another replacement monitor is taking it over");
      ::poll(nullptr, 0, 10);
      if (::flock(lock->get(), LOCK_EX | LOCK_NB) == 0) break;
    }
  }
  auto st = host::reconcile(state, vm);
  if (!st || !*st) return nothing(st ? "no such VM" : st.error().message);
  if (!(*st)->orphaned())
    return nothing(fmt::format("nothing to take over ({}: {})", host::to_string((*st)->status), (*st)->reason));
  auto info = host::load_vmm(state, vm);
  if (!info || !*info) return nothing(info ? "no vmm.json" : info.error().message);
  const host::VmmInfo v = **info;
  auto boot = host::load_boot(state, vm);
  if (!boot) return nothing(boot.error().message);
  // Pin the VMM before claiming the generation: a pidfd on the recorded process.
  auto console = std::make_shared<ConsoleOut>();
  if (auto f = host::open_vm_file(state, vm, host::kConsoleLog, O_WRONLY | O_CREAT | O_APPEND))
    console->open_log(std::move(*f));
  auto adopted = vm::VmProcess::adopt(
      v.vmm->pid, v.vmm->start_time, [console](std::string_view b) { console->write(b); },
      [](std::string_view b) { put_bounded(2, b, 1s); });
  if (!adopted) return nothing(fmt::format("its VMM: {}", adopted.error().message));
  const auto self = host::self_identity().value_or(host::ProcessIdentity{::getpid(), 0, {}});
  auto mon = host::take_over_generation(state, vm, self);
  if (!mon) return nothing(fmt::format("not taken over: {}", mon.error().message));
  say("neshost monitor: VM {}: generation {} taken over from the monitor gone (VMM pid {})\n", vm, mon->generation,
      v.vmm->pid);
  // A VM paused under the monitor gone runs again *before* we listen: QEMU's chardevs redial our
  // listeners at most once a second, so the guest sees its ports' host side gone (and redials)
  // before it sees them back. Resumed while paused, it would see both at once and never redial.
  if (!v.sandbox && host::paused_generation(state, vm) == mon->generation) {
    VmPause p(v.runtime_dir / "qmp.sock", state, vm, mon->generation, true);
    if (auto r = p.resume(); r)
      say("neshost monitor: VM {}: resumed: it was paused under the monitor gone, and its guest must redial\n", vm);
    else
      say("neshost monitor: VM {}: it was paused under the monitor gone and cannot be resumed: {}\n", vm,
          r.error().message);
  }

  RunPlan plan;
  plan.vm = vm;
  plan.state_dir = state;
  plan.serve.state_dir = state;
  auto& sc = plan.serve.session;
  sc.vm = vm;
  sc.generation = mon->generation;
  sc.descriptor = std::move(*boot);
  sc.on_exit = v.on_exit;
  sc.stop_timeout = v.stop_timeout;
  sc.grace = v.grace;
  sc.reconnect = v.reconnect;
  sc.resume = true;  // no boot: only the guest's resumed `ready` (docs/protocol.md "Channel survival")
  // Its start (the record's started_at) and what is left of its --timeout (host/monitor/duties.hpp).
  monitor::take_over_duties(v, sc, host::boottime_ns());
  if (sc.wall_left)
    say("neshost monitor: VM {}: its --timeout ({} ms) goes on: {} ms left\n", vm, sc.wall_timeout->count(),
        std::max<long long>(sc.wall_left->count(), 0));
  plan.serve.listen.kind = host::ListenSpec::Kind::unix_path;
  plan.serve.listen.path = v.channel_socket.string();
  plan.runtime_dir = v.runtime_dir;
  plan.channel_socket = v.channel_socket;
  plan.data_socket = v.data_socket;
  plan.sandbox = v.sandbox;
  plan.workload_log.max_size = v.log_max_size;
  plan.workload_log.max_files = v.log_max_files;
  plan.grace = v.grace;
  plan.rm = v.rm;
  plan.vmm_survives = true;
  plan.monitor_log = true;
  plan.command = mon->command;
  Running run;
  run.console = console;
  run.console_log = host::vm_path(state, vm, host::kConsoleLog);
  run.adopted = std::move(*adopted);
  run.adopted_daemons = v.daemons;
  run.vmm_info = v;
  run.adopt_stdin = sc.descriptor.stdio && sc.descriptor.stdio->attach_stdin;
  run.stdin_source = v.stdin_source;
  RuntimeDir rt(v.runtime_dir);
  // netns mode: the namespace as QEMU holds it (the path may be gone), taken now while it runs;
  // the tap and redirects the monitor gone made are torn down once the VM has ended.
  host::Fd netns_fd;
  if (v.netns && v.vmm) {
    netns_fd.reset(::open(fmt::format("/proc/{}/ns/net", v.vmm->pid).c_str(), O_RDONLY | O_CLOEXEC));
    // The pid is QEMU's only while QEMU (pinned above) still runs after the open: checked again.
    if (netns_fd && !host::vmm_alive(v)) netns_fd.reset();
  }
  host::Fd no_notify;
  // The caller (ensure_monitor) is told once the guest has resumed its session with us, so its
  // next request (kill, exec, ...) finds a booted session; or, if it never does, when we end.
  int status = serve_run(plan, rt, run, no_notify, {}, [&] { tell("adopted"); });
  // Only once QEMU is gone: serve_run may return early (its listener failed) with the VM running.
  if (v.netns && host::vmm_alive(v)) {
    say("neshost monitor: VM {}: netns {}: tap {} left in place: its QEMU still runs\n", vm,
        v.netns->path.string(), v.netns->tap);
  } else if (v.netns) {
    if (!netns_fd)
      if (auto f = vm::open_netns(v.netns->path)) netns_fd = std::move(*f);
    const bool have_ns = static_cast<bool>(netns_fd);
    vm::NetnsAttachment::reclaim(std::move(netns_fd), v.netns->path, v.netns->tap, v.netns->interface,
                                 [](std::string_view line) { say("neshost monitor: {}\n", line); });
    if (have_ns)
      say("neshost monitor: VM {}: netns {}: tap {} torn down (by the replacement of the monitor that made it)\n",
          vm, v.netns->path.string(), v.netns->tap);
    else
      say("neshost monitor: VM {}: netns {}: gone, and tap {} with it\n", vm, v.netns->path.string(),
          v.netns->tap);
  }
  tell(fmt::format("served to its end (exit status {})", status));
  if (plan.rm)
    if (auto r = host::remove_vm(state, vm, self); !r) say("neshost monitor: --rm: {}\n", r.error().message);
  return status;
}

const Registrar run_reg{{"run", "boot a QEMU microVM, run ARGV in it, exit with its status", run_main}};
const Registrar monitor_reg{{"monitor", "take over a detached VM whose monitor died (started by neshost itself)",
                             monitor_main}};

}  // namespace
}  // namespace nes::cli
