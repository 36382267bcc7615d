// The outcome -> exit-status table (protocol/status.hpp): POSIX shell 127/126/128+N, timeout(1)
// 124, docker/podman 125 for host-side failures; and docs/protocol.md's table agrees with it.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include "support.hpp"

#include <cstdlib>
#include <fstream>
#include <sstream>

using namespace nes::proto;
using namespace nes::proto::test;

namespace {
constexpr Outcome kAll[] = {Outcome::exited,         Outcome::signalled, Outcome::start_failed,
                            Outcome::mount_failed,   Outcome::channel_lost, Outcome::protocol_error,
                            Outcome::no_ready,       Outcome::version_mismatch, Outcome::timeout,
                            Outcome::stopped};
}

TEST_CASE("the constants are the conventions they name") {
  CHECK(kStatusTimeout == 124);
  CHECK(kStatusHostFailure == 125);
  CHECK(kStatusNotExecutable == 126);
  CHECK(kStatusNotFound == 127);
  CHECK(kStatusSignalBase == 128);
}

TEST_CASE("guest reports -> exit status") {
  for (int c : {0, 1, 3, 124, 125, 126, 127, 128, 255}) {
    CHECK(exit_status(WorkloadExited::code(static_cast<std::uint8_t>(c))) == c);
    CHECK(exit_status(Outcome::exited, static_cast<std::uint8_t>(c)) == c);
  }
  for (int s : {1, 2, 9, 15, 31, 64}) {
    CAPTURE(s);
    CHECK(exit_status(WorkloadExited::killed(static_cast<std::uint8_t>(s))) == 128 + s);
    CHECK(exit_status(Outcome::signalled, std::nullopt, static_cast<std::uint8_t>(s)) == 128 + s);
  }
  CHECK(exit_status(WorkloadExited::killed(9)) == 137);   // SIGKILL, as docker reports it
  CHECK(exit_status(WorkloadExited::killed(15)) == 143);  // SIGTERM
  CHECK(exit_status(StartFailed{"", 2, StartFailClass::not_found}) == 127);
  CHECK(exit_status(StartFailed{"", 13, StartFailClass::not_executable}) == 126);
  CHECK(exit_status(StartFailed{"", 1, StartFailClass::other}) == 126);
  CHECK(exit_status(Outcome::start_failed, {}, {}, StartFailClass::not_found) == 127);
  CHECK(exit_status(Outcome::start_failed, {}, {}, StartFailClass::not_executable) == 126);
  CHECK(exit_status(Outcome::start_failed, {}, {}, StartFailClass::other) == 126);
  CHECK(exit_status(MountFailed{"t", "r", 19}) == 125);
}

TEST_CASE("host-side outcomes -> exit status") {
  CHECK(exit_status(Outcome::timeout) == 124);
  CHECK(exit_status(Outcome::stopped) == 143);  // 128+SIGTERM, as docker reports `docker stop`
  for (Outcome o : {Outcome::mount_failed, Outcome::channel_lost, Outcome::protocol_error,
                    Outcome::no_ready, Outcome::version_mismatch}) {
    CAPTURE(to_string(o));
    CHECK(exit_status(o) == 125);
  }
}

TEST_CASE("names: outcomes round-trip; enum names are the wire's") {
  for (Outcome o : kAll) {
    CAPTURE(to_string(o));
    CHECK(outcome_from_string(to_string(o)) == o);
  }
  CHECK(!outcome_from_string("Exited").has_value());
  CHECK(!outcome_from_string("").has_value());
  // The wire spelling comes from to_string: the codec uses the same function both ways.
  CHECK(to_string(FsType::ninep) == "9p");
  CHECK(to_string(Halt::poweroff) == "poweroff");
  CHECK(to_string(StartFailClass::not_executable) == "not_executable");
  Boot b = reference_boot();
  b.mounts[0].fs = FsType::ninep;
  CHECK(encode(HostMessage{b}).find(R"("fs":"9p")") != std::string::npos);
}

TEST_CASE("docs/protocol.md's outcome table states what status.hpp computes") {
  const char* root = std::getenv("NES_SOURCE_ROOT");
  REQUIRE_MESSAGE(root, "NES_SOURCE_ROOT is set by meson test");
  std::ifstream f(std::string(root) + "/docs/protocol.md");
  REQUIRE(f.good());
  // Rows: | `outcome` [(`class`)] | from | status | convention |
  std::string line;
  std::size_t rows = 0;
  std::vector<std::string> seen;
  bool in_section = false;  // the table under "## Outcome → exit status"
  auto cells_of = [](const std::string& l) {
    std::vector<std::string> cells;
    std::size_t a = 1;
    for (std::size_t b; (b = l.find('|', a)) != std::string::npos; a = b + 1) {
      std::string c = l.substr(a, b - a);
      c.erase(0, c.find_first_not_of(' '));
      c.erase(c.find_last_not_of(' ') + 1);
      cells.push_back(c);
    }
    return cells;
  };
  auto unquote = [](std::string c) { return c.size() > 2 && c.front() == '`' ? c.substr(1, c.find('`', 1) - 1) : c; };
  while (std::getline(f, line)) {
    if (starts_with(line, "## ")) in_section = starts_with(line, "## Outcome");
    if (!in_section || !starts_with(line, "| `")) continue;
    CAPTURE(line);
    const std::vector<std::string> cells = cells_of(line);
    REQUIRE(cells.size() == 4);
    const std::string name = unquote(cells[0]);
    auto o = outcome_from_string(name);
    REQUIRE(o.has_value());
    seen.push_back(name);
    std::optional<StartFailClass> cls;
    if (auto paren = cells[0].find("(`"); paren != std::string::npos) {
      const std::string c = unquote(cells[0].substr(paren + 1));
      for (auto k : {StartFailClass::not_found, StartFailClass::not_executable, StartFailClass::other})
        if (to_string(k) == c) cls = k;
      REQUIRE(cls.has_value());
    }
    const std::string& status = cells[2];
    if (*o == Outcome::exited) {
      CHECK(status == "the code, 0..255");
    } else if (*o == Outcome::signalled) {
      CHECK(status == "128+N");
    } else {
      CHECK(status == std::to_string(exit_status(*o, std::nullopt, std::nullopt, cls)));
    }
    ++rows;
  }
  for (Outcome o : kAll) CHECK_MESSAGE(std::find(seen.begin(), seen.end(), to_string(o)) != seen.end(), to_string(o));
  CHECK(rows >= std::size(kAll));
}
