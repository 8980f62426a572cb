/* fuzz_proto — the wire decoder (proto_reader) on arbitrary bytes.
 *
 * Input: byte 0 picks the side (bit 0: requests or events), a small frame
 * limit (bit 1), whole-input feeding (bit 2) and the chunking seed; the rest
 * is the stream. The stream is fed in pseudo-random chunks
 * through both entry points (space/commit and feed), drained after each
 * chunk as the contract asks. Every decoded message is encoded again and the
 * encoding decoded once more, which must succeed. */
#include "proto/proto.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static uint32_t rng_next(uint32_t *s)
{
    *s ^= *s << 13; *s ^= *s >> 17; *s ^= *s << 5;
    return *s;
}

/* Re-decodes one encoded message; it must come back whole. */
static void roundtrip(proto_buf *b, int events)
{
    proto_reader *r = proto_reader_new(0);
    if (!r) return;
    if (proto_reader_feed(r, b->data, b->len) == 0) {
        char err[256];
        proto_err code;
        int rc;
        if (events) { proto_ev ev; rc = proto_reader_next_ev(r, &ev, &code, err, sizeof err); }
        else { proto_req req; rc = proto_reader_next_req(r, &req, &code, err, sizeof err); }
        if (rc != 1) abort();   /* our own encoding must frame and decode */
        (void)code;
    }
    proto_reader_free(r);
}

/* Takes every whole message; 1 when the stream broke. */
static int drain(proto_reader *r, int events)
{
    char err[256];
    for (;;) {
        proto_err code = PROTO_OK;
        int rc;
        proto_buf b = { 0 };
        if (events) {
            proto_ev ev;
            rc = proto_reader_next_ev(r, &ev, &code, err, sizeof err);
            if (rc == 1 && code == PROTO_OK && proto_ev_encode(&b, &ev) == 0) roundtrip(&b, 1);
        } else {
            proto_req req;
            rc = proto_reader_next_req(r, &req, &code, err, sizeof err);
            if (rc == 1 && code == PROTO_OK && proto_req_encode(&b, &req) == 0) roundtrip(&b, 0);
        }
        proto_buf_free(&b);
        if (rc < 0) return 1;
        if (rc == 0) return 0;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    int events = data[0] & 1;
    uint32_t seed = 0x9e3779b9u ^ data[0];
    data++; size--;
    /* a small frame limit now and then, so the limit paths are reached */
    proto_reader *r = proto_reader_new((data[-1] & 2) ? 4096 : 0);
    if (!r) return 0;
    size_t off = 0;
    while (off < size) {
        /* bit 2: the whole input at once (whole frames); else small pieces */
        size_t chunk = (data[-1] & 4) ? size : 1 + rng_next(&seed) % 97;
        if (chunk > size - off) chunk = size - off;
        if (rng_next(&seed) & 1) {
            size_t avail = 0;
            char *p = proto_reader_space(r, &avail);
            if (!p || avail == 0) break;
            if (chunk > avail) chunk = avail;
            memcpy(p, data + off, chunk);
            proto_reader_commit(r, chunk);
        } else if (proto_reader_feed(r, data + off, chunk) != 0) {
            break;
        }
        off += chunk;
        if (drain(r, events)) break;
    }
    proto_reader_free(r);
    /* the UTF-8 helpers on the same bytes */
    size_t w = proto_utf8_whole((const char *)data, size);
    if (w > size) abort();
    if (proto_utf8_valid((const char *)data, size) && w != size) abort();
    return 0;
}
