// `neshost run`'s flag table, its parser and --help, and the checks its flags ask of this host
// (host/cli/run_flags.hpp).
#include "host/cli/run_flags.hpp"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <tuple>

#include <fmt/format.h>

#include "host/lib/log_writer.hpp"
#include "host/lib/state_dir.hpp"
#include "host/vm/snapshot.hpp"
#include "protocol/codec.hpp"
#include "protocol/messages.hpp"

namespace nes::cli {

namespace fs = std::filesystem;
using host::Error;
using host::Ok;
using host::Status;

host::Result<std::uint64_t> parse_size(std::string_view flag, std::string_view v) {
  std::uint64_t mult = 1;
  std::string_view num = v;
  if (!v.empty()) {
    char u = static_cast<char>(std::tolower(static_cast<unsigned char>(v.back())));
    if (u == 'k' || u == 'm' || u == 'g') {
      mult = u == 'k' ? 1024 : u == 'm' ? 1024 * 1024 : 1024ull * 1024 * 1024;
      num.remove_suffix(1);
    }
  }
  auto n = parse_uint(flag, num, 1, (1ull << 40) / mult);
  if (!n) return Error{fmt::format("--{}: expected bytes with an optional k, m or g, got '{}'", flag, v)};
  if (*n * mult < host::kMinLogSize) return Error{fmt::format("--{}: {} is below the minimum 64k", flag, v)};
  return *n * mult;
}

Status check_hostname(std::string_view v) {
  if (v.size() > kMaxHostname)
    return Error{fmt::format("--hostname: {} bytes, the guest's limit is {} (HOST_NAME_MAX)", v.size(), kMaxHostname)};
  if (!proto::valid_dns_name(v))
    return Error{fmt::format("--hostname: expected 1..{} letters, digits, '-', '.', '_', got '{}'", kMaxHostname, v)};
  return Ok{};
}

namespace {

/// A path flag's value: not empty (what it names is checked where it is used).
// USER[:GROUP] as names an image's /etc/passwd and /etc/group could hold (POSIX's portable
// user-name characters, at most 32, not all digits: a number is parse_user()'s to judge), or a
// number on either side. Resolved later by host/image/run_image.hpp, only with an IMAGE.
bool user_names_ok(std::string_view v) {
  auto part_ok = [](std::string_view p, bool& digits) {
    if (p.empty() || p.size() > 32) return false;
    digits = true;
    for (char c : p) {
      if (c < '0' || c > '9') digits = false;
      if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-')) return false;
    }
    return true;
  };
  auto colon = v.find(':');
  bool d1 = false, d2 = false;
  if (!part_ok(v.substr(0, colon), d1)) return false;
  if (colon == std::string_view::npos) return !d1;
  if (!part_ok(v.substr(colon + 1), d2)) return false;
  return !(d1 && d2);
}

Status set_path(std::optional<fs::path>& into, std::string_view flag, std::string_view v) {
  if (v.empty()) return Error{fmt::format("--{}: expected a path, got ''", flag)};
  into = fs::path(v);
  return Ok{};
}

/// A seconds flag's value (parse_seconds: 0 < S <= 31 days).
Status set_seconds(std::chrono::milliseconds& into, std::string_view flag, std::string_view v) {
  auto ms = parse_seconds(flag, v);
  if (!ms) return ms.error();
  into = *ms;
  return Ok{};
}

/// The `neshost run` table. Setters take the value as given; `Ok{}` returns keep them one line.
const RunFlag kRunFlags[] = {
    {{"interactive", false, "-i"}, "",
     [](RunFlags& o, std::string_view) -> Status { return o.interactive = true, Ok{}; },
     "forward neshost's stdin to the workload (and its EOF)"},
    {{"tty", false, "-t"}, "",
     [](RunFlags& o, std::string_view) -> Status { return o.tty = true, Ok{}; },
     "give the workload a pseudo-terminal sized like ours (SIGWINCH resizes\n"
     "it); with -i and a terminal on stdin, that terminal is in raw mode until\n"
     "neshost exits (^C then goes to the workload)"},
    {{"log-max-size"}, "SIZE",
     [](RunFlags& o, std::string_view v) -> Status {
       auto n = parse_size("log-max-size", v);
       if (!n) return n.error();
       return o.log_max_size = *n, Ok{};
     },
     "rotate workload.log at SIZE bytes (k, m, g suffixes; default 10m, min 64k)"},
    {{"log-max-files"}, "N",
     [](RunFlags& o, std::string_view v) -> Status {
       auto n = parse_uint("log-max-files", v, 1, 100);
       if (!n) return n.error();
       return o.log_max_files = static_cast<unsigned>(*n), Ok{};
     },
     "rotated files kept, the live one included (default 5, at most 100;\n"
     "1: truncate)"},
    {{"kernel"}, "PATH", [](RunFlags& o, std::string_view v) { return set_path(o.kernel, "kernel", v); },
     "guest kernel (default: $NESHOST_KERNEL, else the one scripts/fetch-kernel.sh\n"
     "fetched)"},
    {{"initrd"}, "PATH", [](RunFlags& o, std::string_view v) { return set_path(o.initrd, "initrd", v); },
     "initramfs with nesinit as /init (default: $NESHOST_INITRD, else the build's)"},
    {{"snapshot"}, "NAME|DIR",
     [](RunFlags& o, std::string_view v) -> Status {
       // A NAME in the state dir's snapshots, or (with a '/') a snapshot's directory.
       if (v.find('/') == std::string_view::npos)
         if (auto c = vm::check_snapshot_name(v); !c) return Error{fmt::format("--snapshot: {}", c.error().message)};
       return o.snapshot = std::string(v), Ok{};
     },
     "restore the VM from a snapshot (neshost snapshot create NAME; a value with a\n"
     "'/' is a snapshot's directory) instead of booting it: its kernel, initramfs,\n"
     "command line, grace, accelerator, RAM and vCPUs (--mem, --cpus, --accel may\n"
     "be left out; if given they must match). Shares (at most 8; 7 with a NIC)\n"
     "and the NIC are plugged in after the restore. Refused (125) when missing,\n"
     "corrupt, made by another init build, kernel or QEMU, or another --mem,\n"
     "--cpus, --accel; --kernel, --initrd, --console, --grace, --sandbox and\n"
     "--rootfs-mode initramfs cannot be used with it, nor more shares"},
    {{"rootfs"}, "DIR", [](RunFlags& o, std::string_view v) { return set_path(o.rootfs, "rootfs", v); },
     "DIR is the guest's root: the workload sees it as / (with /proc, /sys, /dev,\n"
     "/run and a private /tmp), served over virtiofs, writes go to DIR"},
    {{"rootfs-mode"}, "MODE",
     [](RunFlags& o, std::string_view v) -> Status {
       if (v != "virtiofs" && v != "initramfs" && v != "block")
         return Error{fmt::format("--rootfs-mode: expected virtiofs, initramfs or block, got '{}'", v)};
       o.rootfs_block = v == "block";
       o.rootfs_mode_given = true;
       return o.rootfs_initramfs = v == "initramfs", Ok{};
     },
     "virtiofs (default) or initramfs: copy DIR into an initramfs instead\n"
     "(with nesinit and the kernel's modules; scripts/mkinitrd.sh), RAM-backed;\n"
     "block: --rootfs names an EROFS or ext4 image FILE (with an IMAGE: the\n"
     "image's own EROFS file, built once), attached read-only (virtio-blk)\n"
     "under a writable overlay in memory (--upper-size)"},
    {{"upper-size"}, "MIB",
     [](RunFlags& o, std::string_view v) -> Status {
       std::uint32_t n = 0;
       bool ok = !v.empty() && v.size() <= 7;
       for (char c : v) ok = ok && c >= '0' && c <= '9', n = n * 10 + static_cast<std::uint32_t>(c - '0');
       if (!ok || n < 1 || n > proto::kUpperMibMax)
         return Error{fmt::format("--upper-size: expected MiB 1..{}, got '{}'", proto::kUpperMibMax, v)};
       return o.upper_mib = n, Ok{};
     },
     "--rootfs-mode block: the writable layer's size cap in MiB (default: half\n"
     "of the guest's RAM); writes past it fail with ENOSPC"},
    {{"volume", true, "-v"}, "HOST:GUEST[:ro]",
     [](RunFlags& o, std::string_view v) -> Status {
       auto vol = vm::parse_volume(v);
       if (!vol) return vol.error();
       o.volumes.push_back(std::move(*vol));
       if (auto p = vm::check_volumes(o.volumes); !p) return p;
       if (o.volumes.size() > kMaxVolumes) return Error{fmt::format("--volume: at most {} volumes", kMaxVolumes)};
       return Ok{};
     },
     "share host directory HOST at GUEST over virtiofs (repeatable); :ro makes\n"
     "it read-only on both sides (EROFS in the guest). A regular file HOST is\n"
     "bound at GUEST (as docker's file binds, e.g. /etc/hosts; needs root)"},
    {{"mem"}, "MiB",
     [](RunFlags& o, std::string_view v) -> Status {
       auto n = parse_uint("mem", v, 64, 1024 * 1024);
       if (!n) return n.error();
       o.mem = static_cast<std::uint32_t>(*n);
       return o.mem_given = true, Ok{};
     },
     "guest RAM (default 256; 64 up to this host's memory)"},
    {{"cpus"}, "N",
     [](RunFlags& o, std::string_view v) -> Status {
       auto n = parse_uint("cpus", v, 1, 64);
       if (!n) return n.error();
       o.cpus = static_cast<std::uint32_t>(*n);
       return o.cpus_given = true, Ok{};
     },
     "vCPUs (default 1, at most 64)"},
    {{"accel"}, "tcg|kvm|auto",
     [](RunFlags& o, std::string_view v) -> Status {
       auto acc = vm::accel_from_string(v);
       if (!acc) return Error{fmt::format("--accel: expected tcg, kvm or auto, got '{}'", v)};
       return o.accel = *acc, Ok{};
     },
     "auto (default): KVM only if a short probe boot under KVM works, else TCG;\n"
     "kvm is refused (125, nothing started) on a host without a usable /dev/kvm"},
    {{"env", true, "-e"}, "K=V|K",
     [](RunFlags& o, std::string_view v) -> Status {
       auto kv = parse_env(v);
       if (!kv) return kv.error();
       if (*kv) o.env[(*kv)->first] = (*kv)->second;
       return Ok{};
     },
     "workload environment (repeatable; K alone: its value here, if set;\n"
     "PATH defaults to the usual one)"},
    {{"workdir", true, "-w"}, "DIR",
     [](RunFlags& o, std::string_view v) -> Status {
       auto w = parse_workdir(v);
       if (!w) return w.error();
       return o.workdir = std::move(*w), Ok{};
     },
     "workload working directory, absolute (default /)"},
    {{"user", true, "-u"}, "UID[:GID]",
     [](RunFlags& o, std::string_view v) -> Status {
       // Names (USER[:GROUP]) only an IMAGE's /etc/passwd and /etc/group resolve: check_run()
       // refuses them without one; here only what can be neither numbers nor names.
       auto u = parse_user(v);
       if (!u && !user_names_ok(v)) return u.error();
       if (u) std::tie(o.uid, o.gid) = *u;
       return o.user_spec = std::string(v), Ok{};
     },
     "workload uid and gid, numeric (default 0:0; GID alone defaults to UID);\n"
     "with an IMAGE also names, USER[:GROUP] in its /etc/passwd, /etc/group"},
    {{"pull"}, "POLICY",
     [](RunFlags& o, std::string_view v) -> Status {
       if (v == "missing") return o.pull = RunFlags::Pull::missing, Ok{};
       if (v == "always") return o.pull = RunFlags::Pull::always, Ok{};
       if (v == "never") return o.pull = RunFlags::Pull::never, Ok{};
       return Error{fmt::format("--pull: expected missing, always or never, got '{}'", v)};
     },
     "IMAGE only: missing (default): pull an IMAGE not in the store first;\n"
     "always: pull ARGV's first word (an IMAGE then) before the run; never"},
    {{"entrypoint"}, "CMD",
     [](RunFlags& o, std::string_view v) -> Status {
       // "" clears the image's Entrypoint (docker's); a NUL byte could never be exec'd
       if (v.find('\0') != std::string_view::npos) return Error{"--entrypoint: a NUL byte in the command"};
       return o.entrypoint = std::string(v), Ok{};
     },
     "IMAGE only: replaces the image's Entrypoint (and drops its Cmd; \"\"\n"
     "clears it), as docker's"},
    {{"group-add"}, "GID",
     [](RunFlags& o, std::string_view v) -> Status {
       auto g = parse_uint("group-add", v, 0, proto::kInvalidId - 1);
       if (!g) return g.error();
       if (o.groups.size() >= 64) return Error{"--group-add: at most 64 groups"};
       return o.groups.push_back(static_cast<std::uint32_t>(*g)), Ok{};
     },
     "a supplementary group of the workload (repeatable, at most 64;\n"
     "default none)"},
    {{"read-only", false}, "",
     [](RunFlags& o, std::string_view) -> Status { return o.read_only = true, Ok{}; },
     "--rootfs DIR or the IMAGE is read-only for the guest (EROFS; an IMAGE then\n"
     "has no writable layer), as docker's --read-only",
     [](const RunFlags& o) -> Status {
       // Without --rootfs the ARGV's first word may still be an IMAGE (a --rootfs run once
       // resolved): check_run() refuses --read-only with neither.
       if (o.rootfs_initramfs) return Error{"--read-only needs --rootfs DIR over virtiofs, or an IMAGE"};
       return Ok{};
     }},
    {{"hostname", true, "-h"}, "NAME",
     [](RunFlags& o, std::string_view v) -> Status {
       if (auto c = check_hostname(v); !c) return c;
       return o.hostname = std::string(v), Ok{};
     },
     "guest hostname, at most 64 bytes (default: the VM id, as docker run;\n"
     "--help for this text)"},
    {{"on-exit"}, "POLICY",
     [](RunFlags& o, std::string_view v) -> Status {
       auto pol = host::on_exit_from_string(v);
       if (!pol) return Error{fmt::format("--on-exit: expected stop, keep or remove, got '{}'", v)};
       return o.on_exit = *pol, Ok{};
     },
     "stop (default): power off, wait for QEMU; remove: also delete the VM's\n"
     "scratch files (console log); keep: leave the VM up after the workload\n"
     "exits until `neshost stop --state DIR VM` (or SIGTERM)"},
    {{"state"}, "DIR", [](RunFlags& o, std::string_view v) { return set_path(o.state, "state", v); },
     "state directory (default: $NESHOST_STATE, else /var/lib/neshost as root,\n"
     "else ~/.local/state/neshost)"},
    {{"vm"}, "ID",
     [](RunFlags& o, std::string_view v) -> Status {
       if (auto id = host::check_vm_id(v); !id) return Error{fmt::format("--vm: {}", id.error().message)};
       return o.vm = std::string(v), Ok{};
     },
     "VM id, [A-Za-z0-9._-] (default: vm-<random>)"},
    {{"timeout"}, "S",
     [](RunFlags& o, std::string_view v) -> Status {
       std::chrono::milliseconds ms{};
       if (auto s = set_seconds(ms, "timeout", v); !s) return s;
       return o.timeout = ms, Ok{};
     },
     "workload wall limit in seconds: `stop`, grace, shutdown; exit 124"},
    {{"ready-timeout"}, "S",
     [](RunFlags& o, std::string_view v) { return set_seconds(o.ready_timeout, "ready-timeout", v); },
     "seconds from QEMU's start to the guest's `ready` (default 30)"},
    {{"grace"}, "S",
     [](RunFlags& o, std::string_view v) -> Status {
       if (auto s = set_seconds(o.grace, "grace", v); !s) return s;
       return o.grace_given = true, Ok{};
     },
     "seconds between the workload's SIGTERM and SIGKILL in an ordered shutdown\n"
     "(default 10; the init's grace_ms); QEMU is killed if the guest has not\n"
     "powered off S+5 seconds after `shutdown`"},
    {{"console", false}, "",
     [](RunFlags& o, std::string_view) -> Status { return o.console = true, Ok{}; },
     "show every kernel and init message (the console), and neshost's events, on\n"
     "stderr"},
    {{"detach", false, "-d"}, "",
     [](RunFlags& o, std::string_view) -> Status { return o.detach = true, Ok{}; },
     "run in the background: print the VM id once the workload started and\n"
     "exit 0; a monitor process (its own session) serves the VM from then on\n"
     "and logs to STATE/VM/monitor.log (see ps, inspect, wait, stop, kill, rm)"},
    {{"sandbox", false}, "",
     [](RunFlags& o, std::string_view) -> Status { return o.sandbox = true, Ok{}; },
     "no VM: run the init as PID 1 of a fresh pid + mount namespace on this\n"
     "host (unshare; needs root), the workload in the host's filesystem. For\n"
     "development and tests of everything around the VM; no isolation"},
    {{"name"}, "NAME",
     [](RunFlags& o, std::string_view v) -> Status {
       if (auto id = host::check_vm_id(v); !id) return Error{fmt::format("--name: {}", id.error().message)};
       return o.name = std::string(v), Ok{};
     },
     "assign a name to the VM: its id (the same as --vm)",
     [](const RunFlags& o) -> Status {
       if (o.vm && *o.vm != *o.name)
         return Error{fmt::format("--name {} and --vm {} name two VMs (--name is --vm, docker's spelling)", *o.name, *o.vm)};
       return Ok{};
     }},
    {{"rm", false}, "",
     [](RunFlags& o, std::string_view) -> Status { return o.rm = true, Ok{}; },
     "automatically remove the VM's state (records, logs) when it exits\n"
     "(with -d: once its outcome is recorded)"},
    {{"vmm-outlives", false}, "",
     [](RunFlags& o, std::string_view) -> Status { return o.vmm_outlives = true, Ok{}; },
     "the VMM outlives this process (as with -d: recorded in STATE/VM/vmm.json,\n"
     "its channels redial) and a neshost command adopts it if this process dies\n"
     "(for a supervisor running `run` in the foreground: the containerd shim)"},
    {{"stdin-hold", false}, "",
     [](RunFlags& o, std::string_view) -> Status { return o.stdin_hold = true, Ok{}; },
     "with -i and a FIFO on stdin: hold the FIFO open for writing until the\n"
     "control request close-stdin (the shim's CloseIO), so its writers going\n"
     "(a client detached, a supervisor SIGKILLed) is not the workload's EOF",
     [](const RunFlags& o) -> Status { return o.interactive ? Status{Ok{}} : Error{"--stdin-hold needs -i"}; }},
    // The network (host::NetworkSpec; its cross-checks are host::check_network()'s, in check_run()).
    {{"network"}, "MODE",
     [](RunFlags& o, std::string_view v) -> Status {
       if (auto m = host::parse_network_mode(v, o.network); !m) return m;
       return o.network_given = true, Ok{};
     },
     "connect the VM to a network: user (default; also passt, pasta: passt's\n"
     "user-mode network: outbound NAT, the host's loopback closed), slirp\n"
     "(also slirp4netns: QEMU's user-mode network; the guest *can* reach the\n"
     "host's loopback at 10.0.2.2), none (loopback only), netns:PATH (take\n"
     "over that network namespace's interface). Default: $NESHOST_NETWORK if\n"
     "set, else user (none with --sandbox)",
     nullptr, "Network"},
    {{"publish", true, "-p"}, "[IP:]HOST:GUEST[/tcp|/udp]",
     [](RunFlags& o, std::string_view v) -> Status {
       auto m = host::parse_publish(v);
       if (!m) return m.error();
       return o.network.publish.push_back(*m), Ok{};
     },
     "publish a guest port to the host (repeatable; user and slirp modes; IP\n"
     "defaults to 0.0.0.0, as docker's). The host port must be free",
     nullptr, "Network"},
    {{"dns"}, "IP",
     [](RunFlags& o, std::string_view v) -> Status {
       auto a = proto::ip_from_text(v);
       if (!a) return Error{fmt::format("--dns {}: not an IPv4 or IPv6 address", v)};
       return o.network.dns.push_back(*a), Ok{};
     },
     "set a custom DNS server (repeatable, at most 3; user modes default to\n"
     "10.0.2.3, which forwards to the host's resolver)",
     nullptr, "Network"},
    {{"dns-search"}, "DOMAIN",
     [](RunFlags& o, std::string_view v) -> Status {
       if (!proto::valid_dns_name(v))
         return Error{fmt::format("--dns-search {}: a domain is 1..253 of letters, digits, '-', '.', '_'", v)};
       return o.network.dns_search.emplace_back(v), Ok{};
     },
     "set a custom DNS search domain (repeatable)", nullptr, "Network"},
    {{"dns-option"}, "OPT",
     [](RunFlags& o, std::string_view v) -> Status {
       if (!proto::valid_dns_option(v))
         return Error{fmt::format("--dns-option '{}': a resolv.conf option is 1..64 printable bytes, no spaces", v)};
       return o.network.dns_options.emplace_back(v), Ok{};
     },
     "set a DNS option (repeatable; resolv.conf's `options`)", nullptr, "Network"},
    {{"add-host"}, "NAME:IP",
     [](RunFlags& o, std::string_view v) -> Status {
       auto h = host::parse_add_host(v);
       if (!h) return h.error();
       return o.network.hosts.push_back(std::move(*h)), Ok{};
     },
     "add a custom host-to-IP mapping to /etc/hosts (repeatable);\n"
     "NAME:host-gateway maps NAME to the host, and opens the host's loopback\n"
     "to this VM at that address (user and slirp modes)",
     nullptr, "Network"},
};

/// The entries named in `names`, in that order (run's own: the same setter, check and help).
std::vector<RunFlag> select(std::initializer_list<std::string_view> names) {
  std::vector<RunFlag> out;
  for (auto n : names)
    for (const auto& f : kRunFlags)
      if (f.spec.name == n) out.push_back(f);
  return out;
}

/// After every flag: --name is the VM's id; the network's default mode ($NESHOST_NETWORK, else none with --sandbox,
/// else user).
Status finish(RunFlags& o) {
  if (o.name) o.vm = o.name;
  if (o.network_given) return Ok{};
  if (const char* env = std::getenv("NESHOST_NETWORK"); env && *env) {
    if (auto m = host::parse_network_mode(env, o.network); !m) return Error{"$NESHOST_NETWORK: " + m.error().message};
    o.network_given = o.network_from_env = true;
  } else {
    o.network.mode = o.sandbox ? host::NetworkMode::none : host::NetworkMode::passt;
  }
  return Ok{};
}

constexpr std::string_view kRunUsage = R"(usage: neshost run [OPTIONS] [--] ARGV...
       neshost run [OPTIONS] IMAGE [COMMAND [ARG...]]   (an image of the store: docs/images.md)

Boot a QEMU microVM (q35) with nesinit as PID 1, run ARGV in it and exit with its exit status:
the workload's code, 128+N if killed by signal N, 127/126 if it could not start, 124 on
--timeout, 125 for host-side failures (QEMU or the kernel missing, no `ready` in time, ...)
and whenever workload output was lost (one line on stderr names each stream and its bytes;
it overrides the workload's own status, not 124). A slow reader of our stdout only slows the VM down (the
guest holds the workload's output, and its power-off, until we have read it): nothing is lost
unless the VM is ended on purpose while its output is still owed (SIGINT/SIGTERM, neshost stop).
The workload's stdout and stderr are neshost's stdout and stderr, byte-exact (a data channel of
their own, never the serial console), and are also logged to STATE/VM/workload.log (CRI format,
see `neshost logs`). Its stdin is /dev/null unless -i. The outcome record is written to
STATE/VM/outcome.json (see `neshost inspect`); the kernel's and the init's own messages go to
STATE/VM/console.log.
Usage errors exit 125 before anything starts (no VM, no state left), naming the flag, as docker's
own flag errors: an unknown flag, a bad value, flags that exclude each other, what the flags ask of
this host (--accel kvm without a usable /dev/kvm, more --mem than it has, a missing --kernel,
--initrd or --rootfs, a published host port in use, passt missing or too old).

)";

constexpr std::string_view kRunTail = R"(  See `neshost port VM` for a VM's published ports.
SIGINT/SIGTERM: ordered shutdown of the guest; QEMU is killed after a deadline (a second signal:
at once). Once the workload has ended, a signal ends the wait for the output still owed (what
it cuts is counted and reported, exit 125); the last writes to our stdout/stderr wait for
their readers however slow, until a signal (then the bytes left are counted, exit 125) or, after
--timeout, for --grace at most (counted too; the exit stays 124).
Environment: NESHOST_APPEND (extra kernel command-line words, appended last, e.g. nesinit.log=debug);
NESHOST_TCG_BOOT_WORDS=0 (a 1-vCPU TCG guest boots without `nolapic_timer noreplace-smp`, which
spare it ~0.18 s: docs/vm.md "Boot time"; any other value keeps them); NESHOST_TCG_TB_MIB (TCG's
translation buffer in MiB, default 16, 0: QEMU's 1 GiB; not digits or over 5 of them: ignored);
NESHOST_FREE_PAGE_REPORTING=1 or 0 (a virtio-balloon with free page reporting: the guest's freed
pages handed back to the host; default 0).
)";

/// /proc/meminfo's MemTotal in MiB.
std::optional<std::uint64_t> meminfo_mib() {
  std::ifstream f("/proc/meminfo");
  std::string key;
  std::uint64_t kib = 0;
  while (f >> key >> kib) {
    if (key == "MemTotal:") return kib / 1024;
    f.ignore(64, '\n');
  }
  return std::nullopt;
}

}  // namespace

std::span<const RunFlag> run_flags() { return kRunFlags; }

std::span<const RunFlag> snapshot_create_flags() {
  static const std::vector<RunFlag> flags = select({"state", "mem", "cpus", "accel", "grace", "ready-timeout"});
  return flags;
}

std::string run_help() {
  std::string out(kRunUsage);
  out += flag_help(run_flags());
  out += "\nNetwork:\n";
  out += flag_help(run_flags(), "Network");
  out += kRunTail;
  return out;
}

host::Result<RunFlags> parse_run_with(std::span<const RunFlag> table, const Args& args, FlagOrder order) {
  RunFlags o;
  auto a = apply_flags(table, args, order, o);
  if (!a) return a.error();
  o.help = a->help;
  o.argv = std::move(a->positional);
  o.argv_after_dashdash = a->after_dashdash;
  if (auto f = finish(o); !f) return f.error();
  return o;
}

host::Result<RunFlags> parse_run(const Args& args) { return parse_run_with(run_flags(), args, FlagOrder::options_first); }

RunHostProbes real_host_probes() { return {[] { return vm::kvm_device_usable(); }, meminfo_mib}; }

Status check_run_host(const RunFlags& o, const RunHostProbes& probes) {
  if (o.accel == vm::Accel::kvm && !o.sandbox && probes.kvm) {
    if (auto k = probes.kvm(); !k.usable)
      return Error{fmt::format("--accel kvm: KVM is missing on this host ({}); --accel tcg or auto runs without it",
                               k.reason)};
  }
  if (o.mem_given && probes.mem_mib)
    if (auto total = probes.mem_mib(); total && o.mem > *total)
      return Error{fmt::format("--mem {}: more than this host's memory ({} MiB)", o.mem, *total)};
  for (auto [given, flag] : {std::pair{&o.kernel, "kernel"}, {&o.initrd, "initrd"}}) {
    std::error_code ec;
    if (*given && !fs::is_regular_file(**given, ec))
      return Error{fmt::format("--{} '{}': {}", flag, (*given)->string(), ec ? ec.message() : "not a regular file")};
  }
  return Ok{};
}

}  // namespace nes::cli
