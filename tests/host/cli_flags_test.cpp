// The CLI's flag parser (host/cli/flags.hpp) alone: both orders, short forms, switch clusters,
// values inline and apart, and each error naming its flag. Then the commands' flag tables
// (host/cli/flag_table.hpp): every `neshost run` flag's good and bad values, table-driven, its
// host checks with fake probes, its generated help; snapshot create's and exec's.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <signal.h>
#include <stdlib.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>

#include "host/cli/exec_flags.hpp"
#include "host/cli/flags.hpp"
#include "host/cli/run_flags.hpp"
#include "host/cli/vm_flags.hpp"

using namespace nes;
using namespace nes::cli;

namespace {
constexpr FlagSpec kRun[] = {{"detach", false, "-d"}, {"interactive", false, "-i"}, {"tty", false, "-t"},
                             {"env", true, "-e"},      {"state"},                   {"console", false}};

using Given = std::vector<std::pair<std::string, std::string>>;
}  // namespace

TEST_CASE("options first: flags stop at ARGV, whose own flags are kept as given") {
  auto p = parse_flags(kRun, {"-it", "-e", "A=1", "--env=B=2", "--state", "/s", "sh", "-c", "--", "-x"},
                       FlagOrder::options_first);
  REQUIRE(p);
  CHECK(p->given == Given{{"interactive", ""}, {"tty", ""}, {"env", "A=1"}, {"env", "B=2"}, {"state", "/s"}});
  CHECK(p->positional == std::vector<std::string>{"sh", "-c", "--", "-x"});
  CHECK(*p->get("env") == "B=2");  // the last one wins in the map
  CHECK(!p->help);
}

TEST_CASE("options first: `--` and a lone '-' end the options") {
  auto p = parse_flags(kRun, {"-d", "--", "-t", "x"}, FlagOrder::options_first);
  REQUIRE(p);
  CHECK(p->has("detach"));
  CHECK(!p->has("tty"));
  CHECK(p->positional == std::vector<std::string>{"-t", "x"});
  auto q = parse_flags(kRun, {"-", "-d"}, FlagOrder::options_first);
  REQUIRE(q);
  CHECK(q->positional == std::vector<std::string>{"-", "-d"});
  CHECK(q->given.empty());
}

TEST_CASE("short forms with their value attached or after switches, as docker's pflag reads them") {
  auto p = parse_flags(kRun, {"-eA=1", "-e=B=2", "-ite", "C=3", "-de-", "sh", "-eX=1"}, FlagOrder::options_first);
  REQUIRE(p);
  CHECK(p->given == Given{{"env", "A=1"}, {"env", "B=2"}, {"interactive", ""}, {"tty", ""}, {"env", "C=3"},
                          {"detach", ""}, {"env", "-"}});
  CHECK(p->positional == std::vector<std::string>{"sh", "-eX=1"});
  constexpr FlagSpec kLogs[] = {{"follow", false, "-f"}, {"tail", true, "-n"}};
  auto l = parse_flags(kLogs, {"vm", "-n5", "-fn", "7"});
  REQUIRE(l);
  CHECK(l->given == Given{{"tail", "5"}, {"follow", ""}, {"tail", "7"}});
  CHECK(l->positional == std::vector<std::string>{"vm"});
}

TEST_CASE("anywhere: flags among the positionals") {
  constexpr FlagSpec kLogs[] = {{"follow", false, "-f"}, {"tail", true, "-n"}, {"state"}};
  auto p = parse_flags(kLogs, {"vm1", "-f", "-n", "5", "--state=/x", "vm2", "--", "-f"});
  REQUIRE(p);
  CHECK(p->given == Given{{"follow", ""}, {"tail", "5"}, {"state", "/x"}});
  CHECK(p->positional == std::vector<std::string>{"vm1", "vm2", "-f"});
  auto h = parse_flags(kLogs, {"-h", "vm"});
  REQUIRE(h);
  CHECK(h->help);
  auto hl = parse_flags(kLogs, {"vm", "--help"});
  REQUIRE(hl);
  CHECK(hl->help);
}

TEST_CASE("-h is help unless a spec claims it (docker run's -h is --hostname)") {
  constexpr FlagSpec kHost[] = {{"hostname", true, "-h"}};
  auto p = parse_flags(kHost, {"-h", "box", "sh"}, FlagOrder::options_first);
  REQUIRE(p);
  CHECK(!p->help);
  CHECK(*p->get("hostname") == "box");
  CHECK(p->positional == std::vector<std::string>{"sh"});
  auto q = parse_flags(kHost, {"--help"}, FlagOrder::options_first);
  REQUIRE(q);
  CHECK(q->help);
}

TEST_CASE("a docker line's network flags: -p repeatable and in clusters, --rm, --name, --network") {
  constexpr FlagSpec kNet[] = {{"detach", false, "-d"}, {"publish", true, "-p"}, {"rm", false}, {"name"},
                               {"network"}, {"dns"}, {"dns-search"}, {"dns-option"}, {"add-host"}};
  auto p = parse_flags(kNet,
                       {"-dp", "8080:80", "-p127.0.0.1:53:53/udp", "--publish=9000:90", "--rm", "--name", "web",
                        "--network=user", "--dns", "1.1.1.1", "--dns-search", "a.example", "--dns-option",
                        "ndots:2", "--add-host", "db:10.0.0.5", "nginx", "-p", "1"},
                       FlagOrder::options_first);
  REQUIRE(p);
  CHECK(p->given == Given{{"detach", ""}, {"publish", "8080:80"}, {"publish", "127.0.0.1:53:53/udp"},
                          {"publish", "9000:90"}, {"rm", ""}, {"name", "web"}, {"network", "user"},
                          {"dns", "1.1.1.1"}, {"dns-search", "a.example"}, {"dns-option", "ndots:2"},
                          {"add-host", "db:10.0.0.5"}});
  CHECK(p->positional == std::vector<std::string>{"nginx", "-p", "1"});  // the program's own -p
  auto bad = parse_flags(kNet, {"--rm=yes"}, FlagOrder::options_first);
  REQUIRE(!bad);
  CHECK(bad.error().message == "--rm takes no value");
  auto none = parse_flags(kNet, {"-p"}, FlagOrder::options_first);
  REQUIRE(!none);
  CHECK(none.error().message == "--publish needs a value");
}

TEST_CASE("errors name the flag") {
  auto msg = [](std::span<const FlagSpec> specs, Args a, FlagOrder o = FlagOrder::anywhere) {
    auto p = parse_flags(specs, a, o);
    REQUIRE(!p);
    return p.error().message;
  };
  CHECK(msg(kRun, {"--bogus"}) == "unknown flag --bogus");
  CHECK(msg(kRun, {"--bogus=1"}) == "unknown flag --bogus");
  CHECK(msg(kRun, {"-x"}) == "unknown flag -x");
  CHECK(msg(kRun, {"-ix"}) == "unknown flag -ix");
  CHECK(msg(kRun, {"-ie"}) == "--env needs a value");
  CHECK(msg(kRun, {"-iy"}) == "unknown flag -iy");
  CHECK(msg(kRun, {"--state"}) == "--state needs a value");
  CHECK(msg(kRun, {"-e"}, FlagOrder::options_first) == "--env needs a value");
  CHECK(msg(kRun, {"--tty=1"}) == "--tty takes no value");
  CHECK(msg(kRun, {"--console=yes", "sh"}, FlagOrder::options_first) == "--console takes no value");
}

TEST_CASE("value parsers") {
  CHECK((*parse_env("K=V=W"))->second == "V=W");
  CHECK((*parse_env("K="))->second == "");
  CHECK(parse_env("=V").error().message == "--env: expected K=V or K, got '=V'");
  CHECK(parse_env("").error().message == "--env: expected K=V or K, got ''");
  // K alone: our own value, as docker passes it; nothing when unset here.
  REQUIRE(::setenv("NES_CLI_FLAGS_TEST_VAR", "from-here", 1) == 0);
  CHECK(*parse_env("NES_CLI_FLAGS_TEST_VAR") == std::pair<std::string, std::string>{"NES_CLI_FLAGS_TEST_VAR", "from-here"});
  REQUIRE(::unsetenv("NES_CLI_FLAGS_TEST_VAR") == 0);
  CHECK(!*parse_env("NES_CLI_FLAGS_TEST_VAR"));
  CHECK(*parse_workdir("/srv") == "/srv");
  CHECK(parse_workdir("srv").error().message == "--workdir: 'srv' is not an absolute path");
  CHECK(*parse_user("7") == std::pair<std::uint32_t, std::uint32_t>{7, 7});
  CHECK(*parse_user("7:8") == std::pair<std::uint32_t, std::uint32_t>{7, 8});
  CHECK(!parse_user("4294967295"));  // (uid_t)-1 is "no change" to setresuid: refused
  CHECK(!parse_user("a:b"));
  CHECK(parse_seconds("grace", "0.5")->count() == 500);
  CHECK(parse_seconds("grace", "0.0001")->count() == 1);
  CHECK(!parse_seconds("grace", "0"));
  CHECK(!parse_seconds("grace", "nan"));
  CHECK(*parse_uint("cpus", "64", 1, 64) == 64);
  CHECK(parse_uint("cpus", "65", 1, 64).error().message == "--cpus: expected an integer 1..64, got '65'");
  CHECK(!parse_uint("cpus", "", 1, 64));
}

// ---- the flag tables (host/cli/flag_table.hpp): `neshost run`'s, snapshot create's, exec's ----

namespace {

/// A private temp dir (a -v HOST must exist), removed with everything in it.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    std::string t = (std::filesystem::temp_directory_path() / "cli-flags-XXXXXX").string();
    REQUIRE(::mkdtemp(t.data()) != nullptr);
    path = t;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

/// One command line of `neshost run` (ending in ARGV "true"): accepted with `ok` holding, or
/// refused with an error that contains `error`. `flag` is the table entry the case is about.
struct RunCase {
  std::string flag;
  std::vector<std::string> args;
  std::function<bool(const RunFlags&)> ok;  // empty: a refusal
  std::string error = {};
};

}  // namespace

TEST_CASE("every `neshost run` flag: its good values set RunFlags, its bad ones are refused naming it") {
  TempDir tmp;
  const std::string dir = tmp.path.string();
  const std::string h64(64, 'h'), h65(65, 'h'), h300(300, 'h');
  std::vector<std::string> groups65;
  for (int i = 0; i < 65; ++i) groups65.insert(groups65.end(), {"--group-add", "1"});
  REQUIRE(::unsetenv("NES_CLI_FLAGS_UNSET") == 0);
  using F = const RunFlags&;
  const std::vector<RunCase> cases = {
      {"interactive", {"-i"}, [](F o) { return o.interactive; }},
      {"interactive", {"--interactive=1"}, {}, "--interactive takes no value"},
      {"tty", {"-t"}, [](F o) { return o.tty; }},
      {"tty", {"--tty=yes"}, {}, "--tty takes no value"},
      {"log-max-size", {"--log-max-size", "1m"}, [](F o) { return o.log_max_size == 1u << 20; }},
      {"log-max-size", {"--log-max-size", "1k"}, {}, "--log-max-size: 1k is below the minimum 64k"},
      {"log-max-size", {"--log-max-size", "10q"}, {}, "--log-max-size: expected bytes with an optional k, m or g"},
      {"log-max-files", {"--log-max-files", "3"}, [](F o) { return o.log_max_files == 3; }},
      {"log-max-files", {"--log-max-files", "0"}, {}, "--log-max-files: expected an integer 1..100, got '0'"},
      {"log-max-files", {"--log-max-files", "101"}, {}, "--log-max-files: expected an integer 1..100, got '101'"},
      {"kernel", {"--kernel", "/k/bzImage"}, [](F o) { return o.kernel == "/k/bzImage"; }},
      {"kernel", {"--kernel", ""}, {}, "--kernel: expected a path, got ''"},
      {"initrd", {"--initrd=/i.cpio"}, [](F o) { return o.initrd == "/i.cpio"; }},
      {"initrd", {"--initrd="}, {}, "--initrd: expected a path, got ''"},
      {"snapshot", {"--snapshot", "warm"}, [](F o) { return o.snapshot == "warm"; }},
      {"snapshot", {"--snapshot", "../s/warm"}, [](F o) { return o.snapshot == "../s/warm"; }},
      {"snapshot", {"--snapshot", ".hidden"}, {}, "--snapshot: "},
      {"rootfs", {"--rootfs", "/r"}, [](F o) { return o.rootfs == "/r"; }},
      {"rootfs", {"--rootfs", ""}, {}, "--rootfs: expected a path, got ''"},
      {"rootfs-mode", {"--rootfs-mode", "initramfs"}, [](F o) { return o.rootfs_initramfs; }},
      {"rootfs-mode", {"--rootfs-mode", "9p"}, {}, "--rootfs-mode: expected virtiofs, initramfs or block, got '9p'"},
      {"upper-size", {"--upper-size", "64"}, [](F o) { return o.upper_mib == 64; }},
      {"upper-size", {"--upper-size", "0"}, {}, "--upper-size: expected MiB 1..1048576, got '0'"},
      {"volume", {"-v", dir + ":/data:ro"}, [](F o) { return o.volumes.size() == 1 && o.volumes[0].guest == "/data" && o.volumes[0].ro; }},
      {"volume", {"-v", ":"}, {}, "--volume"},
      {"volume", {"-v", dir + ":rel"}, {}, "--volume"},
      {"volume", {"-v", dir + ":/a", "-v", dir + ":/a"}, {}, "twice"},
      {"mem", {"--mem", "512"}, [](F o) { return o.mem == 512 && o.mem_given; }},
      {"mem", {"--mem", "63"}, {}, "--mem: expected an integer 64..1048576, got '63'"},
      {"mem", {"--mem", "1g"}, {}, "--mem: expected an integer 64..1048576, got '1g'"},
      {"mem", {"--mem", "1048577"}, {}, "--mem: expected an integer 64..1048576"},
      {"cpus", {"--cpus", "2"}, [](F o) { return o.cpus == 2 && o.cpus_given; }},
      {"cpus", {"--cpus", "0"}, {}, "--cpus: expected an integer 1..64, got '0'"},
      {"cpus", {"--cpus", "65"}, {}, "--cpus: expected an integer 1..64, got '65'"},
      {"accel", {"--accel", "kvm"}, [](F o) { return o.accel == vm::Accel::kvm; }},
      {"accel", {"--accel=tcg"}, [](F o) { return o.accel == vm::Accel::tcg; }},
      {"accel", {"--accel", "hvf"}, {}, "--accel: expected tcg, kvm or auto, got 'hvf'"},
      {"env", {"-e", "K=V=W", "-e", "NES_CLI_FLAGS_UNSET"}, [](F o) { return o.env == std::map<std::string, std::string>{{"K", "V=W"}}; }},
      {"env", {"-e", "=v"}, {}, "--env: expected K=V or K, got '=v'"},
      {"env", {"-e", ""}, {}, "--env: expected K=V or K, got ''"},
      {"workdir", {"-w", "/srv"}, [](F o) { return o.workdir == "/srv"; }},
      {"workdir", {"-w", "srv"}, {}, "--workdir: 'srv' is not an absolute path"},
      {"user", {"-u", "7:8"}, [](F o) { return o.uid == 7 && o.gid == 8; }},
      {"user", {"-u", "root:staff"}, [](F o) { return o.user_spec == "root:staff" && o.uid == 0; }},
      {"user", {"-u", "ro ot"}, {}, "--user: expected UID[:GID] (numbers), got 'ro ot'"},
      {"user", {"-u", "4294967295"}, {}, "--user: expected UID[:GID]"},
      {"pull", {"--pull", "always"}, [](F o) { return o.pull == RunFlags::Pull::always; }},
      {"pull", {"--pull", "sometimes"}, {}, "--pull: expected missing, always or never, got 'sometimes'"},
      {"entrypoint", {"--entrypoint", "/bin/sh"}, [](F o) { return o.entrypoint == "/bin/sh"; }},
      {"entrypoint", {"--entrypoint", ""}, [](F o) { return o.entrypoint == ""; }},
      {"entrypoint", {"--entrypoint", std::string("a\0b", 3)}, {}, "--entrypoint: a NUL byte in the command"},
      {"group-add", {"--group-add", "5", "--group-add", "6"}, [](F o) { return o.groups == std::vector<std::uint32_t>{5, 6}; }},
      {"group-add", {"--group-add", "x"}, {}, "--group-add: expected an integer 0..4294967294, got 'x'"},
      {"group-add", groups65, {}, "--group-add: at most 64 groups"},
      {"read-only", {"--read-only", "--rootfs", "/r"}, [](F o) { return o.read_only; }},
      {"read-only", {"--rootfs", "/r", "--rootfs-mode", "initramfs", "--read-only"}, {}, "--read-only needs --rootfs DIR over virtiofs"},
      {"hostname", {"-h", "box"}, [](F o) { return o.hostname == "box"; }},
      {"hostname", {"--hostname", h64}, [&](F o) { return o.hostname == h64; }},
      {"hostname", {"--hostname", h65}, {}, "--hostname: 65 bytes, the guest's limit is 64 (HOST_NAME_MAX)"},
      {"hostname", {"-h", h300}, {}, "--hostname: 300 bytes, the guest's limit is 64 (HOST_NAME_MAX)"},
      {"hostname", {"-h", ""}, {}, "--hostname: expected 1..64 letters, digits, '-', '.', '_', got ''"},
      {"hostname", {"-h", "a b"}, {}, "--hostname: expected 1..64 letters, digits, '-', '.', '_', got 'a b'"},
      {"on-exit", {"--on-exit", "keep"}, [](F o) { return o.on_exit == host::OnExitPolicy::keep; }},
      {"on-exit", {"--on-exit", "pause"}, {}, "--on-exit: expected stop, keep or remove, got 'pause'"},
      {"state", {"--state", "/s"}, [](F o) { return o.state == "/s"; }},
      {"state", {"--state", ""}, {}, "--state: expected a path, got ''"},
      {"vm", {"--vm", "web.1"}, [](F o) { return o.vm == "web.1"; }},
      {"vm", {"--vm", "-x"}, {}, "--vm: vm id '-x' starts with '-'"},
      {"vm", {"--vm", "a/b"}, {}, "--vm: vm id may hold only [A-Za-z0-9._-]"},
      {"timeout", {"--timeout", "0.5"}, [](F o) { return o.timeout == std::chrono::milliseconds(500); }},
      {"timeout", {"--timeout", "0"}, {}, "--timeout: expected seconds > 0 (e.g. 30 or 0.5), got '0'"},
      {"timeout", {"--timeout", "nan"}, {}, "--timeout: expected seconds > 0"},
      {"timeout", {"--timeout", "2678401"}, {}, "--timeout: expected seconds > 0"},  // over 31 days
      {"ready-timeout", {"--ready-timeout", "5"}, [](F o) { return o.ready_timeout == std::chrono::seconds(5); }},
      {"ready-timeout", {"--ready-timeout", "x"}, {}, "--ready-timeout: expected seconds > 0 (e.g. 30 or 0.5), got 'x'"},
      {"grace", {"--grace", "3"}, [](F o) { return o.grace == std::chrono::seconds(3) && o.grace_given; }},
      {"grace", {"--grace", "-1"}, {}, "--grace: expected seconds > 0 (e.g. 30 or 0.5), got '-1'"},
      {"console", {"--console"}, [](F o) { return o.console; }},
      {"console", {"--console=yes"}, {}, "--console takes no value"},
      {"detach", {"-d"}, [](F o) { return o.detach; }},
      {"detach", {"--detach=1"}, {}, "--detach takes no value"},
      {"sandbox", {"--sandbox"}, [](F o) { return o.sandbox && o.network.mode == host::NetworkMode::none; }},
      {"sandbox", {"--sandbox=1"}, {}, "--sandbox takes no value"},
      {"name", {"--name", "web"}, [](F o) { return o.vm == "web" && o.name == "web"; }},
      {"name", {"--name", "web", "--vm", "web"}, [](F o) { return o.vm == "web"; }},
      {"name", {"--vm", "b", "--name", "a"}, {}, "--name a and --vm b name two VMs (--name is --vm, docker's spelling)"},
      {"name", {"--name", "-x"}, {}, "--name: vm id '-x' starts with '-'"},
      {"rm", {"--rm"}, [](F o) { return o.rm; }},
      {"rm", {"--rm=yes"}, {}, "--rm takes no value"},
      {"vmm-outlives", {"--vmm-outlives"}, [](F o) { return o.vmm_outlives; }},
      {"vmm-outlives", {"--vmm-outlives=1"}, {}, "--vmm-outlives takes no value"},
      {"stdin-hold", {"-i", "--stdin-hold"}, [](F o) { return o.stdin_hold; }},
      {"stdin-hold", {"--stdin-hold"}, {}, "--stdin-hold needs -i"},
      {"network", {"--network", "slirp"}, [](F o) { return o.network.mode == host::NetworkMode::slirp && o.network_given; }},
      {"network", {"--network", "netns:/run/netns/x"}, [](F o) { return o.network.mode == host::NetworkMode::netns; }},
      {"network", {"--network", "bogus"}, {}, "--network bogus: unknown mode"},
      {"network", {"--network", "netns:rel"}, {}, "--network netns:rel: netns:PATH needs an absolute path"},
      {"publish", {"-p", "127.0.0.1:8080:80/udp"}, [](F o) { return o.network.publish.size() == 1 && o.network.publish[0].host_port == 8080; }},
      {"publish", {"-p", "abc"}, {}, "--publish"},
      {"publish", {"-p", "8080:0"}, {}, "--publish"},
      {"dns", {"--dns", "1.1.1.1"}, [](F o) { return o.network.dns.size() == 1; }},
      {"dns", {"--dns", "1.1.1"}, {}, "--dns 1.1.1: not an IPv4 or IPv6 address"},
      {"dns-search", {"--dns-search", "a.example"}, [](F o) { return o.network.dns_search == std::vector<std::string>{"a.example"}; }},
      {"dns-search", {"--dns-search", "bad domain"}, {}, "--dns-search bad domain: a domain is 1..253 of letters"},
      {"dns-option", {"--dns-option", "ndots:2"}, [](F o) { return o.network.dns_options == std::vector<std::string>{"ndots:2"}; }},
      {"dns-option", {"--dns-option", "a b"}, {}, "--dns-option 'a b': a resolv.conf option is 1..64 printable bytes"},
      {"add-host", {"--add-host", "db:10.0.0.5"}, [](F o) { return o.network.hosts.size() == 1; }},
      {"add-host", {"--add-host", "db"}, {}, "--add-host db: expected NAME:IP or NAME:host-gateway"},
  };
  std::set<std::string> good, bad;
  for (const auto& c : cases) {
    std::vector<std::string> line = c.args;
    line.push_back("true");
    Args args(line.begin(), line.end());
    std::string joined;
    for (const auto& a : line) joined += (a.size() > 40 ? a.substr(0, 40) + "..." : a) + " ";
    CAPTURE(joined);
    auto f = parse_run(args);
    if (c.ok) {
      REQUIRE_MESSAGE(f, f.error().message);
      CHECK(c.ok(*f));
      CHECK(f->argv == std::vector<std::string>{"true"});
      good.insert(c.flag);
    } else {
      REQUIRE(!f);
      CHECK(f.error().message.find(c.error) != std::string::npos);
      CHECK(f.error().message.find(c.flag) != std::string::npos);  // it names the flag
      bad.insert(c.flag);
    }
  }
  // Each entry of the table has both: a new flag cannot be added without its cases.
  for (const auto& e : run_flags()) {
    CAPTURE(e.spec.name);
    CHECK(good.count(std::string(e.spec.name)) == 1);
    CHECK(bad.count(std::string(e.spec.name)) == 1);
  }
}

TEST_CASE("the ARGV: after the options or after `--` (where a positional IMAGE would end)") {
  auto a = parse_run({"-i", "sh", "-c", "x"});
  REQUIRE(a);
  CHECK(a->argv == std::vector<std::string>{"sh", "-c", "x"});
  CHECK(a->argv_after_dashdash == 3);
  auto b = parse_run({"-i", "--", "sh"});
  REQUIRE(b);
  CHECK(b->argv == std::vector<std::string>{"sh"});
  CHECK(b->argv_after_dashdash == 0);
  auto h = parse_run({"--help"});
  REQUIRE(h);
  CHECK(h->help);
}

TEST_CASE("run --help: every entry's line from the table, today's prose kept around them") {
  const std::string help = run_help();
  CHECK(help.starts_with("usage: neshost run [OPTIONS] [--] ARGV...\n"));
  for (const auto& e : run_flags()) {
    CAPTURE(e.spec.name);
    CHECK(help.find(flag_help_line(e.spec, e.value_name, e.help)) != std::string::npos);
    CHECK(!e.help.empty());
    CHECK((e.value_name.empty() != e.spec.takes_value));
  }
  for (const char* prose : {"Usage errors exit 125 before anything starts", "\nNetwork:\n  --network MODE",
                            "  See `neshost port VM` for a VM's published ports.\nSIGINT/SIGTERM: ordered shutdown",
                            "Environment: NESHOST_APPEND", "default 0).\n"})
    CHECK(help.find(prose) != std::string::npos);
  // No option line is wider than 100 columns (the text's own lines stay under ~80).
  std::size_t at = 0, widest = 0;
  for (std::size_t nl; (nl = help.find('\n', at)) != std::string::npos; at = nl + 1)
    if (help.compare(at, 2, "  ") == 0) widest = std::max(widest, nl - at);
  CHECK(widest <= 100);
}

TEST_CASE("help lines: names padded to column 23, long names on a line of their own") {
  CHECK(flag_help_line({"interactive", false, "-i"}, "", "forward stdin") == "  -i, --interactive    forward stdin\n");
  CHECK(flag_help_line({"accel"}, "tcg|kvm|auto", "a\nb") ==
        "  --accel tcg|kvm|auto a\n"
        "                       b\n");
  CHECK(flag_help_line({"volume", true, "-v"}, "HOST:GUEST[:ro]", "share") ==
        "  -v, --volume HOST:GUEST[:ro]\n"
        "                       share\n");
}

TEST_CASE("check_run_host: --accel kvm needs KVM, --mem this host's memory, --kernel/--initrd their files") {
  TempDir tmp;
  const auto file = tmp.path / "vmlinuz";
  { std::ofstream(file) << "k"; }
  RunHostProbes missing{[] { return vm::kvm_device_usable("/nonexistent/kvm"); }, [] { return std::optional<std::uint64_t>(1024); }};
  RunHostProbes usable{[] { return vm::KvmProbe{true, "fake"}; }, [] { return std::optional<std::uint64_t>(1024); }};
  auto check = [](const RunHostProbes& p, Args a) {
    auto f = parse_run(a);
    REQUIRE(f);
    auto c = check_run_host(*f, p);
    return c ? std::string() : c.error().message;
  };
  CHECK(check(missing, {"--accel", "kvm", "true"}) ==
        "--accel kvm: KVM is missing on this host (/nonexistent/kvm: No such file or directory); --accel tcg or auto "
        "runs without it");
  CHECK(check(usable, {"--accel", "kvm", "true"}) == "");
  CHECK(check(missing, {"--accel", "kvm", "--sandbox", "true"}) == "");  // no VM, no KVM needed
  CHECK(check(missing, {"--accel", "auto", "true"}) == "");               // auto falls back to TCG
  CHECK(check(missing, {"true"}) == "");
  // /dev/null opens but is no KVM: said the same way.
  RunHostProbes not_kvm{[] { return vm::kvm_device_usable("/dev/null"); }, {}};
  CHECK(check(not_kvm, {"--accel", "kvm", "true"}).starts_with("--accel kvm: KVM is missing on this host (/dev/null: "));
  CHECK(check(usable, {"--mem", "1024", "true"}) == "");
  CHECK(check(usable, {"--mem", "1025", "true"}) == "--mem 1025: more than this host's memory (1024 MiB)");
  RunHostProbes unknown_mem{[] { return vm::KvmProbe{true, "fake"}; }, [] { return std::optional<std::uint64_t>(); }};
  CHECK(check(unknown_mem, {"--mem", "1048576", "true"}) == "");
  CHECK(check(usable, {"--kernel", file.string(), "--initrd", file.string(), "true"}) == "");
  CHECK(check(usable, {"--kernel", (tmp.path / "none").string(), "true"}) ==
        "--kernel '" + (tmp.path / "none").string() + "': No such file or directory");
  CHECK(check(usable, {"--initrd", tmp.path.string(), "true"}) == "--initrd '" + tmp.path.string() + "': not a regular file");
  // The real probes answer (whatever this host has).
  auto real = real_host_probes();
  CHECK(real.mem_mib().value_or(0) > 0);
  (void)real.kvm();
}

TEST_CASE("snapshot create takes run's own entries for the flags it has") {
  std::vector<std::string> names;
  for (const auto& e : snapshot_create_flags()) names.emplace_back(e.spec.name);
  CHECK(names == std::vector<std::string>{"state", "mem", "cpus", "accel", "grace", "ready-timeout"});
  auto f = parse_run_with(snapshot_create_flags(), {"base", "--mem", "512", "--grace=3"}, FlagOrder::anywhere);
  REQUIRE(f);
  CHECK(f->argv == std::vector<std::string>{"base"});
  CHECK(f->mem == 512);
  CHECK(f->grace == std::chrono::seconds(3));
  CHECK(parse_run_with(snapshot_create_flags(), {"--mem", "1", "base"}, FlagOrder::anywhere).error().message ==
        "--mem: expected an integer 64..1048576, got '1'");
  CHECK(parse_run_with(snapshot_create_flags(), {"--rm", "base"}, FlagOrder::anywhere).error().message ==
        "unknown flag --rm");
  CHECK(parse_run_with(snapshot_create_flags(), {"-h"}, FlagOrder::anywhere)->help);
}

TEST_CASE("exec's table: run's spellings and checks, then VM and ARGV") {
  auto p = parse_exec({"-it", "-e", "A=1", "-w", "/srv", "-u", "7", "--state", "/s", "web", "--", "sh", "-c", "x"});
  REQUIRE(p);
  CHECK(p->interactive);
  CHECK(p->tty);
  CHECK(p->exec.env == std::map<std::string, std::string>{{"A", "1"}});
  CHECK(p->exec.cwd == "/srv");
  CHECK(p->exec.uid == 7);
  CHECK(p->workdir_given);
  CHECK(p->user_given);
  CHECK(p->state == "/s");
  CHECK(p->vm == "web");
  CHECK(p->exec.argv == std::vector<std::string>{"sh", "-c", "x"});
  auto q = parse_exec({"web", "sh"});
  REQUIRE(q);
  CHECK(!q->workdir_given);
  CHECK(!q->user_given);
  CHECK(q->exec.argv == std::vector<std::string>{"sh"});
  const std::vector<std::pair<Args, std::string>> bad = {
      {{"-ix", "web", "sh"}, "unknown flag -ix"},
      {{"-e", "=v", "web", "sh"}, "--env: expected K=V or K, got '=v'"},
      {{"-w", "rel", "web", "sh"}, "--workdir: 'rel' is not an absolute path"},
      {{"-u", "me", "web", "sh"}, "--user: expected UID[:GID] (numbers), got 'me'"},
      {{"--state", "", "web", "sh"}, "--state: expected a path, got ''"},
      {{"--tty=1", "web", "sh"}, "--tty takes no value"},
      {{}, "a VM and ARGV are required"},
      {{"web"}, "ARGV is required"},
      {{"web", "--"}, "ARGV is required"},
      {{"../x", "sh"}, "VM: "},
  };
  for (const auto& [args, error] : bad) {
    CAPTURE(error);
    auto r = parse_exec(args);
    REQUIRE(!r);
    CHECK(r.error().message.starts_with(error));
  }
  CHECK(parse_exec({"--help"})->help);
  const std::string help = exec_help();
  for (const auto& e : exec_flags()) CHECK(help.find(flag_help_line(e.spec, e.value_name, e.help)) != std::string::npos);
}

TEST_CASE("stop's and kill's tables: flags anywhere, one VM, each value checked") {
  auto s = parse_stop({"web", "-t", "5", "--state", "/s"});
  REQUIRE(s);
  CHECK(s->vm == "web");
  CHECK(s->grace == std::chrono::seconds(5));
  CHECK(s->state == "/s");
  CHECK(parse_stop({"--timeout=0.5", "web"})->grace == std::chrono::milliseconds(500));
  CHECK(parse_stop({"web"})->grace == std::chrono::seconds(30));
  CHECK(parse_stop({"web", "-t", "0"})->grace == std::chrono::milliseconds(0));  // docker's: SIGKILL at once
  auto k = parse_kill({"-s", "SIGUSR1", "web"});
  REQUIRE(k);
  CHECK(k->signal == SIGUSR1);
  CHECK(parse_kill({"--signal=15", "web"})->signal == 15);
  CHECK(parse_kill({"web"})->signal == SIGKILL);
  CHECK(*parse_signal("TERM") == SIGTERM);
  CHECK(!parse_signal("65"));
  CHECK(!parse_signal("NOPE"));
  const std::vector<std::pair<std::string, std::string>> bad = {
      {parse_stop({"web", "-t", "-1"}).error().message, "--time: expected seconds > 0"},
      {parse_stop({"web", "--timeout", "x"}).error().message, "--timeout: expected seconds > 0"},
      {parse_stop({"web", "--state="}).error().message, "--state: expected a path, got ''"},
      {parse_stop({}).error().message, "exactly one VM is required"},
      {parse_stop({"a", "b"}).error().message, "exactly one VM is required"},
      {parse_stop({"../x"}).error().message, "VM: "},
      {parse_stop({"web", "--bogus"}).error().message, "unknown flag --bogus"},
      {parse_kill({"-s", "NOPE", "web"}).error().message, "--signal: expected a name (TERM, SIGUSR1, ...) or 1..64, got 'NOPE'"},
      {parse_kill({"-s", "0", "web"}).error().message, "--signal: expected a name"},
      {parse_kill({"-s"}).error().message, "--signal needs a value"},
      {parse_kill({}).error().message, "exactly one VM is required"},
  };
  for (const auto& [got, want] : bad) {
    CAPTURE(want);
    CHECK(got.starts_with(want));
  }
  CHECK(parse_stop({"-h"})->help);
  CHECK(parse_kill({"--help"})->help);
}
