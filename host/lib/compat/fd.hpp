// Forwarding header for one release: <nes/host/fd.hpp> moved to <nes/host/lib/base.hpp> (the
// base/ vocabulary under nes::host names). Installed as <nes/host/fd.hpp>.
#pragma once

#include "host/lib/base.hpp"
