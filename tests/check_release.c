/*
 * check_release.c - unit tests for the heap wing's release and restore
 * (issue 30, daemon/heap/release.c) on the host backend: content in host
 * mode bit for bit through the chunks' own memfds, zeros after discard,
 * offsets and allocation after restore, allocation refused while released,
 * a rank gone or late, asymmetric modes, the state in Stats and at a
 * re-attach, the host copy kept, and no fd left (the fixture's teardown
 * counts them). The fixture is tests/check_wing.h's.
 */
#include "check_wing.h"

#include <sys/mman.h>

#include "heapc_map.h"
#include "status.h"

static void release(int peer, int mode, bool keep)
{
    Heapd__Release m = HEAPD__RELEASE__INIT;
    m.mode = (Heapd__ReleaseMode)mode;
    m.keep = keep;
    hd_heap_release(reg, &peers[peer], 11, &m);
    validate();
}

static void restore(int peer)
{
    Heapd__Restore m = HEAPD__RESTORE__INIT;
    hd_heap_restore(reg, &peers[peer], 12, &m);
    validate();
}

/* Writes (or checks, when check) a pattern into every chunk fd of peer's
 * last attach or restore (every local rank's chunks, in the same order for
 * every peer); 1 MiB chunks. */
static void pattern(int peer, uint8_t seed, bool check, bool zeros)
{
    const rec *r = last(peer);
    ck_assert_uint_gt(r->nfds, 0);
    for (size_t i = 0; i < r->nfds; i++) {
        uint8_t *p = mmap(NULL, 1 << 20, PROT_READ | PROT_WRITE, MAP_SHARED, r->fds[i], 0);
        ck_assert(p != MAP_FAILED);
        for (size_t j = 0; j < (1u << 20); j += 4093) {
            uint8_t want = zeros ? 0 : (uint8_t)(seed + i * 3 + j);
            if (check)
                ck_assert_msg(p[j] == want, "peer %d chunk %zu byte %zu: %u, want %u", peer, i, j, p[j], want);
            else
                p[j] = want;
        }
        munmap(p, 1 << 20);
    }
}

static void both(void (*fn)(int))
{
    fn(0);
    fn(1);
}

START_TEST(release_host_roundtrip)
{
    formed();
    pattern(0, 5, false, false); /* through the attach's fds */
    uint64_t off = alloc2(0, 4096, NULL);
    release(0, HEAPD__RELEASE_MODE__RELEASE_HOST, false);
    ck_assert_int_eq(last(0)->kind, R_ALLOC); /* waiting for rank 1: no answer yet */
    stats(2);
    ck_assert_uint_eq(last(2)->state, HS_STATE_RELEASING);
    release(1, HEAPD__RELEASE_MODE__RELEASE_HOST, false);
    ck_assert_msg(last(0)->kind == R_RELEASE, "%s", last(0)->msg);
    ck_assert_int_eq(last(1)->kind, R_RELEASE);
    ck_assert_uint_eq(last(1)->released, 2u << 20);
    ck_assert_uint_eq(last(1)->saved, 2u << 20);
    stats(2);
    ck_assert_uint_eq(last(2)->state, HS_STATE_RELEASED);
    ck_assert_uint_eq(last(2)->resident, 0);
    ck_assert_uint_eq(last(2)->host_copy, 2u << 20);
    /* Released: no allocation, a second release refused, frees work. */
    alloc_n(0, 1, 4096, NULL);
    is_error(0, HEAPD__ERR_CODE__ERR_STATE, "is released on this node; no allocation until it is restored");
    release(0, HEAPD__RELEASE_MODE__RELEASE_DISCARD, false);
    is_error(0, HEAPD__ERR_CODE__ERR_STATE, "already released; restore it first");
    free1(0, off);
    free1(1, off);
    both(restore);
    ck_assert_msg(last(0)->kind == R_RESTORE, "%s", last(0)->msg);
    ck_assert_uint_eq(last(0)->restored, 2u << 20);
    pattern(0, 5, true, false);
    pattern(1, 5, true, false);
    stats(2);
    ck_assert_uint_eq(last(2)->state, HS_STATE_ACTIVE);
    ck_assert_uint_eq(last(2)->resident, 2u << 20);
    ck_assert_uint_eq(last(2)->host_copy, 0); /* not kept */
    /* Allocation goes on symmetric; restore of an active heap refused. */
    alloc2(1, 8192, NULL);
    restore(0);
    is_error(0, HEAPD__ERR_CODE__ERR_STATE, "is not released: nothing to restore");
}
END_TEST

START_TEST(release_discard_zeros_and_keep)
{
    formed();
    pattern(0, 9, false, false);
    alloc2(0, 4096, NULL);
    release(0, HEAPD__RELEASE_MODE__RELEASE_DISCARD, false);
    release(1, HEAPD__RELEASE_MODE__RELEASE_DISCARD, false);
    ck_assert_uint_eq(last(1)->saved, 0);
    both(restore);
    ck_assert_uint_eq(last(0)->restored, 0);
    pattern(0, 9, true, true);
    /* keep: the host copy stays after restore, and serves the next. */
    pattern(0, 3, false, false);
    release(0, HEAPD__RELEASE_MODE__RELEASE_HOST, true);
    release(1, HEAPD__RELEASE_MODE__RELEASE_HOST, true);
    both(restore);
    stats(2);
    ck_assert_uint_eq(last(2)->host_copy, 2u << 20);
    pattern(0, 3, true, false);
    pattern(0, 4, false, false);
    release(0, HEAPD__RELEASE_MODE__RELEASE_HOST, false);
    release(1, HEAPD__RELEASE_MODE__RELEASE_HOST, false);
    both(restore);
    pattern(0, 4, true, false);
}
END_TEST

START_TEST(release_asymmetric_mode)
{
    formed();
    release(0, HEAPD__RELEASE_MODE__RELEASE_HOST, false);
    release(1, HEAPD__RELEASE_MODE__RELEASE_DISCARD, false);
    is_error(1, HEAPD__ERR_CODE__ERR_INVALID, "rank 0 asked for mode host, rank 1 for mode discard");
    is_error(0, HEAPD__ERR_CODE__ERR_INVALID, "nothing was released");
    stats(2);
    ck_assert_uint_eq(last(2)->state, HS_STATE_ACTIVE);
    release(0, 7, false);
    is_error(0, HEAPD__ERR_CODE__ERR_INVALID, "release mode 7 is unknown");
    release(0, HEAPD__RELEASE_MODE__RELEASE_DISCARD, true);
    is_error(0, HEAPD__ERR_CODE__ERR_INVALID, "keep goes with release mode host only");
}
END_TEST

START_TEST(release_peer_gone)
{
    persist_s = 60;
    formed();
    pattern(1, 2, false, false);
    alloc2(0, 4096, NULL);
    release(0, HEAPD__RELEASE_MODE__RELEASE_HOST, false);
    crash1();
    is_error(0, HEAPD__ERR_CODE__ERR_PEER_GONE, "rank 1 (pid 2001) disconnected while the others waited");
    is_error(0, HEAPD__ERR_CODE__ERR_PEER_GONE, "the heap is still active");
    release(0, HEAPD__RELEASE_MODE__RELEASE_HOST, false);
    is_error(0, HEAPD__ERR_CODE__ERR_PEER_GONE, "rank 1 is not connected");
    /* Back, released together; then a rank gone mid-restore. */
    attach(2, 1);
    ck_assert(!last(2)->att_released);
    release(0, HEAPD__RELEASE_MODE__RELEASE_HOST, false);
    release(2, HEAPD__RELEASE_MODE__RELEASE_HOST, false);
    ck_assert_int_eq(last(2)->kind, R_RELEASE);
    restore(0);
    hd_heap_conn_closed(reg, &peers[2]);
    is_error(0, HEAPD__ERR_CODE__ERR_PEER_GONE, "nothing was restored (the heap is still released)");
    /* A re-attach to the released heap gets no chunk, and restores. */
    attach(3, 1);
    ck_assert_int_eq(last(3)->kind, R_ATTACH);
    ck_assert(last(3)->att_released);
    ck_assert_uint_eq(last(3)->nfds, 0);
    restore(0);
    restore(3);
    ck_assert_msg(last(3)->kind == R_RESTORE, "%s", last(3)->msg);
    pattern(3, 2, true, false); /* the content came back through it all */
}
END_TEST

START_TEST(release_timeout)
{
    formed();
    release(0, HEAPD__RELEASE_MODE__RELEASE_DISCARD, false);
    uint64_t end = uv_now(&loop) + 5000;
    while (last(0)->kind != R_ERROR && uv_now(&loop) < end)
        uv_run(&loop, UV_RUN_ONCE);
    is_error(0, HEAPD__ERR_CODE__ERR_TIMEOUT, "rank(s) 1 never called it");
    stats(2);
    ck_assert_uint_eq(last(2)->state, HS_STATE_ACTIVE);
}
END_TEST

/* backend.h's copies (host backend): save, scrub, load; pinning is a no-op. */
START_TEST(backend_save_load)
{
    char err[256];
    hb_chunk ch;
    ck_assert_msg(hb_chunk_create(be, 0, 1 << 20, &ch, err, sizeof err) == HB_OK, "%s", err);
    uint8_t *p = mmap(NULL, 1 << 20, PROT_READ | PROT_WRITE, MAP_SHARED, ch.fd, 0);
    ck_assert(p != MAP_FAILED);
    for (size_t j = 0; j < (1u << 20); j++)
        p[j] = (uint8_t)(j * 31 + 1);
    uint8_t *copy = malloc(1 << 20);
    ck_assert_int_eq(hb_host_pin(be, copy, 1 << 20, err, sizeof err), HB_OK);
    ck_assert_msg(hb_chunk_save(be, &ch, copy, err, sizeof err) == HB_OK, "%s", err);
    ck_assert_int_eq(hb_chunk_scrub(be, &ch, err, sizeof err), HB_OK);
    ck_assert_uint_eq(p[12345], 0);
    ck_assert_msg(hb_chunk_load(be, &ch, copy, err, sizeof err) == HB_OK, "%s", err);
    ck_assert_int_eq(memcmp(p, copy, 1 << 20), 0);
    ck_assert_uint_eq(p[12345], (uint8_t)(12345 * 31 + 1));
    hb_host_unpin(be, copy);
    munmap(p, 1 << 20);
    hb_chunk_release(be, &ch);
    ck_assert_int_eq(hb_chunk_save(be, &ch, copy, err, sizeof err), HB_EINVAL);
    ck_assert(strstr(err, "released or never created"));
    free(copy);
}
END_TEST

/* heapc_map.h's hm_unmap_chunks: the reservation stays, slots map again. */
START_TEST(map_unmap_chunks_keeps_range)
{
    char err[256];
    hm_space s;
    ck_assert_msg(hm_reserve(HM_HOST, 4 << 20, 1 << 20, &s, err, sizeof err) == HM_OK, "%s", err);
    hb_chunk ch[2];
    for (int i = 0; i < 2; i++) {
        ck_assert_msg(hb_chunk_create(be, 0, 1 << 20, &ch[i], err, sizeof err) == HB_OK, "%s", err);
        ck_assert_msg(hm_map_chunk(&s, (uint32_t)i, ch[i].fd, err, sizeof err) == HM_OK, "%s", err);
    }
    char *base = hm_base(&s);
    base[(1 << 20) + 7] = 42;
    ck_assert_int_eq(hm_unmap_chunks(&s), HM_OK);
    ck_assert_ptr_eq(hm_base(&s), base);
    ck_assert(!hm_is_mapped(&s, 0) && !hm_is_mapped(&s, 1));
    ck_assert_uint_eq(s.nmapped, 0);
    ck_assert_msg(hm_map_chunk(&s, 1, ch[1].fd, err, sizeof err) == HM_OK, "%s", err);
    ck_assert_int_eq(base[(1 << 20) + 7], 42); /* the same memory at the same address */
    ck_assert_int_eq(hm_unmap_all(&s), HM_OK);
    for (int i = 0; i < 2; i++)
        hb_chunk_release(be, &ch[i]);
}
END_TEST

/* ---- a release of named blocks ------------------------------------------- */

static void release_names(int peer, int mode, const char *const *names, size_t n)
{
    Heapd__Release m = HEAPD__RELEASE__INIT;
    m.mode = (Heapd__ReleaseMode)mode;
    m.n_names = n;
    m.names = (char **)names;
    hd_heap_release(reg, &peers[peer], 11, &m);
    validate();
}

/* Checks the content of peer's last restore's chunk fds (2 ranks of 3
 * chunks, rank by rank) against pattern's seed: chunks 1 and 2 of each
 * rank are zeros when zero12 (their release discarded them), the others
 * are the pattern. */
static void check_chunks(int peer, uint8_t seed, bool zero12)
{
    const rec *r = last(peer);
    ck_assert_uint_eq(r->nfds, 6);
    for (size_t i = 0; i < r->nfds; i++) {
        uint8_t *p = mmap(NULL, 1 << 20, PROT_READ, MAP_SHARED, r->fds[i], 0);
        ck_assert(p != MAP_FAILED);
        bool zeros = zero12 && i % 3 != 0;
        for (size_t j = 0; j < (1u << 20); j += 4093) {
            uint8_t want = zeros ? 0 : (uint8_t)(seed + i * 3 + j);
            ck_assert_msg(p[j] == want, "peer %d chunk %zu byte %zu: %u, want %u", peer, i, j, p[j], want);
        }
        munmap(p, 1 << 20);
    }
}

/* Blocks "small" (chunk 0), "kv" (2 MiB: chunks 1 and 2, wholly) and
 * "other" (chunk 0) on both ranks; the heap maps 3 chunks. */
static void named_blocks(void)
{
    formed();
    ck_assert_uint_eq(alloc2(0, 4096, "small"), 0);
    ck_assert_uint_eq(alloc2(1, 2u << 20, "kv"), 1u << 20);
    ck_assert_uint_lt(alloc2(2, 4096, "other"), 1u << 20);
    stats(2);
    ck_assert_uint_eq(last(2)->mapped, 3u << 20);
}

/* Only the chunks wholly inside "kv" go (1 and 2, on both ranks): the
 * reply lists them, Stats keeps chunk 0 resident; restore brings them
 * back from the host copy bit for bit, chunk 0 never left. In discard
 * mode they come back as zeros, chunk 0 as it was. */
START_TEST(release_named_only_their_chunks)
{
    named_blocks();
    release(0, HEAPD__RELEASE_MODE__RELEASE_HOST, false); /* a full release first: every fd at restore */
    release(1, HEAPD__RELEASE_MODE__RELEASE_HOST, false);
    both(restore);
    pattern(0, 9, false, false);
    static const char *const kv[] = {"kv"};
    for (int round = 0; round < 2; round++) {
        int mode = round ? HEAPD__RELEASE_MODE__RELEASE_DISCARD : HEAPD__RELEASE_MODE__RELEASE_HOST;
        release_names(0, mode, kv, 1);
        release_names(1, mode, kv, 1);
        ck_assert_msg(last(0)->kind == R_RELEASE, "%s", last(0)->msg);
        ck_assert_msg(last(1)->kind == R_RELEASE && last(1)->rel_some, "%s", last(1)->msg);
        ck_assert_uint_eq(last(1)->ntrim, 2);
        ck_assert_uint_eq(last(1)->trim_chunks[0], 1);
        ck_assert_uint_eq(last(1)->trim_chunks[1], 2);
        ck_assert_uint_eq(last(1)->released, 4u << 20); /* 2 chunks of 2 ranks */
        ck_assert_uint_eq(last(1)->saved, round ? 0 : 4u << 20);
        stats(2);
        ck_assert_uint_eq(last(2)->state, HS_STATE_RELEASED);
        ck_assert_uint_eq(last(2)->resident, 2u << 20); /* chunk 0 of 2 ranks */
        alloc_n(0, 3, 4096, NULL);
        is_error(0, HEAPD__ERR_CODE__ERR_STATE, "is released on this node");
        both(restore);
        ck_assert_msg(last(1)->kind == R_RESTORE, "%s", last(1)->msg);
        check_chunks(1, 9, round == 1);
        stats(2);
        ck_assert_uint_eq(last(2)->state, HS_STATE_ACTIVE);
        ck_assert_uint_eq(last(2)->resident, 6u << 20);
    }
}
END_TEST

/* A name no live block has: ERR_NOT_FOUND on every rank, nothing
 * released; different names on two ranks: ERR_INVALID; a block with no
 * whole chunk: released with no chunk (the heap is released all the same). */
START_TEST(release_named_refusals)
{
    named_blocks();
    static const char *const none[] = {"kv", "nope"}, *const kv[] = {"kv"}, *const small[] = {"small"};
    release_names(0, HEAPD__RELEASE_MODE__RELEASE_HOST, none, 2);
    release_names(1, HEAPD__RELEASE_MODE__RELEASE_HOST, none, 2);
    is_error(0, HEAPD__ERR_CODE__ERR_NOT_FOUND, "no live block is named \"nope\"");
    is_error(1, HEAPD__ERR_CODE__ERR_NOT_FOUND, "nothing was released");
    release_names(0, HEAPD__RELEASE_MODE__RELEASE_HOST, kv, 1);
    release_names(1, HEAPD__RELEASE_MODE__RELEASE_HOST, small, 1);
    is_error(1, HEAPD__ERR_CODE__ERR_INVALID, "the same block names in the same order");
    is_error(0, HEAPD__ERR_CODE__ERR_INVALID, "asymmetric release");
    stats(2);
    ck_assert_uint_eq(last(2)->state, HS_STATE_ACTIVE);
    ck_assert_uint_eq(last(2)->resident, 6u << 20);
    release_names(0, HEAPD__RELEASE_MODE__RELEASE_HOST, small, 1);
    release_names(1, HEAPD__RELEASE_MODE__RELEASE_HOST, small, 1);
    ck_assert_msg(last(1)->kind == R_RELEASE && last(1)->rel_some, "%s", last(1)->msg);
    ck_assert_uint_eq(last(1)->ntrim, 0);
    ck_assert_uint_eq(last(1)->released, 0);
    both(restore);
    ck_assert_msg(last(1)->kind == R_RESTORE, "%s", last(1)->msg);
    /* A freed block's name is no live block's. */
    free1(0, 1u << 20);
    free1(1, 1u << 20);
    release_names(0, HEAPD__RELEASE_MODE__RELEASE_HOST, kv, 1);
    release_names(1, HEAPD__RELEASE_MODE__RELEASE_HOST, kv, 1);
    is_error(1, HEAPD__ERR_CODE__ERR_NOT_FOUND, "no live block is named \"kv\"");
}
END_TEST

static Suite *release_suite(void)
{
    Suite *s = suite_create("release");
    TCase *tc = tcase_create("release");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, release_host_roundtrip);
    tcase_add_test(tc, release_discard_zeros_and_keep);
    tcase_add_test(tc, release_asymmetric_mode);
    tcase_add_test(tc, release_peer_gone);
    tcase_add_test(tc, release_timeout);
    tcase_add_test(tc, backend_save_load);
    tcase_add_test(tc, map_unmap_chunks_keeps_range);
    tcase_add_test(tc, release_named_only_their_chunks);
    tcase_add_test(tc, release_named_refusals);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return ckw_main(release_suite()); }
