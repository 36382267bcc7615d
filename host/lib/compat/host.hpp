// Forwarding header for one release: <nes/host/host.hpp> moved to <nes/host/lib/host.hpp>.
#pragma once

#include "host/lib/host.hpp"
