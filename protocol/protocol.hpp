// Everything of the lifecycle channel: messages, codec, framing, exit-status table.
#pragma once
#include "codec.hpp"
#include "line_reader.hpp"
#include "messages.hpp"
#include "status.hpp"
