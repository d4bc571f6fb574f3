/* fuzz_dispatch.c - libFuzzer target: daemon/dispatch.c's frame input
 * (hd_dispatch_frame: protobuf decoding, Hello first, the call into the
 * heap wing) with 6 clients as sessions that are no connection: their
 * replies go to fuzz_wing.h's checking sink, their HelloReply and close to
 * this file's.
 *
 * Input: a config byte, then steps of an opcode byte (low 4 bits: what,
 * high bits: which client) and its arguments:
 *   0 a request (fuzz_wing.h's fw_request: kind byte 0..7, hello included),
 *     packed into a Frame, then a byte m: below 200 sent whole, 200..227 cut
 *     to (m - 200)/28 of its length, above 227 one byte changed (position
 *     and xor from the input)
 *   1 raw bytes as a frame (length: 2 bytes, at most 1023)
 *   2 disconnect (hd_dispatch_closed; the client comes back as a new
 *     session)   3 tick (1 ms timeouts)
 *   4 a request as in 0 that came with 1..3 fds (the transport closed them)
 *   5 round: every client bound to a heap sends Alloc of one size at its
 *     next number, and Collect when told to
 *   6 heapd stopping: the unsolicited ERR_SHUTDOWN (hd_dispatch_stop)
 * hd_heap_validate after every step; fuzz_wing.h's checks; a HelloReply
 * names the backend; a client told to close gets nothing more. */
#include "dispatch.h"
#include "fuzz_wing.h"

static hd_dispatch *disp;
static hd_session *sess[NPEER];
static bool closing[NPEER];

static hd_peer *fw_peer(int i)
{
    static hd_peer none; /* a client between two sessions: bound to nothing */
    return sess[i] ? hd_dispatch_session_peer(sess[i]) : &none;
}

static void c_hello(hd_peer *p, uint64_t id, const char *backend)
{
    int i = fw_index(p);
    (void)id;
    TRACE("%d: hello\n", i);
    CHECK(!closing[i], "a HelloReply to a client told to close");
    CHECK(backend && !strcmp(backend, "host"), "HelloReply names backend \"%s\"", backend ? backend : "(null)");
}

static void c_close(hd_peer *p) { closing[fw_index(p)] = true; }

static const hd_client_ops cops = {c_hello, c_close};

static void open_session(int i, uint8_t b)
{
    hd_peer p;
    fw_peer_init(&p, i, b);
    sess[i] = hd_dispatch_session_new(&p, &cops);
    CHECK(sess[i], "hd_dispatch_session_new");
    closing[i] = false;
}

/* The transport closes a client it was told to close once its replies are
 * out: here, before its next frame. */
static void reopen_if_closing(int i)
{
    if (!closing[i])
        return;
    hd_dispatch_closed(disp, sess[i]);
    open_session(i, 0);
}

static void send_frame(int i, const uint8_t *buf, size_t len, size_t nfds)
{
    reopen_if_closing(i);
    hd_dispatch_frame(disp, sess[i], buf, len, nfds);
}

static void send_req(fw_input *in, int i, size_t nfds)
{
    static fw_req r;
    static uint8_t buf[4096];
    fw_request(in, i, in8(in) % 8, &r);
    size_t len = heapd__frame__get_packed_size(&r.f);
    CHECK(len <= sizeof buf, "a %zu-byte request", len);
    heapd__frame__pack(&r.f, buf);
    uint8_t m = in8(in);
    if (m >= 200 && m < 228) {
        len = len * (size_t)(m - 200) / 28;
    } else if (m >= 228 && len) {
        size_t at = in16(in) % len;
        buf[at] ^= (uint8_t)(in8(in) | 1);
    }
    send_frame(i, buf, len, nfds);
}

static void round_all(fw_input *in)
{
    uint64_t size = fw_size(in);
    int start = in8(in) % NPEER;
    for (int k = 0; k < NPEER; k++) {
        int i = (start + k) % NPEER;
        fw_sync(i);
        if (!fw_peer(i)->bind.heap)
            continue;
        uint8_t buf[64];
        Heapd__Alloc m = HEAPD__ALLOC__INIT;
        m.seq = fw_cl[i].next_seq;
        m.size = size;
        Heapd__Frame f = HEAPD__FRAME__INIT;
        f.id = 1;
        f.body_case = HEAPD__FRAME__BODY_ALLOC;
        f.alloc = &m;
        uint64_t before = fw_cl[i].next_seq;
        send_frame(i, buf, heapd__frame__pack(&f, buf), 0);
        fw_validate("a round's alloc");
        fw_sync(i);
        if (fw_peer(i)->bind.heap && fw_cl[i].next_seq == before) {
            Heapd__Collect c = HEAPD__COLLECT__INIT;
            c.seq = before;
            f.id = 2;
            f.body_case = HEAPD__FRAME__BODY_COLLECT;
            f.collect = &c;
            send_frame(i, buf, heapd__frame__pack(&f, buf), 0);
            fw_validate("a round's collect");
        }
    }
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    fw_init();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char *what[] = {"a request",          "raw bytes", "disconnect", "tick",
                                 "a request with fds", "round",     "stop notice"};
    static uint8_t raw[1024];
    fw_input in = {data, size, 0};
    int fds0 = fw_count_fds();
    fw_begin(&in, fds0);
    CHECK(hd_dispatch_create(fw_reg, "host", &disp) == 0, "hd_dispatch_create");
    for (int i = 0; i < NPEER; i++)
        open_session(i, 0);
    while (!in_done(&in)) {
        uint8_t op = in8(&in);
        int i = (op >> 4) % NPEER;
        int k = (op & 15) % 7;
        switch (k) {
        case 0:
            send_req(&in, i, 0);
            break;
        case 1: {
            size_t len = in16(&in) % sizeof raw;
            for (size_t j = 0; j < len; j++)
                raw[j] = in8(&in);
            send_frame(i, raw, len, 0);
            break;
        }
        case 2:
            hd_dispatch_closed(disp, sess[i]);
            open_session(i, in8(&in));
            break;
        case 3:
            fw_tick();
            break;
        case 4:
            send_req(&in, i, 1 + in8(&in) % 3);
            break;
        case 5:
            round_all(&in);
            break;
        default:
            hd_dispatch_stop(sess[i]);
            break;
        }
        fw_validate(what[k]);
    }
    for (int i = 0; i < NPEER; i++) {
        hd_dispatch_closed(disp, sess[i]);
        sess[i] = NULL;
        fw_validate("a disconnect at the end");
    }
    hd_dispatch_destroy(disp);
    fw_end(fds0);
    return 0;
}
