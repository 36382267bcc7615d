// Forwarding header for one release: <nes/host/result.hpp> moved to <nes/host/lib/base.hpp> (the
// base/ vocabulary under nes::host names). Installed as <nes/host/result.hpp>.
#pragma once

#include "host/lib/base.hpp"
