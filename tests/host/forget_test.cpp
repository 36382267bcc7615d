// Host::forget_vm: a long-lived embedder drops finished VMs, so its memory does not grow with
// every VM it ever ran; a live session cannot be forgotten; the record stays answerable from disk.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include "support.hpp"

using namespace nes;
using namespace nes::host;
using namespace nes::test;

TEST_CASE("forget_vm: refused while live, then the VM is gone from the Host, its record is not") {
  Harness h;
  auto path = h.add(h.config("f"));
  auto g = h.guest(path, {step::Send{ready_line()}, step::Expect{"boot"}, step::Send{exited_line(5)},
                          step::Expect{"shutdown"}, step::Close{}});
  REQUIRE(h.run_until([&] { return g->done; }));
  CHECK_FALSE(h.host->forget_vm("f"));  // still waiting for vm_exited
  REQUIRE(h.host->vm_exited("f"));
  REQUIRE(h.run_until([&] { return h.finished("f"); }));
  REQUIRE(h.host->forget_vm("f"));
  CHECK(h.host->session("f") == nullptr);
  CHECK_FALSE(h.host->forget_vm("f"));  // not registered any more
  CHECK(h.host->live_sessions() == 0);
  std::optional<WaitResult> r;
  h.host->async_wait("f", [&](WaitResult w) { r = std::move(w); });
  REQUIRE(h.run_until([&] { return r.has_value(); }));
  REQUIRE(*r);
  CHECK((*r)->exit_status == 5);
  // The id can be registered again (a new run), generation free to start over.
  CHECK(h.host->add_vm(h.config("f")));
}

TEST_CASE("forget_vm: many VMs run and forgotten leave nothing registered") {
  Harness h;
  for (int i = 0; i < 50; ++i) {
    std::string id = "m" + std::to_string(i);
    auto path = h.add(h.config(id));
    auto g = h.guest(path, {step::Send{ready_line()}, step::Expect{"boot"}, step::Send{exited_line(0)},
                            step::Expect{"shutdown"}, step::Close{}});
    REQUIRE(h.run_until([&] { return g->done; }));
    REQUIRE(h.host->vm_exited(id));
    REQUIRE(h.run_until([&] { return h.finished(id); }));
    REQUIRE(h.host->forget_vm(id));
  }
  for (int i = 0; i < 50; ++i) CHECK(h.host->session("m" + std::to_string(i)) == nullptr);
}
