// The Start gate (host/shim/gated_spawn.hpp), against real children: a released child runs its
// program with the given stdio in a session of its own and exits with its status; a child whose
// gate closes unreleased exits 125 having run nothing; a program that does not exist is
// release()'s ENOENT, not a silent 127.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "host/shim/gated_spawn.hpp"
#include "tests/support/temp_dir.hpp"

using namespace nes;
using nes::test::TempDir;

namespace {

shim::Streams streams(const std::string& out) {
  shim::Streams s;
  s.in = host::Fd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  s.out = host::Fd(::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
  s.err = host::Fd(::open("/dev/null", O_WRONLY | O_CLOEXEC));
  return s;
}

int wait_status(pid_t pid) {
  int st = 0;
  while (::waitpid(pid, &st, 0) < 0 && errno == EINTR) {}
  return st;
}

std::string slurp(const std::string& path) {
  std::string s;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  char b[256];
  for (ssize_t n; fd >= 0 && (n = ::read(fd, b, sizeof b)) > 0;) s.append(b, static_cast<std::size_t>(n));
  if (fd >= 0) ::close(fd);
  return s;
}

}  // namespace

TEST_CASE("released: the program runs with our stdout, in its own session, and exits with its status") {
  TempDir t;
  const std::string out = (t.path / "out").string();
  auto c = shim::spawn_gated("sh", {"-c", "echo sid=$(($(cut -d' ' -f6 /proc/self/stat) == $$)); exit 7"}, streams(out));
  REQUIRE(c);
  REQUIRE(shim::release(*c, "sh"));
  const int st = wait_status(c->pid);
  CHECK(WIFEXITED(st));
  CHECK(WEXITSTATUS(st) == 7);
  CHECK(slurp(out) == "sid=1\n");  // the child's shell: its session id is its own pid
}

TEST_CASE("a gate closed unreleased: the child exits 125 and its program never ran") {
  TempDir t;
  const auto marker = t.path / "ran";
  auto c = shim::spawn_gated("/bin/sh", {"-c", "echo > " + marker.string()}, streams((t.path / "out").string()));
  REQUIRE(c);
  c->gate.reset();  // as a shim killed before release() leaves it
  const int st = wait_status(c->pid);
  CHECK(WIFEXITED(st));
  CHECK(WEXITSTATUS(st) == 125);
  CHECK_FALSE(std::filesystem::exists(marker));
}

TEST_CASE("a missing program: release() says execve's ENOENT, naming it; the child exits 127") {
  TempDir t;
  auto c = shim::spawn_gated("/nonexistent/neshost", {}, streams((t.path / "out").string()));
  REQUIRE(c);
  auto r = shim::release(*c, "/nonexistent/neshost");
  REQUIRE_FALSE(r);
  CHECK(r.error().message.find("/nonexistent/neshost") != std::string::npos);
  CHECK(r.error().message.find("No such file") != std::string::npos);
  const int st = wait_status(c->pid);
  CHECK(WIFEXITED(st));
  CHECK(WEXITSTATUS(st) == 127);
}
