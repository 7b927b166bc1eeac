#include "libs/rpc/signals.h"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <csignal>

namespace shoal::rpc {
namespace {

sigset_t ShutdownSet() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGUSR2);  // RequestShutdown
  return set;
}

}  // namespace

void BlockShutdownSignals() {
  sigset_t set = ShutdownSet();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);
}

int WaitForShutdownSignal() {
  sigset_t set = ShutdownSet();
  int sig = 0;
  sigwait(&set, &sig);
  return sig == SIGUSR2 ? 0 : sig;
}

void RequestShutdown() { kill(getpid(), SIGUSR2); }

}  // namespace shoal::rpc
