// `run IMAGE`'s resolution (host/image/run_image.hpp): docker's rules for Entrypoint/Cmd, Env,
// WorkingDir, User (names in the image's /etc/passwd and /etc/group), each error named.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include "host/image/run_image.hpp"

using namespace nes::image;
using V = std::vector<std::string>;

namespace {
const char* kPasswd = "root:x:0:0:root:/root:/bin/sh\n# comment\napp:x:1000:1001::/home/app:/bin/sh\nbroken:x:y\nnobody:x:65534:65534::/:/bin/false\n";
const char* kGroup = "root:x:0:\nstaff:x:50:app,other\napp:x:1001:\nwheel:x:10:root,app\nnogroup:x:65534:\n";

ImageConfig image(V ep, V cmd) {
  ImageConfig c;
  c.entrypoint = ep;
  c.has_entrypoint = !ep.empty();
  c.cmd = cmd;
  c.has_cmd = !cmd.empty();
  c.env = {"PATH=/usr/bin:/bin", "A=1", "EMPTY="};
  c.working_dir = "/srv";
  c.user = "app";
  return c;
}
}  // namespace

TEST_CASE("Entrypoint and Cmd by docker's rules") {
  struct Case { V ep, cmd; std::optional<std::string> entry; V args; V want; };
  const Case cases[] = {
      {{"/bin/sh", "-c"}, {"echo hi"}, {}, {}, {"/bin/sh", "-c", "echo hi"}},           // both
      {{"/bin/sh", "-c"}, {"echo hi"}, {}, {"id"}, {"/bin/sh", "-c", "id"}},            // args replace Cmd
      {{}, {"/bin/sh"}, {}, {"ls", "-l"}, {"ls", "-l"}},                                 // Cmd only
      {{"/bin/sh", "-c"}, {"echo hi"}, std::string("/bin/env"), {}, {"/bin/env"}},      // --entrypoint drops Cmd
      {{"/bin/sh", "-c"}, {"echo hi"}, std::string("/bin/echo"), {"x"}, {"/bin/echo", "x"}},
      {{"/bin/sh"}, {}, std::string(""), {"true"}, {"true"}},                            // --entrypoint "" clears it
  };
  for (const auto& c : cases) {
    RunOverrides o;
    o.entrypoint = c.entry;
    o.args = c.args;
    auto r = resolve_run(image(c.ep, c.cmd), o, kPasswd, kGroup);
    REQUIRE(r.ok());
    CHECK(r->argv == c.want);
  }
  RunOverrides none;
  auto empty = resolve_run(image({}, {}), none, kPasswd, kGroup);
  REQUIRE(!empty.ok());
  CHECK(empty.error().message.find("no command specified") == 0);
}

TEST_CASE("Env under -e, WorkingDir under -w") {
  RunOverrides o;
  o.env = {{"A", "2"}, {"B", "3"}};
  auto r = resolve_run(image({}, {"x"}), o, kPasswd, kGroup);
  REQUIRE(r.ok());
  CHECK(r->env.at("PATH") == "/usr/bin:/bin");
  CHECK(r->env.at("A") == "2");
  CHECK(r->env.at("B") == "3");
  CHECK(r->env.at("EMPTY") == "");
  CHECK(r->workdir == "/srv");
  o.workdir = "/tmp";
  CHECK(resolve_run(image({}, {"x"}), o, kPasswd, kGroup)->workdir == "/tmp");
  ImageConfig rel = image({}, {"x"});
  rel.working_dir = "app";
  CHECK(resolve_run(rel, {}, kPasswd, kGroup)->workdir == "/app");
  rel.working_dir = "";
  CHECK(resolve_run(rel, {}, kPasswd, kGroup)->workdir == "/");
  rel.env = {"=bad"};
  CHECK(resolve_run(rel, {}, kPasswd, kGroup).error().message.find("has no name") != std::string::npos);
}

TEST_CASE("User: names in the image's passwd and group, numbers as docker takes them") {
  struct Case { std::string user; std::uint32_t uid, gid; std::vector<std::uint32_t> groups; };
  const Case cases[] = {
      {"", 0, 0, {}},
      {"root", 0, 0, {10}},
      {"app", 1000, 1001, {10, 50}},
      {"1000", 1000, 1001, {10, 50}},     // a number in passwd: its entry
      {"4242", 4242, 0, {}},              // a number not there: gid 0
      {"app:staff", 1000, 50, {10, 50}},
      {"app:77", 1000, 77, {10, 50}},
      {"4242:nogroup", 4242, 65534, {}},
      {"nobody", 65534, 65534, {}},
  };
  for (const auto& c : cases) {
    CAPTURE(c.user);
    auto r = resolve_user(c.user, kPasswd, kGroup);
    REQUIRE(r.ok());
    CHECK(r->uid == c.uid);
    CHECK(r->gid == c.gid);
    CHECK(r->groups == c.groups);
  }
  CHECK(resolve_user("ghost", kPasswd, kGroup).error().message == "unable to find user ghost: no matching entries in passwd file");
  CHECK(resolve_user("app:ghosts", kPasswd, kGroup).error().message == "unable to find group ghosts: no matching entries in group file");
  CHECK(resolve_user("app", "", "").error().message.find("unable to find user app") == 0);
  CHECK(resolve_user("0", "", "")->uid == 0);
  RunOverrides o;
  o.user = "ghost";
  CHECK(resolve_run(image({}, {"x"}), o, kPasswd, kGroup).error().message.find("--user: unable to find user ghost") == 0);
  CHECK(resolve_run(image({}, {"x"}), {}, "", "").error().message.find("the image's User: unable to find user app") == 0);
}
