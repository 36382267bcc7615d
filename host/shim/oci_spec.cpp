// config.json -> TaskSpec (host/shim/oci_spec.hpp).
#include "host/shim/oci_spec.hpp"

#include <algorithm>
#include <cstdlib>

#include <fmt/format.h>
#include <simdjson.h>

#include "base/small_file.hpp"
#include "host/shim/resources.hpp"
#include "host/vm/qemu_argv.hpp"
#include "host/vm/volume.hpp"
#include "protocol/messages.hpp"

namespace nes::shim {
using host::Error;
using host::Result;
namespace dom = simdjson::dom;

namespace {

constexpr std::size_t kMaxSpecBytes = 4u << 20;

Error field_error(std::string_view field, std::string_view what) {
  return Error{fmt::format("config.json: {}: {}", field, what)};
}

// A string array field: every element a string.
Result<std::vector<std::string>> strings(dom::element e, std::string_view field) {
  dom::array a;
  if (e.get_array().get(a)) return field_error(field, "expected an array of strings");
  std::vector<std::string> out;
  std::size_t i = 0;
  for (dom::element x : a) {
    std::string_view s;
    if (x.get_string().get(s)) return field_error(fmt::format("{}[{}]", field, i), "expected a string");
    out.emplace_back(s);
    ++i;
  }
  return out;
}

Result<std::uint32_t> u32(dom::element e, std::string_view field) {
  std::uint64_t v = 0;
  if (e.get_uint64().get(v) || v > 0xffffffffu) return field_error(field, "expected an unsigned 32-bit integer");
  return static_cast<std::uint32_t>(v);
}

// Pseudo and scratch file systems the guest kernel gives the workload itself (the init mounts
// /proc, /sys, /dev, /dev/pts, /run and a private /tmp): the spec's entries for them are met.
// Only where the init mounts them: a tmpfs the spec wants at /scratch is not met by anything.
bool guest_provided(std::string_view type, std::string_view dst) {
  static constexpr std::string_view kTypes[] = {"proc", "sysfs", "devpts", "tmpfs", "mqueue", "cgroup", "cgroup2", "devtmpfs"};
  static constexpr std::string_view kPaths[] = {"/proc", "/sys", "/dev", "/dev/pts", "/dev/shm", "/dev/mqueue",
                                                "/run", "/tmp", "/sys/fs/cgroup"};
  return std::find(std::begin(kTypes), std::end(kTypes), type) != std::end(kTypes) &&
         std::find(std::begin(kPaths), std::end(kPaths), dst) != std::end(kPaths);
}

// The limits `neshost run` applies (host/vm/volume.hpp, host/cli/plan.cpp), checked here so a spec it
// would refuse fails Create, naming the field, instead of a task that exits 2.
constexpr std::size_t kMaxVolumes = 16;
constexpr std::size_t kMaxGroups = 64;

// Whether the `neshost run` of run_args(s) gives the VM a NIC: `--network netns:PATH` for a spec's
// network namespace; else no --network flag, so neshost's default from the environment it
// inherits from the shim: $NESHOST_NETWORK (only "none" means no NIC; any other mode has one)
// or, unset or empty, user mode (passt), which has one.
bool run_has_nic(const TaskSpec& s) {
  if (!s.netns.empty()) return true;
  const char* env = std::getenv("NESHOST_NETWORK");
  return !(env && std::string_view(env) == "none");
}

// `neshost run --snapshot` plugs each share into a hot-plug root port of its own after the
// restore, the NIC into the last one, and refuses (exit 2) more than fit: checked here, counted as
// it counts run_args(s)'s shares (plan.cpp share_count): --rootfs one, each directory volume one,
// the file volumes one together (their staging share). `files`: how many of s.volumes are files.
host::Status check_snapshot_shares(const TaskSpec& s, std::size_t files) {
  if (s.snapshot.empty()) return host::Ok{};
  const std::size_t shares = 1 + (s.volumes.size() - files) + (files > 0);
  const bool nic = run_has_nic(s);
  const std::size_t limit = vm::kHotplugPorts - (nic ? 1 : 0);
  if (shares <= limit) return host::Ok{};
  return field_error(fmt::format("annotations.{}", kSnapshotAnnotation),
                     fmt::format("a restore plugs in at most {} shares{} (one hot-plug port each, of {}); this task "
                                 "has {} (the root file system, each directory bind mount, and its file bind "
                                 "mounts one together)",
                                 limit, nic ? " beside its NIC" : "", vm::kHotplugPorts, shares));
}

}  // namespace

/// `process` (config.json's, or an Exec's spec) into `s`'s process fields; errors name
/// "process.FIELD".
static host::Status parse_process(dom::object process, TaskSpec& s) {
  {
    dom::element args;
    if (process["args"].get(args)) return field_error("process.args", "missing");
    auto a = strings(args, "process.args");
    if (!a) return a.error();
    if (a->empty() || a->front().empty()) return field_error("process.args", "expected a non-empty array of strings");
    s.argv = std::move(*a);
  }
  if (dom::element env; !process["env"].get(env)) {
    auto e = strings(env, "process.env");
    if (!e) return e.error();
    for (std::size_t i = 0; i < e->size(); ++i)
      if ((*e)[i].find('=') == std::string::npos || (*e)[i].front() == '=')
        return field_error(fmt::format("process.env[{}]", i), "expected KEY=VALUE");
    s.env = std::move(*e);
  }
  if (std::string_view cwd; !process["cwd"].get_string().get(cwd)) {
    if (cwd.empty() || cwd.front() != '/') return field_error("process.cwd", "expected an absolute path");
    s.cwd = std::string(cwd);
  }
  if (bool t = false; !process["terminal"].get_bool().get(t)) s.terminal = t;
  if (dom::object user; !process["user"].get_object().get(user)) {
    if (dom::element v; !user["uid"].get(v)) {
      auto u = u32(v, "process.user.uid");
      if (!u) return u.error();
      s.uid = *u;
    }
    if (dom::element v; !user["gid"].get(v)) {
      auto g = u32(v, "process.user.gid");
      if (!g) return g.error();
      s.gid = *g;
    }
    if (dom::array a; !user["additionalGids"].get_array().get(a)) {
      std::size_t i = 0;
      for (dom::element x : a) {
        auto g = u32(x, fmt::format("process.user.additionalGids[{}]", i++));
        if (!g) return g.error();
        s.groups.push_back(*g);
      }
    }
    if (s.uid == proto::kInvalidId || s.gid == proto::kInvalidId)
      return field_error("process.user", "uid and gid 4294967295 are not ids");
    if (s.groups.size() > kMaxGroups)
      return field_error("process.user.additionalGids", fmt::format("more than {} groups", kMaxGroups));
    if (std::string_view n; !user["username"].get_string().get(n) && !n.empty())
      return field_error("process.user.username", "not supported (give uid and gid)");
  }
  if (dom::element v; !process["selinuxLabel"].get(v)) {
    // A label for the guest's own LSM, which the guest kernel does not run: met trivially.
  }

  return host::Ok{};
}

Result<TaskSpec> parse_oci_process(std::string_view json) {
  if (json.size() > kMaxSpecBytes)
    return Error{fmt::format("process: {} bytes, more than {}", json.size(), kMaxSpecBytes)};
  dom::parser parser;
  simdjson::padded_string padded(json);
  dom::element doc;
  if (auto err = parser.parse(padded).get(doc)) return Error{fmt::format("process: {}", simdjson::error_message(err))};
  dom::object process;
  if (doc.get_object().get(process)) return Error{"process: expected a JSON object"};
  TaskSpec s;
  if (auto ps = parse_process(process, s); !ps) return ps.error();
  return s;
}

/// A tmpfs mount `f` (config.json's mounts[N]) at `dst` with `opts`: flags kept, the tmpfs
/// options passed on (size=, mode=, nr_inodes=, uid=, gid=: digits, with a size's k/m/g/% suffix),
/// anything else refused naming `f.options`.
static Result<Tmpfs> parse_tmpfs(const std::string& f, std::string_view dst, const std::vector<std::string>& opts) {
  Tmpfs t{std::string(dst)};
  t.field = f;
  if (auto g = vm::check_guest_path(dst, true); !g)
    return field_error(f + ".destination", g.error().message);
  for (const auto& o : opts) {
    if (o == "ro") t.ro = true;
    else if (o == "nosuid") t.nosuid = true;
    else if (o == "nodev") t.nodev = true;
    else if (o == "noexec") t.noexec = true;
    else if (o == "rw" || o == "private" || o == "rprivate" || o == "strictatime" || o == "relatime" || o == "noatime") {}
    else {
      const auto eq = o.find('=');
      const std::string k = o.substr(0, eq == std::string::npos ? 0 : eq);
      const std::string v = eq == std::string::npos ? std::string() : o.substr(eq + 1);
      const bool known = k == "size" || k == "mode" || k == "nr_inodes" || k == "uid" || k == "gid";
      const bool digits = !v.empty() && std::all_of(v.begin(), v.end() - (k == "size" ? 1 : 0), [](char c) { return c >= '0' && c <= '9'; }) &&
                          (k != "size" || std::string_view("0123456789kKmMgG%").find(v.back()) != std::string_view::npos);
      if (!known || !digits)
        return field_error(f + ".options", fmt::format("'{}' not supported for a tmpfs (ro, nosuid, nodev, noexec, size=, mode=, nr_inodes=, uid=, gid= are)", o));
      t.data += (t.data.empty() ? "" : ",") + o;
    }
  }
  return t;
}

/// config.json's `mounts` into `s.volumes` (binds; the guest's own file systems where the init
/// mounts them are accepted, anything else refused naming the field); `checked` gets each bind
/// as neshost run parses it (vm::parse_volume).
static host::Status parse_mounts(dom::object top, TaskSpec& s, std::vector<vm::Volume>& checked) {
  dom::array mounts;
  if (top["mounts"].get_array().get(mounts)) return host::Ok{};
  {
    std::size_t i = 0;
    for (dom::element m : mounts) {
      const std::string f = fmt::format("mounts[{}]", i++);
      std::string_view dst, type, src;
      if (m["destination"].get_string().get(dst) || dst.empty() || dst.front() != '/')
        return field_error(f + ".destination", "expected an absolute path");
      if (m["type"].get_string().get(type)) type = {};
      if (m["source"].get_string().get(src)) src = {};
      std::vector<std::string> opts;
      if (dom::element o; !m["options"].get(o)) {
        auto v = strings(o, f + ".options");
        if (!v) return v.error();
        opts = std::move(*v);
      }
      bool bind = type == "bind" || type == "rbind";
      for (const auto& o : opts) bind = bind || o == "bind" || o == "rbind";
      // CRI binds the pod's shared shm directory (sandboxes/ID/shm) over /dev/shm, so a pod's
      // containers share it: in a microVM the guest's own /dev/shm (the init mounts it) is that.
      if (bind && dst == "/dev/shm") continue;
      if (bind) {
        if (src.empty() || src.front() != '/') return field_error(f + ".source", "expected an absolute host path");
        Volume v{std::filesystem::path(src), std::string(dst), false};
        v.rbind = type == "rbind";
        for (const auto& o : opts) {
          v.ro = v.ro || o == "ro";
          v.nosuid = v.nosuid || o == "nosuid";
          v.nodev = v.nodev || o == "nodev";
          v.noexec = v.noexec || o == "noexec";
          v.rbind = v.rbind || o == "rbind";
          if (o == "private" || o == "rprivate" || o == "slave" || o == "rslave" || o == "shared" || o == "rshared")
            v.propagation = o;
        }
        s.volumes.push_back(std::move(v));
        const Volume opt = s.volumes.back();
        if (src.find(':') != std::string_view::npos || dst.find(':') != std::string_view::npos)
          return field_error(f, "a ':' in source or destination is not supported");
        auto pv = vm::parse_volume(fmt::format("{}:{}{}", src, dst, s.volumes.back().ro ? ":ro" : ""));
        if (!pv)
          return field_error(f + ".source", pv.error().message);
        s.volumes.back() = opt;
        s.volumes.back().host = pv->host;
        s.volumes.back().guest = pv->guest;
        checked.push_back(std::move(*pv));
        if (auto p = vm::check_volumes(checked); !p) return field_error(f + ".destination", p.error().message);
        if (checked.size() > kMaxVolumes) return field_error(f, fmt::format("more than {} bind mounts", kMaxVolumes));
      } else if (type == "tmpfs" && !guest_provided(type, dst)) {
        auto t = parse_tmpfs(f, dst, opts);
        if (!t) return t.error();
        s.tmpfs.push_back(std::move(*t));
        if (s.tmpfs.size() > kMaxVolumes) return field_error(f, fmt::format("more than {} tmpfs mounts", kMaxVolumes));
      } else if (!guest_provided(type, dst)) {
        return field_error(f + ".type", fmt::format("'{}' at {} not supported in a microVM (bind mounts of directories, "
                                                   "and the guest's own proc, sysfs, devpts, tmpfs, mqueue, cgroup "
                                                   "where the init mounts them, are)", type, dst));
      }
    }
  }
  return host::Ok{};
}

/// config.json's `linux`: seccomp and devices refused, a network namespace with a path taken
/// (`s.netns`: the VM takes it over), the other namespaces ignored.
static host::Status parse_linux(dom::object top, TaskSpec& s) {
  dom::object linux_;
  if (top["linux"].get_object().get(linux_)) return host::Ok{};
  {
    if (dom::element v; !linux_["seccomp"].get(v))
      return field_error("linux.seccomp", "not supported: the guest kernel runs no seccomp filter for the task (the "
                                          "VM is its isolation boundary); remove the profile");
    if (dom::element r; !linux_["resources"].get(r)) {
      auto res = parse_resources(r, "linux.resources");
      if (!res) return Error{"config.json: " + res.error().message};
      s.resources = *res;
    }
    if (dom::array d; !linux_["devices"].get_array().get(d) && d.size() > 0)
      return field_error("linux.devices", "not supported: host device nodes cannot be passed into the microVM");
    // The other namespaces confine a process on a shared kernel (ignored, see the top); the
    // network one with a path is where the task's network is (CNI): the VM takes it over.
    if (dom::element ns; !linux_["namespaces"].get(ns)) {
      dom::array a;
      if (ns.get_array().get(a)) return field_error("linux.namespaces", "expected an array");
      std::size_t i = 0;
      for (dom::element e : a) {
        const std::string f = fmt::format("linux.namespaces[{}]", i++);
        std::string_view type, path;
        if (e["type"].get_string().get(type)) return field_error(f + ".type", "expected a string");
        if (type != "network" || e["path"].get_string().get(path) || path.empty()) continue;
        if (path.front() != '/') return field_error(f + ".path", "expected an absolute path");
        if (path.find('\0') != std::string_view::npos) return field_error(f + ".path", "a NUL byte in the path");
        if (!s.netns.empty()) return field_error(f, "a second network namespace");
        s.netns = std::filesystem::path(path);
      }
    }
  }
  return host::Ok{};
}

Result<TaskSpec> parse_oci_spec(std::string_view json, const std::filesystem::path& bundle) {
  if (json.size() > kMaxSpecBytes)
    return Error{fmt::format("config.json: {} bytes, more than {}", json.size(), kMaxSpecBytes)};
  dom::parser parser;
  simdjson::padded_string padded(json);
  dom::element doc;
  if (auto err = parser.parse(padded).get(doc)) return Error{fmt::format("config.json: {}", simdjson::error_message(err))};
  dom::object top;
  if (doc.get_object().get(top)) return Error{"config.json: expected a JSON object"};
  TaskSpec s;

  dom::object process;
  if (top["process"].get_object().get(process)) return field_error("process", "missing (a task needs a process)");
  if (auto ps = parse_process(process, s); !ps) return ps.error();

  dom::object root;
  if (top["root"].get_object().get(root)) return field_error("root", "missing (the task's root file system)");
  {
    std::string_view p;
    if (root["path"].get_string().get(p) || p.empty()) return field_error("root.path", "expected a path");
    std::filesystem::path rp(p);
    s.root = rp.is_absolute() ? rp : bundle / rp;
    if (bool ro = false; !root["readonly"].get_bool().get(ro)) s.root_ro = ro;
  }
  if (std::string_view h; !top["hostname"].get_string().get(h)) s.hostname = std::string(h);
  if (dom::element a; !top["annotations"].get(a)) {
    std::string_view snap;
    if (dom::element v; !a[kSnapshotAnnotation].get(v)) {
      if (v.get_string().get(snap) || snap.empty() || snap.front() != '/' || snap.find('\0') != std::string_view::npos)
        return field_error(fmt::format("annotations.{}", kSnapshotAnnotation), "expected an absolute path (a snapshot's directory)");
      s.snapshot = std::filesystem::path(snap);
    }
  }

  std::vector<vm::Volume> checked;  // s.volumes as neshost run parses them (Volume::file)
  if (auto m = parse_mounts(top, s, checked); !m) return m.error();
  if (auto l = parse_linux(top, s); !l) return l.error();
  const auto files = static_cast<std::size_t>(
      std::count_if(checked.begin(), checked.end(), [](const vm::Volume& v) { return v.file; }));
  if (auto c = check_snapshot_shares(s, files); !c) return c.error();
  return s;
}

Result<std::string> read_oci_config(const std::filesystem::path& bundle) {
  return base::read_small_file((bundle / "config.json").c_str(), kMaxSpecBytes);
}

std::vector<std::string> run_args(const TaskSpec& s, const RunPlan& p) {
  // --vmm-outlives: the VM survives its monitor's death; the shim then has it adopted
  // (container_vm.cpp Container::readopt()).
  std::vector<std::string> a = {"run", "--vmm-outlives", "--vm", p.vm, "--state", p.state_dir.string(), "--rootfs", s.root.string(),
                                "--user", fmt::format("{}:{}", s.uid, s.gid), "--workdir", s.cwd};
  for (auto g : s.groups) {
    if (g == s.gid) continue;
    a.insert(a.end(), {"--group-add", std::to_string(g)});
  }
  if (s.root_ro) a.push_back("--read-only");
  if (!s.hostname.empty()) a.insert(a.end(), {"--hostname", s.hostname});
  for (const auto& e : s.env) a.insert(a.end(), {"--env", e});
  if (s.mem_mib) a.insert(a.end(), {"--mem", std::to_string(*s.mem_mib)});
  if (s.cpus) a.insert(a.end(), {"--cpus", std::to_string(*s.cpus)});
  if (!s.snapshot.empty()) a.insert(a.end(), {"--snapshot", s.snapshot.string()});
  for (const auto& v : s.volumes) a.insert(a.end(), {"--volume", fmt::format("{}:{}{}", v.host.string(), v.guest, v.ro ? ":ro" : "")});
  if (!s.netns.empty()) a.insert(a.end(), {"--network", "netns:" + s.netns.string()});
  // The FIFO held by the monitor until CloseIO: a shim SIGKILLed (its own writer gone) is not
  // the workload's EOF, so a replaced shim's clients write on (docs/containerd.md).
  if (p.attach_stdin) a.insert(a.end(), {"--interactive", "--stdin-hold"});
  if (s.terminal) a.push_back("--tty");
  a.push_back("--");
  a.insert(a.end(), s.argv.begin(), s.argv.end());
  return a;
}

}  // namespace nes::shim
