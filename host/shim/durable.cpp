#include "host/shim/durable.hpp"

#include <cstring>
#include <string>

#include <fmt/format.h>

#include "host/lib/state_dir.hpp"
#include "host/shim/fault_point.hpp"

namespace nes::shim {

host::Status write_durable_at(std::string_view point, const std::filesystem::path& dir, std::string_view name,
                              std::string_view bytes) {
  if (int e = fault_errno(point))
    return host::Error{fmt::format("write {}: {} (errno {})", (dir / std::string(name)).string(), std::strerror(e), e)};
  return host::write_durable(dir, name, bytes);
}

}  // namespace nes::shim
