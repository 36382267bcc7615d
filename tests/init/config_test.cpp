// Configuration: channel addresses, kernel command line keys, argv flags (which win), modes.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>

#include "nesinit/config.hpp"
#include "nesinit/guest.hpp"

using namespace nes::init;
using nes::proto::Halt;

TEST_CASE("parse_channel: the three transports and their errors") {
  auto v = parse_channel("vsock:2:7000");
  REQUIRE(v);
  CHECK(*v == Channel{VsockAddr{2, 7000}});
  CHECK(*parse_channel("vsock:4294967295:1") == Channel{VsockAddr{4294967295u, 1}});
  CHECK(*parse_channel("virtio-port:nes.0") == Channel{VirtioPortAddr{"nes.0"}});
  CHECK(*parse_channel("unix:/run/x.sock") == Channel{UnixAddr{"/run/x.sock"}});
  for (const char* bad : {"", "vsock", "vsock:2", "vsock:x:1", "vsock:2:", "vsock:4294967296:1",
                          "vsock:-1:2", "virtio-port:", "virtio-port:a/b", "unix:", "tcp:1.2.3.4:5",
                          "VSOCK:2:7000"}) {
    CAPTURE(bad);
    auto p = parse_channel(bad);
    CHECK(!p);
    CHECK(p.error().message.rfind("channel:", 0) == 0);
  }
  CHECK(!parse_channel("unix:" + std::string(108, 'a')));
  CHECK(parse_channel("unix:" + std::string(107, 'a')));
  for (const char* s : {"vsock:3:1024", "virtio-port:nes.0", "unix:/tmp/a"})
    CHECK(to_string(*parse_channel(s)) == s);
}

TEST_CASE("defaults") {
  Config c;
  CHECK(c.grace_ms == 10000);
  CHECK(c.ack_timeout_ms == 3000);
  CHECK(c.boot_timeout_ms == 30000);
  CHECK(c.halt == Halt::poweroff);
  CHECK(c.log == LogLevel::info);
  CHECK(!c.channel);
}

TEST_CASE("kernel command line: nesinit.* keys, quoting, bad values never fatal") {
  Config c;
  std::vector<std::string> notes;
  apply_cmdline(c,
                "console=ttyS0 quiet nesinit.channel=virtio-port:nes.0 nesinit.grace_ms=2500 "
                "nesinit.halt=reboot \"nesinit.log=debug\" nesinit.bogus=1 nesinit.ack_timeout_ms=x "
                "nesinit.boot-timeout-ms=100 nesinit.novalue\n",
                notes);
  CHECK(c.channel == Channel{VirtioPortAddr{"nes.0"}});
  CHECK(c.grace_ms == 2500);
  CHECK(c.halt == Halt::reboot);
  CHECK(c.log == LogLevel::debug);
  CHECK(c.ack_timeout_ms == 3000);  // bad value: unchanged
  CHECK(c.boot_timeout_ms == 100);
  REQUIRE(notes.size() == 3);
  CHECK(notes[0].find("bogus") != std::string::npos);
  CHECK(notes[1].find("ack_timeout_ms") != std::string::npos);
  CHECK(notes[2].find("novalue") != std::string::npos);
  CHECK(split_cmdline(R"(a "b c" d="e f"  )") == std::vector<std::string>{"a", "b c", "d=e f"});
}

TEST_CASE("argv flags win over the command line; both spellings") {
  Config c;
  std::vector<std::string> notes;
  apply_cmdline(c, "nesinit.channel=vsock:2:7000 nesinit.grace_ms=1", notes);
  auto r = apply_argv(c, {"--channel=unix:/tmp/s", "--grace-ms", "2000", "--connect-timeout-ms=5",
                          "--halt=reboot", "--log=quiet"});
  CHECK(r.command == Command::run);
  CHECK(r.problems.empty());
  CHECK(c.channel == Channel{UnixAddr{"/tmp/s"}});
  CHECK(c.grace_ms == 2000);
  CHECK(c.connect_timeout_ms == 5);
  CHECK(c.halt == Halt::reboot);
  CHECK(c.log == LogLevel::quiet);
}

TEST_CASE("argv: commands, bare words, unknown flags, bad values") {
  Config c;
  CHECK(apply_argv(c, {"--help"}).command == Command::help);
  CHECK(apply_argv(c, {"--version"}).command == Command::version);
  CHECK(apply_argv(c, {"--self-check"}).command == Command::self_check);
  auto r = apply_argv(c, {"single", "--nope=1", "--grace-ms=abc", "--halt=sleep", "--log"});
  CHECK(r.command == Command::run);
  REQUIRE(r.problems.size() == 5);
  CHECK(r.problems[0].find("single") != std::string::npos);
  CHECK(r.problems[1].find("unknown key") != std::string::npos);
  CHECK(r.problems[2].find("grace_ms") != std::string::npos);
  CHECK(r.problems[3].find("halt") != std::string::npos);
  CHECK(r.problems[4].find("missing value") != std::string::npos);
  CHECK(c == Config{});
}

TEST_CASE("mode: guest only as PID 1 of the initial pid namespace") {
  CHECK(decide_mode(1, kInitialPidNsInode) == Mode::guest);
  CHECK(decide_mode(1, 4026532500u) == Mode::sandbox);
  CHECK(decide_mode(1, std::nullopt) == Mode::sandbox);
  CHECK(decide_mode(2, kInitialPidNsInode) == Mode::not_pid1);
  CHECK(decide_mode(777, std::nullopt) == Mode::not_pid1);
  // This test process: not PID 1, whatever namespace it is in.
  CHECK(decide_mode(::getpid(), ns_inode("pid")) == Mode::not_pid1);
  CHECK(ns_inode("pid").has_value());
}

TEST_CASE("finalize_for_mode: vsock default only for a guest; a sandbox needs a non-vsock channel") {
  Config g;
  CHECK(finalize_for_mode(g, Mode::guest));
  CHECK(g.channel == Channel{VsockAddr{2, 7000}});
  Config s;
  CHECK(finalize_for_mode(s, Mode::sandbox).error().message.find("required") != std::string::npos);
  s.channel = VsockAddr{2, 7000};
  CHECK(finalize_for_mode(s, Mode::sandbox).error().message.find("vsock") != std::string::npos);
  s.channel = UnixAddr{"/tmp/x"};
  CHECK(finalize_for_mode(s, Mode::sandbox));
}

TEST_CASE("data channel: --data-channel / nesinit.data=, defaults only beside vsock and nes.0 in a guest") {
  Config c;
  CHECK(apply_key(c, "data-channel", "unix:/tmp/d.sock"));
  CHECK(c.data_channel == Channel{UnixAddr{"/tmp/d.sock"}});
  CHECK(apply_key(c, "data", "virtio-port:nes.1"));  // the kernel command line's key
  CHECK(c.data_channel == Channel{VirtioPortAddr{"nes.1"}});
  CHECK(apply_key(c, "data_channel", "tcp:1").error().message.rfind("data_channel: expected", 0) == 0);
  CHECK(c.data_channel == Channel{VirtioPortAddr{"nes.1"}});  // unchanged on error
  CHECK(default_data_channel(VsockAddr{3, 7000}, Mode::guest) == Channel{VsockAddr{3, 7001}});
  CHECK(default_data_channel(VirtioPortAddr{"nes.0"}, Mode::guest) == Channel{VirtioPortAddr{"nes.1"}});
  CHECK(!default_data_channel(VirtioPortAddr{"other"}, Mode::guest));
  CHECK(!default_data_channel(UnixAddr{"/x"}, Mode::sandbox));
  Config g;
  CHECK(finalize_for_mode(g, Mode::guest));
  CHECK(g.data_channel == Channel{VsockAddr{2, 7001}});
  Config s;
  s.channel = UnixAddr{"/tmp/x"};
  CHECK(finalize_for_mode(s, Mode::sandbox));
  CHECK(!s.data_channel);  // a sandbox has no default
  s.data_channel = VsockAddr{2, 7001};
  CHECK(finalize_for_mode(s, Mode::sandbox).error().message.find("data_channel: vsock") == 0);
}

TEST_CASE("usage: the default channels it names are protocol/channels.hpp's") {
  namespace proto = nes::proto;
  const std::string u(usage());
  for (const std::string& want :
       {"vsock:2:" + std::to_string(proto::kLifecycleVsockPort), "vsock:CID:" + std::to_string(proto::kDataVsockPort),
        std::string("virtio-port:") + proto::kDataPortName + " beside virtio-port:" + proto::kLifecyclePortName}) {
    CAPTURE(want);
    CHECK(u.find(want) != std::string::npos);
  }
}

TEST_CASE("modules list: one path per line, comments and blanks skipped") {
  CHECK(parse_modules_list("# virtio\n/lib/a.ko\n\n  /lib/b.ko  # dep\r\n\t\n/lib/c.ko") ==
        std::vector<std::string>{"/lib/a.ko", "/lib/b.ko", "/lib/c.ko"});
  CHECK(parse_modules_list("").empty());
}

TEST_CASE("modules key: comma-separated names; a bad name or too many is an error naming the key") {
  Config c;
  CHECK_FALSE(c.modules);
  REQUIRE(apply_key(c, "modules", "virtio_pci,virtio_console,virtio-net"));
  CHECK(c.modules == std::vector<std::string>{"virtio_pci", "virtio_console", "virtio-net"});
  for (const char* bad : {"a,,b", "a,", ",a", "", "../x", "a b", "x/y"}) {
    Config d;
    auto r = apply_key(d, "modules", bad);
    REQUIRE_FALSE(r);
    CHECK(r.error().message.starts_with("modules: '"));
    CHECK_FALSE(d.modules);  // unchanged
  }
  std::string many;
  for (int i = 0; i <= static_cast<int>(Config::kMaxModules); ++i) many += (i ? ",m" : "m") + std::to_string(i);
  CHECK(apply_key(c, "modules", many).error().message == "modules: more than 32 names");
  std::vector<std::string> notes;
  Config k;
  apply_cmdline(k, "quiet nesinit.modules=virtio_pci,virtiofs panic=-1", notes);
  CHECK(notes.empty());
  CHECK(k.modules == std::vector<std::string>{"virtio_pci", "virtiofs"});
}

// load_modules against a fake /etc/nesinit whose lists name files that do not exist: every path
// is attempted (open fails, counted) and none ever reaches finit_module, so the host's kernel is
// never touched. The count of failures says which paths were attempted, each once.
TEST_CASE("load_modules: only the named groups, each path once; a missing group falls back to the whole list") {
  char tmpl[] = "/tmp/nes-modules-XXXXXX";
  REQUIRE(::mkdtemp(tmpl));
  std::string dir = tmpl;
  auto write = [](const std::string& path, const std::string& text) {
    FILE* f = std::fopen(path.c_str(), "w");
    REQUIRE(f);
    std::fputs(text.c_str(), f);
    std::fclose(f);
  };
  REQUIRE(::mkdir((dir + "/modules.d").c_str(), 0755) == 0);
  const std::string absent = dir + "/absent";  // never created: open fails with ENOENT
  write(dir + "/modules", absent + "/ring.ko\n" + absent + "/virtio.ko\n" + absent + "/net.ko\n" + absent + "/fs.ko\n");
  write(dir + "/modules.d/net", absent + "/ring.ko\n" + absent + "/virtio.ko\n" + absent + "/net.ko\n");
  write(dir + "/modules.d/fs", absent + "/ring.ko\n" + absent + "/virtio.ko\n" + absent + "/fs.ko\n");
  Log log(2, LogLevel::quiet);
  // Module support is what the kernel says (/proc/modules); here a file that exists stands for
  // it (the test machine's kernel may have none), and one that does not for a kernel without.
  const std::string support = dir + "/modules";
  const char* sup = support.c_str();
  CHECK(load_modules(log, std::nullopt, dir, (dir + "/no-proc-modules").c_str()) == 0);  // none tried
  CHECK(load_modules(log, std::nullopt, dir, sup) == 4);                             // the whole list
  CHECK(load_modules(log, std::vector<std::string>{"net"}, dir, sup) == 3);          // one group
  CHECK(load_modules(log, std::vector<std::string>{"net", "fs"}, dir, sup) == 4);    // shared deps once
  CHECK(load_modules(log, std::vector<std::string>{}, dir, sup) == 0);               // none asked for
  CHECK(load_modules(log, std::vector<std::string>{"net", "gone"}, dir, sup) == 4);  // falls back: whole list
  CHECK(load_modules(log, std::nullopt, dir + "/nowhere", sup) == 0);                // no list: nothing
  std::remove((dir + "/modules.d/net").c_str());
  std::remove((dir + "/modules.d/fs").c_str());
  std::remove((dir + "/modules").c_str());
  ::rmdir((dir + "/modules.d").c_str());
  ::rmdir(dir.c_str());
}
