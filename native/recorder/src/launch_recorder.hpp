// Observes module loads and kernel launches through CUPTI callbacks and, for
// each launch the selection admits, writes a spool entry: prologue snapshot,
// launch, epilogue snapshot, launch metadata (record_agent/README.md).
#pragma once
#include <cupti.h>

namespace mneme::rec {

void CUPTIAPI on_callback(void* userdata, CUpti_CallbackDomain domain, CUpti_CallbackId cbid, const void* cbdata);
// How the recorder switches the CUPTI launch callbacks on and off: on from the
// start under lazy module loading; under eager loading off until a loaded
// module defines a selected kernel.
void set_launch_callback_switch(void (*enable)(bool));
void write_recorder_info(const char* cupti_path);
void write_done_marker();

}  // namespace mneme::rec
