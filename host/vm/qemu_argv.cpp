#include "host/vm/qemu_argv.hpp"

#include <fmt/format.h>


#include "host/lib/state_dir.hpp"
#include "host/vm/virtiofsd.hpp"
#include "protocol/limits.hpp"

namespace nes::vm {

std::string_view to_string(Accel a) {
  switch (a) {
    case Accel::tcg: return "tcg";
    case Accel::kvm: return "kvm";
    case Accel::auto_probe: return "auto";
  }
  return "?";
}

std::optional<Accel> accel_from_string(std::string_view s) {
  if (s == "tcg") return Accel::tcg;
  if (s == "kvm") return Accel::kvm;
  if (s == "auto") return Accel::auto_probe;
  return std::nullopt;
}

std::string kernel_cmdline(const KernelCmdline& c) {
  // ttyS0: the only console (-nodefaults, one serial port). quiet + loglevel: the kernel's own
  // filter keeps its messages off the console (loglevel=0 hides even KERN_EMERG such as the
  // "reboot: Power down" line); --console shows all of them.
  std::string s = c.console == ConsoleLevel::quiet ? "console=ttyS0 quiet loglevel=0"
                                                   : "console=ttyS0 loglevel=7";
  // cryptomgr.notests: no crypto self-tests at boot (docs/vm.md "Boot": the largest single
  // cost a command line can remove: P12, 2.99 -> 2.54 s end to end under TCG).
  s += " panic=-1 cryptomgr.notests";
  // no_timer_check: no check at boot that the IO-APIC delivers the timer's IRQ 0 within a few
  // ticks. A vCPU starved by a loaded host (TCG above all) can miss them, and the kernel then
  // panics "IO-APIC + timer doesn't work!" (seen once here, a VM test at load 15). QEMU's
  // IO-APIC and timers are known good; the check exists for broken chipsets.
  s += " no_timer_check";
  // Under TCG (the planner's choice): the HPET is the tick, no 100 ms of APIC timer calibration
  // against the PIT; a 1-vCPU kernel keeps its SMP lock prefixes, no patching them one by one.
  // Under KVM the APIC timer needs no calibration (TSC-deadline mode) and is cheaper than the
  // HPET, which lives in QEMU.
  if (c.tcg_words) s += " nolapic_timer noreplace-smp";
  s += " nesinit.channel=" + c.channel;
  for (const auto& e : c.extra) s += " " + e;
  return s;
}

std::string hotplug_port(std::size_t i) { return "rp" + std::to_string(i); }

namespace {
// QEMU's option syntax: a ',' inside a value is written ",,".
std::string qemu_escape(std::string_view v) {
  std::string out;
  for (char ch : v) {
    out += ch;
    if (ch == ',') out += ',';
  }
  return out;
}
/// A virtio-blk serial QEMU takes unquoted and the guest reads back as is: 1..20 of [A-Za-z0-9._-].
bool check_block_serial(std::string_view s) {
  return !s.empty() && s.size() <= 20 && host::check_name("serial", s);
}
}  // namespace

host::Result<std::vector<std::string>> qemu_argv(const QemuSpec& s) {
  auto fail = [](std::string m) { return host::Error{std::move(m)}; };
  if (s.qemu.empty()) return fail("qemu: empty program name");
  if (s.kernel.empty()) return fail("kernel: no kernel image given");
  if (s.mem_mib < 64 || s.mem_mib > 1024 * 1024)
    return fail(fmt::format("mem_mib: {} MiB is outside 64..1048576", s.mem_mib));
  if (s.cpus < 1 || s.cpus > 64) return fail(fmt::format("cpus: {} is outside 1..64", s.cpus));
  if (s.accel == Accel::auto_probe) return fail("accel: 'auto' must be resolved before building argv");
  if (s.tcg_tb_mib > 65536) return fail(fmt::format("tcg_tb_mib: {} MiB is outside 0..65536", s.tcg_tb_mib));
  if (!host::check_name("port_name", s.port_name))
    return fail(fmt::format("port_name: '{}' is not 1..64 of [A-Za-z0-9._-]", s.port_name));
  if (s.channel_socket && s.channel_socket->native().size() > proto::kUnixPathMax)
    return fail(fmt::format("channel_socket: '{}' is longer than sun_path ({} bytes)",
                            s.channel_socket->native(), proto::kUnixPathMax));

  if (s.data_socket) {
    if (!s.channel_socket) return fail("data_socket: needs channel_socket (same virtio-serial bus)");
    if (!host::check_name("data_port_name", s.data_port_name) || s.data_port_name == s.port_name)
      return fail(fmt::format("data_port_name: '{}' is not 1..64 of [A-Za-z0-9._-] distinct from "
                              "port_name", s.data_port_name));
    if (s.data_socket->native().size() > proto::kUnixPathMax)
      return fail(fmt::format("data_socket: '{}' is longer than sun_path ({} bytes)",
                              s.data_socket->native(), proto::kUnixPathMax));
  }
  for (std::size_t i = 0; i < s.fs_devices.size(); ++i) {
    const auto& d = s.fs_devices[i];
    if (auto t = check_share_tag(d.tag); !t) return fail(fmt::format("fs_devices[{}].tag: {}", i, t.error().message));
    if (d.socket.empty() || d.socket.native().size() > proto::kUnixPathMax)
      return fail(fmt::format("fs_devices[{}].socket: '{}' is empty or longer than sun_path", i,
                              d.socket.native()));
    for (std::size_t j = 0; j < i; ++j)
      if (s.fs_devices[j].tag == d.tag) return fail(fmt::format("fs_devices[{}].tag: '{}' twice", i, d.tag));
  }

  for (std::size_t i = 0; i < s.block_devices.size(); ++i) {
    const auto& d = s.block_devices[i];
    if (d.path.empty()) return fail(fmt::format("block_devices[{}].path: empty", i));
    if (!check_block_serial(d.serial))
      return fail(fmt::format("block_devices[{}].serial: '{}' is not 1..20 of [A-Za-z0-9._-]", i, d.serial));
    for (std::size_t j = 0; j < i; ++j)
      if (s.block_devices[j].serial == d.serial)
        return fail(fmt::format("block_devices[{}].serial: '{}' twice", i, d.serial));
  }

  if (s.net_args.size() % 2)
    return fail(fmt::format("net_args: {} arguments, expected -netdev/-device VALUE pairs", s.net_args.size()));
  for (std::size_t i = 0; i < s.net_args.size(); i += 2)
    if ((s.net_args[i] != "-netdev" && s.net_args[i] != "-device") || s.net_args[i + 1].empty() ||
        s.net_args[i + 1].starts_with("-"))
      return fail(fmt::format("net_args[{}]: '{}' '{}' is not -netdev/-device VALUE", i, s.net_args[i],
                              s.net_args[i + 1]));

  if (s.qmp_socket && (s.qmp_socket->empty() || s.qmp_socket->native().size() > proto::kUnixPathMax ||
                       s.qmp_socket->native().find(',') != std::string::npos))
    return fail(fmt::format("qmp_socket: '{}' is empty, longer than sun_path or holds a ','", s.qmp_socket->native()));

  if (s.snapshot_layout) {
    bool device = false;
    for (std::size_t i = 0; i < s.net_args.size(); i += 2) device = device || s.net_args[i] == "-device";
    if (!s.fs_devices.empty() || device)
      return fail("snapshot_layout: shares and the NIC are plugged in after a restore, not given on the command line");
  }
  if (s.snapshot_layout != s.ram_file.has_value())
    return fail("ram_file: given exactly with snapshot_layout");
  if (s.ram_file && s.ram_file->path.empty()) return fail("ram_file: empty path");
  if (s.incoming && (!s.qmp_socket || !s.snapshot_layout))
    return fail("incoming: a restore needs qmp_socket and snapshot_layout");

  const std::string redial =
      s.chardev_reconnect_s ? ",reconnect=" + std::to_string(s.chardev_reconnect_s) : std::string();
  std::vector<std::string> a{s.qemu};
  auto add = [&](std::initializer_list<std::string> xs) { a.insert(a.end(), xs); };
  // q35 boots reliably here (microvm hangs without tsc_early_khz). -no-reboot: a guest reboot or
  // a panic (panic=-1) ends QEMU, so every end of the guest is QEMU exiting.
  std::string accel(to_string(s.accel));
  if (s.accel == Accel::tcg && s.tcg_tb_mib) accel += fmt::format(",tb-size={}", s.tcg_tb_mib);
  add({"-M", "q35", "-accel", accel});
  if (s.accel == Accel::kvm) add({"-cpu", "host"});
  add({"-m", std::to_string(s.mem_mib), "-smp", std::to_string(s.cpus)});
  if (s.snapshot_layout)
    add({"-object", fmt::format("memory-backend-file,id=mem0,size={}M,mem-path={},share={}", s.mem_mib,
                                qemu_escape(s.ram_file->path.native()), s.ram_file->shared ? "on" : "off"),
         "-numa", "node,memdev=mem0"});
  else if (!s.fs_devices.empty())
    add({"-object", fmt::format("memory-backend-memfd,id=mem0,size={}M,share=on", s.mem_mib),
         "-numa", "node,memdev=mem0"});
  add({"-no-reboot", "-nodefaults", "-no-user-config", "-display", "none"});
  if (s.firmware) add({"-bios", *s.firmware});
  add({"-kernel", s.kernel.native()});
  if (s.initrd) add({"-initrd", s.initrd->native()});
  add({"-append", s.append});
  // The console: the one serial port, on QEMU's stdout (a pipe the launcher drains).
  add({"-chardev", "stdio,id=con0,signal=off", "-serial", "chardev:con0"});
  if (s.channel_socket) {
    // The lifecycle channel: virtio-serial port `nes.0`; QEMU dials our listener (server=off).
    add({"-device", "virtio-serial-pci,id=vser0",
         "-chardev", "socket,id=nes0,server=off" + redial + ",path=" + qemu_escape(s.channel_socket->native()),
         "-device", "virtserialport,bus=vser0.0,chardev=nes0,name=" + s.port_name});
  }
  if (s.data_socket) {
    // The data channel: a port of its own, so output never queues behind (or ahead of) the
    // lifecycle messages; QEMU dials our second listener.
    add({"-chardev", "socket,id=nes1,server=off" + redial + ",path=" + qemu_escape(s.data_socket->native()),
         "-device", "virtserialport,bus=vser0.0,chardev=nes1,name=" + s.data_port_name});
  }
  for (std::size_t i = 0; i < s.fs_devices.size(); ++i) {
    const auto& d = s.fs_devices[i];
    add({"-chardev", fmt::format("socket,id=fs{},path={}", i, qemu_escape(d.socket.native())),
         "-device", fmt::format("vhost-user-fs-pci,chardev=fs{},tag={}", i, d.tag)});
  }
  for (std::size_t i = 0; i < s.block_devices.size(); ++i) {
    const auto& d = s.block_devices[i];
    // QEMU's default cache (writeback through the host's page cache) and aio=threads, not
    // cache=none,aio=native: an image's file is shared by every VM of that image, read once into
    // the host's page cache for all of them, and O_DIRECT fails outright on tmpfs (docs/vm.md
    // "Block devices").
    add({"-drive", fmt::format("file={},if=none,id=blk{},format=raw,readonly={}", qemu_escape(d.path.native()), i,
                               d.read_only ? "on" : "off"),
         "-device", fmt::format("virtio-blk-pci,drive=blk{},serial={}", i, d.serial)});
  }
  a.insert(a.end(), s.net_args.begin(), s.net_args.end());
  if (s.snapshot_layout)
    for (std::size_t i = 0; i < kHotplugPorts; ++i)
      add({"-device", fmt::format("pcie-root-port,id={},bus=pcie.0,chassis={}", hotplug_port(i), i + 1)});
  if (s.free_page_reporting) add({"-device", "virtio-balloon-pci,id=balloon0,free-page-reporting=on"});
  if (s.qmp_socket) add({"-qmp", "unix:" + s.qmp_socket->native() + ",server=on,wait=off"});
  if (s.incoming) add({"-S", "-incoming", "defer"});  // -S: paused after the load, until `cont`
  return a;
}

}  // namespace nes::vm
