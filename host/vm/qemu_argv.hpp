// The QEMU command line for one nesinit microVM: pure functions, no I/O (docs/vm.md).
// Recipe measured in docs/facts.md "A real microVM on these machines": q35, -no-reboot, kernel
// panic=-1, the channel as virtio-serial port `nes.0` whose chardev *connects* to our listener.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "host/lib/base.hpp"
#include "protocol/channels.hpp"

namespace nes::vm {

/// The accelerator QEMU runs the guest with. `auto_probe` is only a request: it is resolved to
/// kvm or tcg (accel.hpp) before any argv is built.
enum class Accel { tcg, kvm, auto_probe };
std::string_view to_string(Accel a);                  // "tcg", "kvm", "auto"
std::optional<Accel> accel_from_string(std::string_view s);

/// The kernel's console verbosity. quiet: workload output only (`quiet loglevel=0`: the
/// kernel's own log level keeps its messages off the console, no line is filtered by us);
/// full: every kernel message (`loglevel=7`), for `--console`.
enum class ConsoleLevel { quiet, full };

/// What goes on the kernel command line (`-append`).
struct KernelCmdline {
  ConsoleLevel console = ConsoleLevel::quiet;
  /// nesinit.channel=…: the lifecycle channel's virtio-serial port (protocol/channels.hpp).
  std::string channel = std::string("virtio-port:") + proto::kLifecyclePortName;
  /// The boot words for a 1-vCPU TCG guest (docs/vm.md "Boot time"), which spare it two costs
  /// that are TCG's alone: `nolapic_timer` (the HPET ticks: no 100 ms of local APIC timer
  /// calibration against the PIT, which a kernel without a TSC-deadline timer or a told APIC
  /// frequency must do) and `noreplace-smp` (the kernel keeps its SMP `lock` prefixes instead of
  /// patching ~6 000 sites to their UP form, ~85 ms under TCG). Not for 2+ vCPUs: there the
  /// other CPUs' APIC timers would be dummies fed by the HPET's periodic broadcast (no
  /// high-resolution timers, 1000 interrupts/s per CPU for the whole run), and nothing is patched
  /// anyway. Not for KVM: its APIC timer runs in TSC-deadline mode, and patching is quick.
  bool tcg_words = false;
  std::vector<std::string> extra;             // appended verbatim, in order (e.g. nesinit.log=debug)
};
/// `console=ttyS0 quiet loglevel=0 panic=-1 cryptomgr.notests nesinit.channel=virtio-port:nes.0 …`.
/// panic=-1: a panic reboots at once, which -no-reboot turns into QEMU exiting;
/// cryptomgr.notests: the kernel skips its crypto self-tests (boot time, docs/vm.md "Boot");
/// `nolapic_timer noreplace-smp` with KernelCmdline::tcg_words.
std::string kernel_cmdline(const KernelCmdline& c);

/// One virtio-fs device: QEMU's vhost-user-fs-pci, backed by a virtiofsd listening on `socket`;
/// the guest mounts it by `tag` (virtiofsd.hpp).
struct FsDevice {
  std::string tag;                // 1..36 of [A-Za-z0-9._-]
  std::filesystem::path socket;   // virtiofsd's vhost-user socket (< 108 bytes)
};

/// One virtio-blk disk: a raw file the guest finds by `serial` (/sys/block/*/serial; the init's
/// block roots, docs/protocol.md "Block roots"). `read_only`: QEMU opens the file O_RDONLY and the
/// guest sees a read-only disk, so any number of VMs share one file (an image's root); a
/// writable one (a scratch disk) belongs to one VM. Built in even with snapshot_layout: a
/// virtio-blk disk migrates (its file is not in the stream, only the device's state).
struct BlockDevice {
  std::filesystem::path path;  // an existing raw image file (no ',' restriction: escaped)
  std::string serial;          // 1..20 of [A-Za-z0-9._-] (virtio-blk's 20-byte serial), unique
  bool read_only = true;
};

/// One VM's QEMU invocation.
struct QemuSpec {
  std::string qemu = "qemu-system-x86_64";  // looked up in PATH if it has no '/'
  std::filesystem::path kernel;             // bzImage (Debian's vmlinuz) or an ELF vmlinux with a PVH entry
  std::optional<std::filesystem::path> initrd;
  std::string append;                       // kernel command line (kernel_cmdline())
  std::uint32_t mem_mib = 256;              // guest RAM, MiB (>= 64)
  std::uint32_t cpus = 1;                   // vCPUs (1..64)
  Accel accel = Accel::tcg;                 // tcg or kvm (never auto_probe here)
  /// TCG's translation buffer, MiB (`-accel tcg,tb-size=N`): the host memory QEMU fills with the
  /// code it translated, kept resident once touched. 0: QEMU's default (1 GiB, of which an idle
  /// VM of ours touched 30 MiB). Ignored under KVM. docs/vm.md "Host memory per VM".
  std::uint32_t tcg_tb_mib = 0;
  /// Guest memory handed back: a virtio-balloon device with free page reporting
  /// (`-device virtio-balloon-pci,free-page-reporting=on`; the guest kernel needs
  /// CONFIG_VIRTIO_BALLOON and CONFIG_PAGE_REPORTING, kernel/nesinit.config): the guest reports
  /// the pages it freed and QEMU discards them (MADV_DONTNEED, or a hole punched in a shared
  /// memfd/file), so RAM a workload touched and freed stops counting on the host. The balloon
  /// itself is never inflated. false: no balloon device. docs/vm.md "Host memory per VM".
  bool free_page_reporting = false;
  std::optional<std::filesystem::path> channel_socket;  // a *listening* Unix socket: QEMU connects
  /// The virtio-serial port's name as the guest sees it (protocol/channels.hpp).
  std::string port_name = proto::kLifecyclePortName;
  /// The data channel (workload stdio): a second virtserialport on the same virtio-serial bus,
  /// its own chardev dialling this *listening* Unix socket (needs channel_socket).
  std::optional<std::filesystem::path> data_socket;
  /// The data port's name: the guest's default when its channel is nes.0.
  std::string data_port_name = proto::kDataPortName;
  /// Channel survival: QEMU redials a listener that went away every this many seconds
  /// (`reconnect=` on the chardevs, QEMU 7.2's spelling), so a guest booted with
  /// boot.reconnect_ms reaches a restarted host. 0: QEMU never redials (the default).
  std::uint32_t chardev_reconnect_s = 0;
  std::optional<std::string> firmware = "qboot.rom";  // -bios; qboot prints nothing on the serial
                                                      // line (SeaBIOS resets the terminal)
  /// Shares. Any at all makes guest RAM a shared memfd (`memory-backend-memfd,share=on` + one NUMA
  /// node): vhost-user daemons map guest memory to serve requests in place.
  std::vector<FsDevice> fs_devices;
  /// Disks: `-drive file=PATH,if=none,id=blkN,format=raw,readonly=on|off` (QEMU's default
  /// cache: the host's page cache, shared by every VM of one image)
  /// + `-device virtio-blk-pci,drive=blkN,serial=SERIAL`, in this order (so a snapshot's restore
  /// rebuilds the same PCI slots). docs/vm.md "Block devices" says why these options.
  std::vector<BlockDevice> block_devices;
  /// The NIC: the -netdev/-device options host::qemu_net_args() builds (host/lib/network.hpp),
  /// appended as given (already in QEMU's syntax). Empty: no NIC (-nodefaults gives none).
  /// A `stream` netdev on an fd names a number valid in QEMU (LaunchOptions::fds).
  std::vector<std::string> net_args;
  /// QMP, QEMU's JSON control protocol, on this Unix socket (QEMU listens: `server=on,wait=off`):
  /// the monitor pauses and resumes the VM through it (host/vm/qmp.hpp). Unset: no QMP.
  std::optional<std::filesystem::path> qmp_socket;
  /// The layout a VM snapshot needs (host/vm/snapshot.hpp), the same when it is saved and each
  /// time it is restored: guest RAM in a file (ram_file), and kHotplugPorts empty pcie-root-ports
  /// `rp0`.. for the shares and the NIC plugged in
  /// after a restore (fs_devices must then be empty and net_args hold no -device: they are
  /// plugged, not built in; the NIC's -netdev backend stays here, it is no device state).
  bool snapshot_layout = false;
  /// With snapshot_layout: guest RAM is this file (memory-backend-file `mem0`, one NUMA node):
  /// `shared` (MAP_SHARED: the guest's writes reach the file; a snapshot being made, or a
  /// restore's private copy that a share's vhost-user daemon must map too) or not (MAP_PRIVATE:
  /// copy-on-write over a snapshot's file, which stays as it was; clones share its page cache).
  /// Needed by snapshot_layout: a snapshot's RAM is its file, never in the migration stream
  /// (QEMU's x-ignore-shared), so a restore maps it instead of loading it.
  struct RamFile {
    std::filesystem::path path;
    bool shared = false;
  };
  std::optional<RamFile> ram_file;
  /// Start paused, waiting for a saved state through QMP's migrate-incoming (`-incoming defer`;
  /// needs qmp_socket and snapshot_layout).
  bool incoming = false;
};

/// Empty PCIe root ports a snapshot's VM has for what is plugged in after its restore: the shares
/// (one each) and the NIC (the last port).
inline constexpr std::size_t kHotplugPorts = 8;
/// The id of hot-plug root port `i` (0..kHotplugPorts-1): "rp<i>".
std::string hotplug_port(std::size_t i);

/// Checks the spec's fields (names the bad one) and builds the argv, argv[0] = spec.qemu.
/// The serial console is QEMU's stdout (`-chardev stdio`): the launcher gives QEMU /dev/null as
/// stdin and a pipe as stdout, so QEMU never touches a terminal. No monitor, no default devices.
/// Error: a message naming the field (kernel, mem_mib, cpus, accel, tcg_tb_mib, port_name, channel_socket,
/// data_socket, data_port_name, fs_devices[i].tag/socket, block_devices[i].path/serial, net_args: not -netdev/-device VALUE
/// pairs, qmp_socket, snapshot_layout: fs_devices or a -device in net_args given, ram_file: without
/// snapshot_layout or missing with it, incoming: without qmp_socket or snapshot_layout).
host::Result<std::vector<std::string>> qemu_argv(const QemuSpec& spec);

}  // namespace nes::vm
