/* nccl_stub.c - a recording NCCL stand-in for the preload tests: built as
 * $(BUILD)/tests/nccl_stub/libnccl.so.2, it defines the NCCL entry points
 * libheapc_nccl_preload.so interposes and counts each call (stub_calls,
 * indexed as below), remembering the last call's arguments. NCCL_STUB_FAIL
 * names a function ("ncclAllReduce") that then returns
 * ncclUnhandledCudaError. No GPU, no communicator: the tests check that the
 * calls arrive, with their arguments, after the preload's policy ran. */
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
