// queen_locks: distributed locks and semaphores with fencing tokens, from
// the queen-locks operator's route. See clients/cpp/README.md.
#pragma once

#include "queen_locks/client.hpp"
#include "queen_locks/errors.hpp"
#include "queen_locks/handle.hpp"
