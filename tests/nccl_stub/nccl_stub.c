/* nccl_stub.c - a recording NCCL stand-in for the preload tests: built as
 * $(BUILD)/tests/nccl_stub/libnccl.so.2, it defines the NCCL entry points
 * libheapc_nccl_preload.so interposes and counts each call (stub_calls,
 * indexed as below), remembering the last call's arguments. NCCL_STUB_FAIL
 * names a function ("ncclAllReduce") that then returns
 * ncclUnhandledCudaError. No GPU, no communicator: the tests check that the
 * calls arrive, with their arguments, after the preload's policy ran.
 * Issue 32: ncclCommWindowRegister / ncclCommWindowDeregister are counted
 * too (stub_win_reg, stub_win_dereg), with the last registration's
 * arguments (stub_win_comm, stub_win_buf, stub_win_size, stub_win_flags)
 * and the bytes in windows now (stub_win_bytes); and ncclGetVersion (2.28)
 * and friends let libheapc_nccl's own loader (hnccl_load) take it. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "nccl_protos.h"

enum {
    S_ALLREDUCE,
    S_ALLGATHER,
    S_REDUCESCATTER,
    S_BROADCAST,
    S_REDUCE,
    S_SEND,
    S_RECV,
    S_GROUPSTART,
    S_GROUPEND,
    S_N
};
unsigned long stub_calls[S_N];
size_t stub_last_count;
const void *stub_last_send;
void *stub_last_recv;
int stub_last_peer = -1;

ncclResult_t ncclCommCount(const ncclComm_t, int *);
const char *ncclGetErrorString(ncclResult_t);
const char *ncclGetLastError(ncclComm_t);

static ncclResult_t rec(int i, const char *name, const void *s, void *r, size_t n, int peer)
{
    stub_calls[i]++;
    stub_last_send = s;
    stub_last_recv = r;
    stub_last_count = n;
    stub_last_peer = peer;
    const char *f = getenv("NCCL_STUB_FAIL");
    return f && !strcmp(f, name) ? ncclUnhandledCudaError : ncclSuccess;
}

ncclResult_t ncclAllReduce(const void *s, void *r, size_t n, ncclDataType_t dt, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t st)
{
    return rec(S_ALLREDUCE, "ncclAllReduce", s, r, n, -1);
}
ncclResult_t ncclAllGather(const void *s, void *r, size_t n, ncclDataType_t dt, ncclComm_t comm, cudaStream_t st)
{
    return rec(S_ALLGATHER, "ncclAllGather", s, r, n, -1);
}
ncclResult_t ncclReduceScatter(const void *s, void *r, size_t n, ncclDataType_t dt, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t st)
{
    return rec(S_REDUCESCATTER, "ncclReduceScatter", s, r, n, -1);
}
ncclResult_t ncclBroadcast(const void *s, void *r, size_t n, ncclDataType_t dt, int root, ncclComm_t comm,
                           cudaStream_t st)
{
    return rec(S_BROADCAST, "ncclBroadcast", s, r, n, root);
}
ncclResult_t ncclReduce(const void *s, void *r, size_t n, ncclDataType_t dt, ncclRedOp_t op, int root, ncclComm_t comm,
                        cudaStream_t st)
{
    return rec(S_REDUCE, "ncclReduce", s, r, n, root);
}
ncclResult_t ncclSend(const void *s, size_t n, ncclDataType_t dt, int peer, ncclComm_t comm, cudaStream_t st)
{
    return rec(S_SEND, "ncclSend", s, NULL, n, peer);
}
ncclResult_t ncclRecv(void *r, size_t n, ncclDataType_t dt, int peer, ncclComm_t comm, cudaStream_t st)
{
    return rec(S_RECV, "ncclRecv", NULL, r, n, peer);
}
ncclResult_t ncclGroupStart(void) { return rec(S_GROUPSTART, "ncclGroupStart", NULL, NULL, 0, -1); }
ncclResult_t ncclGroupEnd(void) { return rec(S_GROUPEND, "ncclGroupEnd", NULL, NULL, 0, -1); }
ncclResult_t ncclCommCount(const ncclComm_t comm, int *n)
{
    *n = 2;
    return ncclSuccess;
}
const char *ncclGetErrorString(ncclResult_t r)
{
    return r == ncclUnhandledCudaError ? "stub: unhandled cuda error" : "stub: other";
}
const char *ncclGetLastError(ncclComm_t comm) { return "stub: the last error"; }

unsigned long stub_win_reg, stub_win_dereg;
void *stub_win_comm, *stub_win_buf;
size_t stub_win_size, stub_win_bytes;
int stub_win_flags = -1;
static size_t win_sizes[1024];

ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void *buf, size_t size, ncclWindow_t *win, int flags)
{
    const char *f = getenv("NCCL_STUB_FAIL");
    if (f && !strcmp(f, "ncclCommWindowRegister"))
        return ncclUnhandledCudaError;
    if (stub_win_reg == 1023)
        return ncclInternalError;
    stub_win_reg++;
    stub_win_comm = comm;
    stub_win_buf = buf;
    stub_win_size = size;
    stub_win_flags = flags;
    stub_win_bytes += size;
    win_sizes[stub_win_reg] = size;
    *win = (ncclWindow_t)(uintptr_t)stub_win_reg;
    return ncclSuccess;
}
ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win)
{
    uintptr_t i = (uintptr_t)win;
    if (i == 0 || i > stub_win_reg || !win_sizes[i])
        return ncclInvalidArgument;
    stub_win_dereg++;
    stub_win_bytes -= win_sizes[i];
    win_sizes[i] = 0;
    return ncclSuccess;
}
ncclResult_t ncclGetVersion(int *v)
{
    *v = 22800;
    return ncclSuccess;
}
ncclResult_t ncclGetUniqueId(ncclUniqueId *id)
{
    memset(id, 0, sizeof *id);
    return ncclSuccess;
}
ncclResult_t ncclCommInitRank(ncclComm_t *comm, int n, ncclUniqueId id, int rank)
{
    *comm = (ncclComm_t)(void *)0x1;
    return ncclSuccess;
}
ncclResult_t ncclCommDestroy(ncclComm_t comm) { return ncclSuccess; }
