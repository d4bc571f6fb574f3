/* nccl_user.c - stands for torch's libtorch_cuda.so in the preload tests:
 * $(BUILD)/tests/nccl_stub/libnccl_user.so references NCCL's entry points
 * (linked against the stand-in libnccl.so.2 beside it, found through
 * RUNPATH $ORIGIN), so that under LD_PRELOAD its calls bind to
 * libheapc_nccl_preload.so, as torch's do. Loaded with ctypes (RTLD_LOCAL,
 * as Python loads torch). user_call(i, buf, n) makes call i (0 AllReduce,
 * 1 AllGather, 2 ReduceScatter, 3 Broadcast, 4 Reduce, 5 Send, 6 Recv,
 * 7 GroupStart, 8 GroupEnd) and returns NCCL's result. */
#include <stddef.h>

#include "nccl_protos.h"

int user_call(int which, void *buf, size_t n);

int user_call(int which, void *buf, size_t n)
{
    ncclComm_t comm = (ncclComm_t)(void *)0x1;
    switch (which) {
    case 0:
        return ncclAllReduce(buf, buf, n, ncclFloat, ncclSum, comm, NULL);
    case 1:
        return ncclAllGather(buf, buf, n, ncclFloat, comm, NULL);
    case 2:
        return ncclReduceScatter(buf, buf, n, ncclFloat, ncclSum, comm, NULL);
    case 3:
        return ncclBroadcast(buf, buf, n, ncclFloat, 0, comm, NULL);
    case 4:
        return ncclReduce(buf, buf, n, ncclFloat, ncclSum, 0, comm, NULL);
    case 5:
        return ncclSend(buf, n, ncclFloat, 1, comm, NULL);
    case 6:
        return ncclRecv(buf, n, ncclFloat, 1, comm, NULL);
    case 7:
        return ncclGroupStart();
    case 8:
        return ncclGroupEnd();
    }
    return -1;
}
