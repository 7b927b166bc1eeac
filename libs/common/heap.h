#pragma once

namespace shoal {

// Gives the heap's free memory back to the system (glibc's malloc_trim): for a process done with
// a large piece of work, e.g. a peer between the steps of a round, whose heap would otherwise
// keep up to rpc::TuneAllocatorForModelStreams()'s trim threshold.
void ReturnFreeMemory();

}  // namespace shoal
