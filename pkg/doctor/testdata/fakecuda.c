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
 */
#include <ctype.h>
#include <dirent.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef FAKE_GPUS
#define FAKE_GPUS ""
#endif
#ifndef FAKE_DRIVER_API
#define FAKE_DRIVER_API 13000
#endif

#define CUDA_SUCCESS 0
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
	return nvisible > 0 ? CUDA_SUCCESS : CUDA_ERROR_NO_DEVICE;
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

int cuCtxSetCurrent(void *ctx) { return ctx ? CUDA_SUCCESS : CUDA_ERROR_UNKNOWN; }
int cuMemAlloc_v2(unsigned long long *ptr, size_t n) { *ptr = n ? 0x100000 : 0; return CUDA_SUCCESS; }
int cuMemFree_v2(unsigned long long ptr) { (void)ptr; return CUDA_SUCCESS; }
int cuDevicePrimaryCtxRelease_v2(int dev) { (void)dev; return CUDA_SUCCESS; }
