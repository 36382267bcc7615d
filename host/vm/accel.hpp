// Choosing the accelerator: KVM only if a short, bounded probe boot under KVM works, else TCG.
// On these machines /dev/kvm exists but guests hang under it (docs/facts.md): opening the device is
// not proof, only a guest that runs is (docs/vm.md "Accelerator").
#pragma once

#include <chrono>
#include <filesystem>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "host/vm/qemu_argv.hpp"

namespace nes::vm {

/// The verdict of one KVM probe; `reason` says why in one line (for --console and logs).
struct KvmProbe {
  bool usable = false;
  std::string reason;
};

/// /dev/kvm opens read-write and answers KVM_GET_API_VERSION with 12 (the stable KVM API).
KvmProbe kvm_device_usable(const std::filesystem::path& dev = "/dev/kvm");

/// Boots `kernel` under `-accel kvm` with no initramfs and `root=/dev/nonexistent`, so a working
/// guest panics ("VFS: Unable to mount root fs") within a second and, with panic=-1 and
/// -no-reboot, QEMU exits on its own. Usable iff QEMU exited by itself within `deadline` and the
/// console shows the kernel's panic line. A hanging guest is killed at the deadline.
KvmProbe probe_kvm_boot(const std::string& qemu, const std::filesystem::path& kernel,
                        std::chrono::milliseconds deadline = std::chrono::milliseconds(3000));

/// The probe's verdict remembered for this boot of the host, so each run does not pay a probe
/// boot (up to 3 s). The key (probe_key) is the host's boot_id, QEMU's command, and the kernel image's
/// path, size and mtime: any of them changing means a new probe. A usable verdict holds for the
/// whole boot; an unusable one for kUnusableTtl, so a probe that lost its deadline on a loaded
/// machine is retried later.
inline constexpr std::chrono::seconds kUnusableTtl{600};

/// The cache key for `qemu` and `kernel` ("" when the boot_id cannot be read: then no caching).
std::string probe_key(const std::string& qemu, const std::filesystem::path& kernel);

/// Where verdicts are kept: $XDG_RUNTIME_DIR/neshost/kvm-probe, else /run/neshost/kvm-probe for
/// root (both cleared at the host's reboot), else "" (no caching).
std::filesystem::path default_probe_cache();

/// The verdict stored in `file` for `key`, if one is there, well-formed and still valid at
/// `now_s` (seconds since the epoch); nullopt otherwise (a missing, foreign or garbled file
/// included). Reads at most 4 KiB. The reason says it was cached.
std::optional<KvmProbe> cached_probe(const std::filesystem::path& file, const std::string& key,
                                     std::int64_t now_s);

/// Stores `r` for `key` at `now_s` (a private directory 0700, a temp file renamed over the old
/// one, so a reader sees the old verdict or the new one). Errors are ignored: it is a cache.
void store_probe(const std::filesystem::path& file, const std::string& key, const KvmProbe& r,
                 std::int64_t now_s);

/// The probe behind `--accel auto`, in its one order: the device check (`device`, default
/// kvm_device_usable()); with a usable device, the verdict cached in `cache` for
/// probe_key(qemu, kernel) if still valid at `now_s` (seconds since the epoch); else a probe boot
/// (`boot`, default probe_kvm_boot(qemu, kernel)), whose verdict is stored in `cache` at `now_s`.
/// A device check that fails is returned as is and never cached (it costs nothing to redo). An
/// empty `cache`, or a key that cannot be made, means a probe boot every time.
KvmProbe probe_kvm_boot_cached(const std::string& qemu, const std::filesystem::path& kernel,
                               const std::filesystem::path& cache, std::int64_t now_s,
                               const std::function<KvmProbe()>& device = {},
                               const std::function<KvmProbe()>& boot = {});

/// tcg and kvm are returned as given; auto_probe runs `probe` (default: device check, then the
/// probe boot) and returns kvm if usable, else tcg. `why` (optional) receives the reason.
Accel resolve_accel(Accel requested, const std::function<KvmProbe()>& probe,
                    std::string* why = nullptr);

}  // namespace nes::vm
