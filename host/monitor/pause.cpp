#include "host/monitor/pause.hpp"

#include <chrono>
#include <cstdio>

#include <fmt/format.h>

#include "host/monitor/reconcile.hpp"

namespace nes::monitor {

namespace {
constexpr std::chrono::milliseconds kQmpBound{2000};  // QEMU answers stop/cont from its main loop at once
}

VmPause::VmPause(std::filesystem::path qmp_socket, std::filesystem::path state_dir, std::string vm,
                 std::uint64_t generation, bool paused)
    : qmp_socket_(std::move(qmp_socket)),
      state_dir_(std::move(state_dir)),
      vm_(std::move(vm)),
      generation_(generation),
      paused_(paused) {}

host::Status VmPause::connect() {
  if (qmp_) return host::Ok{};
  if (qmp_socket_.empty()) return host::Error{"no VMM to pause: --sandbox runs the init on this host"};
  auto q = vm::Qmp::connect(qmp_socket_, std::chrono::milliseconds(0));
  if (!q) return q.error();
  qmp_ = std::move(*q);
  return host::Ok{};
}

host::Status VmPause::pause() {
  if (paused_) return host::Ok{};
  if (auto c = connect(); !c) return c;
  // The marker first: a monitor killed between the two leaves a marker over a running VM (its
  // replacement resumes it: harmless), never a paused VM no reader knows of.
  if (auto m = host::mark_paused(state_dir_, vm_, generation_); !m) return m.error();
  if (auto r = qmp_->execute("stop", "", kQmpBound); !r) {
    qmp_.reset();  // a broken connection is not reused: the next request connects again
    // QEMU may have stopped the VM all the same (a reply lost, late): run it again on a fresh
    // connection before the marker goes; if even that fails, the marker stays and so does
    // paused_ (a later resume retries): never a paused VM the record does not show.
    if (auto c = connect(); c && qmp_->execute("cont", "", kQmpBound)) {
      (void)host::clear_paused(state_dir_, vm_);
    } else {
      qmp_.reset();
      paused_ = true;
    }
    return r.error();
  }
  paused_ = true;
  return host::Ok{};
}

host::Status VmPause::resume() {
  if (!paused_) return host::Ok{};
  if (auto c = connect(); !c) return c;
  // `cont` first, the marker after: in between, a marker over a running VM (as above).
  if (auto r = qmp_->execute("cont", "", kQmpBound); !r) {
    qmp_.reset();
    return r.error();
  }
  paused_ = false;
  // The VM runs: a marker that cannot be removed is said, not a failed resume (a stale marker
  // of this generation is removed again by ended()).
  if (auto m = host::clear_paused(state_dir_, vm_); !m)
    std::fprintf(stderr, "neshost monitor: VM %s: %s (the record says paused while it runs)\n", vm_.c_str(),
                 m.error().message.c_str());
  return host::Ok{};
}

void VmPause::ended() {
  if (paused_ || host::paused_generation(state_dir_, vm_) == generation_) (void)host::clear_paused(state_dir_, vm_);
  paused_ = false;
}

}  // namespace nes::monitor
