// Choosing the accelerator: KVM only if a short, bounded probe boot under KVM works, else TCG.
// On these machines /dev/kvm exists but guests hang under it (docs/facts.md): opening the device is
// not proof, only a guest that runs is (docs/vm.md "Accelerator").
#pragma once

#include <chrono>
#include <filesystem>
#include <functional>
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

/// tcg and kvm are returned as given; auto_probe runs `probe` (default: device check, then the
/// probe boot) and returns kvm if usable, else tcg. `why` (optional) receives the reason.
Accel resolve_accel(Accel requested, const std::function<KvmProbe()>& probe,
                    std::string* why = nullptr);

}  // namespace nes::vm
