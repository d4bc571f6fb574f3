/* closer.c - threads that close file descriptors off the event loop (see
 * closer.h). */
#include "closer.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Invariants (under mu): q[0..n) in arrival order; busy[i] is the uid thread
 * i closes for, or -1; alive threads reference this; after stop, no thread
 * calls notify. */
typedef struct closer_item {
    int fd;
    uid_t uid;
} closer_item;

struct hd_closer {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    closer_item *q;
    size_t n, cap;
    long busy[HD_CLOSER_THREADS];
    uid_t *done; /* closed, not yet accounted by the loop */
    size_t ndone, donecap;
    bool stop;
    int alive;
    void (*notify)(void *arg);
    void *notify_arg;
};

typedef struct closer_arg {
    hd_closer *k;
    int slot;
} closer_arg;

static void closer_free(hd_closer *k)
{
    free(k->q);
    free(k->done);
    pthread_mutex_destroy(&k->mu);
    pthread_cond_destroy(&k->cv);
    free(k);
}

/* The first queued fd whose uid no other thread is closing for (-1: none). */
static long closer_pick(const hd_closer *k)
{
    for (size_t i = 0; i < k->n; i++) {
        bool taken = false;
        for (int t = 0; t < HD_CLOSER_THREADS; t++)
            taken |= k->busy[t] == (long)k->q[i].uid;
        if (!taken)
            return (long)i;
    }
    return -1;
}

static void *closer_main(void *arg)
{
    closer_arg *ca = arg;
    hd_closer *k = ca->k;
    int slot = ca->slot;
    free(ca);
    pthread_mutex_lock(&k->mu);
    for (;;) {
        long i;
        while (!k->stop && (i = closer_pick(k)) < 0)
            pthread_cond_wait(&k->cv, &k->mu);
        if (k->stop)
            break;
        closer_item it = k->q[i];
        memmove(k->q + i, k->q + i + 1, (k->n - (size_t)i - 1) * sizeof *k->q);
        k->n--;
        k->busy[slot] = (long)it.uid;
        pthread_mutex_unlock(&k->mu);
        close(it.fd); /* may block for the socket's linger time */
        pthread_mutex_lock(&k->mu);
        k->busy[slot] = -1;
        if (k->stop)
            break;
        if (k->ndone == k->donecap) {
            size_t cap = k->donecap ? k->donecap * 2 : 256;
            uid_t *d = realloc(k->done, cap * sizeof *d);
            if (d) {
                k->done = d;
                k->donecap = cap;
            }
        }
        if (k->ndone < k->donecap)
            k->done[k->ndone++] = it.uid;
        k->notify(k->notify_arg);
        pthread_cond_broadcast(&k->cv); /* this uid's next fd may go now */
    }
    int last = --k->alive == 0;
    pthread_mutex_unlock(&k->mu);
    if (last)
        closer_free(k);
    return NULL;
}

hd_closer *hd_closer_start(void (*notify)(void *arg), void *arg)
{
    hd_closer *k = calloc(1, sizeof *k);
    if (!k)
        return NULL;
    pthread_mutex_init(&k->mu, NULL);
    pthread_cond_init(&k->cv, NULL);
    k->notify = notify;
    k->notify_arg = arg;
    for (int i = 0; i < HD_CLOSER_THREADS; i++)
        k->busy[i] = -1;
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    pthread_mutex_lock(&k->mu);
    for (int i = 0; i < HD_CLOSER_THREADS; i++) {
        closer_arg *ca = malloc(sizeof *ca);
        pthread_t th;
        if (!ca)
            break;
        ca->k = k;
        ca->slot = i;
        if (pthread_create(&th, &at, closer_main, ca) == 0)
            k->alive++;
        else
            free(ca);
    }
    pthread_attr_destroy(&at);
    int alive = k->alive;
    pthread_mutex_unlock(&k->mu);
    if (!alive) {
        closer_free(k);
        return NULL;
    }
    return k;
}

int hd_closer_push(hd_closer *k, int fd, uid_t owner)
{
    pthread_mutex_lock(&k->mu);
    if (k->n == k->cap) {
        size_t cap = k->cap ? k->cap * 2 : 256;
        closer_item *q = realloc(k->q, cap * sizeof *q);
        if (!q) {
            pthread_mutex_unlock(&k->mu);
            return -1;
        }
        k->q = q;
        k->cap = cap;
    }
    k->q[k->n++] = (closer_item){fd, owner};
    pthread_cond_signal(&k->cv);
    pthread_mutex_unlock(&k->mu);
    return 0;
}

size_t hd_closer_take_done(hd_closer *k, uid_t *out, size_t max)
{
    pthread_mutex_lock(&k->mu);
    size_t n = k->ndone < max ? k->ndone : max;
    memcpy(out, k->done + (k->ndone - n), n * sizeof *out);
    k->ndone -= n;
    pthread_mutex_unlock(&k->mu);
    return n;
}

void hd_closer_stop(hd_closer *k)
{
    if (!k)
        return;
    pthread_mutex_lock(&k->mu);
    k->stop = true;
    pthread_cond_broadcast(&k->cv);
    pthread_mutex_unlock(&k->mu);
}
