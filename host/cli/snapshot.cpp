// `neshost snapshot create|ls|rm`: a VM booted until its init waits for its descriptor, saved, to
// be restored by `neshost run --snapshot NAME` (docs/vm.md "Snapshots"; host/vm/snapshot.hpp).
#include "host/cli/snapshot.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>

#include <fmt/format.h>

#include "host/cli/cli.hpp"
#include "host/cli/flags.hpp"
#include "host/cli/run_flags.hpp"
#include "host/lib/endpoint.hpp"
#include "host/lib/record.hpp"
#include "host/lib/state_dir.hpp"
#include "host/vm/process.hpp"
#include "host/vm/qmp.hpp"
#include "host/vm/snapshot.hpp"
#include "protocol/codec.hpp"

namespace nes::cli {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr std::string_view kSnapshotHelp = R"(usage: neshost snapshot create [OPTIONS] NAME
       neshost snapshot ls [--state DIR]
       neshost snapshot rm [--state DIR] NAME...

create: boot a microVM as `neshost run` would (the same kernel and initramfs: $NESHOST_KERNEL and
$NESHOST_INITRD, else the build's; the same kernel command line and accelerator) up to the point
just before it would start a workload, and save it in STATE/.snapshots/NAME (its RAM as a sparse
file, QEMU's device state, snapshot.json). Prints NAME on stdout, the boot and save times on
stderr. `neshost run --snapshot NAME ...` then restores a VM from it instead of booting one: each
restore is its own VM (its own id, generation, guest randomness and clock; shares and the NIC are
plugged in after the restore). A restore refuses a snapshot (125, nothing started) that is missing
or corrupt, or made with another initramfs (every rebuild of the init makes one), kernel, QEMU,
accelerator, --mem or --cpus; make it again: neshost snapshot rm NAME; neshost snapshot create
NAME. A snapshot file touched since it was made is hashed at each restore (slower, still checked).
ls: the snapshots in STATE, from their snapshot.json (NAME, when made, RAM, vCPUs, state bytes).
rm: removes each NAME; a VM restored from it runs on (it holds its RAM file open).

Options (create), `neshost run`'s own (the same checks and defaults): every restore runs with its
--mem and --cpus, and its --grace (`run --snapshot` takes no --grace);
--ready-timeout bounds the boot until the init is ready.
)";

constexpr std::string_view kSnapshotExit =
    R"(Exit: create 0 done, 125 usage (nothing started) or the snapshot could not be made (nothing is
left), 130 interrupted (SIGINT/SIGTERM; nothing is left); ls 0; rm 0, or 1 if a NAME was not there.
)";

/// `neshost snapshot --help`: the prose, create's option lines from run's table, the exits.
std::string snapshot_help() {
  return std::string(kSnapshotHelp) + flag_help(snapshot_create_flags()) + std::string(kSnapshotExit);
}

constexpr FlagSpec kStateFlags[] = {{"state"}};

std::chrono::milliseconds left(Clock::time_point d) {
  auto l = std::chrono::duration_cast<std::chrono::milliseconds>(d - Clock::now());
  return l.count() < 0 ? 0ms : l;
}

/// Waits until `fd` is readable, before `deadline`. Errors (naming `what`): QEMU (`pidfd`) exited,
/// a stop signal arrived (`sigfd`: SIGINT, SIGTERM, SIGHUP), or the deadline passed.
host::Status wait_readable(int fd, int pidfd, int sigfd, Clock::time_point deadline, std::string_view what) {
  for (;;) {
    pollfd p[3] = {{fd, POLLIN, 0}, {pidfd, POLLIN, 0}, {sigfd, POLLIN, 0}};
    int n = ::poll(p, 3, static_cast<int>(left(deadline).count()));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return host::errno_error(errno, "poll");
    if (n == 0) return host::Error{fmt::format("{}: not in time (--ready-timeout)", what)};
    if (p[2].revents & POLLIN) return host::Error{fmt::format("{}: stopped by a signal", what)};
    if (p[0].revents & (POLLIN | POLLHUP)) return host::Ok{};
    if (p[1].revents & POLLIN) return host::Error{fmt::format("{}: QEMU exited first", what)};
  }
}

/// Accepts one connection on `listener` (non-blocking) within wait_readable()'s bounds.
host::Result<host::Fd> accept_one(int listener, int pidfd, int sigfd, Clock::time_point deadline, std::string_view what) {
  for (;;) {
    if (auto w = wait_readable(listener, pidfd, sigfd, deadline, what); !w) return w.error();
    host::Fd c(::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC));
    if (c) return c;
    if (errno != EAGAIN && errno != EINTR) return host::errno_error(errno, "accept");
  }
}

/// The guest's first line on the lifecycle channel (its `ready`), bounded in bytes (64 KiB) and
/// by wait_readable().
host::Result<std::string> read_ready(int fd, int pidfd, int sigfd, Clock::time_point deadline) {
  std::string line;
  for (;;) {
    if (auto nl = line.find('\n'); nl != std::string::npos) {
      if (nl + 1 != line.size()) return host::Error{"the guest said more than `ready` before its descriptor"};
      line.pop_back();
      return line;
    }
    if (line.size() > 64 * 1024) return host::Error{"the guest's first line is longer than 64 KiB"};
    if (auto w = wait_readable(fd, pidfd, sigfd, deadline, "the guest's `ready`"); !w) return w.error();
    char buf[4096];
    ssize_t got = ::read(fd, buf, sizeof buf);
    if (got < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (got < 0) return host::errno_error(errno, "read the channel");
    if (got == 0) return host::Error{"the channel closed before the guest said `ready`"};
    line.append(buf, static_cast<std::size_t>(got));
  }
}

/// Removes `.NAME.PID.tmp` directories under `root` whose creating process is gone (a create
/// killed with SIGKILL runs no destructor).
void sweep_stale(const fs::path& root) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const std::string n = e.path().filename().string();
    if (n.size() < 6 || n.front() != '.' || !n.ends_with(".tmp")) continue;
    const auto dot = n.rfind('.', n.size() - 5);
    if (dot == std::string::npos || dot == 0) continue;
    const long pid = std::strtol(n.c_str() + dot + 1, nullptr, 10);
    if (pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) fs::remove_all(e.path(), ec);
  }
}

/// A new file of ours: O_EXCL, mode 0600 from its creation (it will hold guest memory).
host::Result<host::Fd> create_private(const fs::path& p) {
  host::Fd fd(::open(p.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!fd) return host::errno_error(errno, fmt::format("create {}", p.string()));
  return fd;
}

int create(const Args& args) {
  // The machine: run's own entries for the flags create takes (the same checks and defaults).
  auto flags = parse_run_with(snapshot_create_flags(), args, FlagOrder::anywhere);
  if (!flags) return usage_error("snapshot", flags.error().message);
  if (flags->help) { fmt::print("{}", snapshot_help()); return 0; }
  if (flags->argv.size() != 1) return usage_error("snapshot", "create takes one NAME");
  const std::string name = flags->argv[0];
  if (auto c = vm::check_snapshot_name(name); !c) return usage_error("snapshot", c.error().message);
  if (auto c = check_run_host(*flags, real_host_probes()); !c) return usage_error("snapshot", c.error().message);
  const fs::path state = flags->state ? *flags->state : default_state_dir();
  auto fail = [&](std::string_view why) {
    fmt::print(stderr, "neshost snapshot create {}: {}\n", name, why);
    return 125;
  };
  // SIGINT/SIGTERM/SIGHUP end the waits below through a signalfd, so every return path cleans up.
  sigset_t stop;
  sigemptyset(&stop);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&stop, sig);
  ::sigprocmask(SIG_BLOCK, &stop, nullptr);
  host::Fd sigfd(::signalfd(-1, &stop, SFD_CLOEXEC | SFD_NONBLOCK));
  if (!sigfd) return fail(fmt::format("signalfd: {}", std::strerror(errno)));

  const fs::path dir = snapshot_path(state, name);
  if (auto s = host::make_dirs_durable(dir.parent_path()); !s) return fail(s.error().message);
  sweep_stale(dir.parent_path());
  std::error_code ec;
  if (fs::exists(dir, ec))
    return fail(fmt::format("{} exists (neshost snapshot rm{} {} first)", dir.string(),
                            flags->state ? " --state " + flags->state->string() : "", name));
  // Built beside its final place and renamed there once whole: a snapshot is all there or absent.
  // Mode 0700 from its creation; removed on every return (a SIGKILLed create's: sweep_stale()).
  const fs::path wpath = dir.parent_path() / fmt::format(".{}.{}.tmp", name, ::getpid());
  if (::mkdir(wpath.c_str(), 0700) != 0) return fail(fmt::format("mkdir {}: {}", wpath.string(), std::strerror(errno)));
  RuntimeDir work(wpath);
  RuntimeDir rt;
  if (rt.path.empty()) return fail(fmt::format("mkdtemp $TMPDIR/neshost-XXXXXX: {}", std::strerror(errno)));

  auto spec = snapshot_machine(*flags, rt.path);
  if (!spec) return fail(spec.error().message);
  // What it boots, hashed before it boots: a rebuild meanwhile is caught below.
  auto k = vm::hash_file(spec->kernel);
  auto i = vm::hash_file(*spec->initrd);
  if (!k || !i) return fail(!k ? k.error().message : i.error().message);
  spec->channel_socket = rt.path / "channel.sock";
  spec->data_socket = rt.path / "data.sock";
  spec->qmp_socket = rt.path / "qmp.sock";
  // The guest's RAM is the snapshot's file from its first byte (ours, 0600, before QEMU sizes it):
  // nothing of it goes through the migration stream (x-ignore-shared).
  const fs::path ram_file = work.path / vm::kSnapshotRamFile;
  const fs::path state_file = work.path / vm::kSnapshotStateFile;
  auto ram_fd = create_private(ram_file);
  auto state_fd = create_private(state_file);
  if (!ram_fd || !state_fd) return fail(!ram_fd ? ram_fd.error().message : state_fd.error().message);
  spec->ram_file = vm::QemuSpec::RamFile{ram_file, true};
  host::UnixListenOptions lo;
  lo.path = spec->channel_socket->string();
  auto chan = host::listen_unix(lo);
  if (!chan) return fail(chan.error().message);
  lo.path = spec->data_socket->string();
  auto data = host::listen_unix(lo);
  if (!data) return fail(data.error().message);
  auto argv = vm::qemu_argv(*spec);
  if (!argv) return fail(argv.error().message);

  const auto t0 = Clock::now();
  vm::LaunchOptions l;
  l.argv = *argv;
  l.console = [](std::string_view) {};
  l.diagnostics = [](std::string_view) {};
  auto qemu = vm::VmProcess::launch(std::move(l));
  if (!qemu) return fail(fmt::format("cannot start QEMU: {}", qemu.error().message));
  auto& q = **qemu;  // its destructor kills and reaps it on every path
  auto end = [&](std::string_view why) {
    q.terminate(1s);
    if (pollfd pf{sigfd.get(), POLLIN, 0}; ::poll(&pf, 1, 0) == 1) {
      fmt::print(stderr, "neshost snapshot create {}: interrupted; nothing saved\n", name);
      return 130;
    }
    std::string tail = q.diagnostics_tail();
    while (!tail.empty() && std::isspace(static_cast<unsigned char>(tail.back()))) tail.pop_back();
    return fail(tail.empty() ? std::string(why) : fmt::format("{} (QEMU: {})", why, tail));
  };
  const auto deadline = Clock::now() + flags->ready_timeout;
  auto c0 = accept_one(chan->get(), q.pidfd(), sigfd.get(), deadline, "QEMU's channel");
  if (!c0) return end(c0.error().message);
  auto c1 = accept_one(data->get(), q.pidfd(), sigfd.get(), deadline, "QEMU's data channel");
  if (!c1) return end(c1.error().message);
  auto ready = read_ready(c0->get(), q.pidfd(), sigfd.get(), deadline);
  if (!ready) return end(ready.error().message);
  // Only an init that speaks our protocol is worth saving: its `ready` is checked now, not at
  // each restore.
  auto decoded = proto::decode_guest(*ready);
  const auto* msg = std::get_if<proto::GuestMessage>(&decoded);
  const auto* r = msg ? std::get_if<proto::Ready>(msg) : nullptr;
  if (!r || r->resume) return end(fmt::format("the guest's first line is not a fresh `ready`: {}", *ready));
  if (r->protocol_version != proto::kProtocolVersion)
    return end(fmt::format("the init speaks protocol {}, this neshost {}", r->protocol_version, proto::kProtocolVersion));
  const auto booted = Clock::now();

  auto qmp = vm::Qmp::connect(*spec->qmp_socket, 5s);
  if (!qmp) return end(qmp.error().message);
  if (auto s = vm::save_vm_state(*qmp, *state_fd, 120s); !s) return end(s.error().message);
  const auto saved = Clock::now();
  (void)qmp->execute("quit", "", 2s);
  q.terminate(2s);

  vm::SnapshotMeta m;
  m.name = name;
  m.created = host::format_rfc3339(host::wall_now());
  m.qemu_version = qmp->qemu_version();
  m.accel = std::string(vm::to_string(spec->accel));
  m.mem_mib = spec->mem_mib;
  m.cpus = spec->cpus;
  m.grace_ms = static_cast<std::uint32_t>(flags->grace.count());  // parse_run: 1 ms .. 31 days
  m.firmware = spec->firmware;
  m.append = spec->append;
  m.ready = *ready;
  m.kernel = *k;
  m.initrd = *i;
  // The kernel and initramfs must still be what booted (a rebuild meanwhile: the RAM holds the old).
  if (auto c = vm::same_file("kernel", spec->kernel, m.kernel); !c) return fail(c.error().message + " (changed while booting)");
  if (auto c = vm::same_file("initramfs", *spec->initrd, m.initrd); !c) return fail(c.error().message + " (changed while booting)");
  // Both files durable before the metadata that vouches for them; the directory renamed last.
  for (const auto* fd : {&*ram_fd, &*state_fd})
    if (::fsync(fd->get()) != 0) return fail(fmt::format("fsync: {}", std::strerror(errno)));
  auto st = vm::hash_file(state_file);
  auto ram = vm::hash_file(ram_file);
  if (!st || !ram) return fail(!st ? st.error().message : ram.error().message);
  m.state = *st;
  m.state.path = vm::kSnapshotStateFile;
  m.ram = *ram;
  m.ram.path = vm::kSnapshotRamFile;
  if (auto s = host::write_durable(work.path, vm::kSnapshotMetaFile, vm::encode_snapshot_meta(m) + "\n"); !s)
    return fail(s.error().message);
  // Never over another: a snapshot made meanwhile under this name wins.
  if (::renameat2(AT_FDCWD, work.path.c_str(), AT_FDCWD, dir.c_str(), RENAME_NOREPLACE) != 0)
    return fail(fmt::format("rename {} -> {}: {}", work.path.string(), dir.string(), std::strerror(errno)));
  work.path.clear();
  if (host::Fd d(::open(dir.parent_path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)); d) ::fsync(d.get());
  using std::chrono::duration_cast;
  using std::chrono::milliseconds;
  fmt::print("{}\n", name);
  fmt::print(stderr, "neshost snapshot: {}: booted in {} ms, saved in {} ms ({} bytes of device state, {} MiB RAM, {})\n",
             name, duration_cast<milliseconds>(booted - t0).count(), duration_cast<milliseconds>(saved - booted).count(),
             m.state.bytes, m.mem_mib, m.accel);
  return 0;
}

int list(const Args& args) {
  auto p = parse_flags(kStateFlags, args);
  if (!p) return usage_error("snapshot", p.error().message);
  if (p->help) { fmt::print("{}", snapshot_help()); return 0; }
  if (!p->positional.empty()) return usage_error("snapshot", "ls takes no NAME");
  const fs::path state = p->get("state") ? fs::path(*p->get("state")) : default_state_dir();
  const fs::path root = snapshot_path(state, "x").parent_path();
  sweep_stale(root);
  fmt::print("{:<24} {:<32} {:>8} {:>5} {:>12}\n", "NAME", "CREATED", "MEM(MiB)", "CPUS", "STATE(bytes)");
  std::error_code ec;
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const std::string n = e.path().filename().string();
    if (vm::check_snapshot_name(n)) names.push_back(n);
  }
  std::sort(names.begin(), names.end());
  // The metadata only (a restore checks the files): listing never reads guest memory.
  for (const auto& n : names) {
    auto m = vm::read_snapshot_meta(root / n);
    if (!m) {
      fmt::print("{:<24} unusable: {}\n", n, m.error().message);
      continue;
    }
    fmt::print("{:<24} {:<32} {:>8} {:>5} {:>12}\n", n, m->created, m->mem_mib, m->cpus, m->state.bytes);
  }
  return 0;
}

int remove(const Args& args) {
  auto p = parse_flags(kStateFlags, args);
  if (!p) return usage_error("snapshot", p.error().message);
  if (p->help) { fmt::print("{}", snapshot_help()); return 0; }
  if (p->positional.empty()) return usage_error("snapshot", "rm takes NAME...");
  for (const auto& n : p->positional)  // every name checked before any is removed
    if (auto c = vm::check_snapshot_name(n); !c) return usage_error("snapshot", c.error().message);
  const fs::path state = p->get("state") ? fs::path(*p->get("state")) : default_state_dir();
  int status = 0;
  for (const auto& n : p->positional) {
    std::error_code ec;
    const fs::path dir = snapshot_path(state, n);
    if (!fs::exists(dir / vm::kSnapshotMetaFile, ec)) {
      fmt::print(stderr, "neshost snapshot rm: no snapshot '{}' in {}\n", n, state.string());
      status = 1;
      continue;
    }
    // A restore maps `ram` through its own descriptor: unlinking it under a running VM is safe.
    fs::remove_all(dir, ec);
    if (ec) {
      fmt::print(stderr, "neshost snapshot rm: {}: {}\n", dir.string(), ec.message());
      status = 1;
      continue;
    }
    fmt::print("{}\n", n);
  }
  return status;
}

int snapshot_main(const Args& args) {
  if (args.empty()) {
    fmt::print(stderr, "{}", snapshot_help());
    return kExitUsage;
  }
  if (args[0] == "--help" || args[0] == "-h") {
    fmt::print("{}", snapshot_help());
    return 0;
  }
  const Args rest(args.begin() + 1, args.end());
  if (args[0] == "create") return create(rest);
  if (args[0] == "ls") return list(rest);
  if (args[0] == "rm") return remove(rest);
  return usage_error("snapshot", fmt::format("unknown subcommand '{}' (create, ls, rm)", args[0]));
}

const Registrar reg{{"snapshot", "save a booted, waiting microVM; `run --snapshot` restores it", snapshot_main}};

}  // namespace
}  // namespace nes::cli
