#include "host/monitor/duties.hpp"

namespace nes::monitor {

namespace fs = std::filesystem;

host::Status record_started(const fs::path& state, host::VmmInfo& v, host::WallTime started_at,
                            std::optional<std::chrono::milliseconds> timeout) {
  host::VmmInfo next = v;
  next.started_at = started_at;
  if (timeout) {
    next.wall_timeout = *timeout;
    next.wall_deadline_ns = host::boottime_ns() + std::chrono::nanoseconds(*timeout).count();
  }
  if (auto s = host::write_vmm(state, next); !s) return s;
  v = std::move(next);
  return host::Ok{};
}

host::Status record_wall_deadline(const fs::path& state, host::VmmInfo& v) {
  if (!v.wall_timeout) return host::Ok{};
  host::VmmInfo next = v;
  next.wall_deadline_ns = host::boottime_ns() + std::chrono::nanoseconds(*v.wall_timeout).count();
  if (auto s = host::write_vmm(state, next); !s) return s;
  v = std::move(next);
  return host::Ok{};
}

void take_over_duties(const host::VmmInfo& v, host::SessionConfig& sc, std::int64_t now_boottime_ns) {
  sc.started_at = v.started_at;
  if (v.wall_timeout) {
    sc.wall_timeout = *v.wall_timeout;
    sc.wall_from_started = true;  // a `started` the guest sends only now arms it again, as before
    if (v.wall_deadline_ns)
      sc.wall_left = std::chrono::duration_cast<std::chrono::milliseconds>(
          std::chrono::nanoseconds(*v.wall_deadline_ns - now_boottime_ns));
  }
}

}  // namespace nes::monitor
