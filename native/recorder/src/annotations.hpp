// Verification policies the application declared with mneme/annotate.h,
// keyed by the base of the allocation they were declared on.
#pragma once
#include <cstdint>
#include <string>

namespace mneme::rec {

// JSON object of the policy attached to the allocation at `base`, or "" if none.
std::string policy_json(uint64_t base);

}  // namespace mneme::rec
