/* cuda_dl.h - the one loader of libcuda.so.1 (the CUDA driver API), shared
 * by heapd's cuda backend (daemon/backend_cuda.c), libheapc
 * (client/heapc_cuda.c) and libheapc_nccl (client/heapc_nccl.c), and the GPU
 * UUID text form they all use.
 *
 * What it promises:
 *   - libcuda.so.1 is dlopen'ed at most once per process (pthread_once),
 *     with RTLD_NOW | RTLD_LOCAL, and never unloaded (dlclose of libcuda is
 *     not safe); nothing links libcuda, so every user loads on machines
 *     without a GPU and only its CUDA paths fail there.
 *   - cd_open and cd_resolve need no cuda.h; each user keeps its own table of
 *     entry points (the versioned names cuda.h maps to: cuMemGetInfo_v2, ...)
 *     and its own words for failures. Thread-safe. A library: never prints. */
#ifndef HEAPD_CUDA_DL_H
#define HEAPD_CUDA_DL_H

#include <stddef.h>

/* The libcuda handle, or NULL with dlopen's reason in why (the same reason
 * at every call). */
void *cd_open(char *why, size_t whylen);

/* One entry point: *slot gets dlsym(name), else dlsym(alt) (alt may be
 * NULL). */
typedef struct cd_sym {
    void **slot;
    const char *name;
    const char *alt;
} cd_sym;

/* Resolves syms[0..n). Returns 0, or -1 with *missing set to the name of the
 * first entry point libcuda lacks (the driver is too old). */
int cd_resolve(void *lib, const cd_sym *syms, size_t n, const char **missing);

/* "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" from 16 bytes; len >= 41. */
void cd_uuid_format(const unsigned char bytes[16], char *out, size_t len);

/* Parses "GPU-…", "MIG-…" or bare hex (dashes optional, any case) into 16
 * bytes; returns 0, or -1 when s is NULL or not a UUID. */
int cd_uuid_parse(const char *s, unsigned char bytes[16]);

#endif
