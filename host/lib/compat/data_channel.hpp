// Forwarding header for one release: <nes/host/data_channel.hpp> moved to <nes/host/lib/data_channel.hpp>.
#pragma once

#include "host/lib/data_channel.hpp"
