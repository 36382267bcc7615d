// `neshost run`'s plan: from its parsed flags, and the few facts about this host it needs (passed
// in as plain values), to everything the run will do: the boot descriptor, the shares and their
// daemons, the kernel command line, the QEMU spec (or the --sandbox command), the host side's
// stdio and timeouts. One pure function, plan_run(); run.cpp gathers its inputs and carries the
// plan out (docs/vm.md "`neshost run`").
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "host/cli/cli.hpp"
#include "host/cli/flags.hpp"
#include "host/cli/run_flags.hpp"
#include "host/cli/terminal.hpp"
#include "host/lib/base.hpp"
#include "host/lib/host.hpp"
#include "host/lib/network.hpp"
#include "host/lib/session.hpp"
#include "host/vm/qemu_argv.hpp"
#include "host/vm/snapshot.hpp"
#include "host/vm/virtiofsd.hpp"
#include "host/vm/volume.hpp"

namespace nes::cli {

/// The share --rootfs DIR is served as (over virtiofs).
inline constexpr std::string_view kRootShareTag = "nes.root";
/// Where file volumes are staged: the share's tag, and where the guest mounts it before binding
/// each file at its place (under the guest's /run, which the init provides in every root).
inline constexpr std::string_view kFileShareTag = "nes.files";
inline constexpr std::string_view kFileShareAt = "/run/nesinit/files";

/// A restore: the number QEMU inherits its RAM's file at (the snapshot's `ram`, or with shares a
/// private copy: vm::copy_ram()); QemuSpec::ram_file names /proc/self/fd/N. Passt's socket is 3.
inline constexpr int kRamChildFd = 4;

/// What plan_run() needs from this host, as plain values; run.cpp gathers them (the probe, the
/// environment, mkdtemp). `euid` and `rootfs_dir` are all check_run() reads.
struct PlanInputs {
  std::uint32_t euid = 0;  // geteuid(): file volumes need root
  /// --rootfs DIR resolved (fs::canonical) if DIR is a directory; nullopt if it is not (an error).
  std::optional<std::filesystem::path> rootfs_dir;
  /// --rootfs FILE --rootfs-mode block: FILE resolved (fs::canonical) and its file system
  /// (vm::probe_block_fs); unset when FILE could not be probed, `rootfs_block_error` saying why.
  std::optional<std::filesystem::path> rootfs_file;
  std::optional<proto::FsType> rootfs_fs;
  std::string rootfs_block_error;
  /// Used where no flag names them: $NESHOST_KERNEL / $NESHOST_INITRD or the build's defaults,
  /// the init (for --sandbox and mkinitrd), scripts/mkinitrd.sh, the virtiofsd to run.
  std::filesystem::path default_kernel, default_initrd, nesinit, mkinitrd, virtiofsd;
  std::string vm_id;                    // the VM id when no --vm (random_vm_id())
  std::filesystem::path state_dir;      // the state directory when no --state (default_state_dir())
  vm::Accel accel = vm::Accel::tcg;     // --accel resolved (the probe's verdict; never auto_probe)
  std::optional<TermSize> terminal;     // our terminal's size (stdin's, else stdout's); none: 24x80
  bool stdin_is_tty = false;            // -it puts it in raw mode
  std::filesystem::path runtime_dir;    // this run's private $TMPDIR/neshost-XXXXXX (sockets, initrd)
  /// The file volumes' staging directory (another private mkdtemp, kept until the end); needed
  /// iff a -v names a regular file.
  std::optional<std::filesystem::path> staging_dir;
  std::string append;  // $NESHOST_APPEND: extra kernel arguments, appended last; empty: none
  /// Under TCG the command line carries `nolapic_timer noreplace-smp` (vm::KernelCmdline::tcg_words);
  /// $NESHOST_TCG_BOOT_WORDS=0 sets this false: the kernel boots as it would by default (bench
  /// P12's A/B of those steps).
  bool tcg_boot_words = true;
  /// TCG's translation buffer in MiB (vm::QemuSpec::tcg_tb_mib): 16 (an idle VM's QEMU 14 MiB
  /// smaller than with QEMU's 1 GiB default, no boot or workload time lost that we could measure:
  /// docs/vm.md "Host memory per VM"); $NESHOST_TCG_TB_MIB sets it, 0 for QEMU's default.
  std::uint32_t tcg_tb_mib = 16;
  /// vm::QemuSpec::free_page_reporting (a virtio-balloon that hands freed guest pages back);
  /// $NESHOST_FREE_PAGE_REPORTING=1 sets it, 0 clears it (bench P16's A/B).
  bool free_page_reporting = false;
  /// The machine `neshost snapshot create` saves (snapshot_machine()), planned with neither a
  /// NIC nor a share: in a snapshot's layout (QemuSpec::snapshot_layout), its
  /// `nesinit.modules=` listing virtio_net and virtiofs too (a restore may plug in both; with a
  /// modular kernel their modules must be loaded before the snapshot is taken).
  bool snapshot_machine = false;
  /// --snapshot: the snapshot as opened and checked (vm::open_snapshot, vm::check_snapshot), and
  /// its directory.
  std::optional<vm::SnapshotMeta> snapshot;
  std::filesystem::path snapshot_dir;
};

/// How `neshost run` names a --snapshot in its refusals and says how to make it again.
struct SnapshotRef {
  std::string given;                           // --snapshot's value as given: NAME, or DIR (has a '/')
  std::optional<std::filesystem::path> state;  // --state as given (a NAME's state directory); unset: the default
  /// The run's --mem, --cpus and --accel as given ({"--mem", "512", ...}): a snapshot made again
  /// with them matches this run.
  std::vector<std::string> flags;
};

/// Everything one `neshost run` does, decided up front.
struct RunPlan {
  /// serve_vm()'s config: the session (VM id, boot descriptor, on_exit, ready/wall/stop
  /// timeouts, grace; its generation is begun by the caller), the channel's listener, state dir.
  ServeConfig serve;
  std::string vm;                       // == serve.session.vm
  std::filesystem::path state_dir;      // == serve.state_dir
  std::filesystem::path runtime_dir;    // as PlanInputs::runtime_dir
  std::filesystem::path channel_socket, data_socket;  // in runtime_dir; we listen, QEMU dials
  bool sandbox = false;                 // no VM: the init as PID 1 of a fresh pid + mount namespace
  std::filesystem::path kernel;         // empty with --sandbox
  std::filesystem::path initrd;         // empty with --sandbox
  /// --rootfs DIR --rootfs-mode initramfs: `initrd` is built from this DIR (scripts/mkinitrd.sh,
  /// with `nesinit` as /init) before QEMU starts; else `initrd` must exist.
  std::optional<std::filesystem::path> initrd_from;
  std::filesystem::path mkinitrd, nesinit;
  /// One virtiofsd per share, in start order: the root (--rootfs over virtiofs), each directory
  /// volume (tag nes.vI, I its -v index), then the file volumes' staging share (kFileShareTag,
  /// whose `binds` each target an empty file staging_dir/N the caller creates). `log` is left
  /// empty: the caller puts it in the VM's state dir.
  std::vector<vm::VirtiofsdOptions> daemons;
  bool qemu_block = false;              // a block root's disk is attached (--rootfs-mode block)
  vm::KernelCmdline cmdline;            // the kernel command line, as values
  /// What QEMU runs (append = kernel_cmdline(cmdline), fs_devices = the daemons' sockets); nullopt
  /// with --sandbox. vm::qemu_argv() checks it when the run launches it.
  std::optional<vm::QemuSpec> qemu;
  std::vector<std::string> sandbox_argv;  // --sandbox: unshare ... nesinit ...; else empty
  /// Host-side stdio: forward our stdin (-i), the workload's terminal follows ours (-t, SIGWINCH),
  /// raw mode on our terminal (-it with a terminal on stdin).
  bool interactive = false, tty = false, raw_terminal = false;
  bool stdin_hold = false;              // --stdin-hold (RunFlags::stdin_hold)
  bool console = false;                 // --console: the console and our events on stderr
  host::WorkloadLogOptions workload_log;  // STATE/VM/workload.log's rotation
  std::chrono::milliseconds grace{10000};  // --grace: also bounds the last writes after --timeout
  std::vector<std::string> command;     // the workload's ARGV (the monitor record's `command`)
  /// The VM's network as planned: the descriptor's `network` and QEMU's net_args come from it.
  /// user mode: passt must be started (host/vm/passt.hpp) and its socket's QEMU end passed to QEMU
  /// as fd vm::kPasstChildFd (net_args name that number).
  host::NetworkSpec network;
  bool passt = false;
  /// The published ports as `docker ps` shows them ("127.0.0.1:8080->80/tcp"; the monitor
  /// record's `ports`, read by `neshost ps` and `neshost port`).
  std::vector<std::string> ports;
  bool rm = false;                      // --rm
  /// -d: QEMU (or the sandbox) and its daemons outlive this monitor (no death signal, their
  /// identities in STATE/VM/vmm.json), the chardevs redial (QemuSpec::chardev_reconnect_s) and
  /// the session survives a lost channel for kDetachedReconnect (boot.reconnect_ms), so a
  /// replacement monitor can take the VM over (docs/host.md "Re-adoption"). A foreground run's VM
  /// dies with it (its terminal is its user's).
  bool vmm_survives = false;
  /// --snapshot: QEMU starts paused (`-incoming defer`); the run loads the state, plugs these in
  /// (shares in order on the hot-plug ports, the NIC on the last), then lets the guest run.
  std::optional<vm::SnapshotMeta> snapshot;
  std::filesystem::path snapshot_dir;
  SnapshotRef snapshot_ref;  // how its refusals name it (snapshot_refusal())
  std::vector<vm::FsDevice> hotplug_shares;
  std::optional<std::string> hotplug_nic;  // its device_add arguments (host::qmp_nic_device)
  /// This process's stderr is STATE/VM/monitor.log (a -d monitor, a replacement), not a user's
  /// terminal or a container's stderr: what becomes of the data channel is said there too.
  bool monitor_log = false;
};

/// The SnapshotRef of a run's flags (--snapshot, --state, --mem, --cpus, --accel as given).
SnapshotRef snapshot_ref(const RunFlags& flags);

/// A --snapshot refusal as `neshost run` says it: "--snapshot GIVEN: MESSAGE", then what to do.
/// A NAME that is not there: `neshost snapshot ls` (with the --state given) lists the snapshots.
/// A directory that is not one: nothing more. Anything else (stale, corrupt, refused by QEMU), with
/// `remake`: how to make it again, with this run's --mem/--cpus/--accel so that the new one
/// matches: `snapshot rm` and `snapshot create` in its state directory (a NAME's: the --state
/// given, else the default; a DIR inside STATE/.snapshots: that STATE), or for another directory:
/// remove it, create one in any state directory and move it there. Paths are shell-quoted.
host::Error snapshot_refusal(const SnapshotRef& ref, host::Error e, bool remake = true);

/// boot.reconnect_ms of a detached VM: how long the guest keeps its workload (and an outcome not
/// yet acknowledged) while no monitor serves it, redialling; a replacement monitor must be started
/// (by any neshost command on the VM) within it, else the guest shuts down in order as before.
/// Five minutes: an OOM-killed monitor of a VM nobody looks at costs the workload after that,
/// never before; a longer window only delays the power-off of a VM nobody will adopt.
inline constexpr std::chrono::milliseconds kDetachedReconnect{300000};

/// The flags' cross-checks beyond each flag's own (run_flags()), each an error naming the flags
/// (as `neshost run` prints them; all exit kExitUsage, nothing started): --sandbox with
/// -v/--rootfs; --initrd with --rootfs-mode initramfs; --rootfs not a directory
/// (inputs.rootfs_dir), or with --rootfs-mode block not an EROFS/ext4 file (inputs.rootfs_fs);
/// --upper-size without --rootfs-mode block; a file volume without root (inputs.euid); no ARGV (unless --help); with
/// --snapshot, a flag the snapshot decides (--sandbox, --kernel, --initrd, --rootfs-mode
/// initramfs or block, --console, --grace) or more shares than hot-plug ports (vm::kHotplugPorts, one fewer
/// with a NIC); host::check_network()'s (-p without user/passt, a port published twice, ...); an
/// IPv6 -p host address (both backends are IPv4 here); --sandbox with any network but none (it
/// has no NIC and shares the host's network).
host::Status check_run(const RunFlags& flags, const PlanInputs& inputs);

/// The kernel the run boots: --kernel, else inputs.default_kernel (what the accelerator probe
/// boots too, before the plan exists).
std::filesystem::path run_kernel(const RunFlags& flags, const PlanInputs& inputs);

/// The inputs taken from the environment, for `run` and `snapshot create` alike: $NESHOST_APPEND
/// (PlanInputs::append; unset or empty: none) and $NESHOST_TCG_BOOT_WORDS ("0": tcg_boot_words
/// false; unset or any other value: true).
void env_inputs(PlanInputs& inputs);

/// The plan: pure (no I/O, no clock, no environment). Runs check_run() first and returns its
/// error; else an error only if a file volume is given without inputs.staging_dir.
host::Result<RunPlan> plan_run(const RunFlags& flags, const PlanInputs& inputs);

}  // namespace nes::cli
