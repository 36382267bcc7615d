// The CLI's flag parser (host/cli/flags.hpp) alone: both orders, short forms, switch clusters,
// values inline and apart, and each error naming its flag.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cstdlib>

#include "host/cli/flags.hpp"

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
