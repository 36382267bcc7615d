#include "host/vm/accel.hpp"

#include <fcntl.h>
#include <linux/kvm.h>
#include <sys/ioctl.h>

#include <cerrno>
#include <cstring>
#include <mutex>

#include <fmt/format.h>

#include "host/fd.hpp"
#include "host/vm/process.hpp"

namespace nes::vm {

KvmProbe kvm_device_usable(const std::filesystem::path& dev) {
  host::Fd fd(::open(dev.c_str(), O_RDWR | O_CLOEXEC));
  if (!fd) return {false, fmt::format("{}: {}", dev.native(), std::strerror(errno))};
  int v = ::ioctl(fd.get(), KVM_GET_API_VERSION, 0);
  if (v != KVM_API_VERSION)
    return {false, fmt::format("{}: KVM_GET_API_VERSION gave {}, want {}", dev.native(), v,
                               KVM_API_VERSION)};
  return {true, fmt::format("{} answers KVM API {}", dev.native(), v)};
}

KvmProbe probe_kvm_boot(const std::string& qemu, const std::filesystem::path& kernel,
                        std::chrono::milliseconds deadline) {
  QemuSpec spec;
  spec.qemu = qemu;
  spec.kernel = kernel;
  spec.accel = Accel::kvm;
  spec.mem_mib = 128;
  // loglevel=1: only KERN_EMERG, i.e. the panic line we look for.
  spec.append = "console=ttyS0 loglevel=1 panic=-1 root=/dev/nonexistent";
  auto argv = qemu_argv(spec);
  if (!argv.error.empty()) return {false, "probe: " + argv.error};

  std::mutex mu;
  std::string console;
  LaunchOptions o;
  o.argv = std::move(argv.argv);
  o.console = [&](std::string_view b) {
    std::lock_guard lk(mu);
    if (console.size() < 65536) console.append(b);
  };
  auto p = VmProcess::launch(std::move(o));
  if (!p) return {false, "probe: " + p.error().message};
  auto exited = (*p)->wait_for(deadline);
  if (!exited) {
    (*p)->terminate(std::chrono::milliseconds(0));
    (*p)->finish_output(std::chrono::milliseconds(500));
    return {false, fmt::format("a KVM guest did not finish booting within {} ms (hung)",
                               deadline.count())};
  }
  (*p)->finish_output(std::chrono::milliseconds(1000));
  std::lock_guard lk(mu);
  if (console.find("Kernel panic") == std::string::npos)
    return {false, fmt::format("the KVM probe guest {} without reaching the kernel's panic line ({})",
                               describe(*exited), (*p)->diagnostics_tail().substr(0, 200))};
  return {true, "a KVM probe guest booted to its expected panic"};
}

Accel resolve_accel(Accel requested, const std::function<KvmProbe()>& probe, std::string* why) {
  if (requested != Accel::auto_probe) {
    if (why) *why = fmt::format("{} requested", to_string(requested));
    return requested;
  }
  KvmProbe r = probe();
  if (why) *why = r.reason;
  return r.usable ? Accel::kvm : Accel::tcg;
}

}  // namespace nes::vm
