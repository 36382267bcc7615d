// `neshost run`'s plan (host/cli/plan.hpp) alone: parse_run() then plan_run() over plain inputs,
// case by case, asserting on the boot descriptor's fields and the QEMU spec's values; and every
// usage error with its text. Volumes need real host paths: a temp dir, removed at the end.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "host/cli/plan.hpp"
#include "host/vm/passt.hpp"
#include "protocol/channels.hpp"
#include "protocol/codec.hpp"
#include "protocol/limits.hpp"

using namespace nes;
using namespace nes::cli;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

/// The inputs run.cpp would gather, as fixed values.
PlanInputs inputs() {
  PlanInputs in;
  in.euid = 0;
  in.default_kernel = "/k/vmlinuz";
  in.default_initrd = "/k/initrd.cpio";
  in.nesinit = "/b/nesinit";
  in.mkinitrd = "/b/mkinitrd";
  in.virtiofsd = "/b/virtiofsd";
  in.vm_id = "vm-0123abcd";
  in.state_dir = "/state";
  in.accel = vm::Accel::tcg;
  in.runtime_dir = "/tmp/neshost-AAAAAA";
  return in;
}

host::Result<RunPlan> plan(const Args& args, const PlanInputs& in = inputs()) {
  auto f = parse_run(args);
  if (!f) return host::Error{f.error().message};
  return plan_run(*f, in);
}

/// The error text for `args` (what `neshost run` prints after "neshost run: "), "" if none.
std::string error_of(const Args& args, const PlanInputs& in = inputs()) {
  auto p = plan(args, in);
  return p ? std::string() : p.error().message;
}

/// The exit status `neshost run` gives `args` before anything starts (parse_run, check_run): 0 if
/// accepted, kExitUsage (125, for every refusal) if not.
int refusal(const Args& args, const PlanInputs& in = inputs()) {
  auto f = parse_run(args);
  if (!f) return kExitUsage;
  return check_run(*f, in) ? 0 : kExitUsage;
}

/// Sets (or with nullptr unsets) an environment variable for one scope, restoring it after.
struct EnvVar {
  std::string name;
  std::optional<std::string> old;
  EnvVar(const char* n, const char* v) : name(n) {
    if (const char* o = std::getenv(n)) old = o;
    if (v) ::setenv(n, v, 1);
    else ::unsetenv(n);
  }
  ~EnvVar() {
    if (old) ::setenv(name.c_str(), old->c_str(), 1);
    else ::unsetenv(name.c_str());
  }
};

proto::IpAddr ip(const char* t) { return *proto::ip_from_text(t); }

/// A private temp dir, removed with everything in it.
struct TempDir {
  fs::path path;
  TempDir() {
    std::string t = (fs::temp_directory_path() / "cli-plan-XXXXXX").string();
    REQUIRE(::mkdtemp(t.data()) != nullptr);
    path = t;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  fs::path dir(const std::string& name) const {
    fs::create_directories(path / name);
    return path / name;
  }
  fs::path file(const std::string& name) const {
    std::ofstream(path / name) << "x\n";
    return path / name;
  }
};

using Strings = std::vector<std::string>;

}  // namespace

TEST_CASE("defaults: the descriptor, the session's policy, the QEMU spec") {
  EnvVar net("NESHOST_NETWORK", "none");  // the tests' environment; the network's default below
  auto p = plan({"sh", "-c", "echo hi"});
  REQUIRE(p);
  CHECK(p->vm == "vm-0123abcd");
  CHECK(p->state_dir == "/state");
  CHECK(p->serve.state_dir == "/state");
  const auto& s = p->serve.session;
  CHECK(s.vm == "vm-0123abcd");
  CHECK(s.on_exit == host::OnExitPolicy::stop);
  CHECK(s.ready_timeout == 30s);
  CHECK(!s.wall_timeout);
  CHECK(s.wall_from_started);
  CHECK(s.grace == 10s);
  CHECK(s.stop_timeout == 15s);  // the guest's grace + 5 s
  const auto& d = s.descriptor;
  CHECK(d.exec.argv == Strings{"sh", "-c", "echo hi"});
  CHECK(d.exec.env == std::map<std::string, std::string>{{"PATH", proto::kDefaultPath}});
  CHECK(!d.exec.cwd);
  CHECK(d.exec.uid == 0);
  CHECK(d.exec.gid == 0);
  CHECK(d.exec.groups.empty());
  CHECK(d.hostname == std::optional<std::string>("vm-0123abcd"));  // as docker: the id
  CHECK(d.on_exit.terminal);
  CHECK(!d.root);
  CHECK(d.mounts.empty());
  REQUIRE(d.stdio);
  CHECK(!d.stdio->attach_stdin);
  CHECK(!d.stdio->terminal);
  CHECK(d.stdio->buffer_bytes == 256u << 10);
  // The channel: we listen in the runtime dir, QEMU dials.
  CHECK(p->channel_socket == "/tmp/neshost-AAAAAA/channel.sock");
  CHECK(p->data_socket == "/tmp/neshost-AAAAAA/data.sock");
  CHECK(p->serve.listen.kind == host::ListenSpec::Kind::unix_path);
  CHECK(p->serve.listen.path == "/tmp/neshost-AAAAAA/channel.sock");
  CHECK(!p->sandbox);
  CHECK(p->sandbox_argv.empty());
  CHECK(p->daemons.empty());
  CHECK(!p->initrd_from);
  REQUIRE(p->qemu);
  const auto& q = *p->qemu;
  CHECK(q.kernel == "/k/vmlinuz");
  CHECK(q.initrd == std::optional<fs::path>("/k/initrd.cpio"));
  CHECK(q.mem_mib == 256);
  CHECK(q.cpus == 1);
  CHECK(q.accel == vm::Accel::tcg);
  CHECK(q.channel_socket == std::optional<fs::path>(p->channel_socket));
  CHECK(q.data_socket == std::optional<fs::path>(p->data_socket));
  CHECK(q.fs_devices.empty());
  CHECK(p->cmdline.console == vm::ConsoleLevel::quiet);
  CHECK(p->cmdline.extra == Strings{"edd=off", "nesinit.grace_ms=10000",
                                    std::string("nesinit.data=virtio-port:") + proto::kDataPortName,
                                    p->network.mode == host::NetworkMode::none
                                        ? "nesinit.modules=virtio_pci,virtio_console"
                                        : "nesinit.modules=virtio_pci,virtio_console,virtio_net"});
  CHECK(q.append == vm::kernel_cmdline(p->cmdline));
  CHECK(vm::qemu_argv(q));  // a spec QEMU's argv builder accepts
  CHECK(!p->interactive);
  CHECK(!p->tty);
  CHECK(!p->raw_terminal);
  CHECK(!p->console);
  CHECK(p->workload_log.max_size == 10u << 20);
  CHECK(p->workload_log.max_files == 5);
  CHECK(p->grace == 10s);
  CHECK(p->command == Strings{"sh", "-c", "echo hi"});
}

TEST_CASE("TCG's translation buffer: 16 MiB planned, QEMU's default with 0") {
  EnvVar net("NESHOST_NETWORK", nullptr);
  PlanInputs in = inputs();
  in.accel = vm::Accel::tcg;
  auto p = plan({"--network", "none", "true"}, in);
  REQUIRE(p);
  REQUIRE(p->qemu);
  CHECK(p->qemu->tcg_tb_mib == 16);
  in.tcg_tb_mib = 0;
  p = plan({"--network", "none", "true"}, in);
  REQUIRE(p);
  CHECK(p->qemu->tcg_tb_mib == 0);
}

TEST_CASE("the TCG boot words: a 1-vCPU TCG guest only, left out with NESHOST_TCG_BOOT_WORDS=0") {
  EnvVar net("NESHOST_NETWORK", nullptr);
  PlanInputs in = inputs();
  in.accel = vm::Accel::tcg;
  auto tcg = plan({"--network", "none", "true"}, in);
  REQUIRE(tcg);
  CHECK(tcg->cmdline.tcg_words);
  REQUIRE(tcg->qemu);
  CHECK(tcg->qemu->append.find(" nolapic_timer noreplace-smp ") != std::string::npos);
  in.accel = vm::Accel::kvm;
  auto kvm = plan({"--network", "none", "true"}, in);
  REQUIRE(kvm);
  CHECK(!kvm->cmdline.tcg_words);
  CHECK(kvm->qemu->append.find("nolapic_timer") == std::string::npos);
  // 2+ vCPUs: the other CPUs' APIC timers would be the HPET broadcast's dummies; nothing is patched.
  in.accel = vm::Accel::tcg;
  auto two = plan({"--network", "none", "--cpus", "2", "true"}, in);
  REQUIRE(two);
  CHECK(!two->cmdline.tcg_words);
  CHECK(two->qemu->append.find("nolapic_timer") == std::string::npos);
  in.tcg_boot_words = false;
  auto plain = plan({"--network", "none", "true"}, in);
  REQUIRE(plain);
  CHECK(plain->qemu->append.find("noreplace-smp") == std::string::npos);
  // The environment: only "0" leaves them out.
  for (auto [value, words] : {std::pair<const char*, bool>{nullptr, true}, {"0", false}, {"1", true}, {"", true}}) {
    EnvVar w("NESHOST_TCG_BOOT_WORDS", value);
    EnvVar a("NESHOST_APPEND", "nesinit.log=debug");
    PlanInputs e = inputs();
    env_inputs(e);
    CHECK(e.tcg_boot_words == words);
    CHECK(e.append == "nesinit.log=debug");
  }
}

TEST_CASE("nesinit.modules: the channel's modules, virtio_net for a NIC, virtiofs for shares") {
  EnvVar net("NESHOST_NETWORK", nullptr);
  auto has = [](const RunPlan& p, const std::string& word) {
    return std::find(p.cmdline.extra.begin(), p.cmdline.extra.end(), word) != p.cmdline.extra.end();
  };
  auto none = plan({"--network", "none", "true"});
  REQUIRE(none);
  CHECK(has(*none, "nesinit.modules=virtio_pci,virtio_console"));
  auto nic = plan({"true"});
  REQUIRE(nic);
  CHECK(has(*nic, "nesinit.modules=virtio_pci,virtio_console,virtio_net"));
  auto share = plan({"--network", "none", "-v", "/tmp:/data", "true"});
  REQUIRE(share);
  CHECK(has(*share, "nesinit.modules=virtio_pci,virtio_console,virtiofs"));
  // NESHOST_APPEND comes after it: a `nesinit.modules=` there wins (the init applies words in order).
  PlanInputs in = inputs();
  in.append = "nesinit.modules=virtio_pci,virtio_console,vmw_vsock_virtio_transport";
  auto own = plan({"--network", "none", "true"}, in);
  REQUIRE(own);
  CHECK(own->cmdline.extra.back() == in.append);
}

TEST_CASE("a snapshot's machine (snapshot create): both hot-pluggable modules, the snapshot layout") {
  PlanInputs in = inputs();
  in.snapshot_machine = true;
  auto p = plan({"--network", "none", "--grace", "2.5", "/bin/true"}, in);
  REQUIRE(p);
  REQUIRE(p->qemu);
  const auto& q = *p->qemu;
  // Planned with neither a NIC nor a share; a restore may plug in both.
  CHECK(q.append.find(" nesinit.modules=virtio_pci,virtio_console,virtio_net,virtiofs") != std::string::npos);
  CHECK(q.append.find("nesinit.grace_ms=2500") != std::string::npos);
  CHECK(q.snapshot_layout);
  CHECK(!q.incoming);
  CHECK(q.fs_devices.empty());
  CHECK(q.net_args.empty());
  // A plain run: neither.
  auto cold = plan({"--network", "none", "/bin/true"});
  REQUIRE(cold);
  CHECK(!cold->qemu->snapshot_layout);
  CHECK(cold->qemu->append.find("virtio_net") == std::string::npos);
}

TEST_CASE("--vm, --state, --hostname, --console, NESHOST_APPEND") {
  PlanInputs in = inputs();
  in.append = "nesinit.log=debug";
  auto p = plan({"--vm", "web.1", "--state", "/s", "-h", "box", "--console", "--", "true"}, in);
  REQUIRE(p);
  CHECK(p->vm == "web.1");
  CHECK(p->serve.session.vm == "web.1");
  CHECK(p->state_dir == "/s");
  CHECK(p->serve.session.descriptor.hostname == std::optional<std::string>("box"));
  CHECK(p->console);
  CHECK(p->cmdline.console == vm::ConsoleLevel::full);
  CHECK(p->cmdline.extra.back() == "nesinit.log=debug");  // appended last
}

TEST_CASE("-e/--env, -w, -u, --group-add") {
  ::setenv("CLI_PLAN_FROM_HERE", "here", 1);
  ::unsetenv("CLI_PLAN_UNSET");
  auto p = plan({"-e", "A=1", "--env=B=x=y", "-e", "CLI_PLAN_FROM_HERE", "-e", "CLI_PLAN_UNSET", "-e", "PATH=/bin",
                 "-w", "/srv", "-u", "1000:100", "--group-add", "5", "--group-add", "6", "id"});
  REQUIRE(p);
  const auto& ex = p->serve.session.descriptor.exec;
  CHECK(ex.env == std::map<std::string, std::string>{
                      {"A", "1"}, {"B", "x=y"}, {"CLI_PLAN_FROM_HERE", "here"}, {"PATH", "/bin"}});  // ours wins
  CHECK(ex.cwd == std::optional<std::string>("/srv"));
  CHECK(ex.uid == 1000);
  CHECK(ex.gid == 100);
  CHECK(ex.groups == std::vector<std::uint32_t>{5, 6});
  // The last -e for a key wins; GID alone defaults to UID.
  auto q = plan({"-e", "A=1", "-e", "A=2", "-u", "7", "id"});
  REQUIRE(q);
  CHECK(q->serve.session.descriptor.exec.env.at("A") == "2");
  CHECK(q->serve.session.descriptor.exec.uid == 7);
  CHECK(q->serve.session.descriptor.exec.gid == 7);
  ::unsetenv("CLI_PLAN_FROM_HERE");
}

TEST_CASE("-v: one share each (tag, socket, ro), in order, mounted by the descriptor") {
  TempDir t;
  const fs::path a = t.dir("a"), b = t.dir("b");
  auto p = plan({"-v", a.string() + ":/data", "-v", b.string() + ":/opt/b/:ro", "true"});
  REQUIRE(p);
  REQUIRE(p->daemons.size() == 2);
  CHECK(p->daemons[0].share.tag == "nes.v0");
  CHECK(p->daemons[0].share.dir == fs::canonical(a));
  CHECK(!p->daemons[0].share.ro);
  CHECK(p->daemons[0].socket == "/tmp/neshost-AAAAAA/nes.v0.sock");
  CHECK(p->daemons[0].program == "/b/virtiofsd");
  CHECK(p->daemons[0].binds.empty());
  CHECK(p->daemons[1].share.tag == "nes.v1");
  CHECK(p->daemons[1].share.ro);
  const auto& m = p->serve.session.descriptor.mounts;
  CHECK(m == std::vector<proto::Mount>{{"nes.v0", "/data", false, proto::FsType::virtiofs},
                                       {"nes.v1", "/opt/b", true, proto::FsType::virtiofs}});
  REQUIRE(p->qemu);
  REQUIRE(p->qemu->fs_devices.size() == 2);
  CHECK(p->qemu->fs_devices[1].tag == "nes.v1");
  CHECK(p->qemu->fs_devices[1].socket == p->daemons[1].socket);
  CHECK(vm::qemu_argv(*p->qemu));
}

TEST_CASE("-v FILE: one staging share for every file, bound at its place after the directories") {
  TempDir t;
  const fs::path d = t.dir("d"), f1 = t.file("hosts"), f2 = t.file("resolv");
  PlanInputs in = inputs();
  in.staging_dir = "/tmp/neshost-STAGE0";
  auto p = plan({"-v", f1.string() + ":/etc/hosts:ro", "-v", d.string() + ":/d", "-v", f2.string() + ":/etc/resolv.conf",
                 "true"},
                in);
  REQUIRE(p);
  REQUIRE(p->daemons.size() == 2);
  CHECK(p->daemons[0].share.tag == "nes.v1");  // the -v index, file volumes counted
  const auto& st = p->daemons[1];
  CHECK(st.share.tag == kFileShareTag);
  CHECK(st.share.dir == "/tmp/neshost-STAGE0");
  CHECK(!st.share.ro);  // not every file is read-only
  REQUIRE(st.binds.size() == 2);
  CHECK(st.binds[0].source == fs::canonical(f1));
  CHECK(st.binds[0].target == "/tmp/neshost-STAGE0/0");
  CHECK(st.binds[0].ro);
  CHECK(st.binds[1].target == "/tmp/neshost-STAGE0/1");
  CHECK(!st.binds[1].ro);
  CHECK(p->serve.session.descriptor.mounts ==
        std::vector<proto::Mount>{{"nes.v1", "/d", false, proto::FsType::virtiofs},
                                  {"nes.files", "/run/nesinit/files", false, proto::FsType::virtiofs},
                                  {"/run/nesinit/files/0", "/etc/hosts", true, proto::FsType::bind},
                                  {"/run/nesinit/files/1", "/etc/resolv.conf", false, proto::FsType::bind}});
  // All read-only: the staging share is too.
  auto q = plan({"-v", f1.string() + ":/etc/hosts:ro", "true"}, in);
  REQUIRE(q);
  CHECK(q->daemons.at(0).share.ro);
  // Without root: a usage error naming the volume; without a staging dir: an error, not a crash.
  PlanInputs user = in;
  user.euid = 1000;
  CHECK(error_of({"-v", f1.string() + ":/etc/hosts", "true"}, user) ==
        "--volume " + fs::canonical(f1).string() +
            ":/etc/hosts: a single file is bind-mounted into a staging share in a private mount namespace, "
            "which needs root");
  CHECK(error_of({"-v", f1.string() + ":/etc/hosts", "true"}) ==
        "--volume " + fs::canonical(f1).string() + ": no staging directory");
}

TEST_CASE("-v: bad paths, duplicates and too many are errors naming --volume") {
  TempDir t;
  const fs::path a = t.dir("a");
  const std::string missing = (t.path / "nope").string();
  CHECK(error_of({"-v", missing + ":/x", "true"}) ==
        "--volume '" + missing + ":/x': HOST " + missing + " does not exist (expected HOST:GUEST[:ro])");
  CHECK(error_of({"-v", a.string() + ":rel", "true"}) ==
        "--volume '" + a.string() + ":rel': GUEST must be an absolute path (expected HOST:GUEST[:ro])");
  CHECK(error_of({"-v", a.string() + ":/proc/x", "true"}) ==
        "--volume '" + a.string() +
            ":/proc/x': GUEST must not be /proc or below it (the init mounts it) (expected HOST:GUEST[:ro])");
  CHECK(error_of({"-v", a.string() + ":/x:rx", "true"}) ==
        "--volume '" + a.string() + ":/x:rx': option 'rx' is not ro or rw (expected HOST:GUEST[:ro])");
  CHECK(error_of({"-v", a.string() + ":/x", "-v", a.string() + ":/x/", "true"}) == "--volume: GUEST /x is given twice");
  Args many;
  std::vector<std::string> keep;
  for (int i = 0; i <= 16; ++i) keep.push_back(a.string() + ":/v" + std::to_string(i));
  for (const auto& k : keep) many.insert(many.end(), {"-v", k});
  many.push_back("true");
  CHECK(error_of(many) == "--volume: at most 16 volumes");
  many.erase(many.end() - 3, many.end() - 1);  // 16 is fine
  CHECK(plan(many));
}

TEST_CASE("-i, -t, -d and their combinations") {
  PlanInputs in = inputs();
  in.terminal = TermSize{40, 120};
  in.stdin_is_tty = true;
  auto i = plan({"-i", "cat"}, in);
  REQUIRE(i);
  CHECK(i->interactive);
  CHECK(i->serve.session.descriptor.stdio->attach_stdin);
  CHECK(!i->serve.session.descriptor.stdio->terminal);
  CHECK(!i->raw_terminal);
  auto t = plan({"-t", "top"}, in);
  REQUIRE(t);
  CHECK(t->tty);
  CHECK(!t->serve.session.descriptor.stdio->attach_stdin);
  CHECK(t->serve.session.descriptor.stdio->terminal == proto::Terminal{40, 120});
  CHECK(!t->raw_terminal);  // raw mode only with -i too
  auto it = plan({"-it", "sh"}, in);
  REQUIRE(it);
  CHECK(it->interactive);
  CHECK(it->tty);
  CHECK(it->raw_terminal);
  // No terminal here (e.g. -d's monitor, or a pipe): 24x80, no raw mode.
  PlanInputs piped = inputs();
  auto np = plan({"-it", "sh"}, piped);
  REQUIRE(np);
  CHECK(np->serve.session.descriptor.stdio->terminal == proto::Terminal{24, 80});
  CHECK(!np->raw_terminal);
  // -d is carried out before the plan (the monitor's fork); the plan is the same as without it.
  auto d = plan({"-d", "--vm", "bg", "sleep", "9"});
  REQUIRE(d);
  auto nd = plan({"--vm", "bg", "sleep", "9"});
  REQUIRE(nd);
  CHECK(d->serve.session.descriptor == nd->serve.session.descriptor);
  // ... except that its VMM outlives the monitor (docs/host.md "Re-adoption"): the session
  // survives a lost channel for kDetachedReconnect and QEMU's chardevs redial; a foreground
  // run's VM dies with it. --vmm-outlives (the shim's) is -d's VMM in the foreground.
  CHECK(d->vmm_survives);
  CHECK(d->serve.session.reconnect == kDetachedReconnect);
  CHECK(d->qemu->chardev_reconnect_s == 1);
  CHECK(!nd->vmm_survives);
  CHECK(nd->serve.session.reconnect.count() == 0);
  CHECK(nd->qemu->chardev_reconnect_s == 0);
  auto o = plan({"--vmm-outlives", "--vm", "bg", "sleep", "9"});
  REQUIRE(o);
  CHECK((o->vmm_survives && o->serve.session.reconnect == kDetachedReconnect && o->qemu->chardev_reconnect_s == 1));
  auto f = parse_run({"-dit", "sh"});
  REQUIRE(f);
  CHECK(f->detach);
  CHECK(f->interactive);
  CHECK(f->tty);
}

TEST_CASE("--timeout, --grace, --ready-timeout, --on-exit") {
  auto p = plan({"--timeout", "5", "--grace", "2.5", "--ready-timeout", "3", "true"});
  REQUIRE(p);
  const auto& s = p->serve.session;
  CHECK(s.wall_timeout == std::optional(std::chrono::milliseconds(5000)));
  CHECK(s.grace == 2500ms);
  CHECK(s.stop_timeout == 7500ms);
  CHECK(s.ready_timeout == 3s);
  CHECK(p->grace == 2500ms);
  CHECK(p->cmdline.extra.at(1) == "nesinit.grace_ms=2500");
  auto keep = plan({"--on-exit", "keep", "true"});
  REQUIRE(keep);
  CHECK(keep->serve.session.on_exit == host::OnExitPolicy::keep);
  CHECK(!keep->serve.session.descriptor.on_exit.terminal);
  auto rm = plan({"--on-exit=remove", "true"});
  REQUIRE(rm);
  CHECK(rm->serve.session.on_exit == host::OnExitPolicy::remove);
  CHECK(rm->serve.session.descriptor.on_exit.terminal);
  auto logs = plan({"--log-max-size", "64k", "--log-max-files", "1", "true"});
  REQUIRE(logs);
  CHECK(logs->workload_log.max_size == 64u << 10);
  CHECK(logs->workload_log.max_files == 1);
}

TEST_CASE("--sandbox: no VM, the init under unshare") {
  auto p = plan({"--sandbox", "--grace", "1", "true"});
  REQUIRE(p);
  CHECK(p->sandbox);
  CHECK(!p->qemu);
  CHECK(p->kernel.empty());
  CHECK(p->initrd.empty());
  CHECK(p->sandbox_argv ==
        Strings{"unshare", "--pid", "--fork", "--mount-proc", "--kill-child", "/b/nesinit",
                "--channel=unix:/tmp/neshost-AAAAAA/channel.sock", "--data-channel=unix:/tmp/neshost-AAAAAA/data.sock",
                "--grace-ms=1000", "--log=quiet"});
  CHECK(!p->serve.session.descriptor.hostname);  // the machine's UTS namespace: none unless -h
  auto c = plan({"--sandbox", "--console", "-h", "x", "true"});
  REQUIRE(c);
  CHECK(c->sandbox_argv.back() == "--log=info");
  CHECK(c->serve.session.descriptor.hostname == std::optional<std::string>("x"));
}

TEST_CASE("--kernel, --initrd, --rootfs (virtiofs and initramfs), --read-only") {
  auto k = plan({"--kernel", "/my/bzImage", "--initrd", "/my/initrd", "true"});
  REQUIRE(k);
  CHECK(k->kernel == "/my/bzImage");
  CHECK(k->qemu->kernel == "/my/bzImage");
  CHECK(k->qemu->initrd == std::optional<fs::path>("/my/initrd"));
  CHECK(!k->initrd_from);
  CHECK(run_kernel(*parse_run({"--kernel", "/my/bzImage", "true"}), inputs()) == "/my/bzImage");
  CHECK(run_kernel(*parse_run({"true"}), inputs()) == "/k/vmlinuz");

  PlanInputs in = inputs();
  in.rootfs_dir = "/real/root";  // what run.cpp resolved --rootfs to
  auto r = plan({"--rootfs", "root", "--read-only", "true"}, in);
  REQUIRE(r);
  REQUIRE(r->daemons.size() == 1);
  CHECK(r->daemons[0].share.tag == kRootShareTag);
  CHECK(r->daemons[0].share.dir == "/real/root");
  CHECK(r->daemons[0].share.ro);
  CHECK(r->serve.session.descriptor.root == proto::Root{"nes.root", true, proto::FsType::virtiofs});
  CHECK(r->qemu->initrd == std::optional<fs::path>("/k/initrd.cpio"));
  CHECK(r->qemu->fs_devices.at(0).tag == "nes.root");

  auto ir = plan({"--rootfs", "root", "--rootfs-mode", "initramfs", "true"}, in);
  REQUIRE(ir);
  CHECK(ir->daemons.empty());
  CHECK(!ir->serve.session.descriptor.root);
  CHECK(ir->initrd == "/tmp/neshost-AAAAAA/initrd.cpio");
  CHECK(ir->initrd_from == std::optional<fs::path>("/real/root"));
  CHECK(ir->qemu->initrd == std::optional<fs::path>(ir->initrd));
  CHECK(ir->mkinitrd == "/b/mkinitrd");
  CHECK(ir->nesinit == "/b/nesinit");
}

TEST_CASE("--mem, --cpus, the accelerator") {
  PlanInputs in = inputs();
  in.accel = vm::Accel::kvm;  // the probe's verdict for --accel auto
  auto p = plan({"--mem", "1024", "--cpus", "4", "true"}, in);
  REQUIRE(p);
  CHECK(p->qemu->mem_mib == 1024);
  CHECK(p->qemu->cpus == 4);
  CHECK(p->qemu->accel == vm::Accel::kvm);
  auto f = parse_run({"--accel", "tcg", "true"});
  REQUIRE(f);
  CHECK(f->accel == vm::Accel::tcg);
  CHECK(parse_run({"true"})->accel == vm::Accel::auto_probe);
  CHECK(parse_run({"--accel=kvm", "true"})->accel == vm::Accel::kvm);
}

TEST_CASE("every usage error, with the text neshost run prints") {
  PlanInputs in = inputs();
  in.rootfs_dir = "/real/root";
  PlanInputs no_dir = inputs();  // --rootfs DIR that is not a directory
  struct Case {
    Args args;
    std::string error;
    const PlanInputs* in = nullptr;
  };
  const std::vector<Case> cases = {
      {{}, "ARGV is required (neshost run [OPTIONS] -- ARGV...)"},
      {{"--console"}, "ARGV is required (neshost run [OPTIONS] -- ARGV...)"},
      {{"--bogus", "true"}, "unknown flag --bogus"},
      {{"-x", "true"}, "unknown flag -x"},
      {{"--state"}, "--state needs a value"},
      {{"--tty=yes", "true"}, "--tty takes no value"},
      {{"--mem", "32", "true"}, "--mem: expected an integer 64..1048576, got '32'"},
      {{"--cpus", "0", "true"}, "--cpus: expected an integer 1..64, got '0'"},
      {{"--cpus", "many", "true"}, "--cpus: expected an integer 1..64, got 'many'"},
      {{"--accel", "hvf", "true"}, "--accel: expected tcg, kvm or auto, got 'hvf'"},
      {{"--on-exit", "pause", "true"}, "--on-exit: expected stop, keep or remove, got 'pause'"},
      {{"--timeout", "0", "true"}, "--timeout: expected seconds > 0 (e.g. 30 or 0.5), got '0'"},
      {{"--grace", "-1", "true"}, "--grace: expected seconds > 0 (e.g. 30 or 0.5), got '-1'"},
      {{"--ready-timeout", "x", "true"}, "--ready-timeout: expected seconds > 0 (e.g. 30 or 0.5), got 'x'"},
      {{"--log-max-size", "1k", "true"}, "--log-max-size: 1k is below the minimum 64k"},
      {{"--log-max-size", "10q", "true"}, "--log-max-size: expected bytes with an optional k, m or g, got '10q'"},
      {{"--log-max-files", "0", "true"}, "--log-max-files: expected an integer 1..100, got '0'"},
      {{"--rootfs-mode", "9p", "true"}, "--rootfs-mode: expected virtiofs, initramfs or block, got '9p'"},
      {{"--vm", "-x", "true"}, "--vm: vm id '-x' starts with '-'"},
      {{"--vm", "a/b", "true"}, "--vm: vm id may hold only [A-Za-z0-9._-]; got byte 0x2f"},
      {{"-w", "rel", "true"}, "--workdir: 'rel' is not an absolute path"},
      {{"-u", "me", "true"}, "--user: expected UID[:GID] (numbers), got 'me'"},
      {{"-e", "=v", "true"}, "--env: expected K=V or K, got '=v'"},
      {{"--group-add", "x", "true"}, "--group-add: expected an integer 0..4294967294, got 'x'"},
      {{"--sandbox", "--rootfs", "/r", "true"}, "--sandbox runs no VM: --volume and --rootfs need one", &in},
      {{"--initrd", "/i", "--rootfs", "/r", "--rootfs-mode", "initramfs", "true"},
       "--initrd and --rootfs --rootfs-mode initramfs exclude each other", &in},
      {{"--rootfs", "/not/a/dir", "true"}, "--rootfs: '/not/a/dir' is not a directory", &no_dir},
      {{"--read-only", "true"}, "--read-only needs --rootfs DIR over virtiofs, or an IMAGE"},
      {{"--read-only", "--rootfs", "/r", "--rootfs-mode", "initramfs", "true"},
       "--read-only needs --rootfs DIR over virtiofs, or an IMAGE", &in},
      {{"--stdin-hold", "true"}, "--stdin-hold needs -i"},
  };
  for (const auto& c : cases) {
    std::string joined;
    for (auto a : c.args) joined += std::string(a) + " ";
    CAPTURE(joined);
    CHECK(error_of(c.args, c.in ? *c.in : inputs()) == c.error);
  }
  // 64 --group-add at most.
  Args groups;
  for (int i = 0; i < 65; ++i) groups.insert(groups.end(), {"--group-add", "1"});
  groups.push_back("true");
  CHECK(error_of(groups) == "--group-add: at most 64 groups");
  // --help needs no ARGV, and check_run() alone says the same as plan_run().
  auto h = parse_run({"--help"});
  REQUIRE(h);
  CHECK(h->help);
  CHECK(check_run(*h, inputs()));
  auto r = parse_run({"--sandbox", "-v", "/tmp:/t", "true"});
  REQUIRE(r);
  CHECK(check_run(*r, inputs()).error().message == "--sandbox runs no VM: --volume and --rootfs need one");
  // What one flag needs of the others is its entry's check, in parse_run() already.
  CHECK(parse_run({"--read-only", "--rootfs", "/r", "--rootfs-mode", "initramfs", "true"}).error().message ==
        "--read-only needs --rootfs DIR over virtiofs, or an IMAGE");
  // Without --rootfs, ARGV's first word may be an IMAGE (a --rootfs run once resolved): check_run's.
  auto ro = parse_run({"--read-only", "true"});
  REQUIRE(ro);
  CHECK(check_run(*ro, inputs()).error().message == "--read-only needs --rootfs DIR over virtiofs, or an IMAGE");
}

TEST_CASE("--network: user (passt, QEMU's end at fd 3) by default, $NESHOST_NETWORK, slirp, none, --sandbox") {
  {
    EnvVar net("NESHOST_NETWORK", nullptr);
    auto d = plan({"true"});
    REQUIRE(d);
    CHECK(d->network.mode == host::NetworkMode::passt);  // the host's loopback closed (docs/network.md)
    CHECK(d->passt);
    auto p = plan({"--network", "user", "true"});
    REQUIRE(p);
    CHECK(p->network.mode == host::NetworkMode::passt);
    CHECK(p->passt);
    CHECK(p->ports.empty());
    const auto& n = p->serve.session.descriptor.network;
    REQUIRE(n);
    REQUIRE(n->interfaces.size() == 1);
    CHECK(n->interfaces[0].mac == host::UserNet::mac());
    CHECK(n->interfaces[0].addresses == std::vector<proto::IpPrefix>{{ip("10.0.2.15"), 24}});
    REQUIRE(n->routes.size() == 1);
    CHECK(n->routes[0].via == std::optional<proto::IpAddr>(ip("10.0.2.2")));
    REQUIRE(n->dns);
    CHECK(n->dns->nameservers == std::vector<proto::IpAddr>{ip("10.0.2.3")});
    REQUIRE(p->qemu);
    CHECK(vm::kPasstChildFd == 3);
    CHECK(p->qemu->net_args == Strings{"-netdev", "stream,id=net0,server=off,addr.type=fd,addr.str=3", "-device",
                                       "virtio-net-pci,netdev=net0,mac=52:54:00:12:34:56,romfile="});
    CHECK(vm::qemu_argv(*p->qemu));
    // --sandbox: no NIC, the host's own network.
    auto sb = plan({"--sandbox", "true"});
    REQUIRE(sb);
    CHECK(sb->network.mode == host::NetworkMode::none);
    CHECK(!sb->passt);
    CHECK(!sb->serve.session.descriptor.network);
  }
  {
    EnvVar net("NESHOST_NETWORK", "none");
    auto p = plan({"true"});
    REQUIRE(p);
    CHECK(p->network.mode == host::NetworkMode::none);
    CHECK(!p->passt);
    CHECK(!p->serve.session.descriptor.network);
    CHECK(p->qemu->net_args.empty());
    // A flag beats the variable.
    auto u = plan({"--network", "passt", "true"});
    REQUIRE(u);
    CHECK(u->passt);
  }
  {
    EnvVar net("NESHOST_NETWORK", "slirp");
    auto p = plan({"-p", "127.0.0.1:8080:80", "-p", "5353:53/udp", "true"});
    REQUIRE(p);
    CHECK(p->network.mode == host::NetworkMode::slirp);
    CHECK(!p->passt);
    REQUIRE(p->qemu->net_args.size() == 4);
    CHECK(p->qemu->net_args[1] ==
          "user,id=net0,net=10.0.2.0/24,host=10.0.2.2,dns=10.0.2.3,ipv6=off,hostfwd=tcp:127.0.0.1:8080-:80,"
          "hostfwd=udp::5353-:53");
    CHECK(p->ports == Strings{"127.0.0.1:8080->80/tcp", "0.0.0.0:5353->53/udp"});
    auto n = plan({"--network=none", "true"});
    REQUIRE(n);
    CHECK(n->qemu->net_args.empty());
  }
}

TEST_CASE("-p, --dns, --dns-search, --dns-option, --add-host: the descriptor, passt's spec, the ports") {
  EnvVar net("NESHOST_NETWORK", "passt");
  auto p = plan({"-p", "127.0.0.1:8080:80", "--publish=8443:443", "-p", "5353:53/udp", "--dns", "1.1.1.1",
                 "--dns", "2606:4700:4700::1111", "--dns-search", "example.com", "--dns-option", "ndots:2",
                 "--add-host", "db:10.0.0.5", "--add-host", "gw:host-gateway", "true"});
  REQUIRE(p);
  CHECK(p->passt);
  CHECK(p->network.publish.size() == 3);
  CHECK(p->ports == Strings{"127.0.0.1:8080->80/tcp", "0.0.0.0:8443->443/tcp", "0.0.0.0:5353->53/udp"});
  const auto& n = p->serve.session.descriptor.network;
  REQUIRE(n);
  REQUIRE(n->dns);
  CHECK(n->dns->nameservers == std::vector<proto::IpAddr>{ip("1.1.1.1"), ip("2606:4700:4700::1111")});
  CHECK(n->dns->search == Strings{"example.com"});
  CHECK(n->dns->options == Strings{"ndots:2"});
  CHECK(n->hosts == std::vector<proto::HostEntry>{{"db", ip("10.0.0.5")}, {"gw", ip("10.0.2.2")}});
  // passt is told the same ports, and host-gateway opens the gateway's path to the host.
  auto argv = host::passt_argv(p->network, "passt", vm::kPasstChildFd);
  REQUIRE(argv);
  CHECK(std::find(argv->begin(), argv->end(), "--no-map-gw") == argv->end());
  CHECK(std::find(argv->begin(), argv->end(), "127.0.0.1/8080:80") != argv->end());
  // --network none: --dns and --add-host still shape the guest's files, no interface.
  auto none = plan({"--network", "none", "--dns", "9.9.9.9", "--add-host", "db=10.0.0.5", "true"});
  REQUIRE(none);
  const auto& nn = none->serve.session.descriptor.network;
  REQUIRE(nn);
  CHECK(nn->interfaces.empty());
  CHECK(nn->dns->nameservers == std::vector<proto::IpAddr>{ip("9.9.9.9")});
  CHECK(nn->hosts.size() == 1);
}

TEST_CASE("ps_port_text and publish_text: docker ps's and -p's texts") {
  auto m = host::parse_publish("127.0.0.1:8080:80");
  REQUIRE(m);
  CHECK(host::ps_port_text(*m) == "127.0.0.1:8080->80/tcp");
  auto u = host::parse_publish("[::1]:53:5353/udp");
  REQUIRE(u);
  CHECK(host::ps_port_text(*u) == "[::1]:53->5353/udp");
  CHECK(host::publish_text(*m) == "127.0.0.1:8080:80");
  CHECK(host::publish_text(*u) == "[::1]:53:5353/udp");
  CHECK(host::publish_text(*host::parse_publish("8080:80")) == "8080:80");
}

TEST_CASE("a docker line runs unchanged: -dp, --rm, --name, --network") {
  EnvVar net("NESHOST_NETWORK", nullptr);
  auto f = parse_run({"-dp", "127.0.0.1:8080:80", "--rm", "--name", "web", "--network", "passt", "httpd", "-p", "80"});
  REQUIRE(f);
  CHECK(f->detach);
  CHECK(f->rm);
  CHECK(f->vm == std::optional<std::string>("web"));
  CHECK(f->network.mode == host::NetworkMode::passt);
  CHECK(f->network_given);
  CHECK(f->network.publish == std::vector<host::PortMapping>{*host::parse_publish("127.0.0.1:8080:80")});
  CHECK(f->argv == Strings{"httpd", "-p", "80"});
}

TEST_CASE("--name is --vm; --rm") {
  auto p = plan({"--name", "web", "--rm", "true"});
  REQUIRE(p);
  CHECK(p->vm == "web");
  CHECK(p->rm);
  CHECK(plan({"--name", "web", "--vm", "web", "true"}));
  CHECK(!plan({"true"})->rm);
}

TEST_CASE("every network error exits 125 (and the others 2), with the text neshost run prints") {
  EnvVar net("NESHOST_NETWORK", nullptr);
  struct Case {
    Args args;
    std::string error;
  };
  const std::vector<Case> cases = {
      {{"-p", "70000:80", "true"}, "--publish 70000:80: host port '70000' must be 1..65535"},
      {{"-p", "8080:0", "true"}, "--publish 8080:0: guest port '0' must be 1..65535"},
      {{"-p", "8080", "true"}, "--publish 8080: expected [IP:]HOST:GUEST[/tcp|/udp] (a host port is required)"},
      {{"-p", "1.2.3:8080:80", "true"}, "--publish 1.2.3:8080:80: '1.2.3' is not an IPv4 or IPv6 address"},
      {{"-p", "8080:80/sctp", "true"}, "--publish 8080:80/sctp: the protocol must be tcp or udp"},
      {{"-p", "8080:80", "-p", "127.0.0.1:8080:81", "true"},
       "--publish 127.0.0.1:8080:81: host port 8080 is published twice"},
      {{"--network", "none", "-p", "127.0.0.1:8080:80", "true"},
       "--publish needs --network user (passt) or slirp (it is none: the guest has no NIC)"},
      {{"-p", "[::1]:8443:443", "true"},
       "--publish [::1]:8443:443: an IPv6 host address is not supported (the VM's user-mode network is IPv4; "
       "publish on an IPv4 address such as 127.0.0.1 or 0.0.0.0)"},
      {{"--network", "bridge", "true"}, "--network bridge: unknown mode (user, passt, slirp, none or netns:PATH)"},
      {{"--network", "netns:rel/path", "true"},
       "--network netns:rel/path: netns:PATH needs an absolute path to a network namespace"},
      {{"--dns", "1.2.3", "true"}, "--dns 1.2.3: not an IPv4 or IPv6 address"},
      {{"--dns", "1.1.1.1", "--dns", "1.1.1.2", "--dns", "1.1.1.3", "--dns", "1.1.1.4", "true"},
       "--dns: at most 3 nameservers (resolv.conf's MAXNS), got 4"},
      {{"--dns-search", "bad domain", "true"},
       "--dns-search bad domain: a domain is 1..253 of letters, digits, '-', '.', '_'"},
      {{"--dns-option", "a b", "true"}, "--dns-option 'a b': a resolv.conf option is 1..64 printable bytes, no spaces"},
      {{"--add-host", "db", "true"}, "--add-host db: expected NAME:IP or NAME:host-gateway"},
      {{"--add-host", "db:10.0.0", "true"}, "--add-host db:10.0.0: '10.0.0' is not an IPv4 or IPv6 address (or host-gateway)"},
      {{"--network", "none", "--add-host", "gw:host-gateway", "true"},
       "--add-host gw:host-gateway needs --network user (passt) or slirp (it is none)"},
      {{"--sandbox", "--network", "user", "true"},
       "--sandbox runs no VM and shares this host's network: --network passt needs one (--network none only)"},
      {{"--sandbox", "--dns", "1.1.1.1", "true"},
       "--sandbox runs no VM and shares this host's network: --dns, --dns-search, --dns-option and --add-host "
       "need one"},
  };
  for (const auto& c : cases) {
    std::string joined;
    for (auto a : c.args) joined += std::string(a) + " ";
    CAPTURE(joined);
    CHECK(error_of(c.args) == c.error);
    CHECK(refusal(c.args) == kExitUsage);
  }
  {
    EnvVar bad("NESHOST_NETWORK", "bogus");
    CHECK(error_of({"true"}) == "$NESHOST_NETWORK: --network bogus: unknown mode (user, passt, slirp, none or netns:PATH)");
    CHECK(refusal({"true"}) == 125);
    CHECK(refusal({"--network", "none", "true"}) == 0);  // a flag given: the variable is not read
  }
  // Every refusal is the same usage status.
  CHECK(error_of({"--name", "a", "--vm", "b", "true"}) == "--name a and --vm b name two VMs (--name is --vm, docker's spelling)");
  CHECK(refusal({"--name", "a", "--vm", "b", "true"}) == kExitUsage);
  CHECK(error_of({"--name", "-x", "true"}) == "--name: vm id '-x' starts with '-'");
  CHECK(refusal({"--rm=1", "true"}) == kExitUsage);
  CHECK(refusal({"--network"}) == kExitUsage);  // needs a value
  CHECK(refusal({"--mem", "1", "true"}) == kExitUsage);
  CHECK(refusal({"-p", "127.0.0.1:8080:80", "true"}) == 0);
}

namespace {
/// A snapshot as run.cpp would have loaded it (vm::load_snapshot).
PlanInputs snapshot_inputs() {
  PlanInputs in = inputs();
  vm::SnapshotMeta m;
  m.name = "warm";
  m.mem_mib = 512;
  m.cpus = 2;
  m.grace_ms = 2500;
  m.accel = "tcg";
  m.firmware = "qboot.rom";
  m.append = "console=ttyS0 nesinit.channel=virtio-port:nes.0";
  m.kernel.path = "/k/vmlinuz";
  m.initrd.path = "/k/initrd.cpio";
  m.ready = R"({"type":"ready","protocol_version":2})";
  in.snapshot = m;
  in.snapshot_dir = "/state/.snapshots/warm";
  return in;
}
}  // namespace

TEST_CASE("--snapshot: the snapshot's machine, paused for its state; shares and the NIC plugged in after") {
  const PlanInputs in = snapshot_inputs();
  auto p = plan({"--snapshot", "warm", "--network", "none", "true"}, in);
  REQUIRE(p);
  REQUIRE(p->qemu);
  const auto& q = *p->qemu;
  CHECK(q.snapshot_layout);
  CHECK(q.incoming);
  CHECK(q.mem_mib == 512);
  CHECK(q.cpus == 2);
  CHECK(q.append == "console=ttyS0 nesinit.channel=virtio-port:nes.0");  // the snapshot's, not this run's
  CHECK(q.firmware == std::optional<std::string>("qboot.rom"));
  // No share: copy-on-write over the snapshot's RAM file (the descriptor run.cpp checked).
  REQUIRE(q.ram_file);
  CHECK(q.ram_file->path == fmt::format("/proc/self/fd/{}", kRamChildFd));
  CHECK(!q.ram_file->shared);
  CHECK(q.kernel == "/k/vmlinuz");  // the files checked against the snapshot's
  CHECK(q.initrd == std::optional<fs::path>("/k/initrd.cpio"));
  CHECK(q.fs_devices.empty());
  CHECK(q.net_args.empty());
  CHECK(!p->hotplug_nic);
  CHECK(p->serve.session.saved_ready == in.snapshot->ready);
  CHECK(p->grace == 2500ms);  // the snapshot's recorded grace, not --grace's default
  CHECK(p->serve.session.grace == 2500ms);
  CHECK(p->serve.session.stop_timeout == 7500ms);
  CHECK(static_cast<bool>(vm::qemu_argv(q)));

  // A share: RAM a shared copy (QEMU inherits it at kRamChildFd too), the share plugged in.
  PlanInputs sin = in;
  sin.rootfs_dir = "/real/root";
  auto s = plan({"--snapshot", "/state/.snapshots/warm", "--rootfs", "root", "--network", "none", "true"}, sin);
  REQUIRE(s);
  CHECK(s->qemu->ram_file->path == fmt::format("/proc/self/fd/{}", kRamChildFd));
  CHECK(s->qemu->ram_file->shared);
  CHECK(s->qemu->fs_devices.empty());
  REQUIRE(s->hotplug_shares.size() == 1);
  CHECK(s->hotplug_shares[0].tag == kRootShareTag);

  // The NIC: its backend on the command line, the device plugged in on the last root port.
  auto n = plan({"--snapshot", "warm", "--network", "slirp", "true"}, in);
  REQUIRE(n);
  REQUIRE(n->qemu->net_args.size() == 2);
  CHECK(n->qemu->net_args[0] == "-netdev");
  REQUIRE(n->hotplug_nic);
  CHECK(n->hotplug_nic->find(R"("driver":"virtio-net-pci")") != std::string::npos);
  CHECK(n->hotplug_nic->find(fmt::format(R"("bus":"{}")", vm::hotplug_port(vm::kHotplugPorts - 1))) != std::string::npos);
  auto argv = vm::qemu_argv(n->qemu.value());
  REQUIRE(argv);
  for (std::size_t i = 0; i < vm::kHotplugPorts; ++i)
    CHECK(std::find(argv->begin(), argv->end(), fmt::format("pcie-root-port,id=rp{},bus=pcie.0,chassis={}", i, i + 1)) !=
          argv->end());
  CHECK(std::find(argv->begin(), argv->end(), "defer") != argv->end());

  // The ports: the shares on rp0.., the NIC on the last: 8 shares, or 7 and a NIC.
  PlanInputs full = in;
  full.rootfs_dir = "/real/root";
  std::vector<std::string> vols;
  for (int i = 0; i < 7; ++i) vols.push_back(fmt::format("/tmp:/v{}", i));
  Args many = {"--snapshot", "warm", "--rootfs", "root"};
  for (const auto& v : vols) many.insert(many.end(), {"-v", v});
  Args eight = many;
  eight.insert(eight.end(), {"--network", "none", "true"});
  CHECK(plan(eight, full));
  Args seven_and_nic = many;
  seven_and_nic.insert(seven_and_nic.end(), {"--network", "slirp", "true"});
  CHECK(error_of(seven_and_nic, full) ==
        "--snapshot: a restore plugs in at most 7 shares beside its NIC, one hot-plug port each; this run has 8 (each "
        "-v/--volume directory, --rootfs, and all file volumes together are one each); --network none frees the NIC's port");
  CHECK(refusal(seven_and_nic, full) == kExitUsage);  // a flag combination: usage, before anything starts
  CHECK(refusal(eight, full) == 0);
  // File volumes are one share in all; a ninth directory share is one too many.
  Args files = many;
  files.insert(files.end(), {"-v", "/etc/hostname:/h", "-v", "/etc/hosts:/hs", "--network", "none", "true"});
  CHECK(refusal(files, full) == kExitUsage);
  CHECK(error_of(files, full).starts_with("--snapshot: a restore plugs in at most 8 shares, one hot-plug port each; this "
                                          "run has 9 ("));
  CHECK(error_of({"--snapshot", "warm", "--sandbox", "true"}, full).starts_with(
      "--sandbox cannot be used with --snapshot: a snapshot is a VM's"));
}

TEST_CASE("--snapshot: what the snapshot decides is refused (125), a bad name too") {
  const PlanInputs in = snapshot_inputs();
  CHECK(error_of({"--snapshot", "warm", "--kernel", "/k", "true"}, in).find("--kernel cannot be used with --snapshot") != std::string::npos);
  CHECK(refusal({"--snapshot", "warm", "--initrd", "/i", "true"}, in) == kExitUsage);
  CHECK(refusal({"--snapshot", "warm", "--sandbox", "true"}, in) == kExitUsage);
  CHECK(refusal({"--snapshot", "warm", "--console", "true"}, in) == kExitUsage);
  CHECK(refusal({"--snapshot", "warm", "--rootfs", "r", "--rootfs-mode", "initramfs", "true"}, in) == kExitUsage);
  // Without --rootfs too: the snapshot's initramfs is what a restore runs.
  CHECK(refusal({"--snapshot", "warm", "--rootfs-mode", "initramfs", "true"}, in) == kExitUsage);
  CHECK(error_of({"--snapshot", "warm", "--rootfs-mode", "initramfs", "true"}, in)
            .starts_with("--rootfs-mode initramfs cannot be used with --snapshot"));
  CHECK(refusal({"--snapshot", "../up", "true"}, in) == 0);   // a path: a snapshot's directory
  CHECK(refusal({"--snapshot", ".hidden", "true"}, in) == kExitUsage);  // a name: no leading '.'
  CHECK(error_of({"--snapshot", "warm", "--network", "none", "true"}, inputs()).find("not loaded") != std::string::npos);
}

TEST_CASE("--snapshot refusals: named as given, with how to make the snapshot again there") {
  const host::Error stale{"made with another kernel: /k has SHA-256 1; made with 2"};
  auto ref = [](std::string given, std::optional<fs::path> state = std::nullopt, Strings flags = {}) {
    return SnapshotRef{std::move(given), std::move(state), std::move(flags)};
  };
  // A NAME: in the default state directory, or the --state given, with this run's flags.
  CHECK(snapshot_refusal(ref("warm"), stale).message ==
        "--snapshot warm: made with another kernel: /k has SHA-256 1; made with 2 (make it again: neshost snapshot "
        "rm warm; neshost snapshot create warm)");
  CHECK(snapshot_refusal(ref("warm", fs::path("/srv/my state"), {"--mem", "512"}), stale).message ==
        "--snapshot warm: made with another kernel: /k has SHA-256 1; made with 2 (make it again: neshost snapshot "
        "rm --state '/srv/my state' warm; neshost snapshot create --state '/srv/my state' --mem 512 warm)");
  // A directory inside STATE/.snapshots: that STATE (a trailing slash, a relative path resolved).
  CHECK(snapshot_refusal(ref("/srv/state/.snapshots/warm/"), stale).message.ends_with(
      "(make it again: neshost snapshot rm --state /srv/state warm; neshost snapshot create --state /srv/state warm)"));
  const std::string cwd = fs::current_path().string();
  CHECK(snapshot_refusal(ref(".snapshots/warm", std::nullopt, {"--cpus", "2"}), stale).message.ends_with(
      fmt::format("(make it again: neshost snapshot rm --state {0} warm; neshost snapshot create --state {0} --cpus 2 "
                  "warm)", cwd)));
  // Any other directory: removed, made in some state directory, moved there.
  CHECK(snapshot_refusal(ref("/srv/snaps/warm"), stale).message ==
        "--snapshot /srv/snaps/warm: made with another kernel: /k has SHA-256 1; made with 2 (make it again: rm -r "
        "/srv/snaps/warm; neshost snapshot create --state S warm; mv S/.snapshots/warm /srv/snaps/warm, S being any "
        "state directory)");
  CHECK(snapshot_refusal(ref("/srv/.hidden/"), stale).message.ends_with(
      "(make it again: rm -r /srv/.hidden; neshost snapshot create --state S NAME; mv S/.snapshots/NAME "
      "/srv/.hidden, S being any state directory)"));
  // Not there: a NAME's state directory is listed (a directory inside one too); another
  // directory is named, nothing more.
  const host::Error missing{"no snapshot at /s/.snapshots/warm (snapshot.json missing)", ENOENT};
  CHECK(snapshot_refusal(ref("warm", fs::path("/s")), missing).message ==
        "--snapshot warm: no snapshot at /s/.snapshots/warm (snapshot.json missing); `neshost snapshot ls --state /s` "
        "lists the snapshots there");
  CHECK(snapshot_refusal(ref("/s/.snapshots/warm"), missing).message.ends_with("`neshost snapshot ls --state /s` lists "
                                                                               "the snapshots there"));
  const host::Error gone{"no snapshot at /srv/snaps/warm (snapshot.json missing)", ENOENT};
  CHECK(snapshot_refusal(ref("/srv/snaps/warm"), gone).message ==
        "--snapshot /srv/snaps/warm: no snapshot at /srv/snaps/warm (snapshot.json missing)");
  // Not the snapshot's fault (a share's hot-plug): named, no recipe; errno kept.
  CHECK(snapshot_refusal(ref("warm"), host::Error{"device_add: x", 5}, false).message == "--snapshot warm: device_add: x");
  CHECK(snapshot_refusal(ref("warm"), host::Error{"x", 5}).err == 5);
  // The plan keeps how to name it for the restore's own refusals (QEMU's version, a state it cannot load).
  auto p = plan({"--snapshot", "/state/.snapshots/warm", "--state", "/st", "--mem", "256", "--network", "none", "true"},
                snapshot_inputs());
  REQUIRE(p);
  CHECK(p->snapshot_ref.given == "/state/.snapshots/warm");
  CHECK(p->snapshot_ref.state == std::optional<fs::path>("/st"));
  CHECK(p->snapshot_ref.flags == Strings{"--mem", "256"});
}

TEST_CASE("--rootfs FILE --rootfs-mode block: the image file as a read-only virtio-blk disk, the descriptor's block root") {
  PlanInputs in = inputs();
  in.rootfs_file = "/img/root.erofs";  // what run.cpp probed --rootfs to (vm::probe_block_fs)
  in.rootfs_fs = proto::FsType::erofs;
  auto r = plan({"--rootfs", "root.erofs", "--rootfs-mode", "block", "--upper-size", "64", "true"}, in);
  REQUIRE_MESSAGE(r, r.error().message);
  CHECK(r->daemons.empty());  // no virtiofsd: the disk is QEMU's
  CHECK(r->serve.session.descriptor.root == proto::Root{"nes.root", false, proto::FsType::erofs, 64});
  REQUIRE(r->qemu->block_devices.size() == 1);
  CHECK(r->qemu->block_devices[0].path == "/img/root.erofs");
  CHECK(r->qemu->block_devices[0].serial == "nes.root");
  CHECK(r->qemu->block_devices[0].read_only);
  CHECK(r->qemu->fs_devices.empty());
  CHECK(r->qemu->append.find(",virtio_blk") != std::string::npos);
  in.rootfs_fs = proto::FsType::ext4;
  auto ro = plan({"--rootfs", "root.ext4", "--rootfs-mode", "block", "--read-only", "true"}, in);
  REQUIRE_MESSAGE(ro, ro.error().message);
  CHECK(ro->serve.session.descriptor.root == proto::Root{"nes.root", true, proto::FsType::ext4, 0});

  // Refusals (125, nothing started), each naming the flag.
  CHECK(error_of({"--upper-size", "8", "true"}) == "--upper-size needs --rootfs-mode block");
  CHECK(error_of({"--rootfs-mode", "block", "true"}).starts_with("--rootfs-mode block needs --rootfs FILE"));
  PlanInputs bad = inputs();
  bad.rootfs_block_error = "/x.erofs: No such file or directory";
  CHECK(error_of({"--rootfs", "/x.erofs", "--rootfs-mode", "block", "true"}, bad) == "--rootfs: /x.erofs: No such file or directory");
  CHECK(refusal({"--rootfs", "/x.erofs", "--rootfs-mode", "block", "true"}, bad) == 125);
  CHECK(!parse_run({"--rootfs-mode", "blocks", "true"}));
  CHECK(!parse_run({"--upper-size", "0", "true"}));
  CHECK(!parse_run({"--upper-size", "1048577", "true"}));
  CHECK(!parse_run({"--upper-size", "8m", "true"}));
}
