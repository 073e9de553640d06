/*
 * pause: the sandbox ("infra") process of torpor's test pods, as small as
 * the pause of real clusters (a static C program): it sleeps until a
 * signal, reaps every zombie re-parented to it (it is PID 1 of the pod),
 * and exits 0 on SIGTERM or SIGINT. Built static by test/images/build.sh.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

static volatile sig_atomic_t stop;

static void on_stop(int sig) { (void)sig; stop = 1; }

/* Collects every exited child without blocking (in the handler: waitpid is
 * async-signal-safe, and errno is kept for the interrupted code). */
static void on_child(int sig) {
	int saved = errno;
	(void)sig;
	while (waitpid(-1, NULL, WNOHANG) > 0)
		;
	errno = saved;
}

static int handle(int sig, void (*fn)(int)) {
	struct sigaction sa = {0};
	sa.sa_handler = fn;
	sa.sa_flags = SA_RESTART | (sig == SIGCHLD ? SA_NOCLDSTOP : 0);
	sigemptyset(&sa.sa_mask);
	return sigaction(sig, &sa, NULL);
}

int main(void) {
	if (handle(SIGTERM, on_stop) || handle(SIGINT, on_stop) || handle(SIGCHLD, on_child)) {
		perror("pause: sigaction");
		return 1;
	}
	while (!stop)
		pause();
	return 0;
}
