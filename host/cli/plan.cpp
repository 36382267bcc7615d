// `neshost run`'s plan (host/cli/plan.hpp): plan_run() turns its flags (parse_run(),
// host/cli/run_flags.cpp) and a few plain facts about this host into everything the run does.
#include "host/cli/plan.hpp"

#include <algorithm>
#include <cctype>
#include <tuple>

#include <fmt/format.h>

#include "host/lib/log_writer.hpp"
#include "host/lib/record.hpp"
#include "host/vm/passt.hpp"
#include "protocol/codec.hpp"
#include "protocol/channels.hpp"
#include "protocol/limits.hpp"

namespace nes::cli {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

namespace {
/// The shares (virtiofsd daemons) `o` asks for, as plan_shares() makes them: the root over
/// virtiofs, each directory volume, one for all file volumes.
std::size_t share_count(const RunFlags& o) {
  const auto files = std::count_if(o.volumes.begin(), o.volumes.end(), [](const vm::Volume& v) { return v.file; });
  return (o.rootfs && !o.rootfs_initramfs && !o.rootfs_block) + (o.volumes.size() - static_cast<std::size_t>(files)) + (files > 0);
}
}  // namespace

SnapshotRef snapshot_ref(const RunFlags& o) {
  SnapshotRef r;
  r.given = o.snapshot.value_or("");
  r.state = o.state;
  if (o.mem_given) r.flags.insert(r.flags.end(), {"--mem", std::to_string(o.mem)});
  if (o.cpus_given) r.flags.insert(r.flags.end(), {"--cpus", std::to_string(o.cpus)});
  if (o.accel != vm::Accel::auto_probe) r.flags.insert(r.flags.end(), {"--accel", std::string(vm::to_string(o.accel))});
  return r;
}

namespace {
/// `s` as one shell word: as is when it has only [A-Za-z0-9._/=:+-], else single-quoted.
std::string shell_word(std::string_view s) {
  const bool plain = !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || std::string_view("._/=:+-").find(c) != std::string_view::npos;
  });
  if (plain) return std::string(s);
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}
}  // namespace

host::Error snapshot_refusal(const SnapshotRef& ref, host::Error e, bool remake) {
  std::string msg = fmt::format("--snapshot {}: {}", ref.given, e.message);
  // Where the snapshot lives: a NAME in its state directory (std::nullopt: the default one), or a
  // directory of its own (`dir` set, `state` unused).
  std::optional<fs::path> state = ref.state;
  std::optional<fs::path> dir;
  std::string name = ref.given;
  if (ref.given.find('/') != std::string::npos) {
    std::error_code ec;
    fs::path d = fs::absolute(fs::path(ref.given), ec).lexically_normal();
    if (!d.has_filename()) d = d.parent_path();
    name = d.filename().string();
    if (d.parent_path().filename() == vm::kSnapshotsDir && vm::check_snapshot_name(name)) {
      state = d.parent_path().parent_path();
    } else {
      dir = d;
      if (!vm::check_snapshot_name(name)) name = "NAME";
    }
  }
  const std::string at = state ? " --state " + shell_word(state->native()) : "";
  const bool missing = e.err == ENOENT && e.message.starts_with("no snapshot at ");
  if (missing) {
    if (!dir) msg += fmt::format("; `neshost snapshot ls{}` lists the snapshots there", at);
    return host::Error{std::move(msg), e.err};
  }
  if (!remake) return host::Error{std::move(msg), e.err};
  std::string flags;
  for (const auto& f : ref.flags) flags += " " + f;
  if (dir)
    msg += fmt::format(" (make it again: rm -r {0}; neshost snapshot create --state S{1} {2}; mv S/{3}/{2} {0}, "
                       "S being any state directory)",
                       shell_word(dir->native()), flags, shell_word(name), vm::kSnapshotsDir);
  else
    msg += fmt::format(" (make it again: neshost snapshot rm{0} {1}; neshost snapshot create{0}{2} {1})", at,
                       shell_word(name), flags);
  return host::Error{std::move(msg), e.err};
}

host::Status check_run(const RunFlags& o, const PlanInputs& in) {
  using host::Error;
  auto usage = [](std::string m) { return Error{std::move(m)}; };
  if (o.read_only && (!o.rootfs || o.rootfs_initramfs))
    return usage("--read-only needs --rootfs DIR over virtiofs, or an IMAGE");
  // -u names (USER[:GROUP]) are an IMAGE's to resolve (its /etc/passwd, /etc/group)
  if (o.user_spec && !o.image)
    if (auto u = parse_user(*o.user_spec); !u) return usage(u.error().message);
  if (o.sandbox && (!o.volumes.empty() || o.rootfs))
    return usage("--sandbox runs no VM: --volume and --rootfs need one");
  if (o.initrd && o.rootfs && o.rootfs_initramfs)
    return usage("--initrd and --rootfs --rootfs-mode initramfs exclude each other");
  if (o.upper_mib && !o.rootfs_block) return usage("--upper-size needs --rootfs-mode block");
  if (o.rootfs_block && !o.rootfs) return usage("--rootfs-mode block needs --rootfs FILE (an EROFS or ext4 image)");
  if (o.rootfs_block && (!in.rootfs_file || !in.rootfs_fs))
    return usage(fmt::format("--rootfs: {}", in.rootfs_block_error.empty() ? o.rootfs->string() + ": not probed"
                                                                           : in.rootfs_block_error));
  if (o.rootfs && !o.rootfs_block && !in.rootfs_dir)
    return usage(fmt::format("--rootfs: '{}' is not a directory", o.rootfs->string()));
  for (const auto& v : o.volumes)
    if (v.file && in.euid != 0)
      return usage(fmt::format("--volume {}:{}: a single file is bind-mounted into a staging "
                               "share in a private mount namespace, which needs root",
                               v.host.string(), v.guest));
  if (!o.help && o.argv.empty()) return usage("ARGV is required (neshost run [OPTIONS] -- ARGV...)");
  // A snapshot is a booted kernel and init: what would change them is its own, not this run's.
  if (o.snapshot) {
    for (auto [given, flag] : {std::pair{o.sandbox, "--sandbox"}, {o.kernel.has_value(), "--kernel"},
                               {o.initrd.has_value(), "--initrd"}, {o.rootfs_initramfs, "--rootfs-mode initramfs"},
                               {o.rootfs_block, "--rootfs-mode block"},
                               {o.console, "--console"}, {o.grace_given, "--grace"}})
      if (given) {
        const std::string_view f = flag;
        const std::string why =
            f == "--sandbox"   ? "a snapshot is a VM's, and --sandbox runs none"
            : f == "--console" ? "the snapshot's kernel command line (its log level) is kept; the kernel's and the "
                                 "init's messages still go to STATE/VM/console.log"
                               : "a restore keeps the snapshot's kernel, initramfs, command line and grace";
        const std::string how = f == "--kernel"   ? " (a snapshot of another kernel: NESHOST_KERNEL=PATH neshost snapshot create NAME)"
                                : f == "--initrd" ? " (a snapshot of another initramfs: NESHOST_INITRD=PATH neshost snapshot create NAME)"
                                : f == "--grace"  ? " (a snapshot with another: neshost snapshot create --grace SECS NAME)"
                                                  : "";
        return usage(fmt::format("{} cannot be used with --snapshot: {}{}", flag, why, how));
      }
    // A restore plugs each share into a root port of its own, the NIC into the last one.
    const std::size_t shares = share_count(o);
    const bool nic = o.network.mode != host::NetworkMode::none;
    if (shares + nic > vm::kHotplugPorts)
      return usage(fmt::format("--snapshot: a restore plugs in at most {} shares{}, one hot-plug port each; this run "
                               "has {} (each -v/--volume directory, --rootfs, and all file volumes together are one "
                               "each){}",
                               vm::kHotplugPorts - nic, nic ? " beside its NIC" : "", shares,
                               nic ? "; --network none frees the NIC's port" : ""));
  }
  // The network: bad input is refused before anything starts.
  const auto& net = o.network;
  if (o.sandbox && (net.mode != host::NetworkMode::none || !net.hosts.empty() || !net.dns.empty() ||
                    !net.dns_search.empty() || !net.dns_options.empty()))
    return Error{net.mode == host::NetworkMode::none
                        ? std::string("--sandbox runs no VM and shares this host's network: --dns, --dns-search, "
                                      "--dns-option and --add-host need one")
                        : fmt::format("--sandbox runs no VM and shares this host's network: --network {}{} needs one "
                                      "(--network none only)",
                                      host::to_string(net.mode), o.network_from_env ? " (from $NESHOST_NETWORK)" : "")};
  if (auto c = host::check_network(net); !c) return c;
  return host::Ok{};
}

namespace {

/// The session: the descriptor's exec, stdio and hostname, and the host's policy.
host::SessionConfig plan_session(const RunFlags& o, const PlanInputs& in) {
  host::SessionConfig s;
  s.vm = o.vm ? *o.vm : in.vm_id;
  s.on_exit = o.on_exit;
  s.ready_timeout = o.ready_timeout;
  s.wall_timeout = o.timeout;
  s.wall_from_started = true;  // the workload's limit, not the boot's
  // The host's deadline from `shutdown` to QEMU's exit must cover the guest's own grace (SIGTERM
  // .. SIGKILL) plus its report and power-off, or a slow workload's outcome would be cut off.
  s.stop_timeout = o.grace + 5s;
  // --grace is also how long the host waits after `stop` for the outcome before `shutdown`
  // (`docker stop -t`): one grace for both ends, not the library's 10 s default.
  s.grace = o.grace;
  auto& ex = s.descriptor.exec;
  ex.argv = o.argv;
  ex.env = o.env;
  // docker's default PATH when the user gave none (the init would resolve argv[0] without it, but
  // the workload's own children need it too).
  ex.env.try_emplace("PATH", proto::kDefaultPath);
  ex.cwd = o.workdir;
  ex.uid = o.uid;
  ex.gid = o.gid;
  ex.groups = o.groups;
  // As docker's default (the container's id): a VM without -h is named after its id. Not in the
  // sandbox, which shares the machine's UTS namespace and would only warn about it.
  s.descriptor.hostname = o.hostname || o.sandbox ? o.hostname : std::optional<std::string>(s.vm);
  s.descriptor.on_exit.terminal = o.on_exit != host::OnExitPolicy::keep;
  // The workload's stdio on the data channel: stdin only with -i (else /dev/null, as docker), a
  // PTY sized like our terminal with -t.
  proto::Stdio stdio;
  stdio.attach_stdin = o.interactive;
  // What the init holds unsent per stream when the workload exits must fit its bounded final
  // flush before power-off (about 1 s; virtio-serial under TCG moves a few MB/s): 256 KiB, not
  // the 1 MiB default. Flow control keeps the stream lossless either way.
  stdio.buffer_bytes = 256u << 10;
  if (o.tty) {
    TermSize t = in.terminal.value_or(TermSize{});
    stdio.terminal = proto::Terminal{t.rows, t.cols};
  }
  s.descriptor.stdio = stdio;
  return s;
}

/// Shares: one virtiofsd each, the root first (docs/vm.md "Shares"); their mounts go into the
/// descriptor. Error: file volumes without a staging directory.
host::Status plan_shares(const RunFlags& o, const PlanInputs& in, RunPlan& p) {
  auto& desc = p.serve.session.descriptor;
  auto daemon = [&](std::string tag, const fs::path& dir, bool ro) -> vm::VirtiofsdOptions& {
    vm::VirtiofsdOptions vo;
    vo.program = in.virtiofsd;
    vo.socket = p.runtime_dir / (tag + ".sock");
    vo.share = {std::move(tag), dir, ro};
    return p.daemons.emplace_back(std::move(vo));
  };
  if (o.rootfs && o.rootfs_block) {
    // A block root: no daemon; the disk is QEMU's (plan_from), found by the guest by its serial.
    desc.root = proto::Root{std::string(kRootShareTag), o.read_only, *in.rootfs_fs, o.upper_mib};
  } else if (o.rootfs && !o.rootfs_initramfs) {
    daemon(std::string(kRootShareTag), *in.rootfs_dir, o.read_only).overlay = o.rootfs_overlay;
    desc.root = proto::Root{std::string(kRootShareTag), o.read_only, proto::FsType::virtiofs};
  }
  // File volumes: one staging share for all of them. Each entry is both the daemon's bind (the
  // host's file onto staging file N) and the guest's bind mount (kFileShareAt/N at `guest`),
  // both made from it here, so the two cannot disagree.
  std::vector<vm::FileBind> binds;
  std::vector<proto::Mount> file_mounts;
  for (std::size_t i = 0; i < o.volumes.size(); ++i) {
    const auto& v = o.volumes[i];
    if (v.file) {
      // virtiofsd serves directories: the file is bind-mounted (in the daemon's own mount
      // namespace) onto an empty file of a staging directory, shared once for every file volume;
      // the guest binds each at its place after every directory is mounted.
      if (!in.staging_dir) return host::Error{fmt::format("--volume {}: no staging directory", v.host.string())};
      const std::string n = std::to_string(binds.size());
      binds.push_back({v.host, *in.staging_dir / n, v.ro});
      file_mounts.push_back(proto::Mount{fmt::format("{}/{}", kFileShareAt, n), v.guest, v.ro, proto::FsType::bind});
      continue;
    }
    std::string tag = fmt::format("nes.v{}", i);
    desc.mounts.push_back(proto::Mount{tag, v.guest, v.ro, proto::FsType::virtiofs});
    daemon(std::move(tag), v.host, v.ro);
  }
  if (!binds.empty()) {
    bool all_ro = std::all_of(binds.begin(), binds.end(), [](const auto& b) { return b.ro; });
    daemon(std::string(kFileShareTag), *in.staging_dir, all_ro).binds = std::move(binds);
    desc.mounts.push_back(
        proto::Mount{std::string(kFileShareTag), std::string(kFileShareAt), all_ro, proto::FsType::virtiofs});
    desc.mounts.insert(desc.mounts.end(), file_mounts.begin(), file_mounts.end());
  }
  return host::Ok{};
}

/// The kernel command line: the channel, the console's verbosity, the init's log level.
/// The guest's kernel modules, as `nesinit.modules=…` (the init loads only their groups, built by
/// scripts/mkinitrd.sh): the virtio-serial channel's (virtio_pci, virtio_console), virtio_net
/// for a NIC, virtiofs for shares; a snapshot's machine (PlanInputs::snapshot_machine) both, as a
/// restore may plug in either; virtio_blk for a block root. Not vsock (the channel is a virtio
/// port here): each module not loaded is boot time saved (docs/vm.md "Boot"). A block root's
/// erofs and overlay are the lean kernel's built-ins (kernel/nesinit.config).
std::string guest_modules(const RunPlan& p, const PlanInputs& in) {
  std::string m = "nesinit.modules=virtio_pci,virtio_console";
  if (p.network.mode != host::NetworkMode::none || in.snapshot_machine) m += ",virtio_net";
  if (!p.daemons.empty() || in.snapshot_machine) m += ",virtiofs";
  if (p.qemu_block) m += ",virtio_blk";
  return m;
}

vm::KernelCmdline plan_cmdline(const RunFlags& o, const PlanInputs& in, const RunPlan& p) {
  vm::KernelCmdline kc;
  kc.console = o.console ? vm::ConsoleLevel::full : vm::ConsoleLevel::quiet;
  // A 1-vCPU TCG guest gets the boot words that spare TCG's own costs (P12,
  // bench/results/latest.md; vm::KernelCmdline::tcg_words says why not with 2+ vCPUs or KVM);
  // $NESHOST_TCG_BOOT_WORDS=0 leaves them out (the steps' A/B).
  kc.tcg_words = in.accel == vm::Accel::tcg && o.cpus == 1 && in.tcg_boot_words;
  kc.extra = {"edd=off",  // the boot stub's "Probing EDD" line, before any log level applies
              fmt::format("nesinit.grace_ms={}", o.grace.count())};
  // The data channel's port, named (it is also the init's default next to virtio-port:nes.0).
  kc.extra.push_back(std::string("nesinit.data=virtio-port:") + proto::kDataPortName);
  kc.extra.push_back(guest_modules(p, in));
  // Extra kernel arguments for debugging (e.g. nesinit.log=debug), appended last.
  if (!in.append.empty()) kc.extra.push_back(in.append);
  return kc;
}

}  // namespace

fs::path run_kernel(const RunFlags& o, const PlanInputs& in) { return o.kernel ? *o.kernel : in.default_kernel; }

void env_inputs(PlanInputs& in) {
  if (const char* a = std::getenv("NESHOST_APPEND"); a && *a) in.append = a;
  const char* w = std::getenv("NESHOST_TCG_BOOT_WORDS");
  in.tcg_boot_words = !(w && std::string_view(w) == "0");
  if (const char* tb = std::getenv("NESHOST_TCG_TB_MIB"); tb && *tb) {
    // A measuring knob (bench P16's A/B): digits only, else the default stays.
    std::uint32_t v = 0;
    bool ok = std::string_view(tb).size() <= 5;
    for (const char* c = tb; ok && *c; ++c) ok = *c >= '0' && *c <= '9', v = v * 10 + static_cast<std::uint32_t>(*c - '0');
    if (ok) in.tcg_tb_mib = v;
  }
  if (const char* f = std::getenv("NESHOST_FREE_PAGE_REPORTING"); f && (std::string_view(f) == "0" || std::string_view(f) == "1"))
    in.free_page_reporting = *f == '1';  // a measuring knob too: any other value keeps the default
}

namespace {
/// plan_run() once its flags are checked (and, for a restore, the snapshot's grace taken).
host::Result<RunPlan> plan_from(const RunFlags& o, const PlanInputs& in);
}  // namespace

host::Result<RunPlan> plan_run(const RunFlags& o, const PlanInputs& in) {
  if (auto c = check_run(o, in); !c) return c.error();
  if (o.snapshot && !in.snapshot) return host::Error{fmt::format("--snapshot {}: not loaded", *o.snapshot)};
  if (!in.snapshot) return plan_from(o, in);
  // The guest's grace is the snapshot's (recorded in snapshot.json): the host's deadlines follow
  // it, as they follow --grace on a cold boot.
  RunFlags g = o;
  g.grace = std::chrono::milliseconds(in.snapshot->grace_ms);
  return plan_from(g, in);
}

namespace {
host::Result<RunPlan> plan_from(const RunFlags& o, const PlanInputs& in) {
  RunPlan p;
  p.serve.session = plan_session(o, in);
  p.vm = p.serve.session.vm;
  p.state_dir = p.serve.state_dir = o.state ? *o.state : in.state_dir;
  p.runtime_dir = in.runtime_dir;
  p.channel_socket = in.runtime_dir / "channel.sock";
  p.data_socket = in.runtime_dir / "data.sock";
  p.serve.listen.kind = host::ListenSpec::Kind::unix_path;
  p.serve.listen.path = p.channel_socket.string();
  p.sandbox = o.sandbox;
  p.mkinitrd = in.mkinitrd;
  p.nesinit = in.nesinit;
  if (!o.sandbox) {
    // No kernel, no initramfs in the sandbox: the init runs on this host.
    p.kernel = run_kernel(o, in);
    if (o.rootfs && o.rootfs_initramfs) {
      p.initrd = in.runtime_dir / "initrd.cpio";
      p.initrd_from = *in.rootfs_dir;
    } else {
      p.initrd = o.initrd ? *o.initrd : in.default_initrd;
    }
  }
  if (auto s = plan_shares(o, in, p); !s) return s.error();
  // check_run() refused too many shares for the hot-plug ports by share_count(); the daemons
  // planned here are what a restore plugs in, so a count that ever disagrees fails here, before
  // anything starts, not at QMP's device_add.
  if (o.snapshot && p.daemons.size() + (o.network.mode != host::NetworkMode::none) > vm::kHotplugPorts)
    return host::Error{fmt::format("--snapshot: {} shares planned, more than the {} hot-plug ports (share_count() "
                                   "said {})", p.daemons.size(), vm::kHotplugPorts, share_count(o))};
  // The network (netns mode: `link` filled by the caller from the namespace, else an error here).
  p.network = o.network;
  auto guest_net = host::guest_network(p.network);
  if (!guest_net) return guest_net.error();
  p.serve.session.descriptor.network = std::move(*guest_net);
  p.passt = !o.sandbox && p.network.mode == host::NetworkMode::passt;
  for (const auto& m : p.network.publish) p.ports.push_back(host::ps_port_text(m));
  p.rm = o.rm;
  p.vmm_survives = o.detach || o.vmm_outlives;
  if (p.vmm_survives) p.serve.session.reconnect = kDetachedReconnect;
  p.qemu_block = !o.sandbox && o.rootfs && o.rootfs_block;
  p.cmdline = plan_cmdline(o, in, p);
  if (o.sandbox) {
    p.sandbox_argv = {"unshare", "--pid", "--fork", "--mount-proc", "--kill-child", in.nesinit.string(),
                      "--channel=unix:" + p.channel_socket.string(),
                      // Dialled only for a descriptor with `stdio`; where `run` listens for it.
                      "--data-channel=unix:" + p.data_socket.string(),
                      fmt::format("--grace-ms={}", o.grace.count()), o.console ? "--log=info" : "--log=quiet"};
  } else {
    vm::QemuSpec spec;
    spec.kernel = p.kernel;
    spec.initrd = p.initrd;
    spec.append = vm::kernel_cmdline(p.cmdline);
    spec.mem_mib = o.mem;
    spec.cpus = o.cpus;
    spec.accel = in.accel;
    spec.tcg_tb_mib = in.tcg_tb_mib;
    spec.free_page_reporting = in.free_page_reporting;
    spec.channel_socket = p.channel_socket;
    spec.data_socket = p.data_socket;
    spec.qmp_socket = in.runtime_dir / "qmp.sock";  // pause/unpause (host/monitor/pause.hpp)
    if (p.vmm_survives) spec.chardev_reconnect_s = 1;  // QEMU redials a replacement monitor's listeners
    spec.snapshot_layout = in.snapshot_machine;  // a snapshot's machine: what a restore starts too
    if (in.snapshot) {
      // A restore: the snapshot's machine, paused until its state is loaded; the shares and the
      // NIC are plugged in after the load (docs/vm.md "Snapshots").
      const auto& m = *in.snapshot;
      // The kernel and initramfs checked against the snapshot's (run.cpp: vm::check_snapshot).
      p.kernel = spec.kernel = in.default_kernel;
      p.initrd = in.default_initrd;
      spec.initrd = in.default_initrd;
      spec.append = m.append;
      spec.mem_mib = m.mem_mib;
      spec.cpus = m.cpus;
      spec.firmware = m.firmware;
      spec.snapshot_layout = spec.incoming = true;
      for (const auto& d : p.daemons) p.hotplug_shares.push_back({d.share.tag, d.socket});
      // RAM: copy-on-write over the snapshot's file; with shares (vhost-user maps guest memory,
      // so it must be shared) a private copy, a memfd. Either is a descriptor run.cpp opened
      // and checked (vm::open_snapshot) and QEMU inherits.
      spec.ram_file = vm::QemuSpec::RamFile{fmt::format("/proc/self/fd/{}", kRamChildFd), !p.hotplug_shares.empty()};
      if (p.network.mode != host::NetworkMode::none) {
        // The backend on the command line (-netdev), the device plugged in on the last port.
        host::NetBackendIo io;
        if (p.passt) io.passt_fd = vm::kPasstChildFd;
        auto nic = host::qemu_net_args(p.network, io);
        if (!nic) return nic.error();
        for (std::size_t i = 0; i + 1 < nic->size(); i += 2)
          if ((*nic)[i] == "-netdev") spec.net_args.insert(spec.net_args.end(), {(*nic)[i], (*nic)[i + 1]});
        auto dev = host::qmp_nic_device(p.network, vm::hotplug_port(vm::kHotplugPorts - 1));
        if (!dev) return dev.error();
        p.hotplug_nic = std::move(*dev);
      }
      p.serve.session.saved_ready = m.ready;
      p.snapshot = m;
      p.snapshot_dir = in.snapshot_dir;
      p.snapshot_ref = snapshot_ref(o);
    } else {
      for (const auto& d : p.daemons) spec.fs_devices.push_back({d.share.tag, d.socket});
      // A block root: the image file read-only (every VM of it shares the file), its serial the tag.
      if (o.rootfs && o.rootfs_block) spec.block_devices.push_back({*in.rootfs_file, std::string(kRootShareTag), true});
      host::NetBackendIo io;
      if (p.passt) io.passt_fd = vm::kPasstChildFd;
      auto nic = host::qemu_net_args(p.network, io);
      if (!nic) return nic.error();
      spec.net_args = std::move(*nic);
    }
    p.qemu = std::move(spec);
  }
  p.interactive = o.interactive;
  p.stdin_hold = o.stdin_hold;
  p.tty = o.tty;
  p.raw_terminal = o.tty && o.interactive && in.stdin_is_tty;
  p.console = o.console;
  p.workload_log.max_size = o.log_max_size;
  p.workload_log.max_files = o.log_max_files;
  p.grace = o.grace;
  p.command = o.argv;
  return p;
}
}  // namespace

}  // namespace nes::cli
