// VM snapshots: a QEMU microVM saved once its init has said `ready` and waits for its descriptor,
// restored any number of times (docs/vm.md "Snapshots"). A snapshot is a directory:
//   snapshot.json   what it was made from (SnapshotMeta: format, QEMU, accelerator, RAM, vCPUs,
//                   the init's grace, kernel and initramfs with their SHA-256, the command line, the guest's `ready`)
//   state.qemu      QEMU's migration stream of the paused VM: its device state (~200 KB)
//   ram             the guest's RAM (a sparse file the size of it, the VM's memory backend while
//                   it was made; QEMU's x-ignore-shared keeps it out of the stream)
// A restore starts QEMU with the same machine (qemu_argv's snapshot_layout, `-incoming defer`),
// its RAM a private (copy-on-write) mapping of `ram` (or, with shares, a shared copy of it),
// loads the device state through QMP, plugs in the shares and the NIC (its backend, no device state, is on
// the command line), and only then lets it run; the
// host session takes the saved `ready` as the stream's first line (SessionConfig::saved_ready).
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

#include "base/fd.hpp"
#include "host/lib/base.hpp"
#include "host/vm/qemu_argv.hpp"
#include "host/vm/qmp.hpp"

namespace nes::vm {

/// snapshot.json's `format`: a snapshot of another format is refused (made by another neshost).
/// 2: `grace_ms` recorded.
inline constexpr std::uint32_t kSnapshotFormat = 2;
/// snapshot.json's `grace_ms` bounds (ms): --grace's (1 ms .. 31 days).
inline constexpr std::uint32_t kSnapshotMaxGraceMs = 31u * 24 * 3600 * 1000;
/// The directory of a state directory that holds its snapshots: STATE/.snapshots/NAME (a VM id
/// never starts with '.', so no VM's directory is in the way).
inline constexpr std::string_view kSnapshotsDir = ".snapshots";
/// The files of a snapshot's directory (the header's comment says what each holds).
inline constexpr std::string_view kSnapshotMetaFile = "snapshot.json";
inline constexpr std::string_view kSnapshotStateFile = "state.qemu";
inline constexpr std::string_view kSnapshotRamFile = "ram";

/// A file a snapshot depends on: its path when the snapshot was made, size (bytes), SHA-256 (hex),
/// modification time (ns since the epoch). A file whose size and mtime are as recorded is taken
/// as is; any other is hashed and must match (same_file()).
struct SnapshotFile {
  std::filesystem::path path;
  std::uint64_t bytes = 0;
  std::string sha256;
  std::int64_t mtime_ns = 0;
  bool operator==(const SnapshotFile&) const = default;
};

/// The image root a snapshot's VM had attached (issue 47, docs/images.md "Warm starts"): a block
/// root (host/image/block_root.hpp) is a virtio-blk disk, part of the machine the migration stream
/// describes, so a restore attaches the same file again, after checking it is still these bytes.
struct SnapshotRoot {
  std::string image;           // the image's config digest, "sha256:HEX" (docker's IMAGE ID)
  std::filesystem::path path;  // the block root's file (STATE/.images/roots/HEX/root.erofs)
  std::string digest;          // its "sha256:HEX"
  std::string fs;              // "erofs" or "ext4"
  bool operator==(const SnapshotRoot&) const = default;
};

/// What a snapshot was made from; a restore must match each (check_snapshot()).
struct SnapshotMeta {
  std::uint32_t format = kSnapshotFormat;
  std::string name;
  std::string created;        // RFC 3339, UTC
  std::string qemu_version;   // QMP's greeting ("7.2.0")
  std::string accel;          // "tcg" or "kvm"
  std::uint32_t mem_mib = 0;  // guest RAM, MiB
  std::uint32_t cpus = 0;
  /// The init's grace (ms) for the workload's SIGTERM, as `snapshot create --grace` gave it (also
  /// in `append` as nesinit.grace_ms): a restore's host deadlines follow it.
  std::uint32_t grace_ms = 0;
  std::optional<std::string> firmware;  // -bios, as the VM was started with it
  std::string append;         // the kernel command line it booted with
  SnapshotFile kernel, initrd;
  SnapshotFile state;         // state.qemu (path relative to the snapshot's directory)
  SnapshotFile ram;           // ram (likewise)
  std::string ready;          // the guest's `ready` line, without its '\n'
  /// The image root attached when it was made (`snapshot create --image`); none: a bare VM.
  /// snapshot.json's `root` (absent or null: none), so format 2's snapshots read as before.
  std::optional<SnapshotRoot> root;
  bool operator==(const SnapshotMeta&) const = default;
};

/// A snapshot's name: host::check_name()'s rule (1..64 of [A-Za-z0-9._-]), not starting with '.'.
/// Error names it.
host::Status check_snapshot_name(std::string_view name);
/// SHA-256 of a file (hex), its size in bytes and mtime. Error: open/read failures, with errno text.
host::Result<SnapshotFile> hash_file(const std::filesystem::path& p);
/// Whether `p` is the file `recorded` describes: its size and mtime as recorded (no read), else
/// its SHA-256 as recorded. Error: it cannot be read, or its content differs ("WHAT: PATH has
/// SHA-256 X; made with Y", or its size).
host::Status same_file(std::string_view what, const std::filesystem::path& p, const SnapshotFile& recorded);
/// snapshot.json's text (one JSON object).
std::string encode_snapshot_meta(const SnapshotMeta& m);
/// Parses snapshot.json. Errors name the field ("snapshot.json: mem_mib: ...").
host::Result<SnapshotMeta> decode_snapshot_meta(std::string_view json);

/// Reads `dir`'s snapshot.json alone (no file checked). Errors: no such snapshot ("no snapshot at
/// DIR (snapshot.json missing)", err ENOENT), not a regular file, not valid JSON, a field missing
/// or malformed, a format of another neshost. Messages never name the snapshot: its caller does
/// (host/cli: snapshot_refusal()), and says how to make it again.
host::Result<SnapshotMeta> read_snapshot_meta(const std::filesystem::path& dir);

/// A snapshot opened for a restore: its metadata and its two files, each opened once (never
/// through a symlink, only a regular file) and checked on that descriptor (same_file()'s rule),
/// so what QEMU gets is what was checked: `ram` (QEMU maps it as /proc/self/fd/N) and `state`.
struct OpenSnapshot {
  SnapshotMeta meta;
  base::Fd state, ram;
};
/// read_snapshot_meta(), then state.qemu and ram opened and checked. Errors: its, a file
/// missing, not regular ("open PATH: ..."), truncated or altered ("corrupt: ram: PATH has ...").
host::Result<OpenSnapshot> open_snapshot(const std::filesystem::path& dir);

/// What a restore would run with: the kernel and initramfs it would boot, QEMU's version, the
/// accelerator, RAM (MiB) and vCPUs if given.
struct RestoreTarget {
  std::filesystem::path kernel, initrd;
  std::string qemu_version;  // empty: not checked here (QMP tells it once QEMU runs)
  std::string accel;
  std::optional<std::uint32_t> mem_mib, cpus;  // unset: the snapshot's
};
/// Names the first of `t` that differs from the snapshot's: the initramfs (the init build) and the
/// kernel (same_file(): size and mtime, else SHA-256), QEMU's version, the accelerator, RAM, vCPUs.
/// Error: "made with another kernel: PATH has SHA-256 X; made with Y", "made with memory (--mem,
/// MiB) 256; this run has 512".
host::Status check_snapshot(const SnapshotMeta& m, const RestoreTarget& t);

/// Saves a running VM: QMP `stop`, then its device state through `migrate` into the open `file`
/// (passed with `getfd`; RAM in a shared file stays out: x-ignore-shared), waiting up to `within`
/// in all for the migration to complete. QEMU stays paused. Error: QMP's, or the migration failed (its
/// error-desc) or did not complete in time.
host::Status save_vm_state(Qmp& qmp, const base::Fd& file, std::chrono::milliseconds within);
/// Loads `file` into a QEMU started with `-incoming defer` (x-ignore-shared, QMP `migrate-incoming`
/// from a descriptor passed with `getfd`), waiting up to `within`; the VM is then paused (QMP
/// `cont` runs it). Error: the stream did not load (a corrupt or foreign file: QEMU's
/// error-desc), or not in time.
host::Status load_vm_state(Qmp& qmp, const base::Fd& file, std::chrono::milliseconds within);
/// Plugs a virtio-fs share into a paused or running VM on hot-plug port `port` (QMP chardev-add of
/// its virtiofsd socket as chardev "fs<index>", device_add vhost-user-fs-pci "fsdev<index>";
/// `index` distinct per share). Error: QMP's, naming the tag.
host::Status hotplug_share(Qmp& qmp, std::size_t port, std::size_t index, const FsDevice& share,
                           std::chrono::milliseconds within);
/// Plugs the NIC in (QMP device_add with `device_json`: its netdev is on the command line).
/// Error: QMP's.
host::Status hotplug_nic(Qmp& qmp, std::string_view device_json, std::chrono::milliseconds within);

/// A private, shared-mappable copy of a snapshot's RAM file `ram` (open_snapshot()'s): a memfd of
/// its size, only its data extents copied (SEEK_DATA/SEEK_HOLE), for a restore whose shares'
/// vhost-user daemons map guest memory. Error: memfd/read/write failures, with errno text.
host::Result<base::Fd> copy_ram(const base::Fd& ram);

}  // namespace nes::vm
