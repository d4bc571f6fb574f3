/* cuda_dl.c - the one loader of libcuda.so.1 (see cuda_dl.h). */
#include "cuda_dl.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <strings.h>

static struct {
    void *lib;
    char why[256];
} cd_state;

static pthread_once_t cd_once = PTHREAD_ONCE_INIT;

static void cd_load(void)
{
    dlerror();
    cd_state.lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!cd_state.lib) {
        const char *why = dlerror();
        snprintf(cd_state.why, sizeof cd_state.why, "%s", why ? why : "unknown error");
    }
}

void *cd_open(char *why, size_t whylen)
{
    pthread_once(&cd_once, cd_load);
    if (!cd_state.lib && why && whylen)
        snprintf(why, whylen, "%s", cd_state.why);
    return cd_state.lib;
}

int cd_resolve(void *lib, const cd_sym *syms, size_t n, const char **missing)
{
    for (size_t i = 0; i < n; i++) {
        void *p = dlsym(lib, syms[i].name);
        if (!p && syms[i].alt)
            p = dlsym(lib, syms[i].alt);
        if (!p) {
            *missing = syms[i].name;
            return -1;
        }
        *syms[i].slot = p;
    }
    return 0;
}

void cd_uuid_format(const unsigned char b[16], char *out, size_t len)
{
    snprintf(out, len, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1], b[2],
             b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
}

static int hexval(int c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

int cd_uuid_parse(const char *s, unsigned char out[16])
{
    if (!s)
        return -1;
    if (strncasecmp(s, "GPU-", 4) == 0 || strncasecmp(s, "MIG-", 4) == 0)
        s += 4;
    int n = 0;
    for (; *s; s++) {
        if (*s == '-')
            continue;
        int v = hexval((unsigned char)*s);
        if (v < 0 || n >= 32)
            return -1;
        if (n % 2 == 0)
            out[n / 2] = (unsigned char)(v << 4);
        else
            out[n / 2] |= (unsigned char)v;
        n++;
    }
    return n == 32 ? 0 : -1;
}
