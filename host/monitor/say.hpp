// One line of the monitor's (and `neshost run`'s) on stderr, never blocking for long.
#pragma once

#include <chrono>
#include <utility>

#include <fmt/format.h>

#include "host/cli/stdio.hpp"

namespace nes::monitor {

/// One line on stderr, never blocking for long (stderr is our own non-blocking description,
/// cli::make_own_nonblocking): a stderr nobody reads loses the line, it never holds up neshost.
template <class... A>
void say(fmt::format_string<A...> f, A&&... a) {
  cli::put_bounded(2, fmt::format(f, std::forward<A>(a)...), std::chrono::milliseconds(200));
}

}  // namespace nes::monitor
