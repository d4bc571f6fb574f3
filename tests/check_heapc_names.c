/*
 * check_heapc_names.c - unit tests for client/heapc_names.c (issue 29)
 * against a scripted fake heapd in a thread: a re-attach whose live set
 * comes partly in a LiveBatch frame, the named blocks (lookup, a named
 * allocation, a free that forgets the name, a free the live set refuses),
 * commit markers and the generation, a name asymmetry's names, and what
 * detach leaves. The live set against a real heapd: tests/python and
 * tests/it_*.sh.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "heapc.h"
#include "heapd.pb-c.h"
#include "wire.h"
#include "check_util.h"
#include "check_fake.h"

#define CHUNK (64u << 10)

/* ---- fake heapd ---------------------------------------------------------- */

typedef struct fake {
    ckf_fake k; /* first: the script casts it back */
    int chunk;
    int only_attach; /* the script: attach, then Detach */
} fake;

static void live_block(Heapd__LiveBlock *b, uint64_t seq, uint64_t off, uint64_t size, uint64_t bs, const char *name)
{
    heapd__live_block__init(b);
    b->seq = seq;
    b->offset = off;
    b->size = size;
    b->block_size = bs;
    b->name = (char *)name;
}

/* A re-attach of rank 0 of 1 (generation 2, next_seq 5): blocks 1 and 2 in
 * a LiveBatch frame first, block 3 in the reply, marker step = 7. Checks
 * that the Attach asked for persist_s 600. */
static int freattach(fake *f)
{
    Heapd__Frame *m = ckf_expect(&f->k, HEAPD__FRAME__BODY_ATTACH);
    if (!m)
        return -1;
    if (!m->attach->params || m->attach->params->persist_s != 600)
        ckf_fail(&f->k, "fake heapd: Attach persist_s %u, want 600",
                 m->attach->params ? m->attach->params->persist_s : 0);
    Heapd__LiveBlock b1, b2, b3;
    live_block(&b1, 1, 0, 100, 512, "w");
    live_block(&b2, 2, 512, 200, 512, "");
    live_block(&b3, 3, 1024, 600, 1024, "opt");
    Heapd__LiveBlock *batch[2] = {&b1, &b2}, *own[1] = {&b3};
    Heapd__LiveBatch lb = HEAPD__LIVE_BATCH__INIT;
    lb.n_blocks = 2;
    lb.blocks = batch;
    Heapd__Frame bf = HEAPD__FRAME__INIT;
    bf.id = m->id;
    bf.body_case = HEAPD__FRAME__BODY_LIVE_BATCH;
    bf.live_batch = &lb;
    ckf_send(&f->k, &bf, NULL, 0);

    Heapd__HeapParams hp = HEAPD__HEAP_PARAMS__INIT;
    hp.chunk_size = CHUNK;
    hp.initial_size = CHUNK;
    hp.va_size = 4 * CHUNK;
    hp.min_block = 512;
    hp.persist_s = 600;
    Heapd__ChunkRef c0 = HEAPD__CHUNK_REF__INIT;
    Heapd__ChunkRef *refs[1] = {&c0};
    uint32_t local[1] = {0};
    Heapd__Marker mk = HEAPD__MARKER__INIT;
    mk.tag = "step";
    mk.value = 7;
    mk.seq = 4;
    Heapd__Marker *mks[1] = {&mk};
    Heapd__AttachReply ar = HEAPD__ATTACH_REPLY__INIT;
    ar.params = &hp;
    ar.world_size = 1;
    ar.n_local_ranks = 1;
    ar.local_ranks = local;
    ar.mapped = CHUNK;
    ar.n_chunks = 1;
    ar.chunks = refs;
    ar.status_fd_index = -1;
    ar.backend = "host";
    ar.epoch = 1;
    ar.next_seq = 5;
    ar.generation = 2;
    ar.resumed = 1;
    ar.n_live = 1;
    ar.live = own;
    ar.n_markers = 1;
    ar.markers = mks;
    Heapd__Frame rep = HEAPD__FRAME__INIT;
    rep.id = m->id;
    rep.body_case = HEAPD__FRAME__BODY_ATTACH_REPLY;
    rep.attach_reply = &ar;
    ckf_send(&f->k, &rep, &f->chunk, 1);
    heapd__frame__free_unpacked(m, NULL);
    return 0;
}

static void falloc_reply(fake *f, uint64_t id, uint64_t seq, uint64_t off, uint64_t bs)
{
    Heapd__AllocReply ar = HEAPD__ALLOC_REPLY__INIT;
    ar.seq = seq;
    ar.offset = off;
    ar.block_size = bs;
    ar.mapped = CHUNK;
    Heapd__Frame rep = HEAPD__FRAME__INIT;
    rep.id = id;
    rep.body_case = HEAPD__FRAME__BODY_ALLOC_REPLY;
    rep.alloc_reply = &ar;
    ckf_send(&f->k, &rep, NULL, 0);
}

static void fdetach(fake *f)
{
    Heapd__Frame *m = ckf_expect(&f->k, HEAPD__FRAME__BODY_DETACH);
    if (!m)
        return;
    Heapd__DetachReply dr = HEAPD__DETACH_REPLY__INIT;
    Heapd__Frame drep = HEAPD__FRAME__INIT;
    drep.id = m->id;
    drep.body_case = HEAPD__FRAME__BODY_DETACH_REPLY;
    drep.detach_reply = &dr;
    ckf_send(&f->k, &drep, NULL, 0);
    heapd__frame__free_unpacked(m, NULL);
}

/* Alloc 5 named "b" (offset 2048); Free of offset 0 then Commit step = 9
 * at seq 6; Alloc 6 named "x" refused as a name asymmetry; Detach. */
static void fserve(fake *f)
{
    if (f->only_attach) {
        fdetach(f);
        return;
    }
    Heapd__Frame *m = ckf_expect(&f->k, HEAPD__FRAME__BODY_ALLOC);
    if (!m)
        return;
    if (m->alloc->seq != 5 || m->alloc->size != 64 || strcmp(m->alloc->name, "b"))
        ckf_fail(&f->k, "alloc 5: seq %lu size %lu name \"%s\"", (unsigned long)m->alloc->seq,
                 (unsigned long)m->alloc->size, m->alloc->name);
    falloc_reply(f, m->id, 5, 2048, 512);
    heapd__frame__free_unpacked(m, NULL);

    if (!(m = ckf_expect(&f->k, HEAPD__FRAME__BODY_FREE)))
        return;
    if (m->free->n_offsets != 1 || m->free->offsets[0] != 0)
        ckf_fail(&f->k, "free before commit: %zu offsets", m->free->n_offsets);
    Heapd__FreeReply fr = HEAPD__FREE_REPLY__INIT;
    fr.accepted = 1;
    Heapd__Frame rep = HEAPD__FRAME__INIT;
    rep.id = m->id;
    rep.body_case = HEAPD__FRAME__BODY_FREE_REPLY;
    rep.free_reply = &fr;
    ckf_send(&f->k, &rep, NULL, 0);
    heapd__frame__free_unpacked(m, NULL);

    if (!(m = ckf_expect(&f->k, HEAPD__FRAME__BODY_COMMIT)))
        return;
    if (strcmp(m->commit->tag, "step") || m->commit->value != 9 || m->commit->seq != 6)
        ckf_fail(&f->k, "commit: tag %s value %lu seq %lu", m->commit->tag, (unsigned long)m->commit->value,
                 (unsigned long)m->commit->seq);
    Heapd__CommitReply cr = HEAPD__COMMIT_REPLY__INIT;
    cr.value = 9;
    cr.generation = 2;
    Heapd__Frame crep = HEAPD__FRAME__INIT;
    crep.id = m->id;
    crep.body_case = HEAPD__FRAME__BODY_COMMIT_REPLY;
    crep.commit_reply = &cr;
    ckf_send(&f->k, &crep, NULL, 0);
    heapd__frame__free_unpacked(m, NULL);

    if (!(m = ckf_expect(&f->k, HEAPD__FRAME__BODY_ALLOC)))
        return;
    uint32_t ranks[2] = {1, 0};
    uint64_t sizes[2] = {64, 64};
    char *names[2] = {"y", "x"};
    Heapd__Error e = HEAPD__ERROR__INIT;
    e.code = HEAPD__ERR_CODE__ERR_ASYMMETRY;
    e.message = "allocation 6 of heap h: rank 1 named it \"y\", rank 0 \"x\"";
    e.asym_n = 6;
    e.n_asym_ranks = e.n_asym_sizes = e.n_asym_names = 2;
    e.asym_ranks = ranks;
    e.asym_sizes = sizes;
    e.asym_names = names;
    Heapd__Frame erep = HEAPD__FRAME__INIT;
    erep.id = m->id;
    erep.body_case = HEAPD__FRAME__BODY_ERROR;
    erep.error = &e;
    ckf_send(&f->k, &erep, NULL, 0);
    heapd__frame__free_unpacked(m, NULL);
    fdetach(f);
}

static void fake_script(ckf_fake *k)
{
    fake *f = (fake *)k;
    if (ckf_hello(k) == 0 && freattach(f) == 0)
        fserve(f);
}

static void fake_start(fake *f, int only_attach)
{
    memset(f, 0, sizeof *f);
    f->only_attach = only_attach;
    f->chunk = memfd_create("check_heapc_names", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    ck_assert_int_ge(f->chunk, 0);
    ck_assert_int_eq(ftruncate(f->chunk, CHUNK), 0);
    ck_assert_int_eq(fcntl(f->chunk, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL), 0);
    ckf_start(&f->k, "check_heapc_names", fake_script);
}

static void fake_stop(fake *f)
{
    ckf_stop(&f->k);
    close(f->chunk);
    ck_assert_msg(f->k.fail[0] == 0, "%s", f->k.fail);
}

/* ---- tests ----------------------------------------------------------------- */

/* The re-attach's state: resumed, generation, the live set in seq order
 * across the LiveBatch and the reply, the names, the markers. */
static void check_reattach(heapc *c)
{
    ck_assert_int_eq(heapc_resumed(c), 1);
    ck_assert_uint_eq(heapc_generation(c), 2);
    ck_assert_uint_eq(heapc_next_seq(c), 5);
    heapc_block b[4];
    ck_assert_uint_eq(heapc_live(c, NULL, 0), 3);
    ck_assert_uint_eq(heapc_live(c, b, 4), 3);
    ck_assert_uint_eq(b[0].seq, 1);
    ck_assert_str_eq(b[0].name, "w");
    ck_assert_uint_eq(b[1].offset, 512);
    ck_assert_str_eq(b[1].name, "");
    ck_assert_uint_eq(b[2].block_size, 1024);
    ck_assert_str_eq(b[2].name, "opt");
    uint64_t off = 1, size = 1, v = 0;
    ck_assert_int_eq(heapc_lookup(c, "opt", &off, &size), 0);
    ck_assert_uint_eq(off, 1024);
    ck_assert_uint_eq(size, 600);
    ck_assert_int_eq(heapc_lookup(c, "nope", &off, NULL), HEAPC_ENOTFOUND);
    ck_assert_ptr_nonnull(strstr(heapc_errstr(c), "nope"));
    ck_assert_int_eq(heapc_lookup(c, "", NULL, NULL), HEAPC_ENOTFOUND);
    ck_assert_int_eq(heapc_committed(c, "step", &v), 0);
    ck_assert_uint_eq(v, 7);
    ck_assert_int_eq(heapc_committed(c, "other", &v), HEAPC_ENOTFOUND);
    heapc_params p;
    ck_assert_int_eq(heapc_get_params(c, &p), 0);
    ck_assert_int_eq(p.persist_s, 600);
}

START_TEST(test_reattach_names_commit)
{
    fake f;
    fake_start(&f, 0);
    heapc *c = heapc_connect(f.k.path);
    ck_assert_int_eq(heapc_err(c), 0);
    heapc_params p = {0};
    p.persist_s = 600;
    ck_assert_int_eq(heapc_attach(c, "h", 0, 1, &p), 0);
    check_reattach(c);

    void *ptr;
    uint64_t off, size, v;
    ck_assert_int_eq(heapc_alloc_named(c, 64, "b", &ptr, &off), 0);
    ck_assert_uint_eq(off, 2048);
    ck_assert_int_eq(heapc_lookup(c, "b", &off, &size), 0);
    ck_assert_uint_eq(off, 2048);
    ck_assert_uint_eq(size, 64);
    ck_assert_uint_eq(heapc_live(c, NULL, 0), 3); /* the attach's, as it was */

    /* A free forgets the name; the resumed live set is complete, so an
     * offset the rank does not hold is refused here, nothing sent. */
    ck_assert_int_eq(heapc_free(c, 0), 0);
    ck_assert_int_eq(heapc_lookup(c, "w", NULL, NULL), HEAPC_ENOTFOUND);
    ck_assert_int_eq(heapc_free(c, 4096), HEAPC_ENOTHELD);
    ck_assert_int_eq(heapc_lookup(c, "opt", NULL, NULL), 0);

    /* Commit: the queued free first, at the next allocation number. */
    ck_assert_int_eq(heapc_commit(c, "", 1), HEAPC_EINVAL);
    ck_assert_int_eq(heapc_commit(c, "step", 9), 0);
    ck_assert_int_eq(heapc_committed(c, "step", &v), 0);
    ck_assert_uint_eq(v, 9);

    /* A name asymmetry names both names; the number is not consumed. */
    ck_assert_int_eq(heapc_alloc_named(c, 64, "x", &ptr, &off), HEAPC_EASYMMETRY);
    uint32_t ranks[2];
    ck_assert_uint_eq(heapc_last_asymmetry(c, NULL, ranks, NULL, 2), 2);
    ck_assert_str_eq(heapc_last_asymmetry_name(c, 0), "y");
    ck_assert_str_eq(heapc_last_asymmetry_name(c, 1), "x");
    ck_assert_ptr_null(heapc_last_asymmetry_name(c, 2));
    ck_assert_uint_eq(heapc_next_seq(c), 6);
    char longname[HEAPC_NAME_MAX + 2];
    memset(longname, 'n', sizeof longname - 1);
    longname[sizeof longname - 1] = '\0';
    ck_assert_int_eq(heapc_alloc_named(c, 64, longname, &ptr, &off), HEAPC_EINVAL);
    ck_assert_ptr_null(heapc_last_asymmetry_name(c, 0));

    ck_assert_int_eq(heapc_detach(c), 0);
    ck_assert_int_eq(heapc_lookup(c, "opt", NULL, NULL), HEAPC_ESTATE);
    ck_assert_uint_eq(heapc_live(c, NULL, 0), 0);
    ck_assert_uint_eq(heapc_generation(c), 0);
    ck_assert_int_eq(heapc_resumed(c), 0);
    ck_assert_int_eq(heapc_committed(c, "step", &v), HEAPC_ESTATE);
    heapc_free_ctx(c);
    fake_stop(&f);
}
END_TEST

/* heapc_attach_env: $HEAPD_PERSIST when the params leave persist_s at 0
 * (the fake checks that the Attach asks for 600); a bad value fails. */
START_TEST(test_env_persist)
{
    setenv("RANK", "0", 1);
    setenv("WORLD_SIZE", "1", 1);
    setenv("LOCAL_WORLD_SIZE", "1", 1);
    setenv("TORCHELASTIC_RUN_ID", "j", 1);
    setenv("HEAPD_PERSIST", "soon", 1);
    heapc *c = heapc_connect("/tmp/check_heapc_names.no.such.sock");
    ck_assert_int_eq(heapc_attach_env(c, "h", NULL), HEAPC_EINVAL);
    ck_assert_ptr_nonnull(strstr(heapc_errstr(c), "HEAPD_PERSIST=\"soon\""));
    heapc_free_ctx(c);

    setenv("HEAPD_PERSIST", "600", 1);
    fake f;
    fake_start(&f, 1);
    c = heapc_connect(f.k.path);
    ck_assert_int_eq(heapc_attach_env(c, "h", NULL), 0);
    heapc_params p;
    ck_assert_int_eq(heapc_get_params(c, &p), 0);
    ck_assert_int_eq(p.persist_s, 600);
    ck_assert_int_eq(heapc_detach(c), 0);
    heapc_free_ctx(c);
    fake_stop(&f);
    unsetenv("HEAPD_PERSIST");
}
END_TEST

/* The calls before any attach. */
START_TEST(test_not_attached)
{
    heapc *c = heapc_connect("/tmp/check_heapc_names.no.such.sock");
    ck_assert_int_eq(heapc_lookup(c, "w", NULL, NULL), HEAPC_ESTATE);
    ck_assert_int_eq(heapc_commit(c, "step", 1), HEAPC_ESTATE);
    ck_assert_int_eq(heapc_alloc_named(c, 1, "w", NULL, NULL), HEAPC_ESTATE);
    ck_assert_uint_eq(heapc_live(c, NULL, 0), 0);
    ck_assert_ptr_null(heapc_last_asymmetry_name(c, 0));
    ck_assert_ptr_null(heapc_last_asymmetry_name(NULL, 0));
    heapc_free_ctx(c);
}
END_TEST

static Suite *names_suite(void)
{
    Suite *s = suite_create("heapc_names");
    TCase *tc = tcase_create("names");
    tcase_add_test(tc, test_reattach_names_commit);
    tcase_add_test(tc, test_not_attached);
    tcase_add_test(tc, test_env_persist);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    setenv("HEAPC_TRANSPORT", "socket", 1);
    return cku_run(names_suite());
}
