/* SPDX-License-Identifier: MIT */
/*
 * kvbench helpers: clocks, argument parsing, percentiles, and the broker
 * process kvbench starts for itself (private socket, stats over the control
 * socket, its CPU time from /proc).
 */
#include "kvbench.h"

#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ctl.h"
#include "kvbroker/kvbroker.h"

int64_t kvb_bench_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t) ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static uint64_t clock_ns(clockid_t id)
{
	struct timespec ts;

	clock_gettime(id, &ts);
	return (uint64_t) ts.tv_sec * 1000000000ull + (uint64_t) ts.tv_nsec;
}

uint64_t kvb_bench_proc_cpu_ns(void)
{
	return clock_ns(CLOCK_PROCESS_CPUTIME_ID);
}

double kvb_bench_pid_cpu_s(pid_t pid)
{
	char path[64], buf[1024], *p;
	unsigned long long ut, st;
	FILE *f;
	size_t n;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int) pid);
	f = fopen(path, "r");
	if (!f)
		return -1;
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	/* comm may hold spaces: fields restart after the last ')' */
	p = strrchr(buf, ')');
	if (!p)
		return -1;
	/* after ')': state(3) ... utime is field 14, stime 15 */
	if (sscanf(p + 2,
		   "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut,
		   &st) != 2)
		return -1;
	return (double) (ut + st) / (double) sysconf(_SC_CLK_TCK);
}

int kvb_bench_parse_u64(const char *opt, const char *arg, uint64_t min,
			uint64_t max, uint64_t *out)
{
	unsigned long long v;
	char *end = NULL;

	errno = 0;
	if (!arg || !*arg || *arg == '-')
		goto bad;
	v = strtoull(arg, &end, 0);
	if (errno || end == arg)
		goto bad;
	switch (*end) {
	case 'k':
	case 'K':
		v = v > ULLONG_MAX >> 10 ? ULLONG_MAX : v << 10;
		end++;
		break;
	case 'm':
	case 'M':
		v = v > ULLONG_MAX >> 20 ? ULLONG_MAX : v << 20;
		end++;
		break;
	case 'g':
	case 'G':
		v = v > ULLONG_MAX >> 30 ? ULLONG_MAX : v << 30;
		end++;
		break;
	default:
		break;
	}
	if (*end || v < min || v > max)
		goto bad;
	*out = v;
	return 0;
bad:
	fprintf(stderr,
		"kvbench: %s: '%s' is not a whole number in [%llu, %llu] "
		"(K/M/G suffixes allowed)\n",
		opt, arg ? arg : "", (unsigned long long) min,
		(unsigned long long) max);
	return -1;
}

void kvb_bench_unknown_option(char *const *argv, const struct option *lo,
			      const char *sub)
{
	const char *arg = argv[optind - 1], *eq = strchr(arg, '=');
	int len = eq ? (int) (eq - arg) : (int) strlen(arg);
	unsigned matches = 0;

	if (optopt > 0 && optopt < 256) {
		/* a short option, perhaps inside a cluster (-xy): optind
		 * may still be on it, argv[optind - 1] is then another */
		fprintf(stderr,
			"kvbench: unknown option '-%c' (see kvbench %s "
			"--help)\n",
			optopt, sub);
		return;
	}
	if (optopt) { /* a known long option that takes no value */
		fprintf(stderr, "kvbench: %.*s takes no value\n", len, arg);
		return;
	}
	if (len > 2 && !strncmp(arg, "--", 2))
		for (unsigned i = 0; lo[i].name; i++)
			matches +=
				!strncmp(lo[i].name, arg + 2, (size_t) len - 2);
	fprintf(stderr, "kvbench: %s option '%.*s' (see kvbench %s --help)\n",
		matches > 1 ? "ambiguous" : "unknown", len, arg, sub);
}

int kvb_bench_parse_double(const char *opt, const char *arg, double min,
			   double max, double *out)
{
	char *end = NULL;
	double v;

	errno = 0;
	v = arg ? strtod(arg, &end) : 0;
	if (!arg || errno || end == arg || *end || !(v >= min && v <= max)) {
		fprintf(stderr,
			"kvbench: %s: '%s' is not a number in [%g, %g]\n", opt,
			arg ? arg : "", min, max);
		return -1;
	}
	*out = v;
	return 0;
}

int kvb_bench_check_transport(const char *arg, int tcp_ok)
{
	if (!strcmp(arg, "local"))
		return KVB_BENCH_TR_LOCAL;
	if (!strcmp(arg, "tcp")) {
#ifdef KVB_HAVE_TCP
		if (tcp_ok)
			return KVB_BENCH_TR_TCP;
		fprintf(stderr, "kvbench: --transport tcp: only `kvbench "
				"workload` measures tcp\n");
#else
		fprintf(stderr, "kvbench: --transport tcp: this kvbench was "
				"built without the tcp transport "
				"(bridge/tcp)\n");
#endif
		return -1;
	}
	if (!strcmp(arg, "rdma")) {
#if defined(KVB_HAVE_RDMA) && defined(KVB_HAVE_TCP)
		if (tcp_ok)
			return KVB_BENCH_TR_RDMA;
		fprintf(stderr, "kvbench: --transport rdma: only `kvbench "
				"workload` measures rdma\n");
#else
		fprintf(stderr, "kvbench: --transport rdma: this kvbench was "
				"built without the rdma transport "
				"(libibverbs)\n");
#endif
		return -1;
	}
	if (!strcmp(arg, "gpu")) {
#ifdef KVB_HAVE_GPU
		if (tcp_ok)
			return KVB_BENCH_TR_GPU;
		fprintf(stderr, "kvbench: --transport gpu: only `kvbench "
				"workload` measures gpu\n");
#else
		fprintf(stderr, "kvbench: --transport gpu: this kvbench was "
				"built without the gpu transport "
				"(bridge/gpu)\n");
#endif
		return -1;
	}
	fprintf(stderr,
		"kvbench: --transport: '%s' is not one of local, tcp, rdma, "
		"gpu\n",
		arg);
	return -1;
}

void *kvb_bench_shared(size_t len)
{
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE,
		       MAP_SHARED | MAP_ANONYMOUS, -1, 0);

	return p == MAP_FAILED ? NULL : p;
}

int kvb_bench_progress_wanted(int forced)
{
	return forced || isatty(STDERR_FILENO);
}

/* The broker binary: --broker, $KVBROKER, kvbroker next to this
 * executable (installed: both in <prefix>/bin), or ../../broker/kvbroker
 * from it (bench/kvbench/kvbench in the build tree). */
static int find_broker(const char *given, char *out, size_t cap)
{
	const char *env = getenv("KVBROKER");
	char self[PATH_MAX - 32];
	ssize_t n;
	char *slash;

	if (given || (env && *env)) {
		snprintf(out, cap, "%s", given ? given : env);
	} else {
		n = readlink("/proc/self/exe", self, sizeof(self) - 1);
		if (n <= 0)
			return -1;
		self[n] = '\0';
		slash = strrchr(self, '/');
		if (slash)
			*slash = '\0';
		snprintf(out, cap, "%s/kvbroker", self);
		if (access(out, X_OK))
			snprintf(out, cap, "%s/../../broker/kvbroker", self);
	}
	if (access(out, X_OK)) {
		fprintf(stderr,
			"kvbench: broker '%s' is not executable: %s (use "
			"--broker PATH or $KVBROKER)\n",
			out, strerror(errno));
		return -1;
	}
	return 0;
}

int kvb_bench_broker_start(struct bench_broker *b, const char *path,
			   const char *extra, const char *more)
{
	char bin[PATH_MAX + 32], args[1024], *argv[64], *save = NULL, *tok;
	int64_t deadline;
	int argc = 0, fd, status;

	if (find_broker(path, bin, sizeof(bin)))
		return -1;
	snprintf(b->sock, sizeof(b->sock), "/tmp/kvbench-%d-%lld.sock",
		 (int) getpid(), (long long) (kvb_bench_now_ns() % 1000000000));
	kvb_bench_cleanup_path(b->sock, 1);
	snprintf(args, sizeof(args), "%s %s", extra ? extra : "",
		 more ? more : "");
	argv[argc++] = bin;
	argv[argc++] = "--socket";
	argv[argc++] = b->sock;
	argv[argc++] = "--transport";
	argv[argc++] = (char *) (b->transport ? b->transport : "local");
	argv[argc++] = "--log-level";
	argv[argc++] = "warn";
	for (tok = strtok_r(args, " ", &save); tok && argc < 62;
	     tok = strtok_r(NULL, " ", &save))
		argv[argc++] = tok;
	argv[argc] = NULL;
	b->pid = fork();
	if (b->pid < 0) {
		perror("kvbench: fork");
		return -1;
	}
	if (b->pid == 0) {
		/* dies with kvbench, even if kvbench is killed */
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (b->netns && kvb_bench_enter_netns(b->netns))
			_exit(127);
		execv(bin, argv);
		fprintf(stderr, "kvbench: exec %s: %s\n", bin, strerror(errno));
		_exit(127);
	}
	deadline = kvb_bench_now_ns() + 30000000000ll; /* a loaded machine */
	while (kvb_bench_now_ns() < deadline) {
		if (waitpid(b->pid, &status, WNOHANG) == b->pid) {
			fprintf(stderr,
				"kvbench: broker %s exited at start (status "
				"%d)\n",
				bin,
				WIFEXITED(status) ? WEXITSTATUS(status) : -1);
			b->pid = 0;
			return -1;
		}
		fd = kvb_ctl_connect(b->sock, 100);
		if (fd >= 0) {
			close(fd);
			return 0;
		}
		usleep(10000);
	}
	fprintf(stderr, "kvbench: broker did not answer on %s within 30 s\n",
		b->sock);
	kvb_bench_broker_stop(b);
	return -1;
}

void kvb_bench_broker_stop(struct bench_broker *b)
{
	int64_t deadline =
		kvb_bench_now_ns() + 30000000000ll; /* a loaded machine */
	int status;

	if (b->pid <= 0) {
		if (b->sock[0]) /* it never started: forget its socket */
			kvb_bench_cleanup_path(b->sock, 0);
		return;
	}
	kill(b->pid, SIGTERM);
	kill(b->pid, SIGCONT); /* a stopped broker: let it take the SIGTERM */
	while (waitpid(b->pid, &status, WNOHANG) == 0) {
		if (kvb_bench_now_ns() > deadline) {
			fprintf(stderr, "kvbench: broker ignored SIGTERM, "
					"killing it\n");
			kill(b->pid, SIGKILL);
			waitpid(b->pid, &status, 0);
			break;
		}
		usleep(5000);
	}
	unlink(b->sock);
	kvb_bench_cleanup_path(b->sock, 0);
	b->pid = 0;
}

int kvb_bench_broker_stats(const struct bench_broker *b, char *buf, size_t cap)
{
	int n = kvb_ctl_stats(b->sock, 1, buf, cap, 3000);

	return n < 0 ? n : 0;
}

double kvb_bench_json_num(const char *js, const char *key)
{
	char pat[64];
	const char *p;

	snprintf(pat, sizeof(pat), "\"%s\":", key);
	p = strstr(js, pat);
	return p ? strtod(p + strlen(pat), NULL) : -1;
}
