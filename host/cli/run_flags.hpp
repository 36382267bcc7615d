// `neshost run`'s flags: one table (run_flags()) whose entries each hold a flag's names (docker's
// spelling), its setter and check, and its help line; parse_run() reads a command line with it,
// run_help() is `neshost run --help` (its option lines from the table), `snapshot create` takes
// the entries it needs (snapshot_create_flags()). check_run_host() asks this host what the flags
// need of it (KVM, memory, the named kernel and initramfs). Every refusal happens before anything
// starts and exits kExitUsage (125, as docker's own flag errors), naming the flag.
//
// Adding a flag: one entry in kRunFlags (run_flags.cpp), a field in RunFlags, and a good and a bad
// case in tests/host/cli_flags_test.cpp (the test fails for an entry without both). docker's
// `run IMAGE [CMD...]` fits beside `-- ARGV`: RunFlags::argv holds the positionals as given and
// argv_after_dashdash says where a `--` put them, so IMAGE is argv[0] when that index is not 0;
// --entrypoint, --pull and the like are entries whose setters fill fields of their own.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "host/cli/flag_table.hpp"
#include "host/cli/flags.hpp"
#include "host/lib/base.hpp"
#include "host/lib/network.hpp"
#include "host/lib/session.hpp"
#include "host/vm/accel.hpp"
#include "host/vm/qemu_argv.hpp"
#include "host/vm/virtiofsd.hpp"
#include "host/vm/volume.hpp"

namespace nes::cli {

/// At most this many -v volumes: one vhost-user-fs-pci device each (PCI slots on q35's root bus
/// are plentiful; this bounds the daemons one command line can start).
inline constexpr std::size_t kMaxVolumes = 16;
/// The longest -h/--hostname: the guest kernel's (HOST_NAME_MAX, __NEW_UTS_LEN: sethostname(2)
/// refuses more with EINVAL).
inline constexpr std::size_t kMaxHostname = 64;

/// `neshost run`'s flags as parsed (run_flags() documents each); defaults as there.
struct RunFlags {
  std::optional<std::filesystem::path> kernel, initrd, rootfs, state;
  bool rootfs_initramfs = false;   // --rootfs-mode initramfs
  /// --rootfs-mode block: --rootfs names an EROFS or ext4 image file, the guest's root as a
  /// read-only virtio-blk disk under a writable overlay (docs/vm.md "Block devices").
  bool rootfs_block = false;
  bool rootfs_mode_given = false;  // --rootfs-mode on the command line (an IMAGE's default is its own)
  /// --upper-size MIB: a block root's writable layer (a tmpfs) capped at this many MiB; 0: the
  /// guest's default (half of its RAM).
  std::uint32_t upper_mib = 0;
  std::vector<vm::Volume> volumes;
  std::uint32_t mem = 256, cpus = 1;  // MiB, vCPUs
  bool mem_given = false, cpus_given = false;  // --mem / --cpus on the command line
  bool grace_given = false;                    // --grace on the command line
  /// --snapshot NAME|DIR: restore the VM from that snapshot (neshost snapshot create: STATE's NAME,
  /// or a snapshot's directory, a value with a '/') instead of booting one (docs/vm.md "Snapshots").
  std::optional<std::string> snapshot;
  vm::Accel accel = vm::Accel::auto_probe;
  std::map<std::string, std::string> env;
  std::optional<std::string> workdir, hostname, vm;
  std::optional<std::string> name;  // --name as given (docker's spelling of --vm; `vm` is set to it)
  std::uint32_t uid = 0, gid = 0;
  std::vector<std::uint32_t> groups;  // --group-add
  bool read_only = false;             // --read-only
  host::OnExitPolicy on_exit = host::OnExitPolicy::stop;
  std::optional<std::chrono::milliseconds> timeout;
  std::chrono::milliseconds ready_timeout{30000};
  std::chrono::milliseconds grace{10000};
  bool console = false, help = false;
  bool detach = false, sandbox = false;
  bool interactive = false, tty = false;
  std::uint64_t log_max_size = 10u << 20;  // bytes
  unsigned log_max_files = 5;
  std::vector<std::string> argv;  // the workload's ARGV (empty only with help)
  /// Index into `argv` of its first word after a `--` (argv.size() if there was none): where a
  /// positional IMAGE (`run IMAGE [CMD...]`, docker's form) would end and `-- ARGV` begin.
  std::size_t argv_after_dashdash = 0;
  /// `run [OPTIONS] IMAGE [COMMAND [ARG...]]`: set by host/cli/image.hpp apply_run_image() when
  /// ARGV's first word names an image (docs/images.md "run"); nullopt otherwise.
  std::optional<std::string> image;
  std::optional<std::string> entrypoint;  // --entrypoint (IMAGE only)
  /// --pull: when an IMAGE is fetched from its registry first (docker's policies).
  enum class Pull { missing, always, never } pull = Pull::missing;
  /// --user as given: UID[:GID], or with an IMAGE also USER[:GROUP] names (its /etc/passwd and
  /// /etc/group resolve them: host/image/run_image.hpp); uid/gid hold the numbers when numeric.
  std::optional<std::string> user_spec;
  /// IMAGE without --read-only: the root share is this overlay (mounted by its virtiofsd, in its
  /// own mount namespace) on --rootfs's directory.
  std::optional<vm::OverlayRoot> rootfs_overlay;
  /// --network, -p, --dns, --dns-search, --dns-option, --add-host. The mode when no --network:
  /// $NESHOST_NETWORK if set (tests set it to none: a VM with a NIC only in a test's own network
  /// namespace), else none with --sandbox, else user (docker's default is a network too).
  /// `link` (netns mode) is left for run.cpp to fill from the namespace before plan_run().
  host::NetworkSpec network;
  bool network_given = false;  // --network was on the command line (or $NESHOST_NETWORK set)
  bool network_from_env = false;  // the mode came from $NESHOST_NETWORK (errors say so)
  bool rm = false;             // --rm: the VM's state dir goes when the run ends (as `neshost rm`)
  /// --vmm-outlives: as -d's VM, the VMM outlives this process and is adopted if it dies (for a
  /// supervisor that runs `neshost run` in the foreground: the containerd shim).
  bool vmm_outlives = false;
  /// --stdin-hold (with -i): a FIFO stdin is held open for writing by this process until the
  /// control request `close-stdin` (containerd's CloseIO), so the FIFO's writers going (a client
  /// detached, a SIGKILLed shim) is not the workload's EOF.
  bool stdin_hold = false;
};

/// One `neshost run` flag.
using RunFlag = Flag<RunFlags>;

/// `neshost run`'s flags, in --help's order (the "Network" section's last). The one place a new
/// `run` flag is added: its names, setter, check and help line.
std::span<const RunFlag> run_flags();

/// `neshost run --help`: the usage and prose, the option lines generated from run_flags(), the
/// exit statuses, signals and environment.
std::string run_help();

/// The entries `neshost snapshot create` takes (--state, --mem, --cpus, --accel, --grace,
/// --ready-timeout): run's own, so their checks and defaults are run's.
std::span<const RunFlag> snapshot_create_flags();

/// "10m", "512k", "1g", "65536": bytes, docker's --log-opt max-size units (1024-based).
/// At least 64 KiB, at most 1 TiB; errors name `flag` (`--FLAG: ...`).
host::Result<std::uint64_t> parse_size(std::string_view flag, std::string_view v);

/// `-h/--hostname NAME`: 1..kMaxHostname bytes of letters, digits, '-', '.', '_' (the guest's
/// limit; what /etc/hosts holds unquoted). Errors name --hostname.
host::Status check_hostname(std::string_view v);

/// docker-run-style parsing: options until `--` or the first non-option; the rest is ARGV.
/// Short forms as docker users type them (-d, -i, -t, -it, -e, -w, -v, -u, -h, -p). Each value is
/// checked alone by its entry's setter, then each given flag's check (what it needs of the
/// others); what flags mean together beyond that is check_run()'s (host/cli/plan.hpp). Reads what
/// docker reads at this point: each -v HOST (it must exist; vm::parse_volume), for `-e K` K's
/// value in our environment, and $NESHOST_NETWORK. --name is --vm (docker's spelling); both with
/// different values is refused. Every error names its flag (exit kExitUsage).
host::Result<RunFlags> parse_run(const Args& args);

/// As parse_run() with `table` (e.g. snapshot_create_flags()), flags anywhere among the
/// positionals (which go to RunFlags::argv).
host::Result<RunFlags> parse_run_with(std::span<const RunFlag> table, const Args& args, FlagOrder order);

/// What check_run_host() asks this host; each replaceable (tests).
struct RunHostProbes {
  /// /dev/kvm opens read-write and speaks KVM's API (vm::kvm_device_usable()).
  std::function<vm::KvmProbe()> kvm;
  /// The host's memory in MiB (MemTotal in /proc/meminfo); nullopt: unknown, not checked.
  std::function<std::optional<std::uint64_t>()> mem_mib;
};

/// The real probes.
RunHostProbes real_host_probes();

/// What the flags need of this host, asked before anything starts (so -d's creator says it, exit
/// kExitUsage, nothing made): `--accel kvm` (not with --sandbox) a usable KVM device ("--accel
/// kvm: KVM is missing on this host (...)"); `--mem` no more than the host's memory; `--kernel`
/// and `--initrd` as given are regular files (their defaults are checked when the run starts).
host::Status check_run_host(const RunFlags& flags, const RunHostProbes& probes);

}  // namespace nes::cli
