// Forwarding header for one release: <nes/host/testing.hpp> moved to <nes/host/lib/testing.hpp>.
#pragma once

#include "host/lib/testing.hpp"
