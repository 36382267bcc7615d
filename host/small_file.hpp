// Forwarding header: the bounded small-file reader (read_small_file, SmallFileOptions, Longer)
// lives in base/small_file.hpp, namespace nes::base, shared by the init and the host. These
// aliases keep nes::host::read_small_file & co. working for host/ code; new code includes
// "base/small_file.hpp" and writes base::.
#pragma once

#include "base/small_file.hpp"
#include "host/fd.hpp"
#include "host/result.hpp"

namespace nes::host {

using ::nes::base::Longer;
using ::nes::base::read_small_file;
using ::nes::base::SmallFileOptions;

}  // namespace nes::host
