#pragma once

namespace shoal::rpc {

// Blocks SIGTERM and SIGINT in the calling thread and every thread it starts afterwards. Call it
// first thing in main(), before any thread exists.
void BlockShutdownSignals();

// Waits until SIGTERM or SIGINT arrives (or RequestShutdown() is called); returns the signal
// number (0 for RequestShutdown).
int WaitForShutdownSignal();

// Wakes WaitForShutdownSignal() from inside the process (e.g. when a fatal error ends the run).
void RequestShutdown();

}  // namespace shoal::rpc
