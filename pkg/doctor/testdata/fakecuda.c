/*
 * A stand-in for the CUDA driver library (libcuda.so.1) on simulated
 * nodes, built by the doctor's tests and the real-node tests. Like the
 * real one it sees the GPUs whose device nodes the process has: in the
 * doctor's sandbox every /dev/nvidia<N> is a file holding the GPU's UUID;
 * in a real container it is a character device, whose UUID the library
 * knows by minor as the driver does (FAKE_GPUS, "minor=uuid,...", given
 * when it is built). It needs /dev/nvidiactl, orders the GPUs by minor
 * number and honours CUDA_VISIBLE_DEVICES (indices or UUIDs, up to the
 * first entry that names no device), so a probe over it fails for the
 * reasons a container over the real one would. It needs what the real
 * one needs of a container: libm (link it with -lm, after the source, so
 * that it is NEEDED however the linker is set), and for cuInit a procfs
 * (/proc/self/maps), a sysfs and /dev/null, without which cuInit fails
 * with CUDA_ERROR_OPERATING_SYSTEM (304). Built with -DFAKE_CUINIT_HANGS
 * it stands for a wedged GPU: cuInit forks (as a driver's helper would)
 * and neither process ever returns.
 *
 * Like the real one it is an MPS client where an MPS daemon answers in
 * CUDA_MPS_PIPE_DIRECTORY (default /tmp/nvidia-mps): cuInit joins the
 * simulated daemon (package mpssim) on its control socket with the
 * process's CUDA_MPS_ACTIVE_THREAD_PERCENTAGE and
 * CUDA_MPS_PINNED_DEVICE_MEM_LIMIT, and the daemon gives it the lower of
 * its own limits and those. cuMemAlloc then refuses (out of memory) what
 * would take a device past its pinned-memory limit, and cuMemGetInfo
 * counts free memory against it, as the reference H200 showed ("8 GiB
 * refused: 3.86 GiB free" under a 4096M limit). Without a daemon there
 * it is no MPS client, and the variables bound nothing, as with the real
 * driver. Every device refuses what exceeds its memory.
 */
#include <ctype.h>
#include <dirent.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#ifndef FAKE_GPUS
#define FAKE_GPUS ""
#endif
#ifndef FAKE_DRIVER_API
#define FAKE_DRIVER_API 13000
#endif

#define CUDA_SUCCESS 0
#define CUDA_ERROR_OUT_OF_MEMORY 2
#define CUDA_ERROR_INVALID_CONTEXT 201
#define CUDA_ERROR_MPS_CONNECTION_FAILED 805
#define CUDA_ERROR_NOT_INITIALIZED 3
#define CUDA_ERROR_NO_DEVICE 100
#define CUDA_ERROR_INVALID_DEVICE 101
#define CUDA_ERROR_OPERATING_SYSTEM 304
#define CUDA_ERROR_UNKNOWN 999

struct gpu { int minor; char uuid[64]; char node[32]; };
static struct gpu found[64], visible[64];
static int nfound, nvisible = -1;

static int by_minor(const void *a, const void *b) {
	return ((const struct gpu *)a)->minor - ((const struct gpu *)b)->minor;
}

static int read_uuid(const char *path, char *out, size_t len) {
	FILE *f = fopen(path, "r");
	if (f == NULL) return -1;
	if (fgets(out, (int)len, f) == NULL) { fclose(f); return -1; }
	fclose(f);
	out[strcspn(out, "\r\n ")] = 0;
	return strncmp(out, "GPU-", 4) == 0 ? 0 : -1;
}

/* driver_uuid finds the UUID the driver gives the GPU of a minor. */
static int driver_uuid(int minor, char *out, size_t len) {
	char buf[4096];
	snprintf(buf, sizeof buf, "%s", FAKE_GPUS);
	for (char *tok = strtok(buf, ","); tok != NULL; tok = strtok(NULL, ",")) {
		char *eq = strchr(tok, '=');
		if (eq != NULL && atoi(tok) == minor) {
			snprintf(out, len, "%s", eq + 1);
			return 0;
		}
	}
	return -1;
}

static int is_chardev(const char *path) {
	struct stat st;
	return stat(path, &st) == 0 && S_ISCHR(st.st_mode);
}

/* read_line says whether path has a first line to read. */
static int read_line(const char *path) {
	char line[256];
	FILE *f = fopen(path, "r");
	if (f == NULL) return 0;
	int ok = fgets(line, sizeof line, f) != NULL;
	fclose(f);
	return ok;
}

/*
 * os_ready says whether the process has what the driver asks of the
 * kernel before it opens a GPU: its own mappings in procfs, the CPUs in
 * sysfs, and /dev/null, a character device it can write.
 */
static int os_ready(void) {
	if (!read_line("/proc/self/maps") || !read_line("/sys/devices/system/cpu/online")) return 0;
	int fd = open("/dev/null", O_RDWR | O_CLOEXEC);
	if (fd < 0) return 0;
	struct stat st;
	int ok = fstat(fd, &st) == 0 && S_ISCHR(st.st_mode) && write(fd, "", 1) == 1;
	close(fd);
	return ok;
}

/* A GPU's memory in MiB; volatile, so that the library calls libm. */
static volatile double memory_mib = 81559;

/* MPS: the pinned-memory limit of each visible device in MiB, as the
 * daemon gave it (-1: none); what is allocated on each; the allocations,
 * for cuMemFree; the device of the current context. */
static long long mps_limit_mib[64];
static unsigned long long used[64];
struct allocation { unsigned long long ptr; size_t bytes; int dev; };
static struct allocation allocs[256];
static int nallocs, current = -1;
static unsigned long long next_ptr = 0x100000;

/* parse_limits reads the daemon's answer, "thread=25 mem=0=20389M,1=20389M". */
static void parse_limits(const char *answer) {
	const char *mem = strstr(answer, "mem=");
	if (mem == NULL) return;
	char buf[1024];
	snprintf(buf, sizeof buf, "%s", mem + 4);
	buf[strcspn(buf, " \r\n")] = 0;
	for (char *tok = strtok(buf, ","); tok != NULL; tok = strtok(NULL, ",")) {
		char *eq = strchr(tok, '=');
		if (eq == NULL) continue;
		int dev = atoi(tok);
		char *unit;
		long long v = strtoll(eq + 1, &unit, 10);
		if (*unit == 'G') v *= 1024;
		if (dev >= 0 && dev < 64) mps_limit_mib[dev] = v;
	}
}

/*
 * mps_join joins the MPS daemon of the pipe directory, if one answers
 * there: 0 joined or no daemon, -1 a daemon that refused the client.
 */
static int mps_join(void) {
	for (int i = 0; i < 64; i++) mps_limit_mib[i] = -1;
	const char *pipe = getenv("CUDA_MPS_PIPE_DIRECTORY");
	if (pipe == NULL || *pipe == 0) pipe = "/tmp/nvidia-mps";
	struct sockaddr_un addr = {.sun_family = AF_UNIX};
	snprintf(addr.sun_path, sizeof addr.sun_path, "%s/control", pipe);
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0) return 0;
	if (connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0) { close(fd); return 0; }
	const char *thread = getenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), *mem = getenv("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT");
	char req[1024];
	int n = snprintf(req, sizeof req, "client %d %s;%s\n", (int)getuid(), thread ? thread : "", mem ? mem : "");
	if (write(fd, req, (size_t)n) != n) { close(fd); return -1; }
	char answer[4096];
	size_t got = 0;
	ssize_t r;
	while (got < sizeof answer - 1 && (r = read(fd, answer + got, sizeof answer - 1 - got)) > 0) {
		got += (size_t)r;
		answer[got] = 0;
		if (strstr(answer, "\n.\n") != NULL || strncmp(answer, "ERROR", 5) == 0) break;
	}
	close(fd);
	answer[got] = 0;
	if (strncmp(answer, "thread=", 7) != 0) return -1;
	parse_limits(answer);
	return 0;
}

/* capacity is what device dev may hold at most, in bytes. */
static unsigned long long capacity(int dev) {
	unsigned long long total = (unsigned long long)ldexp(memory_mib, 20);
	if (mps_limit_mib[dev] >= 0 && ((unsigned long long)mps_limit_mib[dev] << 20) < total)
		return (unsigned long long)mps_limit_mib[dev] << 20;
	return total;
}

int cuInit(unsigned int flags) {
	(void)flags;
#ifdef FAKE_CUINIT_HANGS
	fork();
	for (;;) pause();
#endif
	if (!os_ready()) return CUDA_ERROR_OPERATING_SYSTEM;
	if (access("/dev/nvidiactl", R_OK) != 0) return CUDA_ERROR_NO_DEVICE;
	DIR *d = opendir("/dev");
	if (d == NULL) return CUDA_ERROR_NO_DEVICE;
	struct dirent *e;
	nfound = 0;
	while ((e = readdir(d)) != NULL && nfound < 64) {
		const char *n = e->d_name;
		if (strncmp(n, "nvidia", 6) != 0 || !isdigit((unsigned char)n[6])) continue;
		struct gpu g = {.minor = atoi(n + 6)};
		snprintf(g.node, sizeof g.node, "/dev/%s", n);
		if (read_uuid(g.node, g.uuid, sizeof g.uuid) != 0 &&
		    !(is_chardev(g.node) && driver_uuid(g.minor, g.uuid, sizeof g.uuid) == 0)) continue;
		found[nfound++] = g;
	}
	closedir(d);
	qsort(found, nfound, sizeof found[0], by_minor);
	const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
	if (cvd == NULL) {
		memcpy(visible, found, sizeof found);
		nvisible = nfound;
	} else {
		char buf[1024];
		snprintf(buf, sizeof buf, "%s", cvd);
		nvisible = 0;
		for (char *tok = strtok(buf, ","); tok != NULL; tok = strtok(NULL, ",")) {
			int hit = -1;
			if (strncmp(tok, "GPU-", 4) == 0) {
				for (int i = 0; i < nfound; i++)
					if (strncmp(found[i].uuid, tok, strlen(tok)) == 0) hit = i;
			} else if (isdigit((unsigned char)tok[0]) && atoi(tok) < nfound) {
				hit = atoi(tok);
			}
			if (hit < 0) break;
			visible[nvisible++] = found[hit];
		}
	}
	if (nvisible == 0) return CUDA_ERROR_NO_DEVICE;
	return mps_join() == 0 ? CUDA_SUCCESS : CUDA_ERROR_MPS_CONNECTION_FAILED;
}

int cuDriverGetVersion(int *v) { *v = FAKE_DRIVER_API; return CUDA_SUCCESS; }

int cuDeviceGetCount(int *n) {
	if (nvisible < 0) return CUDA_ERROR_NOT_INITIALIZED;
	*n = nvisible;
	return CUDA_SUCCESS;
}

int cuDeviceGet(int *dev, int ordinal) {
	if (ordinal < 0 || ordinal >= nvisible) return CUDA_ERROR_INVALID_DEVICE;
	*dev = ordinal;
	return CUDA_SUCCESS;
}

int cuDeviceGetName(char *buf, int len, int dev) {
	snprintf(buf, len, "Simulated GPU (%s)", visible[dev].node);
	return CUDA_SUCCESS;
}

int cuDeviceGetUuid(unsigned char *out, int dev) {
	const char *p = visible[dev].uuid + 4;
	for (int i = 0; i < 16; i++) {
		while (*p == '-') p++;
		unsigned int b;
		if (sscanf(p, "%2x", &b) != 1) return CUDA_ERROR_UNKNOWN;
		out[i] = (unsigned char)b;
		p += 2;
	}
	return CUDA_SUCCESS;
}

int cuDeviceTotalMem_v2(size_t *bytes, int dev) { (void)dev; *bytes = (size_t)ldexp(memory_mib, 20); return CUDA_SUCCESS; }

int cuDevicePrimaryCtxRetain(void **ctx, int dev) {
	/* A simulated node's kernel has no driver behind the numbers. */
	if (is_chardev(visible[dev].node)) {
		*ctx = (void *)(long)(dev + 1);
		return CUDA_SUCCESS;
	}
	int fd = open(visible[dev].node, O_RDWR);
	if (fd < 0) return CUDA_ERROR_UNKNOWN;
	close(fd);
	*ctx = (void *)(long)(dev + 1);
	return CUDA_SUCCESS;
}

int cuCtxSetCurrent(void *ctx) {
	if (ctx == NULL) return CUDA_ERROR_UNKNOWN;
	current = (int)(long)ctx - 1;
	return CUDA_SUCCESS;
}

int cuMemAlloc_v2(unsigned long long *ptr, size_t n) {
	if (current < 0 || current >= nvisible) return CUDA_ERROR_INVALID_CONTEXT;
	if (n > capacity(current) - used[current] || nallocs == 256) return CUDA_ERROR_OUT_OF_MEMORY;
	*ptr = next_ptr;
	next_ptr += (n + 0xfffff) & ~0xfffffULL;
	allocs[nallocs++] = (struct allocation){.ptr = *ptr, .bytes = n, .dev = current};
	used[current] += n;
	return CUDA_SUCCESS;
}

int cuMemFree_v2(unsigned long long ptr) {
	for (int i = 0; i < nallocs; i++) {
		if (allocs[i].ptr != ptr) continue;
		used[allocs[i].dev] -= allocs[i].bytes;
		allocs[i] = allocs[--nallocs];
		return CUDA_SUCCESS;
	}
	return CUDA_ERROR_UNKNOWN;
}

int cuMemGetInfo_v2(size_t *free_bytes, size_t *total) {
	if (current < 0 || current >= nvisible) return CUDA_ERROR_INVALID_CONTEXT;
	*total = (size_t)ldexp(memory_mib, 20);
	*free_bytes = (size_t)(capacity(current) - used[current]);
	return CUDA_SUCCESS;
}
int cuDevicePrimaryCtxRelease_v2(int dev) { (void)dev; return CUDA_SUCCESS; }
