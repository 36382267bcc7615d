// `neshost run`: boot a QEMU microVM with nesinit as PID 1, run one workload in it, show its
// output (the VM console) live and exit with its exit status — `docker run --rm`, behind a VM
// boundary; with -d, in the background (host/monitor/monitor.hpp). Built on serve_vm()
// (host/cli/cli.hpp) and the launcher in host/vm/. Why it works this way: docs/vm.md.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/random.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
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
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include <fmt/format.h>

#include "host/cli/cli.hpp"
#include "host/cli/exec.hpp"
#include "host/cli/stdio.hpp"
#include "host/cli/terminal.hpp"
#include "host/lib/base.hpp"
#include "host/monitor/monitor.hpp"
#include "host/monitor/reconcile.hpp"
#include "host/lib/record.hpp"
#include "host/lib/state_dir.hpp"
#include "host/vm/accel.hpp"
#include "host/vm/console.hpp"
#include "host/vm/process.hpp"
#include "host/vm/qemu_argv.hpp"
#include "host/vm/virtiofsd.hpp"
#include "host/vm/volume.hpp"
#include "protocol/codec.hpp"
#include "protocol/limits.hpp"
#include "protocol/status.hpp"

#ifndef NESHOST_DEFAULT_KERNEL
#define NESHOST_DEFAULT_KERNEL ".cache/kernel/vmlinuz"
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
  -u, --user UID[:GID] workload uid and gid, numeric (default 0:0; GID alone defaults to UID)
  --group-add GID      a supplementary group of the workload (repeatable; default none)
  --read-only          --rootfs DIR is read-only for the guest (EROFS), as docker's --read-only
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
SIGINT/SIGTERM: ordered shutdown of the guest; QEMU is killed after a deadline (a second signal:
at once). Once the workload has ended, a signal ends the wait for the output still owed (what
it cuts is counted and reported, exit 125); the last writes to our stdout/stderr wait for
their readers however slow, until a signal (then the bytes left are counted, exit 125) or, after
--timeout, for --grace at most (counted too; the exit stays 124).
)";

// ---- options ----

// One vhost-user-fs-pci device each (PCI slots on q35's root bus are plentiful; this bounds the
// daemons one command line can start).
constexpr std::size_t kMaxVolumes = 16;
// Where file volumes are staged: the share's tag, and where the guest mounts it before binding
// each file at its place (under the guest's /run, which the init provides in every root).
constexpr std::string_view kFileShareTag = "nes.files";
constexpr std::string_view kFileShareAt = "/run/nesinit/files";

struct RunOptions {
  std::optional<fs::path> kernel, initrd, rootfs, state;
  bool rootfs_initramfs = false;   // --rootfs-mode initramfs
  std::vector<vm::Volume> volumes;
  std::uint32_t mem = 256, cpus = 1;
  vm::Accel accel = vm::Accel::auto_probe;
  std::map<std::string, std::string> env;
  std::optional<std::string> workdir, hostname, vm;
  std::uint32_t uid = 0, gid = 0;
  std::vector<std::uint32_t> groups;  // --group-add
  bool read_only = false;             // --read-only
  host::OnExitPolicy on_exit = host::OnExitPolicy::stop;
  std::optional<std::chrono::milliseconds> timeout;
  std::chrono::milliseconds ready_timeout = 30s;
  std::chrono::milliseconds grace = 10s;
  bool console = false, help = false;
  bool detach = false, sandbox = false;
  bool interactive = false, tty = false;
  std::uint64_t log_max_size = 10u << 20;
  unsigned log_max_files = 5;
  std::vector<std::string> argv;
};

/// "10m", "512k", "1g", "65536": bytes, docker's --log-opt max-size units (1024-based).
/// At least 64 KiB, at most 1 TiB; error names `flag`.
host::Result<std::uint64_t> parse_size(std::string_view flag, std::string_view v) {
  std::uint64_t mult = 1;
  std::string_view num = v;
  if (!v.empty()) {
    char u = static_cast<char>(std::tolower(static_cast<unsigned char>(v.back())));
    if (u == 'k' || u == 'm' || u == 'g') {
      mult = u == 'k' ? 1024 : u == 'm' ? 1024 * 1024 : 1024ull * 1024 * 1024;
      num.remove_suffix(1);
    }
  }
  auto n = parse_uint(flag, num, 1, (1ull << 40) / mult);
  if (!n) return host::Error{fmt::format("--{}: expected bytes with an optional k, m or g, got '{}'", flag, v)};
  if (*n * mult < host::kMinLogSize)
    return host::Error{fmt::format("--{}: {} is below the minimum 64k", flag, v)};
  return *n * mult;
}

/// docker-run-style parsing: options until `--` or the first non-option; the rest is ARGV.
/// Short forms as docker users type them (-d, -i, -t, -it, -e, -w, -v, -u, -h). Errors name the flag.
host::Result<RunOptions> parse_run(const Args& args) {
  static constexpr FlagSpec kRunFlags[] = {
      {"detach", false, "-d"}, {"interactive", false, "-i"}, {"tty", false, "-t"}, {"sandbox", false},
      {"console", false}, {"read-only", false}, {"env", true, "-e"}, {"workdir", true, "-w"},
      {"volume", true, "-v"}, {"kernel"}, {"initrd"}, {"rootfs"}, {"mem"}, {"cpus"}, {"accel"},
      {"user", true, "-u"}, {"hostname", true, "-h"}, {"on-exit"}, {"state"}, {"vm"}, {"timeout"}, {"ready-timeout"},
      {"grace"}, {"log-max-size"}, {"log-max-files"}, {"rootfs-mode"}, {"group-add"}};
  auto parsed = parse_flags(kRunFlags, args, FlagOrder::options_first);
  if (!parsed) return parsed.error();
  RunOptions o;
  o.help = parsed->help;
  o.argv = std::move(parsed->positional);
  for (const auto& [name, v] : parsed->given) {
    if (name == "detach") o.detach = true;
    else if (name == "interactive") o.interactive = true;
    else if (name == "tty") o.tty = true;
    else if (name == "sandbox") o.sandbox = true;
    else if (name == "console") o.console = true;
    else if (name == "read-only") o.read_only = true;
    else if (name == "kernel") o.kernel = v;
    else if (name == "initrd") o.initrd = v;
    else if (name == "rootfs") o.rootfs = v;
    else if (name == "state") o.state = v;
    else if (name == "volume") {
      auto vol = vm::parse_volume(v);
      if (!vol) return vol.error();
      o.volumes.push_back(std::move(*vol));
      if (auto p = vm::check_volumes(o.volumes); !p) return p.error();
      if (o.volumes.size() > kMaxVolumes)
        return host::Error{fmt::format("--volume: at most {} volumes", kMaxVolumes)};
    } else if (name == "rootfs-mode") {
      if (v != "virtiofs" && v != "initramfs")
        return host::Error{fmt::format("--rootfs-mode: expected virtiofs or initramfs, got '{}'", v)};
      o.rootfs_initramfs = v == "initramfs";
    }
    else if (name == "hostname") o.hostname = v;
    else if (name == "workdir") {
      auto w = parse_workdir(v);
      if (!w) return w.error();
      o.workdir = std::move(*w);
    } else if (name == "vm") {
      if (auto id = host::check_vm_id(v); !id) return host::Error{"--vm: " + id.error().message};
      o.vm = v;
    } else if (name == "mem") {
      auto n = parse_uint("mem", v, 64, 1024 * 1024);
      if (!n) return n.error();
      o.mem = static_cast<std::uint32_t>(*n);
    } else if (name == "cpus") {
      auto n = parse_uint("cpus", v, 1, 64);
      if (!n) return n.error();
      o.cpus = static_cast<std::uint32_t>(*n);
    } else if (name == "accel") {
      auto acc = vm::accel_from_string(v);
      if (!acc) return host::Error{fmt::format("--accel: expected tcg, kvm or auto, got '{}'", v)};
      o.accel = *acc;
    } else if (name == "env") {
      auto kv = parse_env(v);
      if (!kv) return kv.error();
      if (*kv) o.env[(*kv)->first] = (*kv)->second;
    } else if (name == "group-add") {
      auto g = parse_uint("group-add", v, 0, proto::kInvalidId - 1);
      if (!g) return g.error();
      if (o.groups.size() >= 64) return host::Error{"--group-add: at most 64 groups"};
      o.groups.push_back(static_cast<std::uint32_t>(*g));
    } else if (name == "user") {
      auto u = parse_user(v);
      if (!u) return u.error();
      std::tie(o.uid, o.gid) = *u;
    } else if (name == "on-exit") {
      auto pol = host::on_exit_from_string(v);
      if (!pol) return host::Error{fmt::format("--on-exit: expected stop, keep or remove, got '{}'", v)};
      o.on_exit = *pol;
    } else if (name == "timeout") {
      auto ms = parse_seconds("timeout", v);
      if (!ms) return ms.error();
      o.timeout = *ms;
    } else if (name == "grace") {
      auto ms = parse_seconds("grace", v);
      if (!ms) return ms.error();
      o.grace = *ms;
    } else if (name == "log-max-size") {
      auto n = parse_size("log-max-size", v);
      if (!n) return n.error();
      o.log_max_size = *n;
    } else if (name == "log-max-files") {
      auto n = parse_uint("log-max-files", v, 1, 100);
      if (!n) return n.error();
      o.log_max_files = static_cast<unsigned>(*n);
    } else if (name == "ready-timeout") {
      auto ms = parse_seconds("ready-timeout", v);
      if (!ms) return ms.error();
      o.ready_timeout = *ms;
    }
  }
  if (o.sandbox && (!o.volumes.empty() || o.rootfs))
    return host::Error{"--sandbox runs no VM: --volume and --rootfs need one"};
  if (o.initrd && o.rootfs && o.rootfs_initramfs)
    return host::Error{"--initrd and --rootfs --rootfs-mode initramfs exclude each other"};
  if (o.rootfs) {
    std::error_code ec;
    if (!fs::is_directory(*o.rootfs, ec))
      return host::Error{fmt::format("--rootfs: '{}' is not a directory", o.rootfs->string())};
    o.rootfs = fs::canonical(*o.rootfs, ec);
  }
  if (o.read_only && (!o.rootfs || o.rootfs_initramfs))
    return host::Error{"--read-only needs --rootfs DIR over virtiofs"};
  for (const auto& v : o.volumes)
    if (v.file && ::geteuid() != 0)
      return host::Error{fmt::format("--volume {}:{}: a single file is bind-mounted into a staging "
                                     "share in a private mount namespace, which needs root",
                                     v.host.string(), v.guest)};
  if (!o.help && o.argv.empty()) return host::Error{"ARGV is required (neshost run [OPTIONS] -- ARGV...)"};
  return o;
}

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

/// A private directory for one run's sockets and generated initramfs, removed on every path that
/// unwinds. Under $TMPDIR (default /tmp), not the state dir: the socket path must fit sun_path.
struct RuntimeDir {
  fs::path path;
  RuntimeDir() {
    const char* t = std::getenv("TMPDIR");
    std::string tmpl = std::string(t && *t == '/' ? t : "/tmp") + "/neshost-XXXXXX";
    if (::mkdtemp(tmpl.data())) path = tmpl;
  }
  ~RuntimeDir() { remove_now(); }
  /// Removes it (idempotent).
  void remove_now() {
    std::error_code ec;
    if (!path.empty()) fs::remove_all(path, ec);
  }
  RuntimeDir(const RuntimeDir&) = delete;
  RuntimeDir& operator=(const RuntimeDir&) = delete;
};

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

/// Runs scripts/mkinitrd.sh for --rootfs; its output goes to stderr. Bounded (120 s).
host::Status build_initrd(const fs::path& rootfs, const fs::path& kernel, const fs::path& out) {
  std::vector<std::string> argv{env_or("NESHOST_MKINITRD", NESHOST_MKINITRD), "--rootfs",
                                rootfs.string(), "--init", env_or("NESHOST_NESINIT", NESHOST_NESINIT),
                                "-o", out.string()};
  // Modules must match the kernel: Debian layout <root>/boot/vmlinuz-REL and <root>/lib/modules/REL.
  std::error_code ec;
  fs::path k = fs::canonical(kernel, ec);
  if (!ec) {
    std::string name = k.filename().string();
    if (name.starts_with("vmlinuz-")) {
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

// ---- run ----

int run_main(const Args& args) {
  auto parsed = parse_run(args);
  if (!parsed) return usage_error("run", parsed.error().message);
  RunOptions o = std::move(*parsed);
  if (o.help) {
    fmt::print("{}", kRunHelp);
    return 0;
  }
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
    if (!o.vm) o.vm = random_vm_id();
    if (!o.state) o.state = default_state_dir();
    // The monitor bounds each of its own steps; this only guards against a monitor that hangs.
    auto d = detach(*o.state, *o.vm, o.ready_timeout + 300s);
    if (!d) return fail(d.error().message);
    if (d->creator) return d->exit_status;
    started_notify = std::move(d->notify);
  }
  // A closed stdout must not kill us mid-shutdown (QEMU would die with us, the record unwritten).
  ::signal(SIGPIPE, SIG_IGN);

  fs::path kernel = o.kernel ? *o.kernel : env_or("NESHOST_KERNEL", NESHOST_DEFAULT_KERNEL);
  std::error_code ec;
  if (!o.sandbox && !fs::is_regular_file(kernel, ec))
    return fail(fmt::format("kernel '{}' not found (scripts/fetch-kernel.sh fetches one, or pass --kernel)",
                            kernel.string()));

  RuntimeDir rt;
  if (rt.path.empty()) return fail(fmt::format("mkdtemp $TMPDIR/neshost-XXXXXX: {}", std::strerror(errno)));
  fs::path initrd;
  if (o.sandbox) {
    // No kernel, no initramfs: the init runs on this host.
  } else if (o.rootfs && o.rootfs_initramfs) {
    initrd = rt.path / "initrd.cpio";
    if (auto s = build_initrd(*o.rootfs, kernel, initrd); !s) return fail(s.error().message);
  } else {
    initrd = o.initrd ? *o.initrd : env_or("NESHOST_INITRD", NESHOST_DEFAULT_INITRD);
    if (!fs::is_regular_file(initrd, ec))
      return fail(fmt::format("initramfs '{}' not found (scripts/mkinitrd.sh builds one, or pass --initrd/--rootfs)",
                              initrd.string()));
  }

  // The accelerator, decided before anything else runs (the probe boot is bounded).
  std::string why;
  vm::Accel accel = o.sandbox ? vm::Accel::tcg : vm::resolve_accel(o.accel, [&] {
    return vm::probe_kvm_boot_cached("qemu-system-x86_64", kernel, vm::default_probe_cache(), ::time(nullptr));
  }, &why);
  if (o.console) say("neshost: accel {} ({})\n", vm::to_string(accel), why);

  // Session: the descriptor and the host's policy.
  ServeConfig cfg;
  cfg.state_dir = o.state ? *o.state : default_state_dir();
  cfg.session.vm = o.vm ? *o.vm : random_vm_id();
  const std::string vmid = cfg.session.vm;
  cfg.session.on_exit = o.on_exit;
  cfg.session.ready_timeout = o.ready_timeout;
  cfg.session.wall_timeout = o.timeout;
  cfg.session.wall_from_started = true;  // the workload's limit, not the boot's
  // The host's deadline from `shutdown` to QEMU's exit must cover the guest's own grace (SIGTERM
  // .. SIGKILL) plus its report and power-off, or a slow workload's outcome would be cut off.
  cfg.session.stop_timeout = o.grace + 5s;
  // --grace is also how long the host waits after `stop` for the outcome before `shutdown`
  // (`docker stop -t`): one grace for both ends, not the library's 10 s default.
  cfg.session.grace = o.grace;
  auto& ex = cfg.session.descriptor.exec;
  ex.argv = o.argv;
  ex.env = o.env;
  // docker's default PATH when the user gave none (the init would resolve argv[0] without it, but
  // the workload's own children need it too).
  ex.env.try_emplace("PATH", proto::kDefaultPath);
  ex.cwd = o.workdir;
  // Shares: one virtiofsd each, the root first (docs/vm.md "Shares").
  std::vector<vm::ShareSpec> shares;
  if (o.rootfs && !o.rootfs_initramfs) {
    shares.push_back({"nes.root", *o.rootfs, o.read_only});
    cfg.session.descriptor.root = proto::Root{"nes.root", o.read_only, proto::FsType::virtiofs};
  }
  // File volumes: one staging share for all of them. Each entry is both the daemon's bind (the
  // host's file onto staging file N) and the guest's bind mount (kFileShareAt/N at `guest`),
  // both made from it below, so the two cannot disagree.
  struct FileVolume {
    vm::FileBind bind;
    std::string guest;
  };
  std::vector<FileVolume> file_volumes;
  // Not in `rt`, which goes at `ready`: the daemon serves the staging directory until the end.
  std::optional<RuntimeDir> staging;
  for (std::size_t i = 0; i < o.volumes.size(); ++i) {
    const auto& v = o.volumes[i];
    if (v.file) {
      // virtiofsd serves directories: the file is bind-mounted (in the daemon's own mount
      // namespace) onto an empty file of a staging directory, shared once for every file volume;
      // the guest binds each at its place after every directory is mounted.
      if (!staging) staging.emplace();
      if (staging->path.empty())
        return fail(fmt::format("mkdtemp $TMPDIR/neshost-XXXXXX: {}", std::strerror(errno)));
      const fs::path target = staging->path / std::to_string(file_volumes.size());
      host::Fd f{::open(target.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600)};
      if (!f) return fail(fmt::format("--volume {}: staging {}: {}", v.host.string(), target.string(),
                                      std::strerror(errno)));
      file_volumes.push_back({{v.host, target, v.ro}, v.guest});
      continue;
    }
    std::string tag = fmt::format("nes.v{}", i);
    shares.push_back({tag, v.host, v.ro});
    cfg.session.descriptor.mounts.push_back(proto::Mount{tag, v.guest, v.ro, proto::FsType::virtiofs});
  }
  if (!file_volumes.empty()) {
    bool all_ro = std::all_of(file_volumes.begin(), file_volumes.end(), [](const auto& f) { return f.bind.ro; });
    shares.push_back({std::string(kFileShareTag), staging->path, all_ro});
    cfg.session.descriptor.mounts.push_back(
        proto::Mount{std::string(kFileShareTag), std::string(kFileShareAt), all_ro, proto::FsType::virtiofs});
    for (const auto& f : file_volumes)
      cfg.session.descriptor.mounts.push_back(proto::Mount{
          fmt::format("{}/{}", kFileShareAt, f.bind.target.filename().string()), f.guest, f.bind.ro, proto::FsType::bind});
  }
  ex.uid = o.uid;
  ex.gid = o.gid;
  ex.groups = o.groups;
  // As docker's default (the container's id): a VM without -h is named after its id. Not in the
  // sandbox, which shares the machine's UTS namespace and would only warn about it.
  cfg.session.descriptor.hostname = o.hostname || o.sandbox ? o.hostname : std::optional<std::string>(cfg.session.vm);
  cfg.session.descriptor.on_exit.terminal = o.on_exit != host::OnExitPolicy::keep;
  // The workload's stdio on the data channel: stdin only with -i (else /dev/null, as docker), a
  // PTY sized like our terminal with -t.
  proto::Stdio stdio;
  stdio.attach_stdin = o.interactive;
  // What the init holds unsent per stream when the workload exits must fit its bounded final
  // flush before power-off (about 1 s; virtio-serial under TCG moves a few MB/s): 256 KiB, not
  // the 1 MiB default. Flow control keeps the stream lossless either way.
  stdio.buffer_bytes = 256u << 10;
  if (o.tty) {
    auto sz = terminal_size(0);
    if (!sz) sz = terminal_size(1);
    TermSize t = sz.value_or(TermSize{});
    stdio.terminal = proto::Terminal{t.rows, t.cols};
  }
  cfg.session.descriptor.stdio = stdio;
  const fs::path data_sock = rt.path / "data.sock";
  const fs::path channel = rt.path / "channel.sock";
  cfg.listen.kind = host::ListenSpec::Kind::unix_path;
  cfg.listen.path = channel.string();

  // STATE/VM/: the record (the library), monitor.json (this run's identity, for `neshost stop`),
  // the console log. 0700 like serve's (records and console logs are private), never through a
  // symlink.
  if (auto d = host::open_vm_dir(cfg.state_dir, vmid, true); !d)
    return fail(fmt::format("--state: {}", d.error().message));
  // This process is the VM's monitor for a new generation (host/monitor/reconcile.hpp): reusing a VM id
  // starts a newer one, which nothing of an older one can change. monitor.json names this process
  // for good (pid, start time, boot id): what `neshost stop` and `kill` find it by.
  const host::ProcessIdentity self = host::self_identity().value_or(host::ProcessIdentity{::getpid(), 0, {}});
  {
    host::MonitorInfo mi;
    mi.vm = vmid;
    mi.monitor = self;
    mi.created_at = host::wall_now();
    mi.command = o.argv;
    auto gen = host::begin_generation(cfg.state_dir, mi);
    if (!gen) return fail(gen.error().message);
    cfg.session.generation = *gen;
  }
  auto console = std::make_shared<ConsoleOut>();
  const fs::path console_log = host::vm_path(cfg.state_dir, vmid, host::kConsoleLog);
  if (auto f = host::open_vm_file(cfg.state_dir, vmid, host::kConsoleLog, O_WRONLY | O_CREAT | O_TRUNC))
    console->open_log(std::move(*f));
  console->show = o.console;

  // The daemons first: each creates the socket its QEMU device connects to. Their logs sit next to
  // console.log; they die with us (PR_SET_PDEATHSIG) and exit by themselves once QEMU has gone.
  std::vector<std::unique_ptr<vm::Virtiofsd>> daemons;
  std::vector<fs::path> daemon_logs;
  std::vector<vm::FsDevice> fs_devices;
  for (const auto& sh : shares) {
    vm::VirtiofsdOptions vo;
    vo.program = virtiofsd_program();
    vo.socket = rt.path / (sh.tag + ".sock");
    vo.share = sh;
    if (sh.tag == kFileShareTag)
      for (const auto& f : file_volumes) vo.binds.push_back(f.bind);
    vo.log = host::vm_path(cfg.state_dir, vmid, host::virtiofsd_log_name(sh.tag));
    daemon_logs.push_back(vo.log);
    auto d = vm::Virtiofsd::start(vo, 10s);
    if (!d) return fail(d.error().message);
    if (o.console)
      say("neshost: virtiofsd pid {} serves {} as {}{}\n", (*d)->pid(), sh.dir.string(), sh.tag,
          sh.ro ? " (ro)" : "");
    daemons.push_back(std::move(*d));
    fs_devices.push_back({sh.tag, vo.socket});
  }

  // The kernel command line: the channel, the console's verbosity, the init's log level.
  vm::KernelCmdline kc;
  kc.console = o.console ? vm::ConsoleLevel::full : vm::ConsoleLevel::quiet;
  kc.extra = {"edd=off",  // the boot stub's "Probing EDD" line, before any log level applies
              fmt::format("nesinit.grace_ms={}", o.grace.count())};
  // The data channel's port, named (it is also the init's default next to virtio-port:nes.0).
  kc.extra.push_back(std::string("nesinit.data=virtio-port:") + proto::kDataPortName);
  // Extra kernel arguments for debugging (e.g. nesinit.log=debug), appended last.
  if (const char* a = std::getenv("NESHOST_APPEND"); a && *a) kc.extra.emplace_back(a);
  vm::QemuSpec spec;
  spec.kernel = kernel;
  spec.initrd = initrd;
  spec.append = vm::kernel_cmdline(kc);
  spec.mem_mib = o.mem;
  spec.cpus = o.cpus;
  spec.accel = accel;
  spec.channel_socket = channel;
  spec.data_socket = data_sock;
  spec.fs_devices = fs_devices;
  host::Result<std::vector<std::string>> argv = o.sandbox ? std::vector<std::string>{} : vm::qemu_argv(spec);
  if (o.sandbox)
    *argv = {"unshare", "--pid", "--fork", "--mount-proc", "--kill-child",
                 env_or("NESHOST_NESINIT", NESHOST_NESINIT).string(), "--channel=unix:" + channel.string(),
                 // Dialled only for a descriptor with `stdio`; where `run` listens for it.
                 "--data-channel=unix:" + data_sock.string(),
                 fmt::format("--grace-ms={}", o.grace.count()), o.console ? "--log=info" : "--log=quiet"};
  if (!argv) return fail(argv.error().message);
  if (o.console) {
    std::string line = "neshost:";
    for (const auto& a : *argv) line += " " + a;
    say("{}\n", line);
  }

  asio::io_context io;
  std::unique_ptr<vm::VmProcess> qemu;
  std::optional<asio::posix::stream_descriptor> exit_watch;
  std::list<asio::posix::stream_descriptor> daemon_watch;  // one per virtiofsd (stable addresses)
  bool remove_scratch = false;
  std::string launch_error;

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
  if (o.interactive)
    pump = std::make_unique<StdinPump>(
        io, 0, [&](std::string_view b) { return hostp && hostp->send_stdin(vmid, b).ok(); },
        [&] { if (hostp) (void)hostp->send_stdin_eof(vmid); });
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
  if (o.tty) {
    winch.add(SIGWINCH);
    arm_winch();
  }
  // -it on a terminal: raw mode, restored when this scope ends (every return below).
  std::unique_ptr<RawMode> raw;
  if (o.tty && o.interactive && ::isatty(0)) {
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
  emb.workload_log.max_size = o.log_max_size;
  emb.workload_log.max_files = o.log_max_files;
  emb.print_events = false;
  emb.channel_is_vm = false;
  std::unique_ptr<ControlServer> control;
  std::optional<host::Record> final_record;
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  emb.on_listening = [&](host::Host& h, const std::string& id) {
    host::UnixListenOptions dl;
    dl.path = data_sock.string();
    if (auto s = h.listen_data_unix(id, dl); !s) {
      launch_error = s.error().message;
      say("neshost run: data channel: {}\n", launch_error);
      (void)h.vm_started(id);
      (void)h.vm_exited(id);
      return;
    }
    // `neshost stop`/`kill`/`top`/`exec` and the shim reach this VM through its control socket
    // (host/monitor/control.hpp): each request on this VM's Host.
    ControlHandlers ch;
    ch.stop = [&h, id] { return h.shutdown(id); };  // what SIGTERM to this process does
    ch.kill = [&h, id](const control::Kill& k) {
      return k.proc ? h.kill_exec(id, *k.proc, k.signal) : h.kill(id, k.signal);
    };
    ch.resize = [&h, id](const control::Resize& r) { return h.send_resize(id, r.rows, r.cols, r.proc.value_or(0)); };
    ch.ps = [&h, id](auto done) { h.async_list_processes(id, std::move(done)); };
    ch.exec = [&execs](control::Exec x, std::vector<host::Fd> fds, ControlRespond respond) {
      execs.start(std::move(x), std::move(fds), std::move(respond));
    };
    auto cs = ControlServer::start(io, host::control_path(cfg.state_dir, id), control_handler(std::move(ch)));
    if (cs) control = std::move(*cs);
    else fmt::print(stderr, "neshost run: control socket: {}\n", cs.error().message);
    vm::LaunchOptions lo;
    lo.argv = *argv;
    lo.console = [console](std::string_view b) { console->write(b); };
    lo.diagnostics = [](std::string_view b) { put_bounded(2, b, 1s); };
    auto p = vm::VmProcess::launch(std::move(lo));
    if (!p) {
      launch_error = p.error().message;
      say("neshost run: cannot start QEMU: {}\n", launch_error);
      (void)h.vm_started(id);  // the session then ends as no_ready (125) through vm_exited
      (void)h.vm_exited(id);
      return;
    }
    qemu = std::move(*p);
    (void)h.vm_started(id);
    // A virtiofsd that dies while QEMU runs leaves the guest's requests on that share unanswered
    // (QEMU's vhost-user-fs does not reconnect): shut the VM down in order, so the outcome is
    // recorded and nothing waits forever.
    for (auto& d : daemons) {
      auto& w = daemon_watch.emplace_back(io, ::fcntl(d->pidfd(), F_DUPFD_CLOEXEC, 3));
      w.async_wait(asio::posix::stream_descriptor::wait_read,
                   [&, id, dp = d.get()](boost::system::error_code ec) {
                     // Its exit after QEMU's, or once the outcome is in, is the normal end.
                     if (ec || !qemu || qemu->wait_for(0ms)) return;
                     if (auto* sess = h.session(id); sess && sess->outcome()) return;
                     auto e = dp->exited();
                     say("neshost run: share '{}' ({}): virtiofsd {} while the guest runs; "
                         "shutting the VM down\n", dp->share().tag, dp->share().dir.string(),
                         e ? vm::describe(*e) : "exited");
                     (void)h.shutdown(id);
                   });
    }
    // QEMU's exit, seen through its pidfd on this io_context: reap, drain the console to EOF
    // (so every line precedes our exit), then tell the library.
    exit_watch.emplace(io, ::fcntl(qemu->pidfd(), F_DUPFD_CLOEXEC, 3));
    exit_watch->async_wait(asio::posix::stream_descriptor::wait_read,
                           [&, id](boost::system::error_code) {
                             if (!qemu) return;
                             if (auto e = qemu->wait_for(0ms); e && o.console)
                               say("neshost: qemu {}\n", vm::describe(*e));
                             qemu->finish_output(2s);
                             console->finish();
                             (void)h.vm_exited(id);
                           });
  };
  emb.hooks.destroy = [&](const std::string&, std::uint64_t) {
    if (qemu) qemu->signal(SIGKILL);  // the exit watch reaps it and reports vm_exited
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
    if (m == Milestone::data_error && !o.console) say("neshost run: data channel: {}\n", ev.detail);
    // QEMU connects both chardev sockets at its start; in --sandbox the init dials the data
    // channel only after `boot`, so the runtime dir stays until then.
    if (m == (o.sandbox ? Milestone::data_connected : Milestone::ready)) rt.remove_now();
    if (m == Milestone::started) {
      notify_started(started_notify);
      execs.workload_started();
    }
    if (m == Milestone::outcome) execs.workload_ended();
    if (m == Milestone::finished) {
      // The record as it ends (with what was lost of the output), for our last words; and from
      // here on SIGINT/SIGTERM are read from a signalfd by the last writes below.
      if (auto* sess = hostp ? hostp->session(vmid) : nullptr; sess && sess->outcome()) final_record = *sess->outcome();
      ::sigprocmask(SIG_BLOCK, &stop_signals, nullptr);
    }
    if (o.console)
      say("neshost: {} {}{}{}\n", ev.vm, ev.kind, ev.detail.empty() ? "" : " ", ev.detail);
    // A workload that ran speaks for itself; anything else gets one line saying why.
    if (m == Milestone::outcome && !o.console && ev.outcome &&
        *ev.outcome != proto::Outcome::exited && *ev.outcome != proto::Outcome::signalled)
      say("neshost run: {}\n", ev.detail);
    if (m == Milestone::recorded && o.on_exit == host::OnExitPolicy::keep)
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
  if (qemu) {
    if (!qemu->exit_status()) qemu->terminate(1s);
    qemu->finish_output(2s);
  }
  if (control) control->stop_accepting();  // its handler needs the Host; replies still go out
  exit_watch.reset();
  daemon_watch.clear();
  qemu.reset();
  if (pump) pump->stop();
  {
    boost::system::error_code bec;
    winch.clear(bec);
  }
  raw.reset();  // the terminal as it was (^C is a signal again), before the last writes
  // `neshost exec` clients still taking their output: the loop goes on until each has it all
  // and its final reply (a slow client costs time, never bytes), or until a signal.
  if (!execs.idle()) {
    io.restart();
    bool stop = false;
    asio::posix::stream_descriptor sig(io, ::fcntl(stop_fd.get(), F_DUPFD_CLOEXEC, 3));
    sig.async_wait(asio::posix::stream_descriptor::wait_read, [&](boost::system::error_code ec) { stop = !ec; });
    while (!execs.idle() && !stop && io.run_one()) {
    }
    if (!execs.idle())
      say("neshost run: {} bytes of `neshost exec` output not delivered: interrupted while its readers were still "
          "taking them\n", execs.queued());
  }
  control.reset();
  // The workload's output our readers have not taken yet: written for as long as they live,
  // however slowly they read, until a signal says to give up (counted and said, exit 125). An
  // end the user asked for up front, --timeout, bounds this too (by --grace), keeping its 124.
  const bool timed_out = final_record && final_record->outcome == proto::Outcome::timeout;
  const auto limit = timed_out ? std::optional(o.grace) : std::nullopt;
  for (auto [w, name] : {std::pair{&out, "stdout"}, std::pair{&errw, "stderr"}}) {
    auto f = w->flush(stop_fd.get(), limit);
    if (!f.left) continue;
    if (f.interrupted) {
      say("neshost run: {} bytes of {} lost: {} while its reader was still taking them\n", f.left, name,
          timed_out ? fmt::format("the --timeout ended neshost {} ms later", o.grace.count()) : "interrupted");
      // As host::reported_status(): it overrides the workload's own status, not a host verdict.
      if (!final_record || final_record->outcome == proto::Outcome::exited ||
          final_record->outcome == proto::Outcome::signalled)
        status = host::kStatusOutputLost;
    } else {
      say("neshost run: {} bytes of {} not delivered: its reader went away\n", f.left, name);
    }
  }
  if (final_record)
    for (const auto& line : host::describe_loss(*final_record)) say("neshost run: {}\n", line);
  // QEMU is gone, so each virtiofsd has lost its client and is exiting; reap it (bounded).
  for (auto& d : daemons) {
    auto e = d->stop(2s);
    if (o.console) say("neshost: virtiofsd {} {}\n", d->share().tag, vm::describe(e));
  }
  daemons.clear();
  if (remove_scratch) {
    fs::remove(console_log, ec);
    for (const auto& l : daemon_logs) fs::remove(l, ec);
    const fs::path wl = host::vm_path(cfg.state_dir, vmid, host::kWorkloadLog);
    for (auto& r : host::rotated_logs(wl)) fs::remove(r, ec);
    fs::remove(wl, ec);
  }
  return status;
}

const Registrar run_reg{{"run", "boot a QEMU microVM, run ARGV in it, exit with its status", run_main}};

}  // namespace
}  // namespace nes::cli
